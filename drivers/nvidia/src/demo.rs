//! `gpu-demo`: the NVIDIA driver without a GPU, end to end in an embedded cluster or on a real
//! API server.
//!
//! Runs the plugin on a mock machine (a shipped profile such as `dgx-a100`, or a profile
//! file) against dra-sdk's test cluster (fake API server, simulated kubelet 1.36, the SDK's
//! scheduler-like allocator with CEL) and walks what the public guides for this driver have
//! operators do: list the DeviceClasses, run a pod whose claim comes from a
//! ResourceClaimTemplate asking for one MIG slice, a pod whose two containers share one full
//! GPU, claims selecting devices by CEL on `productName`, on the memory capacity and on the
//! MIG `profile`, a `GpuConfig` and a `MigDeviceConfig`, and a config on the wrong device
//! type, which fails alone. For every container it prints the devices, the CDI device names,
//! and the environment and device nodes it would get (read back from the CDI spec files the
//! plugin wrote), then unprepares and deletes everything.
//!
//! The pods run side by side, each claim holding its devices: the demo plans its steps for the
//! machine ([`plan`]) and leaves out, saying why ([`DemoReport::skipped`]), the steps whose
//! devices the machine cannot spare: all full-GPU steps need three full GPUs, one with at least
//! 40Gi (`dgx-a100` and `dgx-h100` have them; `mixed` and `workstation` have one T4, so only the
//! shared GPU runs there), the MIG steps need MIG devices (none on `dgx-h100` and
//! `workstation`). What it runs must then succeed: a claim of a planned step that fails is a
//! problem ([`DemoReport::problems`]).
//!
//! The embedded cluster runs no controllers, so the demo does their part: it binds pods to
//! the node (`spec.nodeName`), creates the claim of a template pod as the resourceclaim
//! controller would, and allocates with [`allocate_claim`] as the scheduler would. On a real
//! API server ([`Target::Cluster`], `gpu-demo --kubeconfig`) the pods select the node, the
//! cluster's scheduler allocates and its resourceclaim controller makes the template's claim;
//! the demo waits for each allocation, prepares through a simulated kubelet, and deletes what
//! it created (the plugin's ResourceSlices included).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use dra_sdk::advanced::cdi::Spec;
use dra_sdk::claim::ClaimRef;
use dra_sdk_allocator::allocate_claim;
use dra_sdk_testing::cluster::{NODE_NAME, TestCluster, claim_ref};
use dra_sdk_testing::kubelet::{KubeletDevice, KubeletVersion};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

use crate::config::API_VERSION;
use crate::devices::{DRIVER_NAME, GPU_DEVICE_CLASS, MIG_DEVICE_CLASS, device_classes};
use crate::plugin::{Cli, NvidiaPlugin, cdi_kind};

/// The profile the demo runs on by default: 8 A100-80GB, some in MIG mode.
pub const DEFAULT_PROFILE: &str = "dgx-a100";
/// The claim whose config is of the wrong kind; it must fail, at prepare, alone.
pub const WRONG_TYPE_CLAIM: &str = "wrong-type";
/// What the driver must say about [`WRONG_TYPE_CLAIM`].
pub const WRONG_TYPE_ERROR: &str = "GpuConfig (resource.nvidia.com/v1beta1) cannot configure MIG";
const NAMESPACE: &str = "default";
/// The image of the demo's pods; their containers never run (a real node's kubelet does not
/// know the demo's plugin).
const POD_IMAGE: &str = "registry.k8s.io/pause:3.10";
const PUBLISH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
const ATTRIBUTES: &str = "device.attributes['gpu.nvidia.com']";

/// Why the demo could not run to the end (a claim failing is not one: see [`DemoReport`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DemoError {
    /// The plugin could not be set up from the mock profile.
    #[error("setting up the NVIDIA plugin: {0}")]
    Setup(String),
    /// The embedded cluster, the plugin or the simulated kubelet failed.
    #[error("{action}: {message}")]
    Cluster {
        /// What the demo was doing.
        action: String,
        /// What went wrong.
        message: String,
    },
}

fn failed(action: impl Into<String>) -> impl FnOnce(String) -> DemoError {
    let action = action.into();
    move |message| DemoError::Cluster { action, message }
}

fn err<E: std::fmt::Display>(action: impl Into<String>) -> impl FnOnce(E) -> DemoError {
    let fail = failed(action);
    move |error| fail(error.to_string())
}

/// What happened.
#[derive(Clone, Debug, Default)]
pub struct DemoReport {
    /// Claims the demo's pods used.
    pub claims: usize,
    /// Claims allocated.
    pub allocated: usize,
    /// Claims prepared for every pod using them.
    pub prepared: usize,
    /// Claims unprepared without error.
    pub unprepared: usize,
    /// `(claim, message)` of every claim that failed, at its first failed step.
    pub failed: Vec<(String, String)>,
    /// The UUIDs the containers of the shared-GPU pod saw, one per container.
    pub shared_uuids: Vec<String>,
    /// CDI spec files left after unprepare.
    pub cdi_files_left: usize,
    /// Whether the machine has MIG devices, so that the MIG steps (template, profile,
    /// wrong-type config) ran.
    pub mig_steps: bool,
    /// The steps left out because the machine cannot spare their devices, with why.
    pub skipped: Vec<Skipped>,
    /// The report as printed.
    pub text: String,
}

impl DemoReport {
    /// Everything that did not go as it must; empty when the demo succeeded.
    pub fn problems(&self) -> Vec<String> {
        let mut problems: Vec<String> = self
            .failed
            .iter()
            .filter(|(claim, _)| claim != WRONG_TYPE_CLAIM)
            .map(|(claim, message)| format!("claim {claim} failed: {message}"))
            .collect();
        match self
            .failed
            .iter()
            .find(|(claim, _)| claim == WRONG_TYPE_CLAIM)
        {
            Some((_, message)) if message.contains(WRONG_TYPE_ERROR) => {}
            Some((_, message)) => problems.push(format!(
                "claim {WRONG_TYPE_CLAIM} failed with an unexpected error: {message}"
            )),
            None if !self.was_skipped(WRONG_TYPE_CLAIM) => {
                problems.push(format!("claim {WRONG_TYPE_CLAIM} did not fail"));
            }
            None => {}
        }
        let shared_ran = !self.was_skipped(SHARED_GPU_CLAIM);
        if shared_ran
            && (self.shared_uuids.len() != 2 || self.shared_uuids[0] != self.shared_uuids[1])
        {
            problems.push(format!(
                "the shared-GPU containers saw {:?}, not one UUID twice",
                self.shared_uuids
            ));
        }
        if self.cdi_files_left > 0 {
            problems.push(format!("{} CDI spec file(s) left", self.cdi_files_left));
        }
        problems
    }

    fn was_skipped(&self, claim: &str) -> bool {
        self.skipped.iter().any(|skipped| skipped.claim == claim)
    }
}

/// A step of the demo left out because the machine cannot spare its devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// The claim of the step.
    pub claim: String,
    /// What it shows, and why it does not fit.
    pub why: String,
}

/// The claim whose GPU two containers share.
pub const SHARED_GPU_CLAIM: &str = "shared-gpu";
/// What the memory step asks for at least: `compareTo(quantity("40Gi")) >= 0`.
const BIG_GPU_MIB: u64 = 40 * 1024;

/// A full GPU as published: what the demo's selectors look at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FullGpu {
    /// `productName`.
    pub product: String,
    /// The `memory` capacity in MiB (0 when it does not parse).
    pub memory_mib: u64,
}

/// The MiB of a quantity with a binary or decimal suffix (`81559Mi`, `40Gi`, `16G`, bytes);
/// `None` when it is not such a quantity.
fn quantity_mib(text: &str) -> Option<u64> {
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let number: u64 = digits.parse().ok()?;
    let bytes: u64 = match &text[digits.len()..] {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return None,
    };
    Some(number.saturating_mul(bytes) >> 20)
}

/// The demo's steps for a machine with these full GPUs and these MIG devices (profile →
/// count), and the steps left out, each claim holding its devices while the others run.
///
/// Claims are allocated in the order returned, each taking any free matching device, so the
/// plan only counts on what is left whichever device an earlier claim took: the full-GPU
/// steps go from the narrowest selector to the widest (memory, then product, then the shared
/// GPU, which takes whatever is left), and a step runs only when a matching GPU is sure to be
/// free for it. The shared GPU goes first in priority: it runs whenever there is a full GPU.
pub fn plan(
    full_gpus: &[FullGpu],
    mig_devices: &BTreeMap<String, usize>,
) -> (Vec<Workload>, Vec<Skipped>) {
    let mut skipped = Vec::new();
    let mut skip = |claim: &str, why: String| {
        skipped.push(Skipped {
            claim: claim.to_owned(),
            why,
        });
    };
    let mut full_steps = Vec::new();
    // The shared GPU's device is kept back from the others.
    let mut spare = full_gpus.len().saturating_sub(1);
    if full_gpus.is_empty() {
        skip(
            SHARED_GPU_CLAIM,
            "one full GPU shared by two containers: the machine has no full GPU".into(),
        );
    }
    let is_big = |gpu: &FullGpu| gpu.memory_mib >= BIG_GPU_MIB;
    let memory_runs = spare > 0 && full_gpus.iter().any(is_big);
    if memory_runs {
        spare -= 1;
        full_steps.push(FullStep::Memory);
    } else {
        skip(
            "by-memory",
            if full_gpus.iter().any(is_big) {
                "memory >= 40Gi: no full GPU to spare for it".into()
            } else {
                "memory >= 40Gi: no full GPU has 40Gi".into()
            },
        );
    }
    // The product with the most GPUs sure to be left after the memory step (which may have
    // taken one of them); ties go to the first GPU's product.
    let guaranteed = |product: &str| {
        let of = full_gpus.iter().filter(|gpu| gpu.product == product);
        let count = of.clone().count();
        let maybe_taken = memory_runs && of.clone().any(is_big);
        count - usize::from(maybe_taken)
    };
    let product = full_gpus
        .iter()
        .map(|gpu| gpu.product.as_str())
        .rev()
        .max_by_key(|product| guaranteed(product));
    match product {
        Some(product) if spare > 0 && guaranteed(product) > 0 => {
            full_steps.push(FullStep::Product(product.to_owned()));
        }
        _ => skip(
            "by-product",
            "productName == <a product>, with a GpuConfig: no full GPU to spare for it".into(),
        ),
    }
    if !full_gpus.is_empty() {
        full_steps.push(FullStep::Shared);
    }

    let mut left = mig_devices.clone();
    let mut take = |profile: &str| match left.get_mut(profile) {
        Some(count) if *count > 0 => {
            *count -= 1;
            true
        }
        _ => false,
    };
    let mut mig_steps = Vec::new();
    let first = mig_devices.keys().next().cloned();
    if let Some(first) = &first {
        if take(first) {
            mig_steps.push(MigStep::Job(first.clone()));
        }
        // The wrong-type config and the profile step on whatever is left: the wrong-type one on
        // the smallest profile, the profile step on the largest.
        let profiles: Vec<String> = mig_devices.keys().cloned().collect();
        match profiles.iter().find(|profile| take(profile)) {
            Some(profile) => mig_steps.push(MigStep::WrongType(profile.clone())),
            None => skip(
                WRONG_TYPE_CLAIM,
                "a MIG slice with a GpuConfig: no MIG device to spare for it".into(),
            ),
        }
        match profiles.iter().rev().find(|profile| take(profile)) {
            Some(profile) => mig_steps.push(MigStep::Profile(profile.clone())),
            None => skip(
                "by-profile",
                "MIG profile == <a profile>, with a MigDeviceConfig: no MIG device to spare for it"
                    .into(),
            ),
        }
    } else {
        for claim in ["mig-job-0-mig", "by-profile", WRONG_TYPE_CLAIM] {
            skip(claim, "a MIG step: the machine has no MIG devices".into());
        }
    }
    (workloads(&full_steps, &mig_steps), skipped)
}

/// A full-GPU step of the demo.
enum FullStep {
    Memory,
    Product(String),
    Shared,
}

/// A MIG step of the demo, with its profile.
enum MigStep {
    Job(String),
    WrongType(String),
    Profile(String),
}

/// One pod of the demo and the claim it uses.
#[derive(Clone, Debug)]
pub struct Workload {
    /// The pod.
    pub pod: &'static str,
    /// Its containers, each using the claim.
    pub containers: &'static [&'static str],
    /// The claim.
    pub claim: String,
    /// What the step shows.
    pub what: String,
    /// The claim's `spec`.
    pub spec: Value,
    /// The claim comes from this ResourceClaimTemplate (created with `spec`).
    pub template: Option<&'static str>,
}

fn request(name: &str, class: &str, selector: Option<&str>) -> Value {
    let mut exactly = json!({ "deviceClassName": class, "count": 1 });
    if let Some(expression) = selector {
        exactly["selectors"] = json!([{ "cel": { "expression": expression } }]);
    }
    json!({ "name": name, "exactly": exactly })
}

fn claim_spec(request: Value, config: Option<(&str, &str)>) -> Value {
    let mut devices = json!({ "requests": [request.clone()] });
    if let Some((request_name, kind)) = config {
        devices["config"] = json!([{
            "requests": [request_name],
            "opaque": { "driver": DRIVER_NAME, "parameters": { "apiVersion": API_VERSION, "kind": kind } },
        }]);
    }
    json!({ "devices": devices })
}

/// The workloads of the planned steps, in the order their claims are allocated.
fn workloads(full_steps: &[FullStep], mig_steps: &[MigStep]) -> Vec<Workload> {
    let gpu = |selector: Option<&str>| request("gpu", GPU_DEVICE_CLASS, selector);
    let mig = |profile: &str| {
        request(
            "mig",
            MIG_DEVICE_CLASS,
            Some(&format!("{ATTRIBUTES}.profile == '{profile}'")),
        )
    };
    let mut list = Vec::new();
    for step in mig_steps {
        if let MigStep::Job(profile) = step {
            list.push(Workload {
                pod: "mig-job-0",
                containers: &["main"],
                claim: "mig-job-0-mig".into(),
                what: format!("one {profile} MIG slice, from ResourceClaimTemplate mig-slice"),
                spec: claim_spec(mig(profile), None),
                template: Some("mig-slice"),
            });
        }
    }
    for step in full_steps {
        list.push(match step {
            FullStep::Memory => Workload {
                pod: "by-memory",
                containers: &["main"],
                claim: "by-memory".into(),
                what: "memory >= 40Gi".into(),
                spec: claim_spec(
                    gpu(Some(
                        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity(\"40Gi\")) >= 0",
                    )),
                    None,
                ),
                template: None,
            },
            FullStep::Product(product) => Workload {
                pod: "by-product",
                containers: &["main"],
                claim: "by-product".into(),
                what: format!("productName == '{product}', with a GpuConfig"),
                spec: claim_spec(
                    gpu(Some(&format!("{ATTRIBUTES}.productName == '{product}'"))),
                    Some(("gpu", "GpuConfig")),
                ),
                template: None,
            },
            FullStep::Shared => Workload {
                pod: SHARED_GPU_CLAIM,
                containers: &["ctr0", "ctr1"],
                claim: SHARED_GPU_CLAIM.into(),
                what: "one full GPU shared by two containers".into(),
                spec: claim_spec(gpu(None), None),
                template: None,
            },
        });
    }
    for step in mig_steps {
        match step {
            MigStep::Job(_) => {}
            MigStep::Profile(profile) => list.push(Workload {
                pod: "by-profile",
                containers: &["main"],
                claim: "by-profile".into(),
                what: format!("MIG profile == '{profile}', with a MigDeviceConfig"),
                spec: claim_spec(mig(profile), Some(("mig", "MigDeviceConfig"))),
                template: None,
            }),
            MigStep::WrongType(profile) => list.push(Workload {
                pod: WRONG_TYPE_CLAIM,
                containers: &["main"],
                claim: WRONG_TYPE_CLAIM.into(),
                what: format!("a {profile} MIG slice with a GpuConfig: must fail"),
                spec: claim_spec(mig(profile), Some(("mig", "GpuConfig"))),
                template: None,
            }),
        }
    }
    list
}

/// Where the demo runs.
#[derive(Clone)]
#[non_exhaustive]
pub enum Target {
    /// dra-sdk's embedded cluster (fake API server, no scheduler): the demo binds the pods
    /// to the node and allocates with the SDK's allocator.
    Embedded,
    /// A real API server (`gpu-demo --kubeconfig`): the pods select `node` by its
    /// `kubernetes.io/hostname` label, the cluster's scheduler allocates their claims from the
    /// plugin's slices and its resourceclaim controller makes the template's claim. The
    /// plugin registers with a simulated kubelet only: the node's real kubelet reports
    /// `FailedPrepareDynamicResources` for the pods and never starts them, which is expected.
    Cluster {
        /// The API server.
        client: kube::Client,
        /// The node to publish the mock machine for; no other `gpu.nvidia.com` plugin may
        /// serve it.
        node: String,
        /// The namespace of the claims, template and pods.
        namespace: String,
        /// How long to wait for each allocation.
        timeout: std::time::Duration,
    },
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Embedded => f.write_str("Embedded"),
            Self::Cluster {
                node,
                namespace,
                timeout,
                ..
            } => f
                .debug_struct("Cluster")
                .field("node", node)
                .field("namespace", namespace)
                .field("timeout", timeout)
                .finish_non_exhaustive(),
        }
    }
}

/// The API server and directories the demo runs on.
struct Stage {
    client: kube::Client,
    node: String,
    namespace: String,
    cdi_root: std::path::PathBuf,
    /// `Some(timeout)` on a real cluster.
    real: Option<std::time::Duration>,
    /// The embedded cluster, kept alive for the demo.
    _embedded: Option<TestCluster>,
    /// The kubelet directories on a real cluster.
    _dir: Option<tempfile::TempDir>,
}

/// Runs the demo on the mock `profile` (a shipped name or a file) in the embedded cluster and
/// returns its report, printed on stdout as it goes when `print`. The report's
/// [`DemoReport::problems`] say whether it went as it must.
pub async fn run(profile: &str, print: bool) -> Result<DemoReport, DemoError> {
    run_on(profile, Target::Embedded, print).await
}

/// [`run`] on `target`.
pub async fn run_on(profile: &str, target: Target, print: bool) -> Result<DemoReport, DemoError> {
    let mut out = Out {
        text: String::new(),
        print,
    };
    let (stage, embedded) = match target {
        Target::Embedded => {
            let cluster = TestCluster::start()
                .await
                .map_err(err("starting the embedded cluster"))?;
            let stage = Stage {
                client: cluster.client(),
                node: NODE_NAME.to_owned(),
                namespace: NAMESPACE.to_owned(),
                cdi_root: cluster.cdi_root(),
                real: None,
                _embedded: None,
                _dir: None,
            };
            (stage, Some(cluster))
        }
        Target::Cluster {
            client,
            node,
            namespace,
            timeout,
        } => {
            // Short paths keep the socket names far from the 108-byte limit.
            let dir = tempfile::Builder::new()
                .prefix("gpu-demo")
                .tempdir()
                .map_err(err("creating the kubelet directories"))?;
            for sub in ["registry", "plugins", "cdi"] {
                std::fs::create_dir_all(dir.path().join(sub))
                    .map_err(err("creating the kubelet directories"))?;
            }
            let stage = Stage {
                client,
                node,
                namespace,
                cdi_root: dir.path().join("cdi"),
                real: Some(timeout),
                _embedded: None,
                _dir: Some(dir),
            };
            (stage, None)
        }
    };
    let node = stage.node.clone();
    let cli = <Cli as clap::Parser>::try_parse_from([
        "gpu-kubelet-plugin",
        "--node-name",
        &node,
        "--mock-profile",
        profile,
    ])
    .map_err(|error| DemoError::Setup(error.to_string()))?;
    let nvidia = tokio::task::spawn_blocking(move || NvidiaPlugin::from_args(&cli.nvidia))
        .await
        .map_err(|error| DemoError::Setup(error.to_string()))?
        .map_err(|error| DemoError::Setup(error.to_string()))?;
    let client = stage.client.clone();

    let classes: Api<DeviceClass> = Api::all(client.clone());
    out.line(format!(
        "mock machine {profile} on node {node}; DeviceClasses:"
    ));
    let mut created_classes = Vec::new();
    for class in device_classes() {
        let name = class.metadata.name.clone().unwrap_or_default();
        match classes.create(&PostParams::default(), &class).await {
            Ok(_) => created_classes.push(name.clone()),
            // A real cluster may have them from the chart: used as they are, left alone.
            Err(kube::Error::Api(status)) if status.code == 409 && stage.real.is_some() => {}
            Err(error) => return Err(err(format!("creating DeviceClass {name}"))(error)),
        }
        let cel = class
            .spec
            .as_ref()
            .and_then(|spec| spec.selectors.as_ref())
            .and_then(|selectors| selectors.first())
            .and_then(|selector| selector.cel.as_ref())
            .map_or("", |cel| cel.expression.as_str())
            .to_owned();
        out.line(format!("  {name}: {cel}"));
    }

    let kind = cdi_kind().map_err(err("the CDI kind"))?;
    let resources = nvidia.resources(&node);
    let plugin = match (&embedded, &stage._dir) {
        (Some(cluster), _) => cluster
            .plugin(nvidia.driver.clone(), DRIVER_NAME)
            .cdi_kind(kind)
            .resources(resources)
            .start()
            .await
            .map_err(err("starting the plugin"))?,
        (None, dir) => {
            let dir = dir
                .as_ref()
                .map(|d| d.path().to_owned())
                .unwrap_or_default();
            dra_sdk::plugin::KubeletPlugin::builder(
                nvidia.driver.clone(),
                DRIVER_NAME,
                &node,
                client.clone(),
            )
            .registrar_dir(dir.join("registry"))
            .plugins_dir(dir.join("plugins"))
            .cdi_root(stage.cdi_root.clone())
            .cdi_kind(kind)
            .resources(resources)
            .start()
            .await
            .map_err(err("starting the plugin"))?
        }
    };
    let result = drive(&stage, &plugin, &mut out).await;
    // Stop the plugin whatever happened; the cluster's directory goes with `cluster`.
    let stopped = plugin.shutdown().await.map_err(err("stopping the plugin"));
    let cleaned = cleanup(&stage, &created_classes).await;
    let mut report = result?;
    stopped?;
    cleaned?;
    drop(nvidia);
    drop(embedded);
    out.line(format!(
        "deleted the pods, claims, template{}",
        if created_classes.is_empty() {
            ""
        } else {
            " and DeviceClasses"
        }
    ));
    let problems = report.problems();
    out.line(format!(
        "\nsummary: {} claims, {} allocated, {} prepared, {} failed ({}), {} unprepared, \
         shared GPU seen by {} containers as {}, {} CDI spec files left, {} steps left out: {}",
        report.claims,
        report.allocated,
        report.prepared,
        report.failed.len(),
        report
            .failed
            .iter()
            .map(|(claim, _)| claim.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        report.unprepared,
        report.shared_uuids.len(),
        report.shared_uuids.first().map_or("-", String::as_str),
        report.cdi_files_left,
        report.skipped.len(),
        if problems.is_empty() {
            "OK".to_owned()
        } else {
            problems.join("; ")
        }
    ));
    report.text = out.text;
    Ok(report)
}

/// The pods, claims and template of the demo: the ones it creates are labelled so.
const DEMO_LABEL: (&str, &str) = ("app.kubernetes.io/managed-by", "gpu-demo");

fn labels() -> Value {
    json!({ DEMO_LABEL.0: DEMO_LABEL.1 })
}

/// Deletes what the demo created: pods first (without grace: no container ever ran), then
/// claims, the template, the DeviceClasses it created and, on a real cluster, the plugin's
/// ResourceSlices (no kubelet knows this plugin, so none would). The cluster's resourceclaim
/// controller finishes deleting allocated claims once their pods are gone; the embedded
/// cluster goes as a whole.
async fn cleanup(stage: &Stage, created_classes: &[String]) -> Result<(), DemoError> {
    let params = DeleteParams::default().grace_period(0);
    let selector = ListParams::default().labels(&format!("{}={}", DEMO_LABEL.0, DEMO_LABEL.1));
    let client = &stage.client;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &stage.namespace);
    pods.delete_collection(&params, &selector)
        .await
        .map_err(err("deleting the demo's pods"))?;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &stage.namespace);
    claims
        .delete_collection(&params, &selector)
        .await
        .map_err(err("deleting the demo's claims"))?;
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), &stage.namespace);
    templates
        .delete_collection(&params, &selector)
        .await
        .map_err(err("deleting the demo's template"))?;
    let classes: Api<DeviceClass> = Api::all(client.clone());
    for name in created_classes {
        classes
            .delete(name, &DeleteParams::default())
            .await
            .map_err(err(format!("deleting DeviceClass {name}")))?;
    }
    if stage.real.is_some() {
        let slices: Api<ResourceSlice> = Api::all(client.clone());
        slices
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().fields(&format!(
                    "spec.driver={DRIVER_NAME},spec.nodeName={}",
                    stage.node
                )),
            )
            .await
            .map_err(err("deleting the demo's ResourceSlices"))?;
    }
    Ok(())
}

/// Waits until the cluster's scheduler allocated the claim of `pod` (named `claim`, or the one
/// the resourceclaim controller made from the template) and reserved it for the pod.
async fn await_allocation(
    stage: &Stage,
    pod: &str,
    pod_uid: &str,
    claim: Option<&str>,
    timeout: std::time::Duration,
) -> Result<ResourceClaim, String> {
    let pods: Api<Pod> = Api::namespaced(stage.client.clone(), &stage.namespace);
    let claims: Api<ResourceClaim> = Api::namespaced(stage.client.clone(), &stage.namespace);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let name = match claim {
            Some(name) => Some(name.to_owned()),
            None => pods
                .get(pod)
                .await
                .map_err(|error| format!("reading pod {pod}: {error}"))?
                .status
                .and_then(|status| status.resource_claim_statuses)
                .and_then(|statuses| statuses.into_iter().find_map(|s| s.resource_claim_name)),
        };
        if let Some(name) = name
            && let Some(found) = claims
                .get_opt(&name)
                .await
                .map_err(|error| format!("reading claim {name}: {error}"))?
        {
            let status = found.status.as_ref();
            let reserved = status
                .filter(|status| status.allocation.is_some())
                .and_then(|status| status.reserved_for.as_ref())
                .is_some_and(|consumers| consumers.iter().any(|c| c.uid == pod_uid));
            if reserved {
                return Ok(found);
            }
        }
        if tokio::time::Instant::now() >= deadline {
            let events =
                dra_sdk_testing::e2e::workload::pod_events(&stage.client, &stage.namespace, pod)
                    .await;
            return Err(format!(
                "not allocated and reserved for pod {pod} within {timeout:?} (events: {})",
                events.join(" | ")
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

async fn drive(
    stage: &Stage,
    plugin: &dra_sdk::plugin::KubeletPlugin,
    out: &mut Out,
) -> Result<DemoReport, DemoError> {
    let client = stage.client.clone();
    let node = stage.node.as_str();
    tokio::time::timeout(PUBLISH_TIMEOUT, plugin.published())
        .await
        .map_err(err("waiting for the ResourceSlices"))?;
    let kubelet = dra_sdk_testing::kubelet::KubeletSimulator::new(KubeletVersion::V1_36)
        .register(&plugin.socket_paths().registration)
        .await
        .map_err(err("registering with the simulated kubelet"))?;
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let devices: Vec<_> = slices
        .list(
            &ListParams::default()
                .fields(&format!("spec.driver={DRIVER_NAME},spec.nodeName={node}")),
        )
        .await
        .map_err(err("listing ResourceSlices"))?
        .items
        .into_iter()
        .flat_map(|slice| slice.spec.devices.unwrap_or_default())
        .collect();
    let attribute = |device: &k8s_openapi::api::resource::v1::Device, name: &str| {
        device
            .attributes
            .as_ref()
            .and_then(|attributes| attributes.get(name))
            .and_then(|value| value.string.clone())
    };
    let of_type = |kind: &str| {
        devices
            .iter()
            .filter(|device| attribute(device, "type").as_deref() == Some(kind))
            .count()
    };
    out.line(format!(
        "published {} devices on {node}: {} GPUs, {} MIG devices",
        devices.len(),
        of_type("gpu"),
        of_type("mig")
    ));
    let full_gpus: Vec<FullGpu> = devices
        .iter()
        .filter(|device| attribute(device, "type").as_deref() == Some("gpu"))
        .map(|device| FullGpu {
            product: attribute(device, "productName").unwrap_or_default(),
            memory_mib: device
                .capacity
                .as_ref()
                .and_then(|capacity| capacity.get("memory"))
                .and_then(|memory| quantity_mib(&memory.value.0))
                .unwrap_or(0),
        })
        .collect();
    let mut mig_devices: BTreeMap<String, usize> = BTreeMap::new();
    for profile in devices
        .iter()
        .filter_map(|device| attribute(device, "profile"))
    {
        *mig_devices.entry(profile).or_default() += 1;
    }
    if mig_devices.is_empty() {
        out.line("no MIG devices on this machine: the MIG steps are left out");
    }
    let uuid_of = |name: &str| {
        devices
            .iter()
            .find(|device| device.name == name)
            .and_then(|device| attribute(device, "uuid"))
            .unwrap_or_default()
    };

    let (plans, skipped) = plan(&full_gpus, &mig_devices);
    for step in &skipped {
        out.line(format!(
            "left out on this machine: claim {} ({})",
            step.claim, step.why
        ));
    }
    let namespace = stage.namespace.as_str();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), namespace);
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), namespace);
    let mut report = DemoReport {
        claims: plans.len(),
        mig_steps: !mig_devices.is_empty(),
        skipped,
        ..DemoReport::default()
    };
    let mut allocated: Vec<(&Workload, ClaimRef)> = Vec::new();
    out.line("");
    // One pod at a time, each allocated before the next is made: claims then take devices in
    // the planned order, which the plan counts on (see `plan`).
    for plan in &plans {
        let pod_claim = match plan.template {
            Some(template) => {
                let object = from_json(json!({
                    "metadata": { "name": template, "namespace": namespace, "labels": labels() },
                    "spec": { "spec": plan.spec },
                }))?;
                templates
                    .create(&PostParams::default(), &object)
                    .await
                    .map_err(err(format!("creating ResourceClaimTemplate {template}")))?;
                json!({ "name": "gpu", "resourceClaimTemplateName": template })
            }
            None => json!({ "name": "gpu", "resourceClaimName": plan.claim }),
        };
        let containers: Vec<Value> = plan
            .containers
            .iter()
            .map(|name| json!({ "name": name, "image": POD_IMAGE, "resources": { "claims": [{ "name": "gpu" }] } }))
            .collect();
        // The embedded cluster has no scheduler: the pod is bound to the node directly. A
        // real cluster's scheduler places it by the node's hostname label and allocates.
        let placement = match stage.real {
            None => json!({ "nodeName": node }),
            Some(_) => json!({ "nodeSelector": { "kubernetes.io/hostname": node } }),
        };
        let mut spec = json!({
            "containers": containers,
            "resourceClaims": [pod_claim],
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
        });
        if let (Some(spec), Some(placement)) = (spec.as_object_mut(), placement.as_object()) {
            spec.extend(placement.clone());
        }
        let pod: Pod = from_json(json!({
            "metadata": { "name": plan.pod, "namespace": namespace, "labels": labels() },
            "spec": spec,
        }))?;
        // The claim, owned by `owner` (pod name and UID) when given.
        let create_claim = |owner: Option<&str>| {
            let mut metadata =
                json!({ "name": plan.claim, "namespace": namespace, "labels": labels() });
            if let Some(uid) = owner {
                metadata["ownerReferences"] = json!([{
                    "apiVersion": "v1", "kind": "Pod", "name": plan.pod, "uid": uid,
                    "controller": true,
                }]);
            }
            let claims = &claims;
            let claim =
                from_json::<ResourceClaim>(json!({ "metadata": metadata, "spec": plan.spec }));
            async move {
                claims
                    .create(&PostParams::default(), &claim?)
                    .await
                    .map_err(err(format!("creating claim {}", plan.claim)))
            }
        };
        // A template's claim is made by the resourceclaim controller, owned by the pod: on the
        // embedded cluster, which has none, by the demo below once the pod has its UID.
        if plan.template.is_none() {
            create_claim(None).await?;
        }
        let pod = pods
            .create(&PostParams::default(), &pod)
            .await
            .map_err(err(format!("creating pod {}", plan.pod)))?;
        let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
        let outcome = match stage.real {
            None => {
                if plan.template.is_some() {
                    create_claim(Some(&pod_uid)).await?;
                }
                allocate_claim(
                    &client,
                    namespace,
                    &plan.claim,
                    node,
                    Some((plan.pod, &pod_uid)),
                )
                .await
                .map_err(|error| error.to_string())
            }
            Some(timeout) => {
                let named = plan.template.is_none().then_some(plan.claim.as_str());
                await_allocation(stage, plan.pod, &pod_uid, named, timeout).await
            }
        }
        .and_then(|claim| claim_ref(&claim).map_err(|error| error.to_string()));
        match outcome {
            Ok(reference) => {
                out.line(format!("claim {} ({}) allocated", plan.claim, plan.what));
                report.allocated += 1;
                allocated.push((plan, reference));
            }
            Err(message) => {
                out.line(format!(
                    "claim {} ({}): allocation FAILED: {message}",
                    plan.claim, plan.what
                ));
                report.failed.push((plan.claim.clone(), message));
            }
        }
    }

    let cdi_root = stage.cdi_root.clone();
    for (plan, reference) in &allocated {
        let answer = kubelet
            .prepare(std::slice::from_ref(reference))
            .await
            .map_err(err("NodePrepareResources"))?;
        out.line(format!(
            "\npod {} uses claim {} ({}):",
            plan.pod, plan.claim, plan.what
        ));
        match answer.get(&reference.uid) {
            Some(Ok(prepared)) => {
                report.prepared += 1;
                for container in plan.containers {
                    out.line(format!("  container {container}:"));
                    for device in prepared {
                        let uuid = uuid_of(&device.device);
                        if plan.pod == SHARED_GPU_CLAIM {
                            report.shared_uuids.push(uuid.clone());
                        }
                        out.line(format!("    device {} (uuid {uuid})", device.device));
                        out.line(format!("      CDI {}", device.cdi_device_ids.join(", ")));
                    }
                    let (env, nodes) = cdi_edits(&cdi_root, prepared)?;
                    out.line(format!("      env {}", env.join(" ")));
                    out.line(format!("      device nodes {}", nodes.join(" ")));
                }
            }
            Some(Err(message)) => {
                out.line(format!("  prepare FAILED (as the config says): {message}"));
                report.failed.push((plan.claim.clone(), message.clone()));
            }
            None => report
                .failed
                .push((plan.claim.clone(), "no prepare answer".into())),
        }
    }

    let references: Vec<ClaimRef> = allocated.iter().map(|(_, r)| r.clone()).collect();
    if !references.is_empty() {
        let answers = kubelet
            .unprepare(&references)
            .await
            .map_err(err("NodeUnprepareResources"))?;
        report.unprepared = answers.values().filter(|answer| answer.is_ok()).count();
    }
    report.cdi_files_left = std::fs::read_dir(&cdi_root)
        .map_err(err("reading the CDI directory"))?
        .count();
    out.line(format!("\nunprepared {} claims", report.unprepared));
    Ok(report)
}

fn from_json<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, DemoError> {
    serde_json::from_value(value).map_err(err("building an object"))
}

/// The env and device nodes a container using `devices` gets: the spec-level and device-level
/// edits of the CDI spec files defining their CDI names.
fn cdi_edits(
    cdi_root: &Path,
    devices: &[KubeletDevice],
) -> Result<(Vec<String>, Vec<String>), DemoError> {
    let mut env = BTreeSet::new();
    let mut nodes = BTreeSet::new();
    let ids: BTreeSet<&str> = devices
        .iter()
        .flat_map(|d| &d.cdi_device_ids)
        .map(String::as_str)
        .collect();
    for entry in std::fs::read_dir(cdi_root).map_err(err("reading the CDI directory"))? {
        let path = entry.map_err(err("reading the CDI directory"))?.path();
        let spec = Spec::read_file(&path).map_err(err(format!("reading {}", path.display())))?;
        for device in &spec.devices {
            if !ids.contains(format!("{}={}", spec.kind, device.name).as_str()) {
                continue;
            }
            for edits in [&spec.container_edits, &device.container_edits] {
                env.extend(edits.env.iter().cloned());
                nodes.extend(edits.device_nodes.iter().map(|node| node.path.clone()));
            }
        }
    }
    Ok((env.into_iter().collect(), nodes.into_iter().collect()))
}

/// The report being written, echoed on stdout when printing.
struct Out {
    text: String,
    print: bool,
}

impl Out {
    fn line(&mut self, line: impl AsRef<str>) {
        if self.print {
            println!("{}", line.as_ref());
        }
        // Writing to a String cannot fail.
        let _ = writeln!(self.text, "{}", line.as_ref());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(list: &[(&str, u64)]) -> Vec<FullGpu> {
        list.iter()
            .map(|(product, memory_mib)| FullGpu {
                product: (*product).to_owned(),
                memory_mib: *memory_mib,
            })
            .collect()
    }

    fn claims(plans: &[Workload]) -> Vec<&str> {
        plans.iter().map(|plan| plan.claim.as_str()).collect()
    }

    #[test]
    fn quantities_become_mib() {
        assert_eq!(quantity_mib("81559Mi"), Some(81559));
        assert_eq!(quantity_mib("40Gi"), Some(40 * 1024));
        assert_eq!(quantity_mib("1073741824"), Some(1024));
        assert_eq!(quantity_mib("16G"), Some(15258));
        assert_eq!(quantity_mib("1.5Gi"), None);
        assert_eq!(quantity_mib("lots"), None);
    }

    #[test]
    fn three_big_gpus_run_every_full_gpu_step_narrowest_first() {
        let (plans, skipped) = plan(&gpus(&[("A100", 81559); 3]), &BTreeMap::new());
        assert_eq!(
            claims(&plans),
            ["by-memory", "by-product", SHARED_GPU_CLAIM]
        );
        let left: Vec<&str> = skipped.iter().map(|s| s.claim.as_str()).collect();
        assert_eq!(left, ["mig-job-0-mig", "by-profile", WRONG_TYPE_CLAIM]);
    }

    #[test]
    fn one_small_gpu_runs_the_shared_gpu_only_and_says_why() {
        let (plans, skipped) = plan(&gpus(&[("Tesla T4", 15360)]), &BTreeMap::new());
        assert_eq!(claims(&plans), [SHARED_GPU_CLAIM]);
        assert!(
            skipped
                .iter()
                .any(|s| s.claim == "by-memory" && s.why.contains("no full GPU has 40Gi"))
        );
        assert!(skipped.iter().any(|s| s.claim == "by-product"));
    }

    #[test]
    fn the_product_step_counts_on_a_gpu_the_memory_step_cannot_have_taken() {
        // One big A100 and one small T4: the memory step takes the A100, the product step
        // must ask for the T4, and nothing is left for the shared GPU... which has priority.
        let machine = gpus(&[("A100", 40960), ("Tesla T4", 15360), ("Tesla T4", 15360)]);
        let (plans, _) = plan(&machine, &BTreeMap::new());
        assert_eq!(
            claims(&plans),
            ["by-memory", "by-product", SHARED_GPU_CLAIM]
        );
        assert!(plans[1].what.contains("Tesla T4"), "{}", plans[1].what);
        let (plans, skipped) = plan(&machine[..2], &BTreeMap::new());
        assert_eq!(claims(&plans), ["by-memory", SHARED_GPU_CLAIM]);
        assert!(skipped.iter().any(|s| s.claim == "by-product"));
    }

    #[test]
    fn mig_steps_share_out_the_mig_devices() {
        let two = BTreeMap::from([("1g.5gb".to_owned(), 2)]);
        let (plans, skipped) = plan(&[], &two);
        assert_eq!(claims(&plans), ["mig-job-0-mig", WRONG_TYPE_CLAIM]);
        let left: Vec<&str> = skipped.iter().map(|s| s.claim.as_str()).collect();
        assert_eq!(
            left,
            [SHARED_GPU_CLAIM, "by-memory", "by-product", "by-profile"]
        );
        let mixed = BTreeMap::from([
            ("1g.5gb".to_owned(), 2),
            ("2g.10gb".to_owned(), 1),
            ("3g.20gb".to_owned(), 1),
        ]);
        let (plans, _) = plan(&[], &mixed);
        assert!(
            plans
                .iter()
                .any(|p| p.claim == "by-profile" && p.what.contains("3g.20gb"))
        );
    }
}
