//! `mock-gpu-demo`: the driver end to end, against an embedded cluster or a real one.
//!
//! Starts the plugin on temporary kubelet directories, publishes the mock GPUs, creates a
//! DeviceClass, claims and the Pods that use them the way a user would, has the claims
//! allocated from the published ResourceSlices, prepares them through a simulated kubelet over
//! the plugin's real sockets, shows the CDI edits each container would get, unprepares them and
//! returns a [`DemoReport`] of what happened (also printed).
//!
//! Who allocates ([`AllocationMode`]):
//!
//! - on a real cluster ([`Target::Cluster`], the binary's `--kubeconfig`), by default the
//!   cluster's own kube-scheduler: the Pods select the demo's node by its
//!   `kubernetes.io/hostname` label, the scheduler allocates their claims from the demo's
//!   ResourceSlices and reserves them for the Pods, and the demo waits (bounded by
//!   [`DemoOptions::timeout`]) until every claim is allocated and reserved for all its Pods.
//!   Because the Pods exist, the cluster's resourceclaim controller keeps the reservations,
//!   and so the allocations, while the demo prepares;
//! - in the embedded cluster ([`Target::Embedded`], the SDK's fake API server, which has no
//!   scheduler) and with [`AllocationMode::Demo`], the demo itself: the Pods are bound to the
//!   node directly (`spec.nodeName`, so no scheduler takes them) and the SDK's scheduler-like
//!   allocator (CEL selectors included) allocates each claim and reserves it for the real Pods.
//!
//! The node's real kubelet, if any, sees the Pods too; it does not know the demo's driver (the
//! plugin registers with the simulated kubelet only), so it reports `FailedPrepareDynamicResources`
//! events for them and never starts their containers. That is expected.
//!
//! Everything goes through the API server; with a real cluster the plugin publishes for a real
//! node under a driver name of its own, so it never competes with a deployed driver, and the
//! demo deletes every object it created before it returns (Pods first, then claims, the
//! DeviceClass and the ResourceSlices), leftovers of an interrupted earlier run included.
//!
//! The demo succeeds when every claim but `bad-config` is allocated, prepared and unprepared,
//! `bad-config` fails to prepare with the expected strict-decoding error, and no CDI spec file
//! is left; otherwise [`run`] returns a [`DemoFailed`] error, after cleaning up.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use dra_sdk::claim::ClaimRef;
use dra_sdk::plugin::KubeletPlugin;
use dra_sdk_allocator::allocate_claim;
use dra_sdk_testing::cluster::{NODE_NAME, TestCluster};
use dra_sdk_testing::e2e::node_ready;
use dra_sdk_testing::kubelet::{KubeletDevice, KubeletSimulator, KubeletVersion, RegisteredPlugin};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};

use crate::MockGpuDriver;

/// One claim of the demo: what it asks for, who uses it.
struct DemoClaim {
    name: &'static str,
    what: &'static str,
    /// The claim's `spec.devices`.
    devices: serde_json::Value,
    /// Pods (and the containers in them) that use the claim.
    pods: &'static [(&'static str, &'static [&'static str])],
}

/// Label on every object the demo creates in a real cluster, to find leftovers of an
/// interrupted run.
const DEMO_LABEL: (&str, &str) = ("app.kubernetes.io/managed-by", "mock-gpu-demo");
/// The finalizer the scheduler (or the SDK's allocator) adds when it allocates.
const DELETE_PROTECTION_FINALIZER: &str = "resource.kubernetes.io/delete-protection";
/// How long the plugin gets to write its ResourceSlices.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the demo looks again while it waits for the cluster.
const POLL: Duration = Duration::from_millis(200);
/// A deleted claim still there this long after its Pods are gone is stuck: no resourceclaim
/// controller deallocates it and drops its finalizer, so the demo does.
const CLAIM_STUCK_AFTER: Duration = Duration::from_secs(5);
/// How long force-deleted Pods get to disappear.
const FORCED_POD_DELETION: Duration = Duration::from_secs(15);
/// The image of the demo's Pods; their containers never start (see the module docs).
const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
/// Name of the Pods' claim reference, used by their containers.
const POD_CLAIM_NAME: &str = "gpu";
/// The claim that must fail, and only at prepare.
pub const BAD_CONFIG_CLAIM: &str = "bad-config";
/// The error `bad-config` must fail with.
pub const BAD_CONFIG_ERROR: &str = "unknown field `sharing.timeSlicingConfig.intervall`";
/// Default of [`DemoOptions::timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Who allocates the demo's claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AllocationMode {
    /// The cluster's kube-scheduler, for the demo's Pods (which select the demo's node).
    Scheduler,
    /// The demo, with the SDK's scheduler-like allocator, for Pods it binds to the node itself:
    /// for API servers without a scheduler.
    Demo,
}

impl AllocationMode {
    fn who(self) -> &'static str {
        match self {
            Self::Scheduler => "the cluster's scheduler",
            Self::Demo => "the demo's allocator",
        }
    }
}

/// Where the demo runs.
pub enum Target {
    /// The SDK's embedded fake API server, with a Node of its own; the demo allocates.
    Embedded,
    /// A real cluster.
    Cluster {
        /// A client of its API server, allowed to manage DeviceClasses, ResourceClaims (and
        /// their status), ResourceSlices and Pods, and to list Nodes and Events.
        client: kube::Client,
        /// The node the mock GPUs are published for; when `None`, the first Ready node without
        /// `NoSchedule`/`NoExecute` taints (or else the first node listed).
        node_name: Option<String>,
        /// Namespace of the demo's claims and Pods.
        namespace: String,
        /// Who allocates the claims.
        allocation: AllocationMode,
    },
}

impl Target {
    /// A real cluster: any suitable node, namespace `default`, allocated by its scheduler.
    pub fn cluster(client: kube::Client) -> Self {
        Self::Cluster {
            client,
            node_name: None,
            namespace: "default".into(),
            allocation: AllocationMode::Scheduler,
        }
    }
}

/// What the demo runs.
pub struct DemoOptions {
    /// DRA driver name; also the DeviceClass's name.
    pub driver_name: String,
    /// Number of mock GPUs; the claims need at least 8 (`cel-selected` asks for indexes 6
    /// and 7).
    pub num_devices: u32,
    /// Where it runs.
    pub target: Target,
    /// Bound on each wait for the cluster: for the scheduler to allocate the claims, for the
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

/// The step a claim failed at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Allocation (and reservation for its Pods).
    Allocate,
    /// `NodePrepareResources` through the simulated kubelet.
    Prepare,
    /// `NodeUnprepareResources` through the simulated kubelet.
    Unprepare,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Allocate => "allocate",
            Self::Prepare => "prepare",
            Self::Unprepare => "unprepare",
        })
    }
}

/// A claim that failed, at the first step it failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimFailure {
    /// The claim's name.
    pub claim: String,
    /// Where it failed.
    pub step: Step,
    /// Why.
    pub message: String,
}

/// What happened, counted from what the API server and the plugin answered.
#[derive(Clone, Debug)]
pub struct DemoReport {
    /// Claims created.
    pub claims: usize,
    /// Claims allocated and reserved for all their Pods.
    pub allocated: usize,
    /// Claims prepared for all their Pods.
    pub prepared: usize,
    /// Claims unprepared without error.
    pub unprepared: usize,
    /// Claims that failed, each at its first failed step.
    pub failed: Vec<ClaimFailure>,
    /// CDI spec files left after unprepare.
    pub cdi_files_left: usize,
    /// Who allocated.
    pub allocation: AllocationMode,
    /// The report as printed.
    pub text: String,
}

impl DemoReport {
    /// Everything that did not go as it must: empty when the demo succeeded.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for failure in &self.failed {
            if failure.claim != BAD_CONFIG_CLAIM {
                problems.push(format!(
                    "claim {} failed to {}: {}",
                    failure.claim, failure.step, failure.message
                ));
            }
        }
        match self.failed.iter().find(|f| f.claim == BAD_CONFIG_CLAIM) {
            None => problems.push(format!(
                "claim {BAD_CONFIG_CLAIM} did not fail, though its config has a misspelled field"
            )),
            Some(failure)
                if failure.step != Step::Prepare || !failure.message.contains(BAD_CONFIG_ERROR) =>
            {
                problems.push(format!(
                    "claim {BAD_CONFIG_CLAIM} failed to {} with an unexpected error (expected \
                     prepare to fail with {BAD_CONFIG_ERROR:?}): {}",
                    failure.step, failure.message
                ));
            }
            Some(_) => {}
        }
        if self.cdi_files_left > 0 {
            problems.push(format!(
                "{} CDI spec file(s) left after unprepare",
                self.cdi_files_left
            ));
        }
        problems
    }
}

/// The error [`run`] returns when the demo ran to the end but did not go as it must; it holds
/// the report (`anyhow::Error::downcast_ref::<DemoFailed>()`).
#[derive(Debug, thiserror::Error)]
#[error("the demo failed: {}", problems.join("; "))]
pub struct DemoFailed {
    /// What happened.
    pub report: DemoReport,
    /// What went wrong, as [`DemoReport::problems`] lists it.
    pub problems: Vec<String>,
}

fn gpu_request(class: &str, count: u32, selector: Option<&str>) -> serde_json::Value {
    let mut exactly = serde_json::json!({ "deviceClassName": class, "count": count });
    if let Some(expression) = selector {
        exactly["selectors"] = serde_json::json!([{ "cel": { "expression": expression } }]);
    }
    serde_json::json!({ "name": "gpu", "exactly": exactly })
}

fn gpu_config(driver: &str, sharing: serde_json::Value) -> serde_json::Value {
    serde_json::json!([{
        "requests": ["gpu"],
        "opaque": {
            "driver": driver,
            "parameters": {
                "apiVersion": "gpu.resource.example.com/v1alpha1",
                "kind": "GpuConfig",
                "sharing": sharing
            }
        }
    }])
}

fn demo_claims(driver: &str) -> Vec<DemoClaim> {
    vec![
        DemoClaim {
            name: "single-gpu",
            what: "one GPU, default config",
            devices: serde_json::json!({ "requests": [gpu_request(driver, 1, None)] }),
            pods: &[("pod-a", &["main"])],
        },
        DemoClaim {
            name: "shared-gpu",
            what: "one GPU shared by two pods, time-slicing Long",
            devices: serde_json::json!({
                "requests": [gpu_request(driver, 1, None)],
                "config": gpu_config(driver, serde_json::json!({
                    "strategy": "TimeSlicing", "timeSlicingConfig": { "interval": "Long" }
                })),
            }),
            pods: &[("pod-b", &["main"]), ("pod-c", &["main"])],
        },
        DemoClaim {
            name: "cel-selected",
            what: "two GPUs with index >= 6, selected by CEL, space-partitioned in 4",
            devices: serde_json::json!({
                "requests": [gpu_request(driver, 2, Some(&format!(
                    "device.attributes[\"{driver}\"].index >= 6 && \
                     device.capacity[\"{driver}\"].memory.compareTo(quantity(\"40Gi\")) >= 0"
                )))],
                "config": gpu_config(driver, serde_json::json!({
                    "strategy": "SpacePartitioning", "spacePartitioningConfig": { "partitionCount": 4 }
                })),
            }),
            pods: &[("pod-d", &["trainer", "sidecar"])],
        },
        DemoClaim {
            name: BAD_CONFIG_CLAIM,
            what: "one GPU with a misspelled config field (must fail alone)",
            devices: serde_json::json!({
                "requests": [gpu_request(driver, 1, None)],
                "config": gpu_config(driver, serde_json::json!({
                    "strategy": "TimeSlicing", "timeSlicingConfig": { "intervall": "Long" }
                })),
            }),
            pods: &[("pod-e", &["main"])],
        },
    ]
}

/// The report, printed line by line as it is written when `print` is set.
struct Out {
    text: String,
    print: bool,
}

impl std::fmt::Write for Out {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.text.push_str(s);
        if self.print {
            use std::io::Write as _;
            // A closed stdout must not fail (or panic) the demo.
            let mut stdout = std::io::stdout().lock();
            let _ = stdout.write_all(s.as_bytes());
            let _ = stdout.flush();
        }
        Ok(())
    }
}

/// The API server, node and kubelet directories the demo runs on.
struct Stage {
    client: kube::Client,
    node: String,
    /// The node's `kubernetes.io/hostname` label (its name when it has none).
    hostname: String,
    namespace: String,
    allocation: AllocationMode,
    timeout: Duration,
    /// How long a deleted claim may keep its finalizer before the demo removes it.
    stuck_after: Duration,
    /// Temporary kubelet directories: `registry`, `plugins`, `cdi`.
    dir: tempfile::TempDir,
    /// The embedded API server, kept alive for the demo; `None` on a real cluster.
    embedded: Option<TestCluster>,
}

impl Stage {
    async fn new(target: Target, timeout: Duration) -> Result<Self> {
        let (client, (node, hostname), namespace, allocation, embedded) = match target {
            Target::Embedded => {
                let cluster = TestCluster::start()
                    .await
                    .context("starting the embedded cluster")?;
                let client = cluster.client();
                (
                    client,
                    (NODE_NAME.to_owned(), NODE_NAME.to_owned()),
                    "default".to_owned(),
                    AllocationMode::Demo,
                    Some(cluster),
                )
            }
            Target::Cluster {
                client,
                node_name,
                namespace,
                allocation,
            } => {
                let node = pick_node(&client, node_name.as_deref()).await?;
                (client, node, namespace, allocation, None)
            }
        };
        // Nobody but the demo drops the finalizer in the embedded cluster.
        let stuck_after = if embedded.is_some() {
            Duration::ZERO
        } else {
            CLAIM_STUCK_AFTER.min(timeout)
        };
        // Short paths keep the socket names far from the 108-byte limit.
        let dir = tempfile::Builder::new().prefix("dra").tempdir()?;
        for sub in ["registry", "plugins", "cdi"] {
            std::fs::create_dir_all(dir.path().join(sub))?;
        }
        Ok(Self {
            client,
            node,
            hostname,
            namespace,
            allocation,
            timeout,
            stuck_after,
            dir,
            embedded,
        })
    }

    fn cdi_root(&self) -> PathBuf {
        self.dir.path().join("cdi")
    }

    fn location(&self) -> &'static str {
        if self.embedded.is_some() {
            "the embedded cluster"
        } else {
            "the cluster"
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn claims(&self) -> Api<ResourceClaim> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }
}

/// `(name, kubernetes.io/hostname label)` of the named node, or of the first Ready node
/// without `NoSchedule`/`NoExecute` taints (the first node listed when none is).
async fn pick_node(client: &kube::Client, name: Option<&str>) -> Result<(String, String)> {
    let nodes: Api<Node> = Api::all(client.clone());
    let hostname = |node: &Node, name: &str| {
        node.metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get("kubernetes.io/hostname"))
            .cloned()
            .unwrap_or_else(|| name.to_owned())
    };
    if let Some(name) = name {
        let node = nodes
            .get_opt(name)
            .await
            .with_context(|| format!("reading Node {name}"))?
            .with_context(|| format!("the cluster has no Node {name}"))?;
        return Ok((name.to_owned(), hostname(&node, name)));
    }
    let listed = nodes
        .list(&ListParams::default())
        .await
        .context("listing Nodes to pick one (or pass --node-name)")?;
    let usable = |node: &Node| {
        let ready = node_ready(node);
        let spec = node.spec.as_ref();
        let cordoned = spec.and_then(|spec| spec.unschedulable).unwrap_or(false);
        let tainted = spec
            .and_then(|spec| spec.taints.as_ref())
            .is_some_and(|taints| {
                taints
                    .iter()
                    .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
            });
        ready && !cordoned && !tainted
    };
    let node = listed
        .items
        .iter()
        .find(|node| usable(node))
        .or_else(|| listed.items.first())
        .context("the cluster has no Nodes to publish the mock GPUs for")?;
    let name = node
        .metadata
        .name
        .clone()
        .context("a Node without a name")?;
    let label = hostname(node, &name);
    Ok((name, label))
}

fn labels() -> serde_json::Value {
    serde_json::json!({ DEMO_LABEL.0: DEMO_LABEL.1 })
}

fn label_selector() -> ListParams {
    ListParams::default().labels(&format!("{}={}", DEMO_LABEL.0, DEMO_LABEL.1))
}

/// Runs the demo and returns what happened; the report is also printed when
/// [`DemoOptions::print`] is set.
///
/// Returns an error, after cleaning up, when a step could not be carried out (API server,
/// plugin or kubelet errors, clean-up failures) or when the outcome is not the expected one:
/// then the error is a [`DemoFailed`] holding the report.
pub async fn run(options: DemoOptions) -> Result<DemoReport> {
    let DemoOptions {
        driver_name,
        num_devices,
        target,
        timeout,
        print,
    } = options;
    let stage = Stage::new(target, timeout).await?;
    let client = stage.client.clone();
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let mut out = Out {
        text: String::new(),
        print,
    };
    // Leftovers of an interrupted run would make the creates below fail. (Its
    // ResourceSlices, if any, the plugin takes over.)
    let (pods, claims) = remove_workloads(&stage)
        .await
        .context("removing the leftovers of an earlier run")?;
    let class = remove_device_class(&classes, &driver_name)
        .await
        .context("removing the leftovers of an earlier run")?;
    if pods + claims + usize::from(class) > 0 {
        writeln!(
            out,
            "removed the leftovers of an earlier run: {pods} pod(s), {claims} claim(s), \
             {} DeviceClass",
            usize::from(class)
        )?;
    }

    let driver = MockGpuDriver::new(&driver_name, &stage.node, num_devices);
    let resources = driver.resources();
    let plugin = KubeletPlugin::builder(driver, &driver_name, &stage.node, client.clone())
        .registrar_dir(stage.dir.path().join("registry"))
        .plugins_dir(stage.dir.path().join("plugins"))
        .cdi_root(stage.cdi_root())
        .resources(resources)
        .start()
        .await
        .context("starting the plugin")?;
    let outcome = drive(&stage, &driver_name, &plugin, &classes, &mut out).await;

    // Clean up whatever happened: a failed step must not leave objects in a real cluster, and
    // a failed clean-up step must not keep the others from running.
    let mut cleanup_errors = Vec::new();
    if let Err(error) = remove_workloads(&stage).await {
        cleanup_errors.push(error);
    }
    if let Err(error) = remove_device_class(&classes, &driver_name).await {
        cleanup_errors.push(error);
    }
    if let Err(error) = plugin.shutdown().await {
        cleanup_errors.push(anyhow::Error::new(error).context("stopping the plugin"));
    }
    if stage.embedded.is_none()
        && let Err(error) = remove_slices(&client, &driver_name, &stage.node).await
    {
        cleanup_errors.push(error);
    }
    let mut cleanup_errors = cleanup_errors.into_iter();
    let cleanup = cleanup_errors.next().map_or(Ok(()), Err);
    for error in cleanup_errors {
        tracing::error!("cleaning up: {error:#}");
    }
    if let (Err(_), Err(error)) = (&outcome, &cleanup) {
        // The step's error is the one returned; the cleanup's must not vanish with it.
        tracing::error!("cleaning up after the failed demo: {error:#}");
    }
    let mut report = outcome?;
    cleanup.context("cleaning up")?;
    let problems = report.problems();
    if problems.is_empty() {
        writeln!(out, "demo succeeded; everything it created is deleted")?;
    } else {
        for problem in &problems {
            writeln!(out, "PROBLEM: {problem}")?;
        }
    }
    report.text = out.text;
    if problems.is_empty() {
        Ok(report)
    } else {
        Err(DemoFailed { report, problems }.into())
    }
}

/// Everything between starting the plugin and cleaning up; writes the report to `out`.
async fn drive(
    stage: &Stage,
    driver_name: &str,
    plugin: &KubeletPlugin,
    classes: &Api<DeviceClass>,
    out: &mut Out,
) -> Result<DemoReport> {
    let client = &stage.client;
    let kubelet = KubeletSimulator::new(KubeletVersion::V1_36)
        .register(&plugin.socket_paths().registration)
        .await
        .context("registering with the simulated kubelet")?;
    writeln!(
        out,
        "plugin {driver_name} on node {} of {} registered with a simulated kubelet 1.36 (API {:?})",
        stage.node,
        stage.location(),
        kubelet.api
    )?;

    if tokio::time::timeout(PUBLISH_TIMEOUT, plugin.published())
        .await
        .is_err()
    {
        bail!("the plugin did not publish its ResourceSlices within {PUBLISH_TIMEOUT:?}");
    }
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let published = slices
        .list(&ListParams::default().fields(&format!(
            "spec.driver={driver_name},spec.nodeName={}",
            stage.node
        )))
        .await
        .context("listing ResourceSlices")?;
    let devices: usize = published
        .items
        .iter()
        .map(|slice| slice.spec.devices.as_ref().map_or(0, Vec::len))
        .sum();
    writeln!(
        out,
        "published {devices} GPUs in {} ResourceSlice(s)",
        published.items.len()
    )?;

    let class: DeviceClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": { "name": driver_name, "labels": labels() },
        "spec": { "selectors": [{ "cel": { "expression": format!("device.driver == \"{driver_name}\"") } }] }
    }))?;
    let class_created = match classes.create(&PostParams::default(), &class).await {
        Ok(_) => format!("DeviceClass {driver_name}, "),
        // A class of that name from elsewhere is used as it is (and left alone afterwards).
        Err(kube::Error::Api(status)) if status.code == 409 => {
            writeln!(out, "using the existing DeviceClass {driver_name}")?;
            String::new()
        }
        Err(error) => return Err(error).context("creating the DeviceClass"),
    };

    let plans = demo_claims(driver_name);
    let claims_api = stage.claims();
    let pods_api = stage.pods();
    for plan in &plans {
        let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": { "name": plan.name, "namespace": stage.namespace, "labels": labels() },
            "spec": { "devices": plan.devices },
        }))?;
        claims_api
            .create(&PostParams::default(), &claim)
            .await
            .with_context(|| format!("creating claim {}", plan.name))?;
    }
    // The Pods that use the claims: `(pod, uid)` per claim.
    let mut consumers: Consumers<'_> = Vec::new();
    for plan in &plans {
        let mut pods = Vec::new();
        for (pod, containers) in plan.pods {
            let created = pods_api
                .create(
                    &PostParams::default(),
                    &demo_pod(stage, plan.name, pod, containers)?,
                )
                .await
                .with_context(|| format!("creating pod {pod}"))?;
            let uid = created
                .metadata
                .uid
                .with_context(|| format!("pod {pod} as created has no UID"))?;
            pods.push((*pod, uid));
        }
        consumers.push((plan.name, pods));
    }
    writeln!(
        out,
        "created {class_created}{} claims and {} pods in namespace {}; allocating with {}",
        plans.len(),
        consumers.iter().map(|(_, pods)| pods.len()).sum::<usize>(),
        stage.namespace,
        stage.allocation.who()
    )?;

    let mut allocations = match stage.allocation {
        AllocationMode::Scheduler => await_allocation(stage, &consumers).await?,
        AllocationMode::Demo => allocate_here(stage, &consumers).await,
    };
    let mut failed = Vec::new();
    let mut allocated = Vec::new();
    for plan in &plans {
        match allocations.remove(plan.name) {
            Some(Ok(claim)) => {
                let claim_ref = ClaimRef {
                    uid: claim
                        .metadata
                        .uid
                        .clone()
                        .with_context(|| format!("claim {} has no UID", plan.name))?,
                    namespace: stage.namespace.clone(),
                    name: plan.name.into(),
                };
                let pods: Vec<&str> = pods_of(&consumers, plan.name)
                    .iter()
                    .map(|(pod, _)| *pod)
                    .collect();
                writeln!(
                    out,
                    "claim {} allocated {}, reserved for {}",
                    plan.name,
                    allocated_devices(&claim).join(", "),
                    pods.join(", ")
                )?;
                allocated.push((plan, claim_ref));
            }
            Some(Err(message)) => {
                writeln!(out, "FAILED to allocate: {message}")?;
                failed.push(ClaimFailure {
                    claim: plan.name.into(),
                    step: Step::Allocate,
                    message,
                });
            }
            None => bail!("no allocation outcome for claim {} (a bug)", plan.name),
        }
    }

    prepare_all(stage, &kubelet, &allocated, &mut failed, out).await?;

    let refs: Vec<ClaimRef> = allocated.iter().map(|(_, r)| r.clone()).collect();
    let unprepared = if refs.is_empty() {
        BTreeMap::new()
    } else {
        kubelet
            .unprepare(&refs)
            .await
            .context("NodeUnprepareResources")?
    };
    let mut unprepared_ok = 0;
    for (plan, claim) in &allocated {
        match unprepared.get(&claim.uid) {
            Some(Ok(())) => unprepared_ok += 1,
            Some(Err(error)) => {
                writeln!(out, "unprepare of claim {} FAILED: {error}", plan.name)?;
                if !failed.iter().any(|f| f.claim == plan.name) {
                    failed.push(ClaimFailure {
                        claim: plan.name.into(),
                        step: Step::Unprepare,
                        message: error.clone(),
                    });
                }
            }
            None => {
                if !failed.iter().any(|f| f.claim == plan.name) {
                    failed.push(ClaimFailure {
                        claim: plan.name.into(),
                        step: Step::Unprepare,
                        message: "no answer for the claim".into(),
                    });
                }
            }
        }
    }
    let cdi_files_left = std::fs::read_dir(stage.cdi_root())
        .context("reading the CDI directory")?
        .count();
    // Keep the claims' order.
    failed.sort_by_key(|f| plans.iter().position(|p| p.name == f.claim));
    let prepared = allocated
        .iter()
        .filter(|(plan, _)| !failed.iter().any(|f| f.claim == plan.name))
        .count();
    let report = DemoReport {
        claims: plans.len(),
        allocated: allocated.len(),
        prepared,
        unprepared: unprepared_ok,
        failed,
        cdi_files_left,
        allocation: stage.allocation,
        text: String::new(),
    };
    let failures = if report.failed.is_empty() {
        String::new()
    } else {
        let names: Vec<String> = report
            .failed
            .iter()
            .map(|f| {
                let expected = f.claim == BAD_CONFIG_CLAIM
                    && f.step == Step::Prepare
                    && f.message.contains(BAD_CONFIG_ERROR);
                if expected {
                    format!("{} at {}, as expected", f.claim, f.step)
                } else {
                    format!("{} at {}", f.claim, f.step)
                }
            })
            .collect();
        format!(" ({})", names.join("; "))
    };
    writeln!(
        out,
        "\nsummary: {} of {} claims allocated by {}, {} prepared, {} failed{failures}, \
         {} unprepared, {} CDI spec files left",
        report.allocated,
        report.claims,
        report.allocation.who(),
        report.prepared,
        report.failed.len(),
        report.unprepared,
        report.cdi_files_left,
    )?;
    Ok(report)
}

/// Prepares every allocated claim once per Pod, as the kubelet does (a claim already prepared
/// for an earlier Pod is answered from the plugin's checkpoint), and prints what each
/// container gets.
async fn prepare_all(
    stage: &Stage,
    kubelet: &RegisteredPlugin,
    allocated: &[(&DemoClaim, ClaimRef)],
    failed: &mut Vec<ClaimFailure>,
    out: &mut Out,
) -> Result<()> {
    for (plan, claim) in allocated {
        for (pod, containers) in plan.pods {
            let answer = kubelet
                .prepare(std::slice::from_ref(claim))
                .await
                .context("NodePrepareResources")?;
            writeln!(out, "\npod {pod}, claim {} ({}):", plan.name, plan.what)?;
            let Some(result) = answer.get(&claim.uid) else {
                writeln!(out, "  FAILED: no answer for the claim")?;
                record_failure(failed, plan.name, Step::Prepare, "no answer for the claim");
                continue;
            };
            match result {
                Ok(devices) => {
                    for container in *containers {
                        writeln!(out, "  container {container}:")?;
                        for device in devices {
                            writeln!(
                                out,
                                "    {} -> {}",
                                device.device,
                                device.cdi_device_ids.join(", ")
                            )?;
                        }
                        for env in container_env(&stage.cdi_root(), devices)? {
                            writeln!(out, "      env {env}")?;
                        }
                    }
                }
                Err(error) => {
                    writeln!(out, "  FAILED: {error}")?;
                    record_failure(failed, plan.name, Step::Prepare, error);
                }
            }
        }
    }
    Ok(())
}

fn record_failure(failed: &mut Vec<ClaimFailure>, claim: &str, step: Step, message: &str) {
    if !failed.iter().any(|f| f.claim == claim) {
        failed.push(ClaimFailure {
            claim: claim.into(),
            step,
            message: message.into(),
        });
    }
}

/// A Pod using `claim` from all its containers, pinned to the demo's node: by
/// `spec.nodeName` when the demo allocates (no scheduler takes it), by a `nodeSelector` on
/// the node's `kubernetes.io/hostname` label when the scheduler does.
fn demo_pod(stage: &Stage, claim: &str, name: &str, containers: &[&str]) -> Result<Pod> {
    let containers: Vec<_> = containers
        .iter()
        .map(|container| {
            serde_json::json!({
                "name": container,
                "image": PAUSE_IMAGE,
                "resources": { "claims": [{ "name": POD_CLAIM_NAME }] },
                // Admitted under the `restricted` Pod Security Standard.
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": { "drop": ["ALL"] },
                },
            })
        })
        .collect();
    let mut spec = serde_json::json!({
        "containers": containers,
        "resourceClaims": [{ "name": POD_CLAIM_NAME, "resourceClaimName": claim }],
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 65535,
            "seccompProfile": { "type": "RuntimeDefault" },
        },
    });
    match stage.allocation {
        AllocationMode::Demo => spec["nodeName"] = serde_json::json!(stage.node),
        AllocationMode::Scheduler => {
            spec["nodeSelector"] = serde_json::json!({ "kubernetes.io/hostname": stage.hostname });
        }
    }
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": stage.namespace, "labels": labels() },
        "spec": spec,
    }))?)
}

/// Per claim: the allocated claim, or why it is not.
type Allocations = BTreeMap<String, Result<ResourceClaim, String>>;

/// The claims, in the demo's order, each with the `(name, UID)` of the Pods using it.
type Consumers<'a> = Vec<(&'a str, Vec<(&'a str, String)>)>;

fn pods_of<'c, 'a>(consumers: &'c Consumers<'a>, claim: &str) -> &'c [(&'a str, String)] {
    consumers
        .iter()
        .find(|(name, _)| *name == claim)
        .map_or(&[], |(_, pods)| pods.as_slice())
}

/// [`AllocationMode::Demo`]: allocates each claim with the SDK's allocator and reserves it for
/// its Pods.
async fn allocate_here(stage: &Stage, consumers: &Consumers<'_>) -> Allocations {
    let mut allocations = BTreeMap::new();
    for (claim, pods) in consumers {
        let mut outcome = Err("the claim has no pods".to_owned());
        for (pod, uid) in pods {
            outcome = allocate_claim(
                &stage.client,
                &stage.namespace,
                claim,
                &stage.node,
                Some((pod, uid)),
            )
            .await
            .map_err(|error| error.to_string());
            if outcome.is_err() {
                break;
            }
        }
        allocations.insert((*claim).to_owned(), outcome);
    }
    allocations
}

/// [`AllocationMode::Scheduler`]: waits until the scheduler allocated each claim and reserved
/// it for all its Pods, or until the timeout; a claim still waiting then fails with its Pods'
/// scheduling state.
async fn await_allocation(stage: &Stage, consumers: &Consumers<'_>) -> Result<Allocations> {
    let claims_api = stage.claims();
    let deadline = Instant::now() + stage.timeout;
    let mut allocations = BTreeMap::new();
    let mut waiting: Vec<&str> = consumers.iter().map(|(name, _)| *name).collect();
    loop {
        let mut still = Vec::new();
        for name in waiting {
            let claim = claims_api
                .get(name)
                .await
                .with_context(|| format!("reading claim {name}"))?;
            let uids: Vec<&str> = pods_of(consumers, name)
                .iter()
                .map(|(_, uid)| uid.as_str())
                .collect();
            if missing_reservations(&claim, &uids).is_empty() {
                allocations.insert(name.to_owned(), Ok(claim));
            } else {
                still.push((name, claim));
            }
        }
        if still.is_empty() {
            return Ok(allocations);
        }
        if Instant::now() >= deadline {
            for (name, claim) in still {
                let mut why = Vec::new();
                for (pod, uid) in pods_of(consumers, name) {
                    if missing_reservations(&claim, &[uid.as_str()]).is_empty() {
                        continue;
                    }
                    why.push(format!(
                        "pod {pod}: {}",
                        scheduling_state(stage, pod, uid).await
                    ));
                }
                let state = if allocated_devices(&claim).is_empty() {
                    "was not allocated"
                } else {
                    "was allocated but not reserved for all its pods"
                };
                allocations.insert(
                    name.to_owned(),
                    Err(format!(
                        "claim {}/{name} {state} within {:?}: {}",
                        stage.namespace,
                        stage.timeout,
                        why.join("; ")
                    )),
                );
            }
            return Ok(allocations);
        }
        waiting = still.into_iter().map(|(name, _)| name).collect();
        tokio::time::sleep(POLL).await;
    }
}

/// The UIDs of `pods` the claim is not (allocated and) reserved for.
fn missing_reservations<'a>(claim: &ResourceClaim, pods: &[&'a str]) -> Vec<&'a str> {
    let Some(status) = claim.status.as_ref().filter(|s| s.allocation.is_some()) else {
        return pods.to_vec();
    };
    let reserved: BTreeSet<&str> = status
        .reserved_for
        .iter()
        .flatten()
        .map(|consumer| consumer.uid.as_str())
        .collect();
    pods.iter()
        .copied()
        .filter(|uid| !reserved.contains(uid))
        .collect()
}

fn allocated_devices(claim: &ResourceClaim) -> Vec<String> {
    claim
        .status
        .as_ref()
        .and_then(|status| status.allocation.as_ref())
        .and_then(|allocation| allocation.devices.as_ref())
        .map(|devices| {
            devices
                .results
                .iter()
                .flatten()
                .map(|result| format!("{}/{}", result.pool, result.device))
                .collect()
        })
        .unwrap_or_default()
}

/// Why a Pod is not running with its claim: its `PodScheduled` condition and its last
/// events, as far as they can be read.
async fn scheduling_state(stage: &Stage, pod: &str, uid: &str) -> String {
    let mut state = match stage.pods().get_opt(pod).await {
        Ok(Some(found)) => {
            let node = found.spec.as_ref().and_then(|spec| spec.node_name.clone());
            let condition = found
                .status
                .as_ref()
                .and_then(|status| status.conditions.as_ref())
                .and_then(|conditions| conditions.iter().find(|c| c.type_ == "PodScheduled"))
                .map(|c| {
                    format!(
                        "PodScheduled={} ({}: {})",
                        c.status,
                        c.reason.as_deref().unwrap_or("no reason"),
                        c.message.as_deref().unwrap_or("no message")
                    )
                });
            match (node, condition) {
                (Some(node), Some(condition)) => format!("bound to {node}, {condition}"),
                (Some(node), None) => format!("bound to {node}"),
                (None, Some(condition)) => condition,
                (None, None) => {
                    "not scheduled, no PodScheduled condition (is a kube-scheduler running?)"
                        .to_owned()
                }
            }
        }
        Ok(None) => "the pod is gone".to_owned(),
        Err(error) => format!("the pod could not be read: {error}"),
    };
    let events: Api<Event> = Api::namespaced(stage.client.clone(), &stage.namespace);
    let selector = ListParams::default().fields(&format!(
        "involvedObject.kind=Pod,involvedObject.name={pod},involvedObject.uid={uid}"
    ));
    if let Ok(mut listed) = events.list(&selector).await
        && !listed.items.is_empty()
    {
        listed.items.sort_by(|a, b| {
            let key = |e: &Event| (e.last_timestamp.clone(), e.event_time.clone());
            key(a).cmp(&key(b))
        });
        let last: Vec<String> = listed
            .items
            .iter()
            .rev()
            .take(2)
            .map(|e| {
                format!(
                    "{} {}: {}",
                    e.type_.as_deref().unwrap_or("?"),
                    e.reason.as_deref().unwrap_or("?"),
                    e.message.as_deref().unwrap_or("").trim()
                )
            })
            .collect();
        let _ = write!(state, "; last events: {}", last.join(" | "));
    }
    state
}

/// Deletes the demo's Pods, then its claims; returns how many of each there were.
async fn remove_workloads(stage: &Stage) -> Result<(usize, usize)> {
    let pods = remove_pods(&stage.pods(), stage.timeout).await?;
    let claims = remove_claims(&stage.claims(), stage.stuck_after, stage.timeout).await?;
    Ok((pods, claims))
}

/// Deletes the demo's Pods and waits until they are gone: the node's kubelet confirms the
/// deletion of a scheduled Pod. Pods still there after `timeout` (a node without a working
/// kubelet) are force-deleted.
async fn remove_pods(pods: &Api<Pod>, timeout: Duration) -> Result<usize> {
    let listed = pods
        .list(&label_selector())
        .await
        .context("listing the demo's Pods")?
        .items;
    for pod in &listed {
        if let Some(name) = &pod.metadata.name {
            ignore_not_found(pods.delete(name, &DeleteParams::default()).await)
                .with_context(|| format!("deleting pod {name}"))?;
        }
    }
    let mut deadline = Instant::now() + timeout;
    let mut forced = false;
    loop {
        let left = pods
            .list(&label_selector())
            .await
            .context("listing the demo's Pods")?
            .items;
        if left.is_empty() {
            return Ok(listed.len());
        }
        if Instant::now() >= deadline {
            let names: Vec<&str> = left
                .iter()
                .filter_map(|p| p.metadata.name.as_deref())
                .collect();
            if forced {
                bail!(
                    "pods {} are still there after their forced deletion",
                    names.join(", ")
                );
            }
            tracing::warn!(
                "pods {} still there {timeout:?} after their deletion (no kubelet confirmed it); \
                 forcing it",
                names.join(", ")
            );
            for name in names {
                ignore_not_found(
                    pods.delete(name, &DeleteParams::default().grace_period(0))
                        .await,
                )
                .with_context(|| format!("force-deleting pod {name}"))?;
            }
            forced = true;
            deadline = Instant::now() + FORCED_POD_DELETION;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Deletes the demo's claims and waits until they are gone. Normally the cluster's
/// resourceclaim controller deallocates a deleted claim no Pod uses any more and drops its
/// delete-protection finalizer; a claim still there `stuck_after` the deletion (no controller:
/// the embedded cluster, an API server alone) loses the finalizer to the demo.
async fn remove_claims(
    claims: &Api<ResourceClaim>,
    stuck_after: Duration,
    timeout: Duration,
) -> Result<usize> {
    let listed = claims
        .list(&label_selector())
        .await
        .context("listing the demo's ResourceClaims")?
        .items;
    for claim in &listed {
        if let Some(name) = &claim.metadata.name {
            ignore_not_found(claims.delete(name, &DeleteParams::default()).await)
                .with_context(|| format!("deleting claim {name}"))?;
        }
    }
    let start = Instant::now();
    loop {
        let left = claims
            .list(&label_selector())
            .await
            .context("listing the demo's ResourceClaims")?
            .items;
        if left.is_empty() {
            return Ok(listed.len());
        }
        let waited = start.elapsed();
        if waited >= stuck_after + timeout {
            let names: Vec<&str> = left
                .iter()
                .filter_map(|c| c.metadata.name.as_deref())
                .collect();
            bail!(
                "claims {} are still there {waited:.1?} after their deletion (finalizers other \
                 than {DELETE_PROTECTION_FINALIZER}?)",
                names.join(", ")
            );
        }
        if waited >= stuck_after {
            for claim in &left {
                drop_finalizer(claims, claim).await?;
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Removes the delete-protection finalizer of a deleted claim; a conflict is left for the
/// next round.
async fn drop_finalizer(claims: &Api<ResourceClaim>, claim: &ResourceClaim) -> Result<()> {
    let Some(name) = claim.metadata.name.as_deref() else {
        return Ok(());
    };
    let finalizers = claim.metadata.finalizers.clone().unwrap_or_default();
    if claim.metadata.deletion_timestamp.is_none()
        || !finalizers.iter().any(|f| f == DELETE_PROTECTION_FINALIZER)
    {
        return Ok(());
    }
    let kept: Vec<_> = finalizers
        .into_iter()
        .filter(|f| f != DELETE_PROTECTION_FINALIZER)
        .collect();
    let patch = serde_json::json!({ "metadata": {
        "finalizers": kept,
        "resourceVersion": claim.metadata.resource_version,
    }});
    match claims
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(error) => Err(error).with_context(|| format!("removing the finalizer of claim {name}")),
    }
}

/// Deletes the DeviceClass `name` if the demo created it; returns whether it did.
async fn remove_device_class(classes: &Api<DeviceClass>, name: &str) -> Result<bool> {
    let Some(class) = classes
        .get_opt(name)
        .await
        .context("reading the DeviceClass")?
    else {
        return Ok(false);
    };
    let ours = class
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(DEMO_LABEL.0))
        .is_some_and(|value| value == DEMO_LABEL.1);
    if ours {
        ignore_not_found(classes.delete(name, &DeleteParams::default()).await)
            .context("deleting the DeviceClass")?;
    }
    Ok(ours)
}

/// Deletes the plugin's ResourceSlices: on a real cluster no kubelet knows this plugin, so
/// none would remove them once it is gone.
async fn remove_slices(client: &kube::Client, driver_name: &str, node: &str) -> Result<()> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let fields = format!("spec.driver={driver_name},spec.nodeName={node}");
    slices
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().fields(&fields),
        )
        .await
        .context("deleting the demo's ResourceSlices")?;
    Ok(())
}

fn ignore_not_found<T>(result: kube::Result<T>) -> kube::Result<()> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error),
    }
}

/// The environment a container using `devices` gets: spec-level and device-level env of the
/// CDI spec files that define their CDI IDs.
fn container_env(cdi_root: &Path, devices: &[KubeletDevice]) -> Result<Vec<String>> {
    let mut env = BTreeSet::new();
    for id in devices.iter().flat_map(|d| &d.cdi_device_ids) {
        let Some((kind, name)) = id.split_once('=') else {
            continue;
        };
        for entry in std::fs::read_dir(cdi_root)? {
            let path = entry?.path();
            let spec = dra_sdk::advanced::cdi::Spec::read_file(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            if spec.kind.to_string() != kind {
                continue;
            }
            let Some(device) = spec.devices.iter().find(|d| d.name == name) else {
                continue;
            };
            for edits in [&spec.container_edits, &device.container_edits] {
                env.extend(edits.env.iter().cloned());
            }
        }
    }
    Ok(env.into_iter().collect())
}
