//! The README's main command: the demo against the embedded cluster, against an API server over
//! HTTP (`--kubeconfig`), and what makes it fail.
//!
//! The real-cluster run (kube-scheduler allocating, kube-controller-manager and a kubelet on
//! the node) is in the SDK's e2e suite; here the API server is the SDK's fake, which has no
//! scheduler.

use std::time::Duration;

use dra_sdk_testing::apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use mock_gpu::demo::{
    AllocationMode, BAD_CONFIG_CLAIM, BAD_CONFIG_ERROR, ClaimFailure, DemoFailed, DemoOptions,
    DemoReport, Step, Target, bad_config_failure,
};

const SUCCESS: &str = "4 of 4 claims allocated by the demo's allocator, 3 prepared, 1 failed \
                       (bad-config at prepare, as expected), 4 unprepared, 0 CDI spec files left";

fn assert_expected(report: &DemoReport) {
    assert_eq!(report.claims, 4, "{}", report.text);
    assert_eq!(report.allocated, 4, "{}", report.text);
    assert_eq!(report.prepared, 3, "{}", report.text);
    assert_eq!(report.unprepared, 4, "{}", report.text);
    assert_eq!(report.cdi_files_left, 0, "{}", report.text);
    assert_eq!(report.failed.len(), 1, "{}", report.text);
    assert_eq!(report.failed[0].claim, BAD_CONFIG_CLAIM);
    assert_eq!(report.failed[0].step, Step::Prepare);
    assert!(
        report.failed[0].message.contains(BAD_CONFIG_ERROR),
        "{}",
        report.text
    );
    assert!(report.problems().is_empty(), "{:?}", report.problems());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_allocates_prepares_and_cleans_up() {
    let mut options = DemoOptions::new("gpu.example.com", Target::Embedded);
    options.print = false;
    let report = mock_gpu::demo::run(options).await.unwrap();
    assert_expected(&report);
    assert_eq!(report.allocation, AllocationMode::Demo);
    let text = &report.text;
    assert!(text.contains("published 8 GPUs"), "{text}");
    assert!(
        text.contains("GPU_DEVICE_1_TIMESLICE_INTERVAL=Long"),
        "{text}"
    );
    assert!(text.contains("GPU_DEVICE_6_PARTITION_COUNT=4"), "{text}");
    assert!(
        text.contains("unknown field `sharing.timeSlicingConfig.intervall`"),
        "{text}"
    );
    assert!(text.contains(SUCCESS), "{text}");
}

/// A fake API server with a Node `worker-1` and a kubeconfig for it.
async fn api_server() -> (FakeApiServer, tempfile::NamedTempFile) {
    let api = FakeApiServer::start().await.unwrap();
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node", "metadata": { "name": "worker-1" },
    }))
    .unwrap();
    api.insert(&node).unwrap();
    let kubeconfig = tempfile::NamedTempFile::new().unwrap();
    api.write_kubeconfig(kubeconfig.path()).unwrap();
    (api, kubeconfig)
}

fn assert_nothing_left(api: &FakeApiServer) {
    assert!(api.list::<ResourceClaim>().unwrap().is_empty());
    assert!(api.list::<Pod>().unwrap().is_empty());
    assert!(api.list::<DeviceClass>().unwrap().is_empty());
    assert!(api.list::<ResourceSlice>().unwrap().is_empty());
}

/// Runs the binary off the runtime's threads: the API server must keep answering meanwhile.
async fn run_binary(args: Vec<std::ffi::OsString>) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_mock-gpu-demo"))
            .args(args)
            .output()
    })
    .await
    .unwrap()
    .unwrap()
}

fn cluster(api: &FakeApiServer, allocation: AllocationMode) -> Target {
    Target::Cluster {
        client: api.client().unwrap(),
        node_name: Some("worker-1".into()),
        namespace: "default".into(),
        allocation,
    }
}

/// `--kubeconfig --allocate demo`: everything goes through an API server over HTTP (here the
/// SDK's fake one, with a Node of its own and no scheduler), and the demo leaves nothing
/// behind, not even the leftovers of an interrupted run; a DeviceClass it did not create stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_against_a_cluster_cleans_up_after_itself() {
    let (api, kubeconfig) = api_server().await;
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
    let leftover: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "pod-a", "namespace": "default",
            "labels": { "app.kubernetes.io/managed-by": "mock-gpu-demo" },
        },
        "spec": { "containers": [{ "name": "main", "image": "registry.k8s.io/pause:3.10" }] },
    }))
    .unwrap();
    api.insert(&leftover).unwrap();

    // A short timeout: nothing drops the claims' finalizer here, and the demo does so only
    // once they look stuck.
    let output = run_binary(vec![
        "--kubeconfig".into(),
        kubeconfig.path().into(),
        "--allocate".into(),
        "demo".into(),
        "--timeout".into(),
        "1".into(),
    ])
    .await;
    let report = String::from_utf8_lossy(&output.stdout);
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{report}\n{errors}");
    assert!(
        report.contains("removed the leftovers of an earlier run: 1 pod(s), 1 claim(s)"),
        "{report}"
    );
    assert!(
        report.contains("plugin demo.gpu.example.com on node worker-1 of the cluster"),
        "{report}"
    );
    assert!(report.contains(SUCCESS), "{report}");
    assert_nothing_left(&api);

    // A DeviceClass of the same name from elsewhere is used and kept.
    let class = dra_sdk_testing::cluster::driver_device_class(
        "demo.gpu.example.com",
        "demo.gpu.example.com",
    );
    api.insert(&class).unwrap();
    let mut options = DemoOptions::new("demo.gpu.example.com", cluster(&api, AllocationMode::Demo));
    options.timeout = Duration::from_secs(1);
    options.print = false;
    let report = mock_gpu::demo::run(options).await.unwrap();
    assert_expected(&report);
    assert!(
        report.text.contains("using the existing DeviceClass"),
        "{}",
        report.text
    );
    assert_eq!(api.list::<DeviceClass>().unwrap().len(), 1);
    assert!(api.list::<ResourceClaim>().unwrap().is_empty());
    assert!(api.list::<Pod>().unwrap().is_empty());
}

/// A claim that cannot be allocated (6 GPUs: none has index >= 6) fails the demo: `run`
/// returns a [`DemoFailed`] naming it, after cleaning up, and the binary exits non-zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unexpected_failure_fails_the_demo() {
    let (api, kubeconfig) = api_server().await;
    let mut options = DemoOptions::new("demo.gpu.example.com", cluster(&api, AllocationMode::Demo));
    options.num_devices = 6;
    options.timeout = Duration::from_secs(1);
    options.print = false;
    let error = mock_gpu::demo::run(options).await.unwrap_err();
    let failed = error
        .downcast_ref::<DemoFailed>()
        .unwrap_or_else(|| panic!("{error:#}"));
    let report = &failed.report;
    assert_eq!(report.allocated, 3, "{}", report.text);
    assert_eq!(report.prepared, 2, "{}", report.text);
    let claims: Vec<_> = report
        .failed
        .iter()
        .map(|f| (f.claim.as_str(), f.step))
        .collect();
    assert_eq!(
        claims,
        [
            ("cel-selected", Step::Allocate),
            (BAD_CONFIG_CLAIM, Step::Prepare)
        ],
        "{}",
        report.text
    );
    assert_eq!(failed.problems.len(), 1, "{:?}", failed.problems);
    assert!(
        failed.problems[0].starts_with("claim cel-selected failed to allocate"),
        "{:?}",
        failed.problems
    );
    assert!(error.to_string().contains("cel-selected"), "{error}");
    assert!(
        report.text.contains(
            "3 of 4 claims allocated by the demo's allocator, 2 prepared, 2 failed \
             (cel-selected at allocate; bad-config at prepare, as expected)"
        ),
        "{}",
        report.text
    );
    assert_nothing_left(&api);

    let output = run_binary(vec![
        "--kubeconfig".into(),
        kubeconfig.path().into(),
        "--allocate".into(),
        "demo".into(),
        "--timeout".into(),
        "1".into(),
        "--num-devices".into(),
        "6".into(),
    ])
    .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("claim cel-selected failed to allocate"),
        "{stderr}"
    );
    assert!(stdout.contains("PROBLEM: claim cel-selected"), "{stdout}");
    assert_nothing_left(&api);
}

/// With `--allocate scheduler` (the default) and no scheduler, the wait is bounded and the
/// error names each claim and why its pods are not scheduled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_scheduler_the_demo_times_out_clearly() {
    let (api, _kubeconfig) = api_server().await;
    let mut options = DemoOptions::new(
        "demo.gpu.example.com",
        cluster(&api, AllocationMode::Scheduler),
    );
    options.timeout = Duration::from_secs(1);
    options.print = false;
    let started = std::time::Instant::now();
    let error = mock_gpu::demo::run(options).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(20));
    let failed = error
        .downcast_ref::<DemoFailed>()
        .unwrap_or_else(|| panic!("{error:#}"));
    assert_eq!(failed.report.allocated, 0);
    assert_eq!(failed.report.failed.len(), 4);
    assert!(
        failed
            .report
            .failed
            .iter()
            .all(|f| f.step == Step::Allocate)
    );
    let message = error.to_string();
    assert!(
        message.contains("claim default/single-gpu was not allocated within 1s: pod pod-a: not scheduled, no PodScheduled condition"),
        "{message}"
    );
    assert!(message.contains("pod pod-c"), "{message}");
    assert_nothing_left(&api);
}

fn report(failed: Vec<ClaimFailure>, cdi_files_left: usize) -> DemoReport {
    DemoReport {
        claims: 4,
        allocated: 4,
        prepared: 4 - failed.len(),
        unprepared: 4,
        failed,
        expected_failures: [(BAD_CONFIG_CLAIM.to_owned(), bad_config_failure())].into(),
        cdi_files_left,
        allocation: AllocationMode::Scheduler,
        extra: (),
        text: String::new(),
    }
}

fn failure(claim: &str, step: Step, message: &str) -> ClaimFailure {
    ClaimFailure {
        claim: claim.into(),
        step,
        message: message.into(),
    }
}

#[test]
fn only_the_expected_failure_is_success() {
    let expected = failure(
        BAD_CONFIG_CLAIM,
        Step::Prepare,
        &format!("invalid GpuConfig: {BAD_CONFIG_ERROR} (did you mean `interval`?)"),
    );
    assert!(report(vec![expected.clone()], 0).problems().is_empty());

    // The bad config prepared.
    let problems = report(vec![], 0).problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("did not fail"), "{problems:?}");
    // It failed, but for another reason or at another step.
    let other = failure(BAD_CONFIG_CLAIM, Step::Prepare, "connection refused");
    assert_eq!(report(vec![other], 0).problems().len(), 1);
    let other = failure(BAD_CONFIG_CLAIM, Step::Allocate, BAD_CONFIG_ERROR);
    assert_eq!(report(vec![other], 0).problems().len(), 1);
    // Another claim failed at any step.
    let unprepare = failure("single-gpu", Step::Unprepare, "boom");
    let problems = report(vec![unprepare, expected.clone()], 0).problems();
    assert_eq!(problems, ["claim single-gpu failed to unprepare: boom"]);
    // CDI specs left.
    let problems = report(vec![expected], 2).problems();
    assert_eq!(problems, ["2 CDI spec file(s) left after unprepare"]);
}
