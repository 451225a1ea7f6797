//! `DeviceStatusWriter` against the fake API server over real HTTP: one server-side apply per
//! claim per change, other drivers' entries kept, own entries removed by `clear`, limits
//! checked before sending, a refused write (the 1.36 `resourceclaims/driver` authorization)
//! reported clearly and changing nothing, a replaced claim not written.

use dra_sdk::claim::ClaimRef;
use dra_sdk::device_status::{DeviceStatus, DeviceStatusError, DeviceStatusWriter};
use dra_sdk_testing::apiserver::{FakeApiServer, Fault};
use dra_sdk_testing::assert_contains;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

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
    assert_contains(&message, "`associated-node:patch` on resourceclaims/driver");
    assert_contains(&message, "resourceNames [net.example.com]");
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
    use dra_sdk_testing::cluster::{NewClaim, TestCluster};
    use dra_sdk_testing::sample_driver::{DRIVER as GPU_DRIVER, GpuDriver, gpus};

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
    let pool = dra_sdk_testing::cluster::NODE_NAME;
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

/// A driver that reports device status: a `Ready` status per prepared device (or, with `bad`,
/// one the API would refuse), and the plugin events it sees.
#[derive(Clone, Default)]
struct StatusDriver {
    bad: bool,
    events: std::sync::Arc<std::sync::Mutex<Vec<dra_sdk::driver::PluginEvent>>>,
}

#[async_trait::async_trait]
impl dra_sdk::driver::Driver for StatusDriver {
    type Config = dra_sdk_testing::sample_driver::GpuConfig;

    fn config_registry(&self) -> dra_sdk::config::ConfigRegistry<Self::Config> {
        dra_sdk::config::ConfigRegistry::new()
            .register::<dra_sdk_testing::sample_driver::GpuConfig>()
    }

    fn reports_device_status(&self) -> bool {
        true
    }

    async fn prepare(
        &self,
        claim: &dra_sdk::claim::Claim<Self::Config>,
    ) -> Result<dra_sdk::driver::PreparedClaim, dra_sdk::claim::DriverError> {
        let mut prepared = dra_sdk_testing::sample_driver::prepare_gpus(claim);
        for device in &claim.devices {
            let status = DeviceStatus::new(&device.device.pool, &device.device.name)
                .ready("Prepared", "ready for the pod")
                .data(json!({ "claim": claim.claim.name }));
            let status = if self.bad {
                status.interface("gpu0", ["10.0.0.1"], "")
            } else {
                status
            };
            prepared = prepared.with_device_status(status);
        }
        Ok(prepared)
    }

    async fn unprepare(
        &self,
        _: &dra_sdk::claim::RecordedClaim,
    ) -> Result<(), dra_sdk::claim::DriverError> {
        Ok(())
    }

    fn on_event(&self, event: &dra_sdk::driver::PluginEvent) {
        self.events.lock().unwrap().push(event.clone());
    }
}

async fn prepared_claim(
    driver: StatusDriver,
) -> (dra_sdk_testing::cluster::RunningPlugin, ClaimRef) {
    use dra_sdk_testing::cluster::{NewClaim, TestCluster};
    let running = TestCluster::start_with(
        driver,
        dra_sdk_testing::sample_driver::DRIVER,
        dra_sdk_testing::sample_driver::gpus(1),
    )
    .await
    .unwrap();
    let cluster = running.cluster();
    cluster
        .create_claim(
            NewClaim::new("default", "gpu").request("gpu", dra_sdk_testing::sample_driver::DRIVER),
        )
        .await
        .unwrap();
    let claim = cluster.allocate("default", "gpu").await.unwrap();
    (running, claim)
}

fn stored_devices(running: &dra_sdk_testing::cluster::RunningPlugin) -> Vec<Value> {
    let claim: ResourceClaim = running
        .cluster()
        .api()
        .get(Some("default"), "gpu")
        .unwrap()
        .unwrap();
    serde_json::to_value(claim.status.unwrap().devices.unwrap_or_default())
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// The plugin writes what prepare returned once the claim is prepared, the context's handle
/// changes it later with one write, and unprepare removes it.
#[tokio::test]
async fn the_plugin_writes_status_at_prepare_and_removes_it_at_unprepare() {
    let (running, claim) = prepared_claim(StatusDriver::default()).await;
    let prepared = running
        .kubelet()
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(prepared[&claim.uid].is_ok(), "{prepared:?}");
    let devices = stored_devices(&running);
    assert_eq!(devices.len(), 1, "{devices:?}");
    assert_eq!(devices[0]["driver"], dra_sdk_testing::sample_driver::DRIVER);
    assert_eq!(devices[0]["conditions"][0]["reason"], "Prepared");
    assert_eq!(devices[0]["data"], json!({ "claim": "gpu" }));

    let before = patches(running.cluster().api());
    let writer = running.plugin().context().device_status().unwrap();
    let pool = dra_sdk_testing::cluster::NODE_NAME;
    let later = DeviceStatus::new(pool, "gpu-0").condition("Ready", false, "XidError", "XID 79");
    assert!(writer.apply(&claim, &[later]).await.unwrap());
    assert_eq!(patches(running.cluster().api()), before + 1);
    assert_eq!(
        stored_devices(&running)[0]["conditions"][0]["reason"],
        "XidError"
    );

    let unprepared = running
        .kubelet()
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(unprepared[&claim.uid].is_ok());
    assert!(stored_devices(&running).is_empty());
}

/// A refused write (the 1.36 authorization without the driver's grant) is reported to the
/// driver with what to grant; the claim is prepared all the same.
#[tokio::test]
async fn a_refused_status_write_leaves_the_claim_prepared() {
    let driver = StatusDriver::default();
    let events = driver.events.clone();
    let (running, claim) = prepared_claim(driver).await;
    running.cluster().api().faults().inject(
        Fault::status(422)
            .resource("resourceclaims/status")
            .message("status.devices: Forbidden: changing status.devices requires resource=\"resourceclaims/driver\", verb=\"[associated-node:patch arbitrary-node:patch]\" permission"),
    );
    let prepared = running
        .kubelet()
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(prepared[&claim.uid].is_ok(), "{prepared:?}");
    assert!(stored_devices(&running).is_empty());
    let events = events.lock().unwrap().clone();
    let failure = events
        .iter()
        .find_map(|event| match event {
            dra_sdk::driver::PluginEvent::DeviceStatusFailed {
                claim: failed,
                error,
            } => Some((failed.clone(), error.clone())),
            _ => None,
        })
        .expect("a DeviceStatusFailed event");
    assert_eq!(failure.0, claim);
    assert!(
        failure
            .1
            .contains("`associated-node:patch` on resourceclaims/driver"),
        "{}",
        failure.1
    );
    let recorded = running.plugin().context().prepared_claims().await.unwrap();
    assert_eq!(recorded.len(), 1);
}

/// A status the API would refuse fails the claim with the field named, before anything is
/// sent or written.
#[tokio::test]
async fn an_invalid_status_from_prepare_fails_the_claim() {
    let (running, claim) = prepared_claim(StatusDriver {
        bad: true,
        ..StatusDriver::default()
    })
    .await;
    let prepared = running
        .kubelet()
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    let error = prepared[&claim.uid].as_ref().unwrap_err().to_string();
    assert_contains(&error, "networkData.ips[0]");
    assert!(stored_devices(&running).is_empty());
}

/// Against a 1.33-style server (ResourceClaims only as `v1beta2`), the writer finds the
/// version by discovery and writes through it.
#[tokio::test]
async fn the_writer_uses_the_newest_served_version() {
    use dra_sdk_testing::apiserver::ResourceType;
    use kube::api::{ApiResource, DynamicObject, PostParams};

    let server = FakeApiServer::builder()
        .git_version("v1.33.4")
        .resource_types([ResourceType::RESOURCE_CLAIMS.with_version("v1beta2")])
        .start()
        .await
        .unwrap();
    let resource = ApiResource {
        group: "resource.k8s.io".into(),
        version: "v1beta2".into(),
        api_version: "resource.k8s.io/v1beta2".into(),
        kind: "ResourceClaim".into(),
        plural: "resourceclaims".into(),
    };
    let api: Api<DynamicObject> =
        Api::namespaced_with(server.client().unwrap(), "default", &resource);
    let claim: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1beta2", "kind": "ResourceClaim",
        "metadata": {"name": "nic", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "nic"}}]}},
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &claim).await.unwrap();
    let allocation = json!({
        "apiVersion": "resource.k8s.io/v1beta2", "kind": "ResourceClaim",
        "metadata": {"name": "nic", "namespace": "default"},
        "status": {"allocation": {"devices": {"results": [
            {"request": "nic", "driver": DRIVER, "pool": "node-1", "device": "eth0"},
        ]}}},
    });
    api.patch_status(
        "nic",
        &PatchParams::apply("scheduler"),
        &Patch::Apply(&allocation),
    )
    .await
    .unwrap();
    let reference = ClaimRef::new("default", "nic", created.metadata.uid.unwrap());

    let writer = DeviceStatusWriter::new(server.client().unwrap(), DRIVER);
    let status = DeviceStatus::new("node-1", "eth0").ready("Configured", "up");
    assert!(writer.apply(&reference, &[status]).await.unwrap());
    let stored = api.get_status("nic").await.unwrap();
    assert_eq!(stored.data["status"]["devices"][0]["driver"], DRIVER);
    assert_eq!(
        stored.data["status"]["devices"][0]["conditions"][0]["type"],
        "Ready"
    );
    writer.clear(&reference).await.unwrap();
    let stored = api.get_status("nic").await.unwrap();
    assert!(
        stored.data["status"]["devices"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "{stored:?}"
    );
}
