//! The `mock-gpu-kubelet-plugin` binary as an operator runs it: against an API server through
//! `--kubeconfig`, publishing its devices, registering, and cleaning up on SIGTERM.

use std::path::Path;
use std::process::{Child, Command};

use dra_sdk_testing::assert_contains;
use dra_sdk_testing::cluster::{NODE_NAME, TestCluster, wait_for};
use dra_sdk_testing::kubelet::{KubeletSimulator, KubeletVersion};
use k8s_openapi::api::resource::v1::ResourceSlice;
use mock_gpu::testing::plugin_command;

fn spawn_plugin(cluster: &TestCluster, kubeconfig: &Path) -> Child {
    plugin_command(
        Path::new(env!("CARGO_BIN_EXE_mock-gpu-kubelet-plugin")),
        cluster,
        kubeconfig,
        4,
    )
    .spawn()
    .expect("spawn plugin")
}

// Multi-threaded: the fake API server must keep answering while this test waits for the child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_registers_and_removes_its_sockets_on_sigterm() {
    let cluster = TestCluster::start().await.unwrap();
    let kubeconfig = cluster.write_kubeconfig().unwrap();
    let mut child = spawn_plugin(&cluster, &kubeconfig);

    let registrar = cluster.registrar_dir();
    wait_for("the registration socket", || {
        KubeletSimulator::discover(&registrar).is_ok_and(|found| found.len() == 1)
    })
    .await;
    let socket = KubeletSimulator::discover(&registrar).unwrap().remove(0);
    let plugin = KubeletSimulator::new(KubeletVersion::V1_36)
        .register(&socket)
        .await
        .unwrap();
    assert_eq!(plugin.info.name, "gpu.example.com");

    let api = cluster.api();
    wait_for("a ResourceSlice", || {
        !api.list::<ResourceSlice>().unwrap().is_empty()
    })
    .await;
    let slices = api.list::<ResourceSlice>().unwrap();
    let devices: usize = slices
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum();
    assert_eq!(devices, 4);
    assert_eq!(slices[0].spec.node_name.as_deref(), Some(NODE_NAME));

    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "exit status {status}");
    assert!(!socket.exists(), "registration socket left behind");
    assert!(
        !Path::new(&plugin.info.endpoint).exists(),
        "DRA socket left behind"
    );
    // Slices stay: the kubelet wipes them if the plugin does not come back.
    assert!(!api.list::<ResourceSlice>().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_partitionable_and_consumable_flags_shape_what_is_published() {
    let cluster = TestCluster::start().await.unwrap();
    let kubeconfig = cluster.write_kubeconfig().unwrap();
    let binary = Path::new(env!("CARGO_BIN_EXE_mock-gpu-kubelet-plugin"));
    let mut child = plugin_command(binary, &cluster, &kubeconfig, 2)
        .arg("--gpu-partitions=3")
        .env("GPU_ALLOW_MULTIPLE_ALLOCATIONS", "true")
        .spawn()
        .unwrap();
    let api = cluster.api();
    let devices = || -> Vec<serde_json::Value> {
        api.list::<ResourceSlice>()
            .unwrap()
            .iter()
            .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
            .map(|d| serde_json::to_value(d).unwrap())
            .collect()
    };
    wait_for("2 GPUs with 3 partitions each", || devices().len() == 8).await;
    let counter_sets: Vec<String> = api
        .list::<ResourceSlice>()
        .unwrap()
        .iter()
        .flat_map(|s| s.spec.shared_counters.clone().unwrap_or_default())
        .map(|set| set.name)
        .collect();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(counter_sets, ["gpu-0-counters", "gpu-1-counters"]);
    let devices = devices();
    let whole = devices.iter().find(|d| d["name"] == "gpu-1").unwrap();
    assert_eq!(whole["allowMultipleAllocations"], true, "{whole}");
    assert_eq!(
        whole["capacity"]["memory"]["requestPolicy"]["default"],
        "80Gi"
    );
    let partition = devices
        .iter()
        .find(|d| d["name"] == "gpu-1-partition-2")
        .unwrap();
    assert_eq!(
        partition["attributes"]["partition"]["int"], 2,
        "{partition}"
    );
    assert_eq!(
        partition["consumesCounters"][0]["counters"]["memory"]["value"],
        "27306Mi"
    );
}

#[test]
fn too_many_partitions_are_refused_naming_the_flag() {
    let output = Command::new(env!("CARGO_BIN_EXE_mock-gpu-kubelet-plugin"))
        .args(["--node-name", "n", "--gpu-partitions", "101"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_contains(&stderr, "--gpu-partitions");
    let help = Command::new(env!("CARGO_BIN_EXE_mock-gpu-kubelet-plugin"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for variable in [
        "[env: GPU_PARTITIONS=]",
        "[env: GPU_ALLOW_MULTIPLE_ALLOCATIONS=]",
    ] {
        assert!(help.contains(variable), "{variable}: {help}");
    }
}

#[test]
fn bad_flags_fail_with_a_clear_message() {
    let output = Command::new(env!("CARGO_BIN_EXE_mock-gpu-kubelet-plugin"))
        .args([
            "--node-name",
            "n",
            "--http-endpoint",
            "nonsense",
            "--kubeconfig",
            "/nonexistent",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("/nonexistent") || stderr.contains("http-endpoint"),
        "{stderr}"
    );
}
