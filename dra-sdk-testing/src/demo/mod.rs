//! A driver's demo, end to end, against the embedded cluster or a real one: the runner behind
//! `mock-gpu-demo` and the NVIDIA driver's `gpu-demo`.
//!
//! [`run`] starts the driver's plugin ([`DemoDriver::start_plugin`]) on a [`Stage`] (the
//! embedded cluster's fake API server and node, or a real API server's node with temporary
//! kubelet directories), registers it with a simulated kubelet over its real sockets, waits for
//! its ResourceSlices, creates the driver's DeviceClasses unless they exist, and then, one
//! [`Workload`] at a time as the driver plans them ([`DemoDriver::plan`]), the claim (or its
//! template) and the Pods that use it, and has the claim allocated and reserved for them:
//!
//! - with [`AllocationMode::Demo`] (always in the embedded cluster, which has no scheduler nor
//!   controllers) by the demo: the Pods are bound to the node (`spec.nodeName`), the demo makes
//!   a template's claim as the resourceclaim controller would, and the SDK's scheduler-like
//!   allocator (CEL selectors included) allocates;
//! - with [`AllocationMode::Scheduler`] by the cluster's kube-scheduler: the Pods select the
//!   node by its `kubernetes.io/hostname` label, and the demo waits (bounded by
//!   [`RunOptions::timeout`]) until the claim is allocated and reserved for all its Pods.
//!   Because the Pods exist, the resourceclaim controller keeps the reservations, and so the
//!   allocations, while the demo prepares.
//!
//! One at a time, so that claims take devices in the order the driver planned. Then it
//! prepares each claim once per Pod through the simulated kubelet, as the kubelet does,
//! printing what each container gets (devices, CDI names, environment and device nodes read
//! back from the CDI spec files), unprepares them, counts the CDI spec files left, and deletes
//! everything it created, whatever happened: Pods first (waiting for the node's kubelet to
//! confirm, forcing after the timeout), claims (dropping the delete-protection finalizer of
//! one still there after a few seconds: no controller deallocates it), templates, the
//! DeviceClasses it created and, on a real cluster, the plugin's ResourceSlices. Everything it
//! creates is labelled `app.kubernetes.io/managed-by=<DemoDriver::label>`, and a run first
//! removes the leftovers of an interrupted one.
//!
//! The node's real kubelet, if any, sees the Pods too; it does not know the demo's plugin (which
//! registers with the simulated kubelet only), so it reports `FailedPrepareDynamicResources`
//! events for them and never starts their containers. That is expected.
//!
//! A claim failing is not an error of [`run`]: the [`DemoReport`] records it
//! ([`ClaimFailure`]), and [`DemoReport::problems`] says whether the demo went as it must
//! (claims meant to fail, [`ExpectedFailure`], must fail so, and alone).

mod cdi;
mod cleanup;
mod report;
mod target;
mod workload;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use dra_sdk::claim::ClaimRef;
use dra_sdk::plugin::{KubeletPlugin, PluginError};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::Api;
use kube::api::PostParams;

pub use self::cdi::{ContainerCdi, container_cdi};
pub use self::report::{
    ClaimFailure, DemoFailed, DemoReport, ExpectedFailure, Out, ReportExtra, Step,
};
pub use self::target::{AllocationMode, DEFAULT_NAMESPACE, DEMO_LABEL_KEY, Stage, Target};
pub use self::workload::{DemoPod, Workload};
use crate::cluster::{ClusterError, claim_ref};
use crate::kubelet::{
    KubeletDevice, KubeletError, KubeletSimulator, KubeletVersion, RegisteredPlugin,
};

/// Default of [`RunOptions::timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the plugin gets to write its ResourceSlices.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the demo looks again while it waits for the cluster.
const POLL: Duration = Duration::from_millis(200);
/// A claim's failure when the plugin's answer leaves it out.
const NO_ANSWER: &str = "no answer for the claim";

/// Why a demo could not run to the end (a claim failing is not one: see [`DemoReport`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DemoError {
    /// The kubeconfig could not be read or used.
    #[error("--kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        /// Its path.
        path: PathBuf,
        /// Why.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The driver's plugin could not be set up.
    #[error("setting up {what}: {message}")]
    Setup {
        /// What, e.g. `the NVIDIA plugin`.
        what: String,
        /// Why.
        message: String,
    },
    /// The embedded cluster could not start (its error says so).
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The cluster has no node to publish for (or not the one named).
    #[error("{0}")]
    NoNode(String),
    /// An API request failed.
    #[error("{action}: {source}")]
    Api {
        /// What the demo was doing.
        action: String,
        /// The client error.
        source: kube::Error,
    },
    /// A file or directory could not be read or made.
    #[error("{action}: {source}")]
    Io {
        /// What the demo was doing.
        action: String,
        /// The error.
        source: std::io::Error,
    },
    /// A CDI spec file the plugin wrote could not be read.
    #[error("reading {}: {source}", path.display())]
    Cdi {
        /// The file.
        path: PathBuf,
        /// Why.
        source: dra_sdk::cdi::CdiError,
    },
    /// An object of the demo could not be built.
    #[error("building {what}: {source}")]
    Object {
        /// Which object.
        what: String,
        /// Why.
        source: serde_json::Error,
    },
    /// The API server returned an object without a field every stored object has.
    #[error("{object} as returned by the API server has no {field}")]
    Incomplete {
        /// The object.
        object: String,
        /// The missing field.
        field: &'static str,
    },
    /// The plugin could not start or stop.
    #[error("{action}: {source}")]
    Plugin {
        /// What the demo was doing.
        action: &'static str,
        /// The plugin's error.
        source: PluginError,
    },
    /// The plugin did not publish in time.
    #[error("the plugin did not publish its ResourceSlices within {0:?}")]
    PublishTimeout(Duration),
    /// The simulated kubelet could not call the plugin.
    #[error("{action}: {source}")]
    Kubelet {
        /// What the demo was doing.
        action: &'static str,
        /// The kubelet's error.
        source: KubeletError,
    },
    /// Objects the demo deleted are still there.
    #[error("{0}")]
    Stuck(String),
    /// A step failed while the demo did `context`.
    #[error("{context}: {source}")]
    Context {
        /// What the demo was doing, e.g. `cleaning up`.
        context: &'static str,
        /// What failed.
        source: Box<DemoError>,
    },
}

impl DemoError {
    /// The [`Api`](Self::Api) error of `action`, for `map_err`.
    fn api(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let action = action.into();
        move |source| Self::Api { action, source }
    }

    /// This error, as it happened while doing `context`.
    fn context(self, context: &'static str) -> Self {
        Self::Context {
            context,
            source: Box::new(self),
        }
    }
}

/// What a driver's demo brings to [`run`]: its plugin, its DeviceClasses, its workloads and its
/// own checks.
pub trait DemoDriver {
    /// The driver's own part of the report.
    type Extra: ReportExtra;

    /// The value of [`DEMO_LABEL_KEY`] on everything the demo creates: the demo's name, so that
    /// a run finds (only) the leftovers of its own interrupted runs.
    fn label(&self) -> &str;

    /// The DRA driver name the plugin publishes under.
    fn driver_name(&self) -> &str;

    /// The DeviceClasses the workloads use. The demo creates those that do not exist
    /// (labelled as its own) and deletes them afterwards; existing ones it uses and keeps.
    fn device_classes(&self) -> Vec<DeviceClass>;

    /// Whether workloads come from ResourceClaimTemplates: only then does the demo delete
    /// labelled templates, which needs the permission to.
    fn uses_templates(&self) -> bool {
        false
    }

    /// Starts the plugin on the stage (see [`Stage::plugin`]); may write to the report.
    fn start_plugin(
        &mut self,
        stage: &Stage,
        out: &mut Out,
    ) -> impl Future<Output = Result<KubeletPlugin, DemoError>> + Send;

    /// The workloads, in the order their claims are to be allocated, planned from what the
    /// plugin published on the stage's node; may write to the report and fill its extra part.
    fn plan(
        &mut self,
        stage: &Stage,
        slices: &[ResourceSlice],
        out: &mut Out,
        extra: &mut Self::Extra,
    ) -> Vec<Workload>;

    /// What to print after a prepared device's name in a container (its UUID, say); may record
    /// what the container saw in the extra part. Nothing by default.
    fn device_note(
        &self,
        workload: &Workload,
        container: &str,
        device: &KubeletDevice,
        extra: &mut Self::Extra,
    ) -> String {
        let _ = (workload, container, device, extra);
        String::new()
    }

    /// The summary line of the report, written once everything is cleaned up.
    fn summary(&self, report: &DemoReport<Self::Extra>) -> String;
}

/// Where and how [`run`] runs.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Where it runs.
    pub target: Target,
    /// Bound on each wait for the cluster: for the scheduler to allocate a claim, for the Pods
    /// to go after their deletion (then they are force-deleted), for the claims to go.
    pub timeout: Duration,
    /// Print the report on stdout as it is written.
    pub print: bool,
}

impl RunOptions {
    /// [`DEFAULT_TIMEOUT`], printing.
    pub fn new(target: Target) -> Self {
        Self {
            target,
            timeout: DEFAULT_TIMEOUT,
            print: true,
        }
    }
}

/// Runs `driver`'s demo and returns what happened; the report is also printed when
/// [`RunOptions::print`] is set. Returns an error, after cleaning up, when a step could not be
/// carried out (API server, plugin or kubelet errors, clean-up failures); whether the demo
/// went as it must is [`DemoReport::problems`] (or [`DemoReport::check`]).
pub async fn run<D: DemoDriver>(
    driver: &mut D,
    options: RunOptions,
) -> Result<DemoReport<D::Extra>, DemoError> {
    let RunOptions {
        target,
        timeout,
        print,
    } = options;
    let stage = Stage::new(target, timeout, driver.label()).await?;
    let mut out = Out::new(print);
    let classes: Vec<String> = driver
        .device_classes()
        .iter()
        .filter_map(|class| class.metadata.name.clone())
        .collect();
    // Leftovers of an interrupted run would make the creates below fail. (Its
    // ResourceSlices, if any, the plugin takes over.)
    let leftovers = "removing the leftovers of an earlier run";
    let removed = cleanup::remove_workloads(&stage, driver.uses_templates())
        .await
        .map_err(|error| error.context(leftovers))?;
    let classes_removed = cleanup::remove_device_classes(&stage, &classes)
        .await
        .map_err(|error| error.context(leftovers))?;
    if removed != cleanup::Removed::default() || classes_removed > 0 {
        out.line(format!(
            "removed the leftovers of an earlier run: {} pod(s), {} claim(s), {} template(s), \
             {classes_removed} DeviceClass(es)",
            removed.pods, removed.claims, removed.templates
        ));
    }

    let plugin = driver.start_plugin(&stage, &mut out).await?;
    let outcome = drive(driver, &stage, &plugin, &mut out).await;

    // Clean up whatever happened: a failed step must not leave objects in a real cluster, and
    // a failed clean-up step must not keep the others from running.
    let mut errors = Vec::new();
    if let Err(error) = cleanup::remove_workloads(&stage, driver.uses_templates()).await {
        errors.push(error);
    }
    if let Err(error) = cleanup::remove_device_classes(&stage, &classes).await {
        errors.push(error);
    }
    if let Err(source) = plugin.shutdown().await {
        errors.push(DemoError::Plugin {
            action: "stopping the plugin",
            source,
        });
    }
    if !stage.is_embedded()
        && let Err(error) = cleanup::remove_slices(&stage, driver.driver_name()).await
    {
        errors.push(error);
    }
    let mut errors = errors.into_iter();
    let cleanup = errors.next().map_or(Ok(()), Err);
    for error in errors {
        tracing::error!("cleaning up: {error}");
    }
    if let (Err(_), Err(error)) = (&outcome, &cleanup) {
        // The step's error is the one returned; the cleanup's must not vanish with it.
        tracing::error!("cleaning up after the failed demo: {error}");
    }
    let mut report = outcome?;
    cleanup.map_err(|error| error.context("cleaning up"))?;

    out.line(driver.summary(&report));
    let problems = report.problems();
    if problems.is_empty() {
        out.line("demo succeeded; everything it created is deleted");
    }
    for problem in &problems {
        out.line(format!("PROBLEM: {problem}"));
    }
    report.text = out.into_text();
    Ok(report)
}

/// A claim allocated and reserved for its Pods, with its workload.
type Allocated<'w> = (&'w Workload, ClaimRef);

/// Everything between starting the plugin and cleaning up; writes the report to `out`.
async fn drive<D: DemoDriver>(
    driver: &mut D,
    stage: &Stage,
    plugin: &KubeletPlugin,
    out: &mut Out,
) -> Result<DemoReport<D::Extra>, DemoError> {
    let driver_name = driver.driver_name().to_owned();
    let kubelet = KubeletSimulator::new(KubeletVersion::V1_36)
        .register(&plugin.socket_paths().registration)
        .await
        .map_err(|source| DemoError::Kubelet {
            action: "registering with the simulated kubelet",
            source,
        })?;
    out.line(format!(
        "plugin {driver_name} on node {} of {} registered with a simulated kubelet 1.36 (API {:?})",
        stage.node(),
        stage.location(),
        kubelet.api
    ));
    if tokio::time::timeout(PUBLISH_TIMEOUT, plugin.published())
        .await
        .is_err()
    {
        return Err(DemoError::PublishTimeout(PUBLISH_TIMEOUT));
    }
    let slices = Api::<ResourceSlice>::all(stage.client().clone())
        .list(&cleanup::slice_selector(&driver_name, stage.node()))
        .await
        .map_err(DemoError::api("listing ResourceSlices"))?
        .items;
    let mut extra = D::Extra::default();
    let workloads = driver.plan(stage, &slices, out, &mut extra);

    create_device_classes(stage, driver.device_classes(), out).await?;
    out.line(format!(
        "\ncreating {} claims and {} pods in namespace {}, one claim at a time; allocating with {}",
        workloads.len(),
        workloads.iter().map(|w| w.pods.len()).sum::<usize>(),
        stage.namespace(),
        stage.allocation().who()
    ));
    let mut failed = Vec::new();
    let mut allocated: Vec<Allocated<'_>> = Vec::new();
    for workload in &workloads {
        let outcome = workload::create_and_allocate(stage, workload).await?;
        let claim = match outcome {
            Ok(claim) => claim,
            Err(message) => {
                out.line(format!(
                    "claim {} ({}): allocation FAILED: {message}",
                    workload.claim, workload.what
                ));
                record(&mut failed, workload.failure(Step::Allocate, message));
                continue;
            }
        };
        let pods: Vec<&str> = workload.pods.iter().map(|p| p.name.as_str()).collect();
        out.line(format!(
            "claim {} ({}) allocated {}, reserved for {}",
            workload.claim,
            workload.what,
            workload::allocated_devices(&claim).join(", "),
            pods.join(", ")
        ));
        let reference = claim_ref(&claim).map_err(|error| match error {
            ClusterError::Incomplete { object, field } => DemoError::Incomplete { object, field },
            other => DemoError::Cluster(other),
        })?;
        allocated.push((workload, reference));
    }

    let prepared = prepare_all(
        driver,
        stage,
        &kubelet,
        &allocated,
        &mut failed,
        out,
        &mut extra,
    )
    .await?;
    let unprepared = unprepare_all(&kubelet, &allocated, &mut failed, out).await?;
    let cdi_files_left = std::fs::read_dir(stage.cdi_root())
        .map_err(|source| DemoError::Io {
            action: "reading the CDI directory".into(),
            source,
        })?
        .count();
    // Keep the workloads' order.
    failed.sort_by_key(|f: &ClaimFailure| workloads.iter().position(|w| w.claim == f.claim));
    Ok(DemoReport {
        claims: workloads.len(),
        allocated: allocated.len(),
        prepared,
        unprepared,
        failed,
        expected_failures: workloads
            .iter()
            .filter_map(|w| Some((w.claim.clone(), w.expected_failure.clone()?)))
            .collect(),
        cdi_files_left,
        allocation: stage.allocation(),
        extra,
        text: String::new(),
    })
}

/// Creates the DeviceClasses, labelled as the demo's; one that exists (from a chart, say) is
/// used as it is and left alone afterwards.
async fn create_device_classes(
    stage: &Stage,
    classes: Vec<DeviceClass>,
    out: &mut Out,
) -> Result<(), DemoError> {
    let api: Api<DeviceClass> = Api::all(stage.client().clone());
    out.line("DeviceClasses:");
    for mut class in classes {
        let name = class.metadata.name.clone().unwrap_or_default();
        class
            .metadata
            .labels
            .get_or_insert_default()
            .insert(DEMO_LABEL_KEY.to_owned(), stage.label().to_owned());
        // Read through JSON: `spec` is optional in 1.37's types only.
        let cel = serde_json::to_value(&class)
            .ok()
            .and_then(|class| {
                class["spec"]["selectors"][0]["cel"]["expression"]
                    .as_str()
                    .map(str::to_owned)
            })
            .unwrap_or_default();
        match api.create(&PostParams::default(), &class).await {
            Ok(_) => out.line(format!("  {name}: {cel}")),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                out.line(format!("  using the existing DeviceClass {name}"));
            }
            Err(error) => {
                return Err(DemoError::api(format!("creating DeviceClass {name}"))(
                    error,
                ));
            }
        }
    }
    Ok(())
}

/// Prepares every allocated claim once per Pod, as the kubelet does (a claim already prepared
/// for an earlier Pod is answered from the plugin's checkpoint), and prints what each
/// container gets; returns how many claims were prepared for all their Pods.
async fn prepare_all<D: DemoDriver>(
    driver: &D,
    stage: &Stage,
    kubelet: &RegisteredPlugin,
    allocated: &[Allocated<'_>],
    failed: &mut Vec<ClaimFailure>,
    out: &mut Out,
    extra: &mut D::Extra,
) -> Result<usize, DemoError> {
    let mut prepared = 0;
    for (workload, claim) in allocated {
        let mut all = true;
        for pod in &workload.pods {
            let answer = kubelet
                .prepare(std::slice::from_ref(claim))
                .await
                .map_err(|source| DemoError::Kubelet {
                    action: "NodePrepareResources",
                    source,
                })?;
            out.line(format!(
                "\npod {} uses claim {} ({}):",
                pod.name, workload.claim, workload.what
            ));
            let devices = match answer.get(&claim.uid) {
                Some(Ok(devices)) => devices,
                outcome => {
                    let message = match outcome {
                        Some(Err(error)) => error.clone(),
                        _ => NO_ANSWER.to_owned(),
                    };
                    let failure = workload.failure(Step::Prepare, message);
                    let expected = (workload.expected_failure.as_ref())
                        .is_some_and(|expected| expected.matches(&failure));
                    let note = if expected { ", as expected" } else { "" };
                    out.line(format!("  prepare FAILED{note}: {}", failure.message));
                    record(failed, failure);
                    all = false;
                    continue;
                }
            };
            let cdi = container_cdi(&stage.cdi_root(), devices)?;
            for container in &pod.containers {
                out.line(format!("  container {container}:"));
                for device in devices {
                    let note = driver.device_note(workload, container, device, extra);
                    out.line(format!("    device {}{note}", device.device));
                    out.line(format!("      CDI {}", device.cdi_device_ids.join(", ")));
                }
                for env in &cdi.env {
                    out.line(format!("      env {env}"));
                }
                for node in &cdi.device_nodes {
                    out.line(format!("      device node {node}"));
                }
            }
        }
        prepared += usize::from(all);
    }
    Ok(prepared)
}

/// Unprepares every allocated claim in one call; returns how many were unprepared.
async fn unprepare_all(
    kubelet: &RegisteredPlugin,
    allocated: &[Allocated<'_>],
    failed: &mut Vec<ClaimFailure>,
    out: &mut Out,
) -> Result<usize, DemoError> {
    let references: Vec<ClaimRef> = allocated.iter().map(|(_, r)| r.clone()).collect();
    let answers = if references.is_empty() {
        BTreeMap::new()
    } else {
        kubelet
            .unprepare(&references)
            .await
            .map_err(|source| DemoError::Kubelet {
                action: "NodeUnprepareResources",
                source,
            })?
    };
    let mut unprepared = 0;
    for (workload, claim) in allocated {
        match answers.get(&claim.uid) {
            Some(Ok(())) => unprepared += 1,
            outcome => {
                let message = match outcome {
                    Some(Err(error)) => error.clone(),
                    _ => NO_ANSWER.to_owned(),
                };
                out.line(format!(
                    "unprepare of claim {} FAILED: {message}",
                    workload.claim
                ));
                record(failed, workload.failure(Step::Unprepare, message));
            }
        }
    }
    out.line(format!("\nunprepared {unprepared} claims"));
    Ok(unprepared)
}

/// Records a claim's failure, unless it failed at an earlier step (or for an earlier Pod).
fn record(failed: &mut Vec<ClaimFailure>, failure: ClaimFailure) {
    if !failed.iter().any(|f| f.claim == failure.claim) {
        failed.push(failure);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(claim: &str) -> Workload {
        let spec = crate::cluster::NewClaim::new("", claim).request("gpu", "gpu.example.com");
        Workload::new(claim, "", spec, vec![DemoPod::new("p", &["main"])])
    }

    #[test]
    fn a_claim_keeps_its_first_failure() {
        let mut failed = Vec::new();
        let a = workload("a");
        record(&mut failed, a.failure(Step::Prepare, "first".into()));
        record(&mut failed, a.failure(Step::Unprepare, "second".into()));
        record(
            &mut failed,
            workload("b").failure(Step::Unprepare, "other".into()),
        );
        let seen: Vec<_> = failed.iter().map(|f| (f.claim.as_str(), f.step)).collect();
        assert_eq!(seen, [("a", Step::Prepare), ("b", Step::Unprepare)]);
        assert_eq!(failed[0].message, "first");
    }

    #[test]
    fn errors_say_what_the_demo_was_doing() {
        let error = DemoError::Stuck("pods a are still there".into()).context("cleaning up");
        assert_eq!(error.to_string(), "cleaning up: pods a are still there");
        let error = DemoError::Setup {
            what: "the NVIDIA plugin".into(),
            message: "no profile x".into(),
        };
        assert_eq!(
            error.to_string(),
            "setting up the NVIDIA plugin: no profile x"
        );
    }
}
