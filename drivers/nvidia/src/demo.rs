//! `gpu-demo`: the NVIDIA driver without a GPU, end to end in an embedded cluster or on a real
//! API server.
//!
//! Runs the plugin on a mock machine (a shipped profile such as `dgx-a100`, or a profile
//! file) with the test kit's demo runner ([`dra_sdk_testing::demo`]: fake API server or a real
//! one, simulated kubelet 1.36, the SDK's scheduler-like allocator with CEL when there is no
//! scheduler) and walks what the public guides for this driver have operators do: list the
//! DeviceClasses, run a pod whose claim comes from a ResourceClaimTemplate asking for one MIG
//! slice, a pod whose two containers share one full GPU, claims selecting devices by CEL on
//! `productName`, on the memory capacity and on the MIG `profile`, a `GpuConfig` and a
//! `MigDeviceConfig`, and a config on the wrong device type, which fails alone. For every
//! container it prints the devices with their UUIDs, the CDI device names, and the environment
//! and device nodes it would get (read back from the CDI spec files the plugin wrote), then
//! unprepares and deletes everything.
//!
//! The pods run side by side, each claim holding its devices: the demo plans its steps for the
//! machine ([`plan`]) and leaves out, saying why ([`NvidiaExtra::skipped`]), the steps whose
//! devices the machine cannot spare: all full-GPU steps need three full GPUs, one with at least
//! 40Gi (`dgx-a100` and `dgx-h100` have them; `mixed` and `workstation` have one T4, so only the
//! shared GPU runs there), the MIG steps need MIG devices (none on `dgx-h100` and
//! `workstation`). What it runs must then succeed: a claim of a planned step that fails is a
//! problem ([`DemoReport::problems`](dra_sdk_testing::demo::DemoReport::problems)).
//!
//! In the embedded cluster the runner binds the pods to the node, makes the template's claim as
//! the resourceclaim controller would, and allocates; on a real API server
//! ([`Target::Cluster`], `gpu-demo --kubeconfig`) the pods select the node, the cluster's
//! scheduler allocates and its resourceclaim controller makes the template's claim.

use std::collections::BTreeMap;

use dra_sdk::plugin::KubeletPlugin;
use dra_sdk_testing::cluster::NewClaim;
use dra_sdk_testing::demo::{
    self, DemoDriver, DemoPod, ExpectedFailure, Out, ReportExtra, Stage, Step, Workload,
};
pub use dra_sdk_testing::demo::{AllocationMode, DemoError, RunOptions, Target};
use dra_sdk_testing::kubelet::KubeletDevice;
use k8s_openapi::api::resource::v1::{Device, DeviceClass, ResourceSlice};
use serde_json::json;

use crate::config::API_VERSION;
use crate::devices::{DRIVER_NAME, GPU_DEVICE_CLASS, MIG_DEVICE_CLASS, device_classes};
use crate::plugin::{Cli, NvidiaPlugin, cdi_kind};

/// The profile the demo runs on by default: 8 A100-80GB, some in MIG mode.
pub const DEFAULT_PROFILE: &str = "dgx-a100";
/// The claim whose config is of the wrong kind; it must fail, at prepare, alone.
pub const WRONG_TYPE_CLAIM: &str = "wrong-type";
/// What the driver must say about [`WRONG_TYPE_CLAIM`].
pub const WRONG_TYPE_ERROR: &str = "GpuConfig (resource.nvidia.com/v1beta1) cannot configure MIG";
const ATTRIBUTES: &str = "device.attributes['gpu.nvidia.com']";

/// What happened.
pub type DemoReport = demo::DemoReport<NvidiaExtra>;

/// The NVIDIA demo's own part of the report.
#[derive(Clone, Debug, Default)]
pub struct NvidiaExtra {
    /// The UUIDs the containers of the shared-GPU pod saw, one per container.
    pub shared_uuids: Vec<String>,
    /// Whether the machine has MIG devices, so that the MIG steps (template, profile,
    /// wrong-type config) ran.
    pub mig_steps: bool,
    /// The steps left out because the machine cannot spare their devices, with why.
    pub skipped: Vec<Skipped>,
}

impl ReportExtra for NvidiaExtra {
    /// Both containers of the shared-GPU pod must see one GPU, when that step ran.
    fn problems(&self) -> Vec<String> {
        let shared_ran = !self.skipped.iter().any(|s| s.claim == SHARED_GPU_CLAIM);
        let one_uuid_twice =
            self.shared_uuids.len() == 2 && self.shared_uuids[0] == self.shared_uuids[1];
        if shared_ran && !one_uuid_twice {
            vec![format!(
                "the shared-GPU containers saw {:?}, not one UUID twice",
                self.shared_uuids
            )]
        } else {
            Vec::new()
        }
    }
}

/// Runs the demo on the mock `profile` (a shipped name or a file) in the embedded cluster and
/// returns its report, printed on stdout as it goes when `print`. The report's
/// [`problems`](dra_sdk_testing::demo::DemoReport::problems) say whether it went as it must.
pub async fn run(profile: &str, print: bool) -> Result<DemoReport, DemoError> {
    let mut options = RunOptions::new(Target::Embedded);
    options.print = print;
    run_on(profile, options).await
}

/// [`run`] where and how `options` say.
pub async fn run_on(profile: &str, options: RunOptions) -> Result<DemoReport, DemoError> {
    let mut nvidia = NvidiaDemo {
        profile: profile.to_owned(),
        plugin: None,
        uuids: BTreeMap::new(),
    };
    demo::run(&mut nvidia, options).await
}

/// The NVIDIA driver's part of the demo.
struct NvidiaDemo {
    profile: String,
    /// The plugin's hardware, kept for the run (the mock machine's files live with it).
    plugin: Option<NvidiaPlugin>,
    /// The UUID of each published device, by name.
    uuids: BTreeMap<String, String>,
}

impl DemoDriver for NvidiaDemo {
    type Extra = NvidiaExtra;

    fn label(&self) -> &str {
        "gpu-demo"
    }

    fn driver_name(&self) -> &str {
        DRIVER_NAME
    }

    fn device_classes(&self) -> Vec<DeviceClass> {
        device_classes()
    }

    fn uses_templates(&self) -> bool {
        true
    }

    async fn start_plugin(
        &mut self,
        stage: &Stage,
        out: &mut Out,
    ) -> Result<KubeletPlugin, DemoError> {
        let setup = |message: String| DemoError::Setup {
            what: "the NVIDIA plugin".into(),
            message,
        };
        let node = stage.node().to_owned();
        out.line(format!("mock machine {} on node {node}", self.profile));
        let cli = <Cli as clap::Parser>::try_parse_from([
            "gpu-kubelet-plugin",
            "--node-name",
            &node,
            "--mock-profile",
            &self.profile,
        ])
        .map_err(|error| setup(error.to_string()))?;
        let nvidia = tokio::task::spawn_blocking(move || NvidiaPlugin::from_args(&cli.nvidia))
            .await
            .map_err(|error| setup(error.to_string()))?
            .map_err(|error| setup(error.to_string()))?;
        let kind = cdi_kind().map_err(|error| setup(format!("the CDI kind: {error}")))?;
        let plugin = stage
            .plugin(nvidia.driver.clone(), DRIVER_NAME)
            .cdi_kind(kind)
            .resources(nvidia.resources(&node))
            .start()
            .await
            .map_err(|source| DemoError::Plugin {
                action: "starting the plugin",
                source,
            })?;
        self.plugin = Some(nvidia);
        Ok(plugin)
    }

    fn plan(
        &mut self,
        stage: &Stage,
        slices: &[ResourceSlice],
        out: &mut Out,
        extra: &mut NvidiaExtra,
    ) -> Vec<Workload> {
        let devices: Vec<&Device> = slices
            .iter()
            .flat_map(|slice| slice.spec.devices.iter().flatten())
            .collect();
        let of_type = |kind: &str| {
            devices
                .iter()
                .filter(|device| attribute(device, "type").as_deref() == Some(kind))
                .count()
        };
        out.line(format!(
            "published {} devices on {}: {} GPUs, {} MIG devices",
            devices.len(),
            stage.node(),
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
        self.uuids = devices
            .iter()
            .filter_map(|device| Some((device.name.clone(), attribute(device, "uuid")?)))
            .collect();
        let (workloads, skipped) = plan(&full_gpus, &mig_devices);
        for step in &skipped {
            out.line(format!(
                "left out on this machine: claim {} ({})",
                step.claim, step.why
            ));
        }
        extra.mig_steps = !mig_devices.is_empty();
        extra.skipped = skipped;
        workloads
    }

    fn device_note(
        &self,
        workload: &Workload,
        _container: &str,
        device: &KubeletDevice,
        extra: &mut NvidiaExtra,
    ) -> String {
        let uuid = self.uuids.get(&device.device).cloned().unwrap_or_default();
        if workload.claim == SHARED_GPU_CLAIM {
            extra.shared_uuids.push(uuid.clone());
        }
        format!(" (uuid {uuid})")
    }

    fn summary(&self, report: &DemoReport) -> String {
        let problems = report.problems();
        let failed: Vec<&str> = report.failed.iter().map(|f| f.claim.as_str()).collect();
        format!(
            "\nsummary: {} claims, {} allocated, {} prepared, {} failed ({}), {} unprepared, \
             shared GPU seen by {} containers as {}, {} CDI spec files left, {} steps left out: {}",
            report.claims,
            report.allocated,
            report.prepared,
            report.failed.len(),
            failed.join(", "),
            report.unprepared,
            report.extra.shared_uuids.len(),
            report
                .extra
                .shared_uuids
                .first()
                .map_or("-", String::as_str),
            report.cdi_files_left,
            report.extra.skipped.len(),
            if problems.is_empty() {
                "OK".to_owned()
            } else {
                problems.join("; ")
            }
        )
    }
}

/// A string attribute of a published device.
fn attribute(device: &Device, name: &str) -> Option<String> {
    device
        .attributes
        .as_ref()
        .and_then(|attributes| attributes.get(name))
        .and_then(|value| value.string.clone())
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

/// One request of the class, with a CEL selector when given.
fn request(name: &str, class: &str, selector: Option<&str>) -> NewClaim {
    let claim = NewClaim::new("", "").request(name, class);
    match selector {
        Some(expression) => claim.selector(expression),
        None => claim,
    }
}

/// `claim` with an opaque config of `kind` for its request `request`.
fn configured(claim: NewClaim, request: &str, kind: &str) -> NewClaim {
    let parameters = json!({ "apiVersion": API_VERSION, "kind": kind });
    claim.config(&[request], DRIVER_NAME, parameters)
}

/// The workload of a pod `pod` with one container `main` using the claim `claim`.
fn single(pod: &str, claim: &str, what: String, spec: NewClaim) -> Workload {
    Workload::new(claim, what, spec, vec![DemoPod::new(pod, &["main"])])
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
            let what = format!("one {profile} MIG slice, from ResourceClaimTemplate mig-slice");
            list.push(
                single("mig-job-0", "mig-job-0-mig", what, mig(profile)).from_template("mig-slice"),
            );
        }
    }
    for step in full_steps {
        list.push(match step {
            FullStep::Memory => single(
                "by-memory",
                "by-memory",
                "memory >= 40Gi".into(),
                gpu(Some(
                    "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity(\"40Gi\")) >= 0",
                )),
            ),
            FullStep::Product(product) => single(
                "by-product",
                "by-product",
                format!("productName == '{product}', with a GpuConfig"),
                configured(
                    gpu(Some(&format!("{ATTRIBUTES}.productName == '{product}'"))),
                    "gpu",
                    "GpuConfig",
                ),
            ),
            FullStep::Shared => Workload::new(
                SHARED_GPU_CLAIM,
                "one full GPU shared by two containers",
                gpu(None),
                vec![DemoPod::new(SHARED_GPU_CLAIM, &["ctr0", "ctr1"])],
            ),
        });
    }
    for step in mig_steps {
        match step {
            MigStep::Job(_) => {}
            MigStep::Profile(profile) => list.push(single(
                "by-profile",
                "by-profile",
                format!("MIG profile == '{profile}', with a MigDeviceConfig"),
                configured(mig(profile), "mig", "MigDeviceConfig"),
            )),
            MigStep::WrongType(profile) => list.push(
                single(
                    WRONG_TYPE_CLAIM,
                    WRONG_TYPE_CLAIM,
                    format!("a {profile} MIG slice with a GpuConfig: must fail"),
                    configured(mig(profile), "mig", "GpuConfig"),
                )
                .must_fail(ExpectedFailure {
                    step: Step::Prepare,
                    error: WRONG_TYPE_ERROR.into(),
                    because: "its GpuConfig is on a MIG device".into(),
                }),
            ),
        }
    }
    list
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
