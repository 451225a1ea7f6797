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
//!
//! With `DRA_E2E_K8S_BIN` naming the Kubernetes binaries (see docs/testing.md) it then measures
//! the same against a real API server and kubelet (`dra_sdk_testing::e2e`), and with
//! `DRA_GO_TEST_DRIVER` naming the upstream Go test driver's binary, side by side with it in
//! the same run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dra_sdk_testing::cluster::TestCluster;
use dra_sdk_testing::e2e::RealCluster;
use dra_sdk_testing::e2e::workload::{self, ClaimSource};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimTemplate, ResourceSlice};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use mock_gpu::testing::plugin_command;

use dra_sdk_testing::deliverables::memory::{
    print_mappings, print_startup, rss_by_mapping, rss_kib,
};

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
        let kubeconfig = cluster.write_kubeconfig().expect("kubeconfig");
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
    report("fake API server", "mock-gpu-kubelet-plugin", startups, rss);
    print_mappings(&mappings);

    if let Some(dir) = std::env::var_os("DRA_E2E_K8S_BIN") {
        against_real_components(Path::new(&dir), &binary, idle).await;
    } else {
        println!("real API server and kubelet: skipped (DRA_E2E_K8S_BIN is not set)");
    }
}

fn report(server: &str, plugin: &str, startups: Vec<Duration>, rss: Vec<[u64; 3]>) {
    print_startup(
        &format!("{plugin}, {server}"),
        "8 devices",
        "the executable",
        startups,
        rss,
    );
}

async fn against_real_components(dir: &Path, ours: &Path, idle: Duration) {
    let cluster = RealCluster::builder(dir)
        .start()
        .await
        .expect("e2e cluster");
    let client = cluster.client().await.expect("client");
    let node = cluster.node("node-1").expect("node-1");
    let kubeconfig = cluster.kubeconfig().display().to_string();
    let registrar = node.registrar_dir().display().to_string();
    let plugins = node.plugins_dir().display().to_string();
    let cdi = node.cdi_root().display().to_string();
    let go_driver = "test-driver.cdi.k8s.io";
    std::fs::create_dir_all(node.plugins_dir().join(go_driver)).expect("Go driver's socket dir");
    let ours_args: Vec<String> = [
        "--kubeconfig",
        &kubeconfig,
        "--node-name",
        "node-1",
        "--num-devices",
        "8",
        "--kubelet-registrar-directory-path",
        &registrar,
        "--kubelet-plugins-directory-path",
        &plugins,
        "--cdi-root",
        &cdi,
    ]
    .map(str::to_owned)
    .to_vec();
    let go_args: Vec<String> = [
        "--kubeconfig",
        &kubeconfig,
        "kubelet-plugin",
        "--node-name",
        "node-1",
        "--num-devices",
        "8",
        "--plugin-registration-path",
        &registrar,
        "--datadir",
        &plugins,
        "--cdi-dir",
        &cdi,
    ]
    .map(str::to_owned)
    .to_vec();
    let mut plugins: Vec<(&str, PathBuf, &[String], &str)> = vec![(
        "mock-gpu-kubelet-plugin",
        ours.to_owned(),
        &ours_args,
        mock_gpu::DEFAULT_DRIVER_NAME,
    )];
    // The Go test driver is built from the Kubernetes tree (`test/e2e/dra/test-driver`); no
    // release archive has it, so it runs only where the user names it.
    match std::env::var_os("DRA_GO_TEST_DRIVER") {
        Some(go) => plugins.push(("dra-test-driver (Go)", go.into(), &go_args, go_driver)),
        None => println!("Go test driver: skipped (DRA_GO_TEST_DRIVER is not set)"),
    }
    let slices = Api::<ResourceSlice>::all(client);
    let mut results: Vec<(Vec<Duration>, Vec<[u64; 3]>)> = vec![Default::default(); plugins.len()];
    for _ in 0..5 {
        for (i, (name, program, args, driver)) in plugins.iter().enumerate() {
            let by_driver = ListParams::default().fields(&format!("spec.driver={driver}"));
            let started = Instant::now();
            let mut process = cluster
                .spawn_program(&name.replace(' ', "-"), program, args)
                .expect("spawn");
            while slices
                .list(&by_driver)
                .await
                .expect("list")
                .items
                .is_empty()
            {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "{name}: no slice after 30 s"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            results[i].0.push(started.elapsed());
            tokio::time::sleep(idle).await;
            results[i]
                .1
                .push(process.pid().and_then(rss_kib).unwrap_or_default());
            process.stop();
            slices
                .delete_collection(&DeleteParams::default(), &by_driver)
                .await
                .expect("delete slices");
            while !slices
                .list(&by_driver)
                .await
                .expect("list")
                .items
                .is_empty()
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    for ((name, ..), (startups, rss)) in plugins.iter().zip(results) {
        report("real v1.36 API server and kubelet", name, startups, rss);
    }

    // Prepare as the real kubelet sees it: both plugins running, pods one after the other,
    // the time between the kubelet's "Calling NodePrepareResources rpc" and "Done calling"
    // log lines for each driver.
    let mut running = Vec::new();
    for (name, program, args, _) in &plugins {
        running.push(
            cluster
                .spawn_program(&name.replace(' ', "-"), program, args)
                .expect("spawn"),
        );
    }
    let client = cluster.client().await.expect("client");
    let namespace = cluster.create_namespace("bench").await.expect("namespace");
    for (_, _, _, driver) in &plugins {
        let by_driver = ListParams::default().fields(&format!("spec.driver={driver}"));
        while slices
            .list(&by_driver)
            .await
            .expect("list")
            .items
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        node.wait_for_registration(driver, 0, Duration::from_secs(30))
            .await
            .expect("registered");
        make_class_and_template(&client, &namespace, driver).await;
    }
    for round in 0..PODS {
        for (_, _, _, driver) in &plugins {
            let pod_name = format!("{}-{round}", driver.split('.').next().unwrap_or("pod"));
            let pod = workload::pod_using(
                &namespace,
                &pod_name,
                "node-1",
                &ClaimSource::Template((*driver).to_owned()),
                &["ctr"],
            );
            Api::<Pod>::namespaced(client.clone(), &namespace)
                .create(&PostParams::default(), &pod)
                .await
                .expect("pod");
            workload::wait_for_pod_running(&client, &namespace, &pod_name, Duration::from_secs(30))
                .await
                .expect("running");
            workload::delete_pods(&client, &namespace, &[&pod_name], Duration::from_secs(30))
                .await
                .expect("deleted");
        }
    }
    let log = std::fs::read_to_string(node.kubelet_log_path().expect("kubelet log")).expect("log");
    for (name, _, _, driver) in &plugins {
        let mut times = kubelet_prepare_times(&log, driver);
        times.sort();
        if times.is_empty() {
            println!("{name}: no NodePrepareResources in the kubelet's log");
            continue;
        }
        let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
        println!(
            "{name}: NodePrepareResources of 1 claim as the real kubelet times it ({} pods): \
             p50 {:?}, p90 {:?}, max {:?}",
            times.len(),
            at(0.5),
            at(0.9),
            times[times.len() - 1]
        );
    }
    drop(running);
}

/// Pods per driver for the kubelet-side prepare figures.
const PODS: usize = 20;

async fn make_class_and_template(client: &kube::Client, namespace: &str, driver: &str) {
    let class = format!("bench.{driver}");
    Api::<DeviceClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &workload::device_class(&class, driver, None).unwrap(),
        )
        .await
        .expect("create class");
    let template =
        workload::claim_template(namespace, driver, &class, serde_json::Value::Null, None)
            .expect("template");
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &template)
        .await
        .expect("create template");
}

/// The durations between the kubelet's "Calling NodePrepareResources rpc" line and the next
/// "Done calling NodePrepareResources rpc" line of `driver` (klog time stamps, microseconds).
fn kubelet_prepare_times(log: &str, driver: &str) -> Vec<Duration> {
    let stamp = |line: &str| -> Option<f64> {
        // I1125 03:38:13.723916 ...
        let time = line.split_whitespace().nth(1)?;
        let mut parts = time.split(':');
        let hours: f64 = parts.next()?.parse().ok()?;
        let minutes: f64 = parts.next()?.parse().ok()?;
        let seconds: f64 = parts.next()?.parse().ok()?;
        Some(hours * 3600.0 + minutes * 60.0 + seconds)
    };
    let driver = format!("driverName=\"{driver}\"");
    let mut started = None;
    let mut times = Vec::new();
    for line in log.lines().filter(|line| line.contains(&driver)) {
        if line.contains("\"Calling NodePrepareResources rpc\"") {
            started = stamp(line);
        } else if line.contains("\"Done calling NodePrepareResources rpc\"")
            && let (Some(start), Some(end)) = (started.take(), stamp(line))
        {
            times.push(Duration::from_secs_f64((end - start).max(0.0)));
        }
    }
    times
}
