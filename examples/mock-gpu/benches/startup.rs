//! Start-up time and idle memory of the `mock-gpu-kubelet-plugin` process with 8 devices:
//! time from spawn to its first ResourceSlice in the API server, and resident memory once
//! idle.
//!
//! Run: `cargo bench -p mock-gpu --bench startup`

use std::time::{Duration, Instant};

use dra_sdk::testing::cluster::TestCluster;
use k8s_openapi::api::resource::v1::ResourceSlice;
use mock_gpu::testing::plugin_command;

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
}

#[tokio::main]
async fn main() {
    let mut startups = Vec::new();
    let mut rss = Vec::new();
    for _ in 0..5 {
        let cluster = TestCluster::start().await.expect("cluster");
        let kubeconfig = cluster.path().join("kubeconfig");
        cluster
            .api()
            .write_kubeconfig(&kubeconfig)
            .expect("kubeconfig");
        let started = Instant::now();
        let binary = std::path::Path::new(env!("CARGO_BIN_EXE_mock-gpu-kubelet-plugin"));
        let mut child = plugin_command(binary, &cluster, &kubeconfig, 8)
            .spawn()
            .expect("spawn");
        while cluster
            .api()
            .list::<ResourceSlice>()
            .expect("list")
            .is_empty()
        {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no slice after 30 s"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        startups.push(started.elapsed());
        tokio::time::sleep(Duration::from_secs(2)).await;
        rss.push(rss_kib(child.id()).unwrap_or(0));
        let _ = child.kill();
        let _ = child.wait();
    }
    startups.sort();
    rss.sort();
    println!(
        "process start to first ResourceSlice: median {:?} (min {:?}, max {:?})",
        startups[startups.len() / 2],
        startups[0],
        startups[startups.len() - 1]
    );
    println!(
        "idle resident memory with 8 devices: median {:.1} MiB (min {:.1}, max {:.1})",
        rss[rss.len() / 2] as f64 / 1024.0,
        rss[0] as f64 / 1024.0,
        rss[rss.len() - 1] as f64 / 1024.0
    );
}
