//! `mock-gpu-demo`: the driver end to end, against an embedded cluster or a real one.
//!
//! The test kit's demo runner ([`dra_sdk_testing::demo`]) does the work: it starts the plugin
//! on temporary kubelet directories, publishes the mock GPUs, creates a DeviceClass, the claims
//! and the Pods that use them the way a user would, has the claims allocated from the published
//! ResourceSlices, prepares them through a simulated kubelet over the plugin's real sockets,
//! shows the CDI edits each container would get, unprepares them, deletes everything it created
//! and returns a [`DemoReport`] of what happened (also printed). This module brings the mock
//! GPU driver's part: the plugin, the DeviceClass, four claims and their Pods, and the summary.
//!
//! Who allocates ([`AllocationMode`]): on a real cluster ([`Target::Cluster`], the binary's
//! `--kubeconfig`) by default the cluster's own kube-scheduler, for Pods that select the demo's
//! node; in the embedded cluster ([`Target::Embedded`]) and with [`AllocationMode::Demo`] the
//! demo itself, with the SDK's scheduler-like allocator, for Pods it binds to the node.
//!
//! With a real cluster the plugin publishes for a real node under a driver name of its own, so
//! it never competes with a deployed driver.
//!
//! The demo succeeds when every claim but `bad-config` is allocated, prepared and unprepared,
//! `bad-config` fails to prepare with the expected strict-decoding error, and no CDI spec file
//! is left; otherwise [`run`] returns a [`DemoFailed`] error, after cleaning up.

use std::time::Duration;

use anyhow::Result;
use dra_sdk::plugin::KubeletPlugin;
use dra_sdk_testing::cluster::{NewClaim, driver_device_class};
use dra_sdk_testing::demo::{
    self, DemoDriver, DemoError, DemoPod, ExpectedFailure, Out, RunOptions, Stage, Workload,
};
pub use dra_sdk_testing::demo::{AllocationMode, ClaimFailure, DEFAULT_TIMEOUT, Step, Target};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use serde_json::{Value, json};

use crate::MockGpuDriver;

/// What happened; the driver adds nothing to the runner's report.
pub type DemoReport = demo::DemoReport<()>;
/// The error [`run`] returns when the demo ran to the end but did not go as it must; it holds
/// the report (`anyhow::Error::downcast_ref::<DemoFailed>()`).
pub type DemoFailed = demo::DemoFailed<()>;

/// The claim that must fail, and only at prepare.
pub const BAD_CONFIG_CLAIM: &str = "bad-config";
/// The error `bad-config` must fail with.
pub const BAD_CONFIG_ERROR: &str = "unknown field `sharing.timeSlicingConfig.intervall`";

/// What the demo runs.
pub struct DemoOptions {
    /// DRA driver name; also the DeviceClass's name.
    pub driver_name: String,
    /// Number of mock GPUs; the claims need at least 8 (`cel-selected` asks for indexes 6
    /// and 7).
    pub num_devices: u32,
    /// Where it runs.
    pub target: Target,
    /// Bound on each wait for the cluster: for the scheduler to allocate a claim, for the
    /// Pods to go after their deletion (then they are force-deleted), for the claims to go.
    pub timeout: Duration,
    /// Print the report on stdout as it is written.
    pub print: bool,
}

impl DemoOptions {
    /// 8 GPUs, [`DEFAULT_TIMEOUT`], printing.
    pub fn new(driver_name: impl Into<String>, target: Target) -> Self {
        Self {
            driver_name: driver_name.into(),
            num_devices: 8,
            target,
            timeout: DEFAULT_TIMEOUT,
            print: true,
        }
    }
}

/// How `bad-config` must fail.
pub fn bad_config_failure() -> ExpectedFailure {
    ExpectedFailure {
        step: Step::Prepare,
        error: BAD_CONFIG_ERROR.into(),
        because: "its config has a misspelled field".into(),
    }
}

/// Runs the demo and returns what happened; the report is also printed when
/// [`DemoOptions::print`] is set.
///
/// Returns an error, after cleaning up, when a step could not be carried out (API server,
/// plugin or kubelet errors, clean-up failures: a [`DemoError`]) or when the outcome is not the
/// expected one: then the error is a [`DemoFailed`] holding the report.
pub async fn run(options: DemoOptions) -> Result<DemoReport> {
    let mut demo = MockGpuDemo {
        driver_name: options.driver_name,
        num_devices: options.num_devices,
    };
    let options = RunOptions {
        target: options.target,
        timeout: options.timeout,
        print: options.print,
    };
    Ok(demo::run(&mut demo, options).await?.check()?)
}

/// The mock GPU driver's part of the demo.
struct MockGpuDemo {
    driver_name: String,
    num_devices: u32,
}

impl DemoDriver for MockGpuDemo {
    type Extra = ();

    fn label(&self) -> &str {
        "mock-gpu-demo"
    }

    fn driver_name(&self) -> &str {
        &self.driver_name
    }

    fn device_classes(&self) -> Vec<DeviceClass> {
        vec![driver_device_class(&self.driver_name, &self.driver_name)]
    }

    async fn start_plugin(
        &mut self,
        stage: &Stage,
        _out: &mut Out,
    ) -> Result<KubeletPlugin, DemoError> {
        let driver = MockGpuDriver::new(&self.driver_name, stage.node(), self.num_devices);
        let resources = driver.resources();
        stage
            .plugin(driver, &self.driver_name)
            .resources(resources)
            .start()
            .await
            .map_err(|source| DemoError::Plugin {
                action: "starting the plugin",
                source,
            })
    }

    fn plan(
        &mut self,
        _stage: &Stage,
        slices: &[ResourceSlice],
        out: &mut Out,
        _extra: &mut (),
    ) -> Vec<Workload> {
        let devices: usize = slices
            .iter()
            .map(|slice| slice.spec.devices.as_ref().map_or(0, Vec::len))
            .sum();
        out.line(format!(
            "published {devices} GPUs in {} ResourceSlice(s)",
            slices.len()
        ));
        workloads(&self.driver_name)
    }

    fn summary(&self, report: &DemoReport) -> String {
        let failures: Vec<String> = report
            .failed
            .iter()
            .map(|f| {
                let expected = if report.is_expected(f) {
                    ", as expected"
                } else {
                    ""
                };
                format!("{} at {}{expected}", f.claim, f.step)
            })
            .collect();
        let failures = if failures.is_empty() {
            String::new()
        } else {
            format!(" ({})", failures.join("; "))
        };
        format!(
            "\nsummary: {} of {} claims allocated by {}, {} prepared, {} failed{failures}, \
             {} unprepared, {} CDI spec files left",
            report.allocated,
            report.claims,
            report.allocation.who(),
            report.prepared,
            report.failed.len(),
            report.unprepared,
            report.cdi_files_left,
        )
    }
}

/// A claim for `count` GPUs of the class `driver`, with a CEL selector when given.
fn gpus(driver: &str, count: u32, selector: Option<&str>) -> NewClaim {
    let claim = NewClaim::new("", "").request("gpu", driver).count(count);
    match selector {
        Some(expression) => claim.selector(expression),
        None => claim,
    }
}

/// `claim` with a `GpuConfig` of this sharing.
fn shared(claim: NewClaim, driver: &str, sharing: Value) -> NewClaim {
    let parameters = json!({
        "apiVersion": "gpu.resource.example.com/v1alpha1",
        "kind": "GpuConfig",
        "sharing": sharing,
    });
    claim.config(&["gpu"], driver, parameters)
}

/// The demo's claims, each with the Pods using it.
fn workloads(driver: &str) -> Vec<Workload> {
    let cel = format!(
        "device.attributes[\"{driver}\"].index >= 6 && \
         device.capacity[\"{driver}\"].memory.compareTo(quantity(\"40Gi\")) >= 0"
    );
    let time_slicing = |interval: &str| json!({ "strategy": "TimeSlicing", "timeSlicingConfig": { interval: "Long" } });
    vec![
        Workload::new(
            "single-gpu",
            "one GPU, default config",
            gpus(driver, 1, None),
            vec![DemoPod::new("pod-a", &["main"])],
        ),
        Workload::new(
            "shared-gpu",
            "one GPU shared by two pods, time-slicing Long",
            shared(gpus(driver, 1, None), driver, time_slicing("interval")),
            vec![
                DemoPod::new("pod-b", &["main"]),
                DemoPod::new("pod-c", &["main"]),
            ],
        ),
        Workload::new(
            "cel-selected",
            "two GPUs with index >= 6, selected by CEL, space-partitioned in 4",
            shared(
                gpus(driver, 2, Some(&cel)),
                driver,
                json!({
                    "strategy": "SpacePartitioning", "spacePartitioningConfig": { "partitionCount": 4 }
                }),
            ),
            vec![DemoPod::new("pod-d", &["trainer", "sidecar"])],
        ),
        Workload::new(
            BAD_CONFIG_CLAIM,
            "one GPU with a misspelled config field (must fail alone)",
            shared(gpus(driver, 1, None), driver, time_slicing("intervall")),
            vec![DemoPod::new("pod-e", &["main"])],
        )
        .must_fail(bad_config_failure()),
    ]
}
