//! Start-up time and idle memory of the `mock-gpu-kubelet-plugin` process with 8 devices:
//! time from spawn to its first ResourceSlice in the API server, and resident memory once
//! idle.
//!
//! Run: `cargo bench -p mock-gpu --bench startup` measures the plugin as built for this bench.
//! The figures in docs/benchmarks.md are of the binary we ship, built with the size-optimised
//! `dist` profile, named in `MOCK_GPU_PLUGIN`:
//!
//! `MOCK_GPU_IDLE_SECS` sets how long it idles before its memory is read (default 2).
//!
//! ```sh
//! cargo build --profile dist -p mock-gpu --no-default-features --bin mock-gpu-kubelet-plugin
//! MOCK_GPU_PLUGIN=target/dist/mock-gpu-kubelet-plugin cargo bench -p mock-gpu --bench startup
//! ```

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dra_sdk::testing::cluster::TestCluster;
use k8s_openapi::api::resource::v1::ResourceSlice;
use mock_gpu::testing::plugin_command;

/// `VmRSS`, `RssAnon` and `RssFile` of a process, in KiB.
fn rss_kib(pid: u32) -> Option<[u64; 3]> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|value| value.split_whitespace().next()?.parse().ok())
    };
    Some([field("VmRSS:")?, field("RssAnon:")?, field("RssFile:")?])
}

/// Resident KiB per mapped file (`[heap]`, `[stack]`, or `anonymous` for the rest), largest
/// first: where the resident memory goes.
fn rss_by_mapping(pid: u32) -> Vec<(String, u64)> {
    let Ok(smaps) = std::fs::read_to_string(format!("/proc/{pid}/smaps")) else {
        return Vec::new();
    };
    let mut by_name = std::collections::BTreeMap::<String, u64>::new();
    let mut current = String::new();
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields
            .first()
            .is_some_and(|range| range.contains('-') && !range.ends_with(':'))
        {
            current = fields
                .get(5)
                .map_or("anonymous", |name| name.rsplit('/').next().unwrap_or(name))
                .to_owned();
        } else if let Some(kib) = line.strip_prefix("Rss:") {
            let kib: u64 = kib
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .unwrap_or(0);
            *by_name.entry(current.clone()).or_default() += kib;
        }
    }
    let mut sorted: Vec<_> = by_name.into_iter().filter(|(_, kib)| *kib > 0).collect();
    sorted.sort_by_key(|(_, kib)| std::cmp::Reverse(*kib));
    sorted
}

#[tokio::main]
async fn main() {
    let mut startups = Vec::new();
    let mut rss = Vec::new();
    let mut mappings = Vec::new();
    // A relative MOCK_GPU_PLUGIN is relative to the workspace root, where the command runs.
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let binary = std::env::var_os("MOCK_GPU_PLUGIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_mock-gpu-kubelet-plugin")),
        |path| workspace.join(path),
    );
    // How long the plugin idles before its memory is read: 2 s, or MOCK_GPU_IDLE_SECS.
    let idle = Duration::from_secs(
        std::env::var("MOCK_GPU_IDLE_SECS")
            .ok()
            .and_then(|secs| secs.parse().ok())
            .unwrap_or(2),
    );
    println!(
        "plugin: {}, idle {idle:?} before reading its memory",
        binary.display()
    );
    for _ in 0..5 {
        let cluster = TestCluster::start().await.expect("cluster");
        let kubeconfig = cluster.path().join("kubeconfig");
        cluster
            .api()
            .write_kubeconfig(&kubeconfig)
            .expect("kubeconfig");
        let started = Instant::now();
        let mut child = plugin_command(&binary, &cluster, &kubeconfig, 8)
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
        tokio::time::sleep(idle).await;
        rss.push(rss_kib(child.id()).unwrap_or_default());
        mappings = rss_by_mapping(child.id());
        let _ = child.kill();
        let _ = child.wait();
    }
    startups.sort();
    rss.sort_by_key(|[total, ..]| *total);
    println!(
        "process start to first ResourceSlice: median {:?} (min {:?}, max {:?})",
        startups[startups.len() / 2],
        startups[0],
        startups[startups.len() - 1]
    );
    let mib = |kib: u64| kib as f64 / 1024.0;
    let [total, anon, file] = rss[rss.len() / 2];
    println!(
        "idle resident memory with 8 devices: median {:.1} MiB (min {:.1}, max {:.1}); \
         of the median, {:.1} MiB anonymous (heap, stacks), {:.1} MiB file-backed (the executable)",
        mib(total),
        mib(rss[0][0]),
        mib(rss[rss.len() - 1][0]),
        mib(anon),
        mib(file),
    );
    let top: Vec<String> = mappings
        .iter()
        .take(6)
        .map(|(name, kib)| format!("{name} {:.1}", mib(*kib)))
        .collect();
    println!("resident MiB by mapping (last run): {}", top.join(", "));
}
