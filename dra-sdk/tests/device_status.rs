//! `DeviceStatusWriter` against the fake API server over real HTTP: one server-side apply per
//! claim per change, other drivers' entries kept, own entries removed by `clear`, limits
//! checked before sending, a refused write (the 1.36 `resourceclaims/driver` authorization)
//! reported clearly and changing nothing, a replaced claim not written.
#![cfg(feature = "testing")]

use dra_sdk::device_status::{DeviceStatus, DeviceStatusError, DeviceStatusWriter};
use dra_sdk::driver::ClaimRef;
use dra_sdk::testing::apiserver::{FakeApiServer, Fault};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

mod driver_common;

const DRIVER: &str = "net.example.com";

async fn setup() -> (FakeApiServer, ClaimRef) {
    let server = FakeApiServer::start().await.unwrap();
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "nic", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "nic"}}]}},
    }))
    .unwrap();
    let claim = server.insert(&claim).unwrap();
    // Only allocated devices may have a status (the fake enforces it as the real server does).
    let allocation = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "nic", "namespace": "default"},
        "status": {"allocation": {"devices": {"results": [
            {"request": "nic", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0"},
            {"request": "nic", "driver": DRIVER, "pool": "node-1", "device": "eth0"},
            {"request": "nic", "driver": DRIVER, "pool": "node-1", "device": "eth1"},
        ]}}},
    });
    Api::<ResourceClaim>::namespaced(server.client().unwrap(), "default")
        .patch_status(
            "nic",
            &PatchParams::apply("scheduler"),
            &Patch::Apply(&allocation),
        )
        .await
        .unwrap();
    // Another driver's entry, written with its own field manager.
    let other = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "nic", "namespace": "default"},
        "status": {"devices": [{"driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0",
                                "data": {"owner": "gpu"}}]},
    });
    Api::<ResourceClaim>::namespaced(server.client().unwrap(), "default")
        .patch_status(
            "nic",
            &PatchParams::apply("gpu.example.com"),
            &Patch::Apply(&other),
        )
        .await
        .unwrap();
    let reference = ClaimRef {
        uid: claim.metadata.uid.unwrap(),
        namespace: "default".into(),
        name: "nic".into(),
    };
    (server, reference)
}

fn devices(server: &FakeApiServer) -> Vec<Value> {
    let claim: ResourceClaim = server.get(Some("default"), "nic").unwrap().unwrap();
    serde_json::to_value(claim.status.unwrap().devices.unwrap_or_default())
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn drivers(server: &FakeApiServer) -> Vec<String> {
    devices(server)
        .iter()
        .map(|d| {
            format!(
                "{}/{}",
                d["driver"].as_str().unwrap(),
                d["device"].as_str().unwrap()
            )
        })
        .collect()
}

fn patches(server: &FakeApiServer) -> u64 {
    server.stats().resource("resourceclaims/status").patch
}

#[tokio::test]
async fn one_apply_per_change_and_other_drivers_kept() {
    let (server, claim) = setup().await;
    let writer = DeviceStatusWriter::new(server.client().unwrap(), DRIVER);
    let eth0 = DeviceStatus::new("node-1", "eth0")
        .ready("Configured", "up")
        .interface("net1", ["10.1.2.3/24"], "00:11:22:33:44:55");
    let before = patches(&server);
    assert!(
        writer
            .apply(&claim, std::slice::from_ref(&eth0))
            .await
            .unwrap()
    );
    assert!(
        !writer
            .apply(&claim, std::slice::from_ref(&eth0))
            .await
            .unwrap(),
        "unchanged"
    );
    assert_eq!(patches(&server), before + 1);
    assert_eq!(
        drivers(&server),
        ["gpu.example.com/gpu-0", "net.example.com/eth0"]
    );
    let ours = &devices(&server)[1];
    assert_eq!(ours["conditions"][0]["type"], "Ready");
    assert_eq!(ours["networkData"]["ips"], json!(["10.1.2.3/24"]));

    // A change: eth0 replaced, eth1 added, the other driver still there.
    let eth1 = DeviceStatus::new("node-1", "eth1").data(json!({"mtu": 9000}));
    let eth0 = eth0.data(json!({"mtu": 1500}));
    assert!(writer.apply(&claim, &[eth0, eth1]).await.unwrap());
    assert_eq!(patches(&server), before + 2);
    assert_eq!(
        drivers(&server),
        [
            "gpu.example.com/gpu-0",
            "net.example.com/eth0",
            "net.example.com/eth1"
        ]
    );
    assert_eq!(devices(&server)[1]["data"], json!({"mtu": 1500}));

    // Unprepare: ours removed, theirs kept.
    writer.clear(&claim).await.unwrap();
    assert_eq!(drivers(&server), ["gpu.example.com/gpu-0"]);
    assert_eq!(devices(&server)[0]["data"], json!({"owner": "gpu"}));
}

#[tokio::test]
async fn invalid_status_is_not_sent() {
    let (server, claim) = setup().await;
    let writer = DeviceStatusWriter::new(server.client().unwrap(), DRIVER);
    let before = patches(&server);
    let too_big = DeviceStatus::new("node-1", "eth0").data(json!("x".repeat(11 * 1024)));
    let error = writer.apply(&claim, &[too_big]).await.unwrap_err();
    assert!(
        error.to_string().contains("device node-1/eth0, data"),
        "{error}"
    );
    assert_eq!(patches(&server), before);
}

#[tokio::test]
async fn a_refused_write_says_what_to_grant_and_changes_nothing() {
    let (server, claim) = setup().await;
    let writer = DeviceStatusWriter::new(server.client().unwrap(), DRIVER);
    server.faults().inject(
        // What a real v1.36.2 server answers (a 422, not a 403).
        Fault::status(422)
            .resource("resourceclaims/status")
            .message(
                "ResourceClaim.resource.k8s.io \"nic\" is invalid: status.devices: Forbidden: changing status.devices requires resource=\"resourceclaims/driver\", verb=\"[associated-node:patch]\" permission: resourceclaims.resource.k8s.io \"net.example.com\" is forbidden: User \"system:serviceaccount:dra:plugin\" cannot associated-node:patch resource \"resourceclaims/driver\"",
            ),
    );
    let status = DeviceStatus::new("node-1", "eth0").ready("Configured", "up");
    let error = writer
        .apply(&claim, std::slice::from_ref(&status))
        .await
        .unwrap_err();
    assert!(
        matches!(error, DeviceStatusError::Forbidden { .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("`associated-node:patch` on resourceclaims/driver"),
        "{message}"
    );
    assert!(
        message.contains("resourceNames [net.example.com]"),
        "{message}"
    );
    assert_eq!(drivers(&server), ["gpu.example.com/gpu-0"]);
    // Once granted, the same status is sent again (nothing was remembered as written).
    assert!(writer.apply(&claim, &[status]).await.unwrap());
    assert_eq!(
        drivers(&server),
        ["gpu.example.com/gpu-0", "net.example.com/eth0"]
    );
}

#[tokio::test]
async fn only_allocated_devices_have_a_status() {
    let (server, claim) = setup().await;
    let writer = DeviceStatusWriter::new(server.client().unwrap(), DRIVER);
    let error = writer
        .apply(&claim, &[DeviceStatus::new("node-1", "eth9")])
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("must be an allocated device in the claim"),
        "{error}"
    );
    assert_eq!(drivers(&server), ["gpu.example.com/gpu-0"]);
}

#[tokio::test]
async fn a_replaced_or_deleted_claim_is_not_written() {
    let (server, claim) = setup().await;
    let writer = DeviceStatusWriter::new(server.client().unwrap(), DRIVER);
    let stale = ClaimRef {
        uid: "00000000-0000-0000-0000-000000000000".into(),
        ..claim.clone()
    };
    let status = DeviceStatus::new("node-1", "eth0");
    let error = writer
        .apply(&stale, std::slice::from_ref(&status))
        .await
        .unwrap_err();
    assert!(
        matches!(error, DeviceStatusError::ClaimGone { .. }),
        "{error:?}"
    );
    assert_eq!(drivers(&server), ["gpu.example.com/gpu-0"]);

    server
        .delete::<ResourceClaim>(Some("default"), "nic")
        .unwrap();
    writer.clear(&claim).await.unwrap();
}

/// The handle from the runtime context: a plugin in the test cluster writes the status of a
/// claim it prepared, through the plugin's own client, and removes it again.
#[tokio::test]
async fn the_driver_context_hands_out_a_writer() {
    use dra_sdk::testing::cluster::{NewClaim, TestCluster};
    use driver_common::{DRIVER as GPU_DRIVER, GpuDriver, gpus};

    let running = TestCluster::start_with(GpuDriver::default(), GPU_DRIVER, gpus(1))
        .await
        .unwrap();
    let cluster = running.cluster();
    cluster
        .create_claim(NewClaim::new("default", "gpu").request("gpu", GPU_DRIVER))
        .await
        .unwrap();
    let claim = cluster.allocate("default", "gpu").await.unwrap();
    let prepared = running
        .kubelet()
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(prepared[&claim.uid].is_ok(), "{prepared:?}");

    let writer = running.plugin().context().device_status().unwrap();
    let pool = dra_sdk::testing::cluster::NODE_NAME;
    let status = DeviceStatus::new(pool, "gpu-0").ready("Prepared", "ready for the pod");
    assert!(writer.apply(&claim, &[status]).await.unwrap());
    let stored: ResourceClaim = cluster.api().get(Some("default"), "gpu").unwrap().unwrap();
    let devices = serde_json::to_value(stored.status.unwrap().devices.unwrap()).unwrap();
    assert_eq!(devices[0]["driver"], GPU_DRIVER);
    assert_eq!(devices[0]["conditions"][0]["reason"], "Prepared");

    writer.clear(&claim).await.unwrap();
    let stored: ResourceClaim = cluster.api().get(Some("default"), "gpu").unwrap().unwrap();
    assert!(
        stored
            .status
            .unwrap()
            .devices
            .unwrap_or_default()
            .is_empty()
    );
}
