//! The mock GPU plugin, as the binary operators run, against real Kubernetes v1.36
//! components: the SDK's end-to-end suite, then the demo (`mock-gpu-demo --kubeconfig`).
//! Skipped, with one line saying so, without `DRA_E2E_K8S_BIN` (see `dra_sdk::testing::e2e`).

use std::path::Path;
use std::time::Duration;

use dra_sdk::testing::e2e::suite::E2eSuite;
use dra_sdk::testing::e2e::{RealCluster, binaries_or_skip};
use mock_gpu::DEFAULT_DRIVER_NAME;
use serde_json::json;
use tokio::sync::OnceCell;

static CLUSTER: OnceCell<RealCluster> = OnceCell::const_new();

async fn cluster() -> Option<&'static RealCluster> {
    let binaries = binaries_or_skip()?;
    Some(
        CLUSTER
            .get_or_init(|| async {
                RealCluster::builder(binaries)
                    .start()
                    .await
                    .unwrap_or_else(|error| panic!("starting the e2e cluster: {error}"))
            })
            .await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_binary_passes_the_e2e_suite() {
    let Some(cluster) = cluster().await else {
        return;
    };
    let node = cluster.node("node-1").unwrap();
    let args: Vec<String> = [
        "--kubeconfig",
        &cluster.kubeconfig().display().to_string(),
        "--node-name",
        node.name(),
        "--num-devices",
        "4",
        "--kubelet-registrar-directory-path",
        &node.registrar_dir().display().to_string(),
        "--kubelet-plugins-directory-path",
        &node.plugins_dir().display().to_string(),
        "--cdi-root",
        &node.cdi_root().display().to_string(),
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect();
    let mut plugin = cluster
        .spawn_program(
            "mock-gpu-kubelet-plugin",
            Path::new(env!("CARGO_BIN_EXE_mock-gpu-kubelet-plugin")),
            &args,
        )
        .unwrap();
    node.wait_for_registration(DEFAULT_DRIVER_NAME, 0, Duration::from_secs(60))
        .await
        .unwrap_or_else(|error| panic!("{error}; plugin log:\n{}", plugin.log_tail(20)));

    let report = E2eSuite::new(cluster, node.name(), DEFAULT_DRIVER_NAME)
        .bad_config(
            json!({
                "apiVersion": "gpu.resource.example.com/v1alpha1",
                "kind": "GpuConfig",
                "sharing": { "strategy": "TimeSlicing", "timeSlicingConfig": { "intervall": "Long" } },
            }),
            "unknown field `sharing.timeSlicingConfig.intervall`",
        )
        .run()
        .await
        .unwrap();
    println!("{report}");
    report.assert_all_passed();
    plugin.stop();
}

/// The README's main job against a real cluster: `mock-gpu-demo --kubeconfig` creates real
/// Pods, the real scheduler allocates their claims from the demo plugin's slices, the claims
/// stay allocated while the demo prepares them, and the binary exits 0 with a true summary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_against_the_real_cluster() {
    let Some(cluster) = cluster().await else {
        return;
    };
    let namespace = cluster.create_namespace("demo").await.unwrap();
    let binary = env!("CARGO_BIN_EXE_mock-gpu-demo");
    let mut command = std::process::Command::new(binary);
    command
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig())
        .args(["--node-name", "node-1", "--namespace", &namespace])
        .env("DRIVER_NAME", "e2e-demo.gpu.example.com");
    // Off the runtime: the binary takes a few seconds.
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(
            "summary: 4 of 4 claims allocated by the cluster's scheduler, 3 prepared, \
             1 failed (bad-config at prepare, as expected), 4 unprepared, 0 CDI spec files left"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("unknown field `sharing.timeSlicingConfig.intervall`"),
        "{stdout}"
    );
    // Everything it created is gone.
    let client = cluster.client().await.unwrap();
    let pods = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &namespace)
        .list(&Default::default())
        .await
        .unwrap();
    assert!(pods.items.is_empty(), "pods left: {}", pods.items.len());
    let claims =
        kube::Api::<k8s_openapi::api::resource::v1::ResourceClaim>::namespaced(client, &namespace)
            .list(&Default::default())
            .await
            .unwrap();
    assert!(
        claims.items.is_empty(),
        "claims left: {}",
        claims.items.len()
    );
}
