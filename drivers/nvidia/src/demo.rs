//! `gpu-demo`: the NVIDIA driver without a GPU, end to end in an embedded cluster.
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
//! The pods run side by side: the full-GPU steps need three free full GPUs, one with at least
//! 40Gi (`dgx-a100` and `dgx-h100` have them; on `mixed` and `workstation` the claims without a
//! free matching GPU fail to allocate, and [`DemoReport::problems`] lists them). A machine
//! without MIG devices leaves the MIG steps out.
//!
//! The embedded cluster runs no controllers, so the demo does their part: it binds pods to
//! the node (`spec.nodeName`), creates the claim of a template pod as the resourceclaim
//! controller would, and allocates with [`allocate_claim`] as the scheduler would. A real
//! API server (`--kubeconfig`) is not supported yet: [`DemoError::RealClusterUnsupported`].

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use dra_sdk::cdi::Spec;
use dra_sdk::driver::ClaimRef;
use dra_sdk::testing::allocator::allocate_claim;
use dra_sdk::testing::cluster::{NODE_NAME, TestCluster, claim_ref};
use dra_sdk::testing::kubelet::{KubeletDevice, KubeletVersion};
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
const PUBLISH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
const ATTRIBUTES: &str = "device.attributes['gpu.nvidia.com']";

/// Why the demo could not run to the end (a claim failing is not one: see [`DemoReport`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DemoError {
    /// `--kubeconfig` was given.
    #[error(
        "--kubeconfig: running against a real API server is not supported yet by gpu-demo; run it without --kubeconfig (embedded cluster)"
    )]
    RealClusterUnsupported,
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
            None if self.mig_steps => {
                problems.push(format!("claim {WRONG_TYPE_CLAIM} did not fail"));
            }
            None => {}
        }
        if self.shared_uuids.len() != 2 || self.shared_uuids[0] != self.shared_uuids[1] {
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
}

/// One pod of the demo and the claim it uses.
struct Workload {
    pod: &'static str,
    containers: &'static [&'static str],
    claim: String,
    what: String,
    /// The claim's `spec`.
    spec: Value,
    /// The claim comes from this ResourceClaimTemplate (created with `spec`).
    template: Option<&'static str>,
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

/// The guides' workloads, for what the mock machine publishes: the first GPU's product name,
/// the MIG profiles present (none: the MIG workloads are left out, and said so).
fn workloads(product: &str, mig_profiles: &BTreeSet<String>) -> Vec<Workload> {
    let gpu = |selector: Option<&str>| request("gpu", GPU_DEVICE_CLASS, selector);
    let mut list = vec![
        Workload {
            pod: "shared-gpu",
            containers: &["ctr0", "ctr1"],
            claim: "shared-gpu".into(),
            what: "one full GPU shared by two containers".into(),
            spec: claim_spec(gpu(None), None),
            template: None,
        },
        Workload {
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
        Workload {
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
    ];
    let (Some(first), Some(last)) = (mig_profiles.first(), mig_profiles.last()) else {
        return list;
    };
    let mig = |profile: &str| {
        request(
            "mig",
            MIG_DEVICE_CLASS,
            Some(&format!("{ATTRIBUTES}.profile == '{profile}'")),
        )
    };
    list.insert(
        0,
        Workload {
            pod: "mig-job-0",
            containers: &["main"],
            claim: "mig-job-0-mig".into(),
            what: format!("one {first} MIG slice, from ResourceClaimTemplate mig-slice"),
            spec: claim_spec(mig(first), None),
            template: Some("mig-slice"),
        },
    );
    list.push(Workload {
        pod: "by-profile",
        containers: &["main"],
        claim: "by-profile".into(),
        what: format!("MIG profile == '{last}', with a MigDeviceConfig"),
        spec: claim_spec(mig(last), Some(("mig", "MigDeviceConfig"))),
        template: None,
    });
    list.push(Workload {
        pod: WRONG_TYPE_CLAIM,
        containers: &["main"],
        claim: WRONG_TYPE_CLAIM.into(),
        what: format!("a {first} MIG slice with a GpuConfig: must fail"),
        spec: claim_spec(mig(first), Some(("mig", "GpuConfig"))),
        template: None,
    });
    list
}

/// Runs the demo on the mock `profile` (a shipped name or a file) and returns its report,
/// printed on stdout as it goes when `print`. The report's [`DemoReport::problems`] say
/// whether it went as it must.
pub async fn run(profile: &str, print: bool) -> Result<DemoReport, DemoError> {
    let mut out = Out {
        text: String::new(),
        print,
    };
    let cli = <Cli as clap::Parser>::try_parse_from([
        "gpu-kubelet-plugin",
        "--node-name",
        NODE_NAME,
        "--mock-profile",
        profile,
    ])
    .map_err(|error| DemoError::Setup(error.to_string()))?;
    let nvidia = tokio::task::spawn_blocking(move || NvidiaPlugin::from_args(&cli.nvidia))
        .await
        .map_err(|error| DemoError::Setup(error.to_string()))?
        .map_err(|error| DemoError::Setup(error.to_string()))?;
    let cluster = TestCluster::start()
        .await
        .map_err(err("starting the embedded cluster"))?;
    let client = cluster.client();

    let classes: Api<DeviceClass> = Api::all(client.clone());
    out.line(format!("mock machine {profile}; DeviceClasses:"));
    for class in device_classes() {
        let name = class.metadata.name.clone().unwrap_or_default();
        classes
            .create(&PostParams::default(), &class)
            .await
            .map_err(err(format!("creating DeviceClass {name}")))?;
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

    let plugin = cluster
        .plugin(nvidia.driver.clone(), DRIVER_NAME)
        .cdi_kind(cdi_kind().map_err(err("the CDI kind"))?)
        .resources(nvidia.resources(NODE_NAME))
        .start()
        .await
        .map_err(err("starting the plugin"))?;
    let result = drive(&cluster, &plugin, &mut out).await;
    // Stop the plugin whatever happened; the cluster's directory goes with `cluster`.
    let stopped = plugin.shutdown().await.map_err(err("stopping the plugin"));
    let mut report = result?;
    stopped?;
    drop(nvidia);
    let problems = report.problems();
    out.line(format!(
        "\nsummary: {} claims, {} allocated, {} prepared, {} failed ({}), {} unprepared, \
         shared GPU seen by {} containers as {}, {} CDI spec files left: {}",
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
        if problems.is_empty() {
            "OK".to_owned()
        } else {
            problems.join("; ")
        }
    ));
    report.text = out.text;
    Ok(report)
}

async fn drive(
    cluster: &TestCluster,
    plugin: &dra_sdk::plugin::KubeletPlugin,
    out: &mut Out,
) -> Result<DemoReport, DemoError> {
    let client = cluster.client();
    if let Some(publisher) = plugin.publisher() {
        tokio::time::timeout(PUBLISH_TIMEOUT, publisher.synced())
            .await
            .map_err(err("waiting for the ResourceSlices"))?;
    }
    let kubelet = cluster
        .register(plugin, KubeletVersion::V1_36)
        .await
        .map_err(err("registering with the simulated kubelet"))?;
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let devices: Vec<_> = slices
        .list(&ListParams::default())
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
        "published {} devices on {NODE_NAME}: {} GPUs, {} MIG devices",
        devices.len(),
        of_type("gpu"),
        of_type("mig")
    ));
    let product = devices
        .iter()
        .find(|device| attribute(device, "type").as_deref() == Some("gpu"))
        .and_then(|device| attribute(device, "productName"))
        .unwrap_or_default();
    let profiles: BTreeSet<String> = devices
        .iter()
        .filter_map(|device| attribute(device, "profile"))
        .collect();
    if profiles.is_empty() {
        out.line("no MIG devices on this machine: the MIG steps are left out");
    }
    let uuid_of = |name: &str| {
        devices
            .iter()
            .find(|device| device.name == name)
            .and_then(|device| attribute(device, "uuid"))
            .unwrap_or_default()
    };

    let plans = workloads(&product, &profiles);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), NAMESPACE);
    let mut report = DemoReport {
        claims: plans.len(),
        mig_steps: !profiles.is_empty(),
        ..DemoReport::default()
    };
    let mut allocated: Vec<(&Workload, ClaimRef)> = Vec::new();
    out.line("");
    for plan in &plans {
        let pod_claim = match plan.template {
            Some(template) => {
                let object = from_json(json!({
                    "metadata": { "name": template, "namespace": NAMESPACE },
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
            .map(|name| json!({ "name": name, "image": "ubuntu:24.04", "resources": { "claims": [{ "name": "gpu" }] } }))
            .collect();
        let pod: Pod = from_json(json!({
            "metadata": { "name": plan.pod, "namespace": NAMESPACE },
            "spec": { "nodeName": NODE_NAME, "containers": containers, "resourceClaims": [pod_claim] },
        }))?;
        let pod = pods
            .create(&PostParams::default(), &pod)
            .await
            .map_err(err(format!("creating pod {}", plan.pod)))?;
        let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
        // A template's claim is made by the resourceclaim controller, owned by the pod.
        let owner = plan.template.map(|_| {
            json!([{ "apiVersion": "v1", "kind": "Pod", "name": plan.pod, "uid": pod_uid, "controller": true }])
        });
        let claim: ResourceClaim = from_json(json!({
            "metadata": { "name": plan.claim, "namespace": NAMESPACE, "ownerReferences": owner },
            "spec": plan.spec,
        }))?;
        claims
            .create(&PostParams::default(), &claim)
            .await
            .map_err(err(format!("creating claim {}", plan.claim)))?;
        let outcome = allocate_claim(
            &client,
            NAMESPACE,
            &plan.claim,
            NODE_NAME,
            Some((plan.pod, &pod_uid)),
        )
        .await
        .map_err(|error| error.to_string())
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

    let cdi_root = cluster.cdi_root();
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
                        if plan.pod == "shared-gpu" {
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

    // Clean up as a user would: pods, claims, template, classes. Finalizers the allocator
    // added are the resourceclaim controller's to drop; the embedded cluster goes anyway.
    let params = DeleteParams::default();
    let classes: Api<DeviceClass> = Api::all(client.clone());
    for plan in &plans {
        pods.delete(plan.pod, &params)
            .await
            .map_err(err(format!("deleting pod {}", plan.pod)))?;
        claims
            .delete(&plan.claim, &params)
            .await
            .map_err(err(format!("deleting claim {}", plan.claim)))?;
        if let Some(template) = plan.template {
            templates
                .delete(template, &params)
                .await
                .map_err(err("deleting the template"))?;
        }
    }
    for class in device_classes() {
        let name = class.metadata.name.unwrap_or_default();
        classes
            .delete(&name, &params)
            .await
            .map_err(err(format!("deleting DeviceClass {name}")))?;
    }
    out.line(format!(
        "\nunprepared {} claims; deleted the pods, claims, template and DeviceClasses",
        report.unprepared
    ));
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
