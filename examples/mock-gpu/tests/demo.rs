//! The README's main command: the demo against the embedded cluster.

use mock_gpu::demo::{DemoOptions, Target};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_allocates_prepares_and_cleans_up() {
    let report = mock_gpu::demo::run(DemoOptions {
        driver_name: "gpu.example.com".into(),
        num_devices: 8,
        target: Target::Embedded,
    })
    .await
    .unwrap();
    assert!(report.contains("published 8 GPUs"), "{report}");
    assert!(
        report.contains("GPU_DEVICE_1_TIMESLICE_INTERVAL=Long"),
        "{report}"
    );
    assert!(
        report.contains("GPU_DEVICE_6_PARTITION_COUNT=4"),
        "{report}"
    );
    assert!(
        report.contains("unknown field `sharing.timeSlicingConfig.intervall`"),
        "{report}"
    );
    assert!(
        report.contains("4 claims allocated, 3 prepared, 1 failed (the bad config), 4 unprepared, 0 CDI spec files left"),
        "{report}"
    );
}

/// `--kubeconfig`: everything goes through an API server over HTTP (here the SDK's fake one,
/// with a Node of its own), and the demo leaves nothing behind, not even the leftovers of an
/// interrupted run; a DeviceClass it did not create stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_against_a_cluster_cleans_up_after_itself() {
    use dra_sdk::testing::apiserver::FakeApiServer;
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};

    let api = FakeApiServer::start().await.unwrap();
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node", "metadata": { "name": "worker-1" },
    }))
    .unwrap();
    api.insert(&node).unwrap();
    let leftover: ResourceClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {
            "name": "single-gpu", "namespace": "default",
            "labels": { "app.kubernetes.io/managed-by": "mock-gpu-demo" },
            "finalizers": ["resource.kubernetes.io/delete-protection"],
        },
        "spec": { "devices": { "requests": [] } },
    }))
    .unwrap();
    api.insert(&leftover).unwrap();
    let kubeconfig = tempfile::NamedTempFile::new().unwrap();
    api.write_kubeconfig(kubeconfig.path()).unwrap();

    let path = kubeconfig.path().to_owned();
    // Off the runtime's threads: the API server must keep answering while the demo runs.
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_mock-gpu-demo"))
            .arg("--kubeconfig")
            .arg(path)
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    let report = String::from_utf8_lossy(&output.stdout);
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{report}\n{errors}");
    assert!(
        report.contains("plugin demo.gpu.example.com on node worker-1 of the cluster"),
        "{report}"
    );
    assert!(
        report.contains("4 claims allocated, 3 prepared, 1 failed (the bad config), 4 unprepared, 0 CDI spec files left"),
        "{report}"
    );
    assert!(api.list::<ResourceClaim>().unwrap().is_empty());
    assert!(api.list::<DeviceClass>().unwrap().is_empty());
    assert!(api.list::<ResourceSlice>().unwrap().is_empty());

    // A DeviceClass of the same name from elsewhere is used and kept.
    let class = dra_sdk::testing::cluster::driver_device_class(
        "demo.gpu.example.com",
        "demo.gpu.example.com",
    );
    api.insert(&class).unwrap();
    let report = mock_gpu::demo::run(DemoOptions {
        driver_name: "demo.gpu.example.com".into(),
        num_devices: 8,
        target: Target::Cluster {
            client: api.client().unwrap(),
            node_name: Some("worker-1".into()),
            namespace: "default".into(),
        },
    })
    .await
    .unwrap();
    assert!(
        report.contains("using the existing DeviceClass"),
        "{report}"
    );
    assert!(report.contains("3 prepared"), "{report}");
    assert_eq!(api.list::<DeviceClass>().unwrap().len(), 1);
    assert!(api.list::<ResourceClaim>().unwrap().is_empty());
}
