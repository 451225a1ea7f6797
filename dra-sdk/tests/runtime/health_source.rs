//! The health stream when the driver stops reporting a device, and shutdown while health
//! streams are open.

use std::time::Duration;

use dra_sdk::health::{DeviceState, HealthStatus};
use dra_sdk_testing::cluster::{NODE_NAME, TestCluster};
use dra_sdk_testing::kubelet::KubeletVersion;
use dra_sdk_testing::sample_driver::{DRIVER, GpuDriver};

#[tokio::test]
async fn a_cleared_device_leaves_the_stream_and_shutdown_has_a_deadline() {
    let cluster = TestCluster::start().await.unwrap();
    let driver = GpuDriver {
        health: Some(vec![
            DeviceState::healthy(NODE_NAME, "gpu-0"),
            DeviceState::healthy(NODE_NAME, "gpu-1"),
        ]),
    };
    let plugin = cluster
        .plugin(driver, DRIVER)
        .health_resend_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    let mut watch = kubelet.watch_health().await.unwrap();
    let first = watch.next().await.unwrap().unwrap();
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(first.iter().all(|d| d.status == HealthStatus::Healthy));

    // The driver no longer knows gpu-1: it leaves the list, so the kubelet's staleness
    // timeout makes its health unknown instead of the last state staying fresh.
    plugin.context().clear_device_state(NODE_NAME, "gpu-1");
    let cleared = tokio::time::timeout(Duration::from_secs(2), watch.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(cleared.len(), 1, "{cleared:?}");
    assert_eq!(cleared[0].device, "gpu-0");
    // And it stays so on every re-send.
    let again = tokio::time::timeout(Duration::from_secs(2), watch.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(again, cleared);

    // Shutdown has a deadline even with the stream open.
    tokio::time::timeout(Duration::from_secs(10), plugin.shutdown())
        .await
        .expect("shutdown with an open health stream")
        .unwrap();
    drop(watch);
}
