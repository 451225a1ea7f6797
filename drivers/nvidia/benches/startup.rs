//! Start-up time and idle memory of the `gpu-kubelet-plugin` process on the mock `dgx-a100`
//! machine (8 A100s, some in MIG mode: 19 devices with passthrough off): time from
//! spawn to its first ResourceSlice in the fake API server, and resident memory once idle.
//!
//! Run: `cargo bench -p dra-driver-nvidia --bench startup` measures the plugin as built for
//! this bench. The figures in docs/benchmarks.md are of the binary we ship, built with the
//! size-optimised `dist` profile, named in `NVIDIA_GPU_PLUGIN` (relative to the workspace
//! root):
//!
//! ```sh
//! cargo build --profile dist -p dra-driver-nvidia --bin gpu-kubelet-plugin
//! NVIDIA_GPU_PLUGIN=target/dist/gpu-kubelet-plugin cargo bench -p dra-driver-nvidia --bench startup
//! ```
//!
//! `NVIDIA_GPU_PROFILE` picks another mock profile (default `dgx-a100`), `NVIDIA_GPU_IDLE_SECS`
//! how long the plugin idles before its memory is read (default 2), `NVIDIA_GPU_STARTS` the
//! number of starts (default 5).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use dra_sdk_testing::cluster::TestCluster;
use k8s_openapi::api::resource::v1::ResourceSlice;

use dra_sdk_testing::deliverables::memory::{
    print_mappings, print_startup, rss_by_mapping, rss_kib,
};

/// The plugin at `binary` on the mock `profile`, pointed at `cluster` as an operator would
/// run it on the cluster's node.
fn plugin_command(
    binary: &Path,
    cluster: &TestCluster,
    kubeconfig: &Path,
    profile: &str,
) -> Command {
    let mut command = cluster.plugin_command(binary, kubeconfig);
    command.args(["--mock-profile", profile]);
    command
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() {
    // A relative NVIDIA_GPU_PLUGIN is relative to the workspace root, where the command runs.
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let binary = std::env::var_os("NVIDIA_GPU_PLUGIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_gpu-kubelet-plugin")),
        |path| workspace.join(path),
    );
    let profile: String = env_or("NVIDIA_GPU_PROFILE", "dgx-a100".to_owned());
    let idle = Duration::from_secs(env_or("NVIDIA_GPU_IDLE_SECS", 2));
    let starts: usize = env_or("NVIDIA_GPU_STARTS", 5).max(1);
    let size = std::fs::metadata(&binary).map_or(0, |meta| meta.len());
    println!(
        "plugin: {} ({:.1} MB), profile {profile}, {starts} starts, idle {idle:?} before reading its memory",
        binary.display(),
        size as f64 / 1e6
    );

    let mut startups = Vec::with_capacity(starts);
    let mut rss = Vec::with_capacity(starts);
    let mut mappings = Vec::new();
    let mut devices = 0;
    for _ in 0..starts {
        let cluster = TestCluster::start().await.expect("cluster");
        let kubeconfig = cluster.write_kubeconfig().expect("kubeconfig");
        let started = Instant::now();
        let mut child = plugin_command(&binary, &cluster, &kubeconfig, &profile)
            .spawn()
            .expect("spawn");
        let slices = loop {
            let slices = cluster.api().list::<ResourceSlice>().expect("list");
            if !slices.is_empty() {
                break slices;
            }
            if started.elapsed() > Duration::from_secs(30)
                || matches!(child.try_wait(), Ok(Some(_)))
            {
                let _ = child.kill();
                panic!(
                    "no ResourceSlice from {} after {:?}",
                    binary.display(),
                    started.elapsed()
                );
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        startups.push(started.elapsed());
        tokio::time::sleep(idle).await;
        // Every device, once the publisher is done (all slices of the pool are in by now).
        devices = cluster
            .api()
            .list::<ResourceSlice>()
            .unwrap_or(slices)
            .iter()
            .map(|slice| slice.spec.devices.as_ref().map_or(0, Vec::len))
            .sum::<usize>();
        rss.push(rss_kib(child.id()).unwrap_or_default());
        mappings = rss_by_mapping(child.id());
        let _ = child.kill();
        let _ = child.wait();
    }

    print_startup(
        &format!("gpu-kubelet-plugin, {profile}"),
        &format!("{devices} devices published"),
        "the executable, libc",
        startups,
        rss,
    );
    print_mappings(&mappings);
}
