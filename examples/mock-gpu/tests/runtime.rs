//! The example driver at run time, through the SDK's driver context: a hot-plugged GPU and a
//! changed GPU reach the ResourceSlices, and an unhealthy GPU is reported on the kubelet's
//! health stream and tainted in its slice, all while the plugin serves, through its real
//! sockets and the fake API server.

use dra_sdk::health::HealthStatus;
use dra_sdk::slices::Quantity;
use dra_sdk_testing::claims::AllocatedClaim;
use dra_sdk_testing::cluster::{self, NODE_NAME, TestCluster, claim_ref};
use k8s_openapi::api::resource::v1::Device;
use kube::Api;
use mock_gpu::{DEFAULT_DRIVER_NAME, GpuHealth, MockGpuDriver, RuntimeError};

/// Polls the driver's ResourceSlices until `done` holds for the devices they list.
async fn wait_for_devices(
    client: &kube::Client,
    what: &str,
    done: impl Fn(&[Device]) -> bool,
) -> Vec<Device> {
    cluster::wait_for_devices(client, DEFAULT_DRIVER_NAME, what, done).await
}

fn taint_keys(devices: &[Device], name: &str) -> Vec<String> {
    devices
        .iter()
        .find(|device| device.name == name)
        .and_then(|device| device.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|taint| {
            format!(
                "{}={}:{}",
                taint.key,
                taint.value.unwrap_or_default(),
                taint.effect
            )
        })
        .collect()
}

#[tokio::test]
async fn gpus_change_and_fail_at_run_time() {
    let driver = MockGpuDriver::new(DEFAULT_DRIVER_NAME, NODE_NAME, 2);
    assert!(matches!(driver.add_gpu(), Err(RuntimeError::NotStarted)));
    let running = TestCluster::start_with(driver.clone(), DEFAULT_DRIVER_NAME, driver.resources())
        .await
        .expect("starting the plugin");
    let client = running.cluster().client();
    let kubelet = running.kubelet();
    assert!(kubelet.health_advertised);
    let mut health = kubelet.watch_health().await.expect("health stream");
    let first = health.next().await.unwrap().unwrap();
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(first.iter().all(|d| d.status == HealthStatus::Healthy));

    // Hot-plug: gpu-2 is published, and a claim for it is prepared.
    let gpu = driver.add_gpu().unwrap();
    assert_eq!(gpu.name(), "gpu-2");
    wait_for_devices(&client, "the hot-plugged gpu-2", |d| d.len() == 3).await;
    let claim = AllocatedClaim::new("default", "on-gpu-2")
        .device("gpu", DEFAULT_DRIVER_NAME, NODE_NAME, "gpu-2")
        .create(&client)
        .await
        .unwrap();
    let claim = claim_ref(&claim).unwrap();
    let prepared = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
    assert_eq!(prepared[&claim.uid].as_ref().unwrap()[0].device, "gpu-2");

    // A changed GPU: gpu-0 now shows 40Gi.
    driver
        .update_gpu(0, |gpu| gpu.memory = Quantity("40Gi".into()))
        .unwrap();
    wait_for_devices(&client, "gpu-0 with 40Gi", |devices| {
        devices.iter().any(|d| {
            d.name == "gpu-0"
                && d.capacity
                    .as_ref()
                    .and_then(|c| c.get("memory"))
                    .is_some_and(|c| c.value.0 == "40Gi")
        })
    })
    .await;
    assert!(matches!(
        driver.update_gpu(9, |_| {}),
        Err(RuntimeError::NoSuchGpu(9))
    ));

    // gpu-1 fails: tainted in its slice and unhealthy on the health stream, from one call.
    driver
        .set_gpu_health(1, GpuHealth::Unhealthy("XID 79: fell off the bus".into()))
        .unwrap();
    let devices = wait_for_devices(&client, "the taint on gpu-1", |d| {
        !taint_keys(d, "gpu-1").is_empty()
    })
    .await;
    assert_eq!(
        taint_keys(&devices, "gpu-1"),
        ["gpu.example.com/unhealthy=true:NoSchedule"]
    );
    assert!(taint_keys(&devices, "gpu-0").is_empty());
    loop {
        let list = health.next().await.unwrap().unwrap();
        if let Some(gpu1) = list
            .iter()
            .find(|d| d.device == "gpu-1" && d.status == HealthStatus::Unhealthy)
        {
            assert_eq!(gpu1.message, "XID 79: fell off the bus");
            // The hot-plugged GPU is reported too.
            assert!(list.iter().any(|d| d.device == "gpu-2"));
            break;
        }
    }

    // Recovery removes the taint.
    driver.set_gpu_health(1, GpuHealth::Healthy).unwrap();
    wait_for_devices(&client, "gpu-1 untainted", |d| {
        d.len() == 3 && taint_keys(d, "gpu-1").is_empty()
    })
    .await;
    running.shutdown().await.unwrap();
}

/// The two opt-in SDK features, as `--device-status --device-metadata` turns them on: the
/// prepared GPU's status lands in the claim and its metadata file is mounted through a CDI
/// device the kubelet gets; unprepare removes both. Run: `cargo test -p mock-gpu --test
/// runtime device_status_and_metadata`.
#[tokio::test]
async fn device_status_and_metadata_when_turned_on() {
    let driver = MockGpuDriver::new(DEFAULT_DRIVER_NAME, NODE_NAME, 1)
        .with_device_status(true)
        .with_device_metadata(true);
    let running = TestCluster::start_with(driver.clone(), DEFAULT_DRIVER_NAME, driver.resources())
        .await
        .expect("starting the plugin");
    let client = running.cluster().client();
    let claim = AllocatedClaim::new("default", "with-status")
        .device("gpu", DEFAULT_DRIVER_NAME, NODE_NAME, "gpu-0")
        .create(&client)
        .await
        .unwrap();
    let claim = claim_ref(&claim).unwrap();
    let kubelet = running.kubelet();
    let prepared = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
    let devices = prepared[&claim.uid].as_ref().unwrap();
    assert!(
        devices[0]
            .cdi_device_ids
            .contains(&format!("{DEFAULT_DRIVER_NAME}/metadata={}_gpu", claim.uid)),
        "{devices:?}"
    );
    let claims: Api<k8s_openapi::api::resource::v1::ResourceClaim> =
        Api::namespaced(client.clone(), "default");
    let status = claims
        .get_status("with-status")
        .await
        .unwrap()
        .status
        .unwrap();
    let entries = status.devices.unwrap();
    assert_eq!(entries[0].device, "gpu-0");
    assert_eq!(
        entries[0].conditions.as_ref().unwrap()[0].reason,
        "Prepared"
    );
    assert_eq!(
        entries[0].data.as_ref().unwrap().0["uuid"],
        driver.gpus()[0].uuid.as_str()
    );

    let unprepared = kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(unprepared[&claim.uid].is_ok());
    let status = claims
        .get_status("with-status")
        .await
        .unwrap()
        .status
        .unwrap();
    assert!(status.devices.unwrap_or_default().is_empty());
    let metadata_spec = running.cluster().cdi_root().join(format!(
        "{DEFAULT_DRIVER_NAME}_metadata_{}_gpu.json",
        claim.uid
    ));
    assert!(!metadata_spec.exists());
}
