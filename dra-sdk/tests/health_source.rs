//! The health stream when the driver's health source goes away, and shutdown while health
//! streams are open.

use std::time::Duration;

use dra_sdk::health::{DeviceHealth, HealthReporter, HealthStatus};
use dra_sdk_testing::cluster::{NODE_NAME, TestCluster};
use dra_sdk_testing::kubelet::KubeletVersion;

use dra_sdk_testing::sample_driver::{DRIVER, GpuDriver};

#[tokio::test]
async fn devices_become_unknown_when_the_health_source_goes_away() {
    let (reporter, source) = HealthReporter::new();
    reporter.set(vec![DeviceHealth::new(
        NODE_NAME,
        "gpu-0",
        HealthStatus::Healthy,
    )]);
    let cluster = TestCluster::start().await.unwrap();
    let plugin = cluster
        .plugin(
            GpuDriver {
                health: Some(source),
            },
            DRIVER,
        )
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
    assert_eq!(first[0].status, HealthStatus::Healthy);

    // The driver's monitor ends (its reporter dropped): the kubelet must not keep seeing the
    // last state as fresh.
    drop(reporter);
    let gone = tokio::time::timeout(Duration::from_secs(2), watch.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(gone[0].status, HealthStatus::Unknown, "{gone:?}");
    assert_eq!(gone[0].device, "gpu-0");
    // And it stays so on every re-send.
    let again = tokio::time::timeout(Duration::from_secs(2), watch.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(again[0].status, HealthStatus::Unknown);

    // Shutdown has a deadline even with the stream open.
    tokio::time::timeout(Duration::from_secs(10), plugin.shutdown())
        .await
        .expect("shutdown with an open health stream")
        .unwrap();
    drop(watch);
}
