//! Prepare and unprepare: VFIO bind/unbind sequences with their exact sysfs writes and
//! rollback, and whole claims through the kubelet simulator and the fake API server of
//! dra-sdk's testing kit, on a fake host tree. GPU sharing (time-slicing, MPS, consumable
//! shares) is in `prepare/sharing.rs`, a module of this test binary.

mod fixture;
mod sharing;

use std::path::PathBuf;
use std::time::Duration;

use dra_driver_nvidia::backend::GpuInfo;
use dra_driver_nvidia::driver::{DRIVER_NAME, NvidiaDriver, NvidiaGpu, VfioBinder, VfioBinding};
use dra_driver_nvidia::host::{CommandOutput, HostCommand, HostEvent, RootedHost};
use dra_sdk::advanced::cdi::Spec;
use dra_sdk::claim::ClaimRef;
use dra_sdk::plugin::KubeletPlugin;
use dra_sdk_testing::assert_contains;
use dra_sdk_testing::claims::AllocatedClaim;
use dra_sdk_testing::cluster::{NODE_NAME, TestCluster};
use dra_sdk_testing::kubelet::{KubeletVersion, RegisteredPlugin};
use fixture::*;
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use serde_json::{Value, json};

// ---- VFIO sequences ----------------------------------------------------------------------

fn write(path: &str, contents: &str) -> HostEvent {
    HostEvent::write(path, contents)
}

/// The GPU behind a VFIO device, as prepare hands it to the binder.
fn on_nvidia(gpu: &GpuInfo) -> NvidiaGpu {
    NvidiaGpu {
        uuid: gpu.uuid.clone(),
        minor: gpu.minor,
    }
}

fn binder(host: &RootedHost) -> VfioBinder<'_> {
    VfioBinder::new(host, Duration::from_millis(1), Duration::from_millis(30))
}

#[test]
fn vfio_bind_and_restore_write_exactly_what_the_kernel_needs() {
    let f = Fixture::new("workstation");
    let gpu = &f.inventory.gpus[0].info;
    let bdf = gpu.pci.bus_id.as_str();
    // No process holds /dev/nvidia<minor> in the fake /proc: the GPU is idle.
    let binding = binder(&f.host).bind(bdf, Some(&on_nvidia(gpu))).unwrap();
    assert_eq!(
        binding,
        VfioBinding {
            bus_id: bdf.to_owned(),
            iommu_group: 20,
            vfio_driver: "vfio-pci".into(),
            previous_driver: Some("nvidia".into()),
            persistence: None,
        }
    );
    let device = format!("/sys/bus/pci/devices/{bdf}");
    assert_eq!(
        f.host.events(),
        [
            write(&format!("{device}/driver_override"), "\n"),
            write("/sys/bus/pci/drivers/nvidia/unbind", bdf),
            write(&format!("{device}/driver_override"), "vfio-pci"),
            write("/sys/bus/pci/drivers/vfio-pci/bind", bdf),
        ]
    );
    assert_eq!(f.bound_driver(bdf).as_deref(), Some("vfio-pci"));

    f.host.clear_events();
    binder(&f.host).restore(&binding).unwrap();
    assert_eq!(
        f.host.events(),
        [
            write(&format!("{device}/driver_override"), "\n"),
            write("/sys/bus/pci/drivers/vfio-pci/unbind", bdf),
            write("/sys/bus/pci/drivers/nvidia/bind", bdf),
        ]
    );
    assert_eq!(f.bound_driver(bdf).as_deref(), Some("nvidia"));

    // Idempotent: nothing left to undo.
    f.host.clear_events();
    binder(&f.host).restore(&binding).unwrap();
    assert_eq!(f.host.events(), []);
}

#[test]
fn a_busy_gpu_is_not_touched() {
    let f = Fixture::new("workstation");
    let gpu = &f.inventory.gpus[0].info;
    f.holder(4242, "python3", &format!("/dev/nvidia{}", gpu.minor));
    let error = binder(&f.host)
        .bind(&gpu.pci.bus_id, Some(&on_nvidia(gpu)))
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with(&format!("{} is still in use after", gpu.pci.bus_id)),
        "{error}"
    );
    assert_contains(
        &error,
        format!(
            "/dev/nvidia{} is held by PID 4242 (python3); stop them and retry",
            gpu.minor
        ),
    );
    // Nothing written, nothing run.
    assert_eq!(f.host.events(), []);
    assert_eq!(f.bound_driver(&gpu.pci.bus_id).as_deref(), Some("nvidia"));
}

#[test]
fn a_failed_bind_is_rolled_back_to_nvidia() {
    let f = Fixture::new("workstation");
    let gpu = &f.inventory.gpus[0].info;
    let bdf = gpu.pci.bus_id.as_str();
    // vfio-pci is not registered: modprobe "succeeds" but the driver never shows up, so the
    // bind write fails with ENODEV after the GPU was unbound from nvidia.
    std::fs::remove_dir_all(f.host_path("/sys/bus/pci/drivers/vfio-pci")).unwrap();
    f.host.script("modprobe", [CommandOutput::ok("")]);

    let error = binder(&f.host)
        .bind(bdf, Some(&on_nvidia(gpu)))
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "writing {bdf:?} to /sys/bus/pci/drivers/vfio-pci/bind: No such device (os error 19)"
        )
    );
    let device = format!("/sys/bus/pci/devices/{bdf}");
    assert_eq!(
        f.host.events(),
        [
            HostEvent::Command(HostCommand::new("modprobe", ["vfio_pci"]).chrooted()),
            write(&format!("{device}/driver_override"), "\n"),
            write("/sys/bus/pci/drivers/nvidia/unbind", bdf),
            write(&format!("{device}/driver_override"), "vfio-pci"),
            write("/sys/bus/pci/drivers/vfio-pci/bind", bdf),
            // Rollback.
            write(&format!("{device}/driver_override"), "\n"),
            write("/sys/bus/pci/drivers/nvidia/bind", bdf),
        ]
    );
    assert_eq!(f.bound_driver(bdf).as_deref(), Some("nvidia"));
}

#[test]
fn modprobe_failures_are_reported_before_any_write() {
    let f = Fixture::new("workstation");
    let gpu = &f.inventory.gpus[0].info;
    std::fs::remove_dir_all(f.host_path("/sys/bus/pci/drivers/vfio-pci")).unwrap();
    f.host.script(
        "modprobe",
        [CommandOutput::failed(
            1,
            "modprobe: FATAL: Module vfio_pci not found.\n",
        )],
    );
    assert_eq!(
        binder(&f.host)
            .bind(&gpu.pci.bus_id, Some(&on_nvidia(gpu)))
            .unwrap_err()
            .to_string(),
        "loading kernel module vfio_pci failed: modprobe: FATAL: Module vfio_pci not found."
    );
    assert_eq!(f.bound_driver(&gpu.pci.bus_id).as_deref(), Some("nvidia"));
}

#[test]
fn the_best_vfio_variant_comes_from_modules_alias() {
    let f = Fixture::new("workstation");
    let gpu = &f.inventory.gpus[0].info;
    let bdf = gpu.pci.bus_id.as_str();
    let files = [
        (
            format!("/sys/bus/pci/devices/{bdf}/modalias"),
            "pci:v000010DEd00002342sv000010DEsd000016EBbc03sc02i00\n".to_owned(),
        ),
        (
            "/proc/sys/kernel/osrelease".to_owned(),
            "6.8.0-1013-nvidia-64k\n".to_owned(),
        ),
        (
            "/lib/modules/6.8.0-1013-nvidia-64k/modules.alias".to_owned(),
            "alias vfio_pci:v*d*sv*sd*bc*sc*i* vfio_pci\n\
             alias vfio_pci:v000010DEd00002342sv*sd*bc*sc*i* nvgrace_gpu_vfio_pci\n"
                .to_owned(),
        ),
    ];
    for (path, contents) in files {
        let resolved = f.host_path(&path);
        std::fs::create_dir_all(resolved.parent().unwrap()).unwrap();
        std::fs::write(resolved, contents).unwrap();
    }
    std::fs::create_dir_all(f.host_path("/sys/bus/pci/drivers/nvgrace-gpu-vfio-pci")).unwrap();
    let binding = binder(&f.host).bind(bdf, Some(&on_nvidia(gpu))).unwrap();
    assert_eq!(binding.vfio_driver, "nvgrace-gpu-vfio-pci");
    assert_eq!(f.bound_driver(bdf).as_deref(), Some("nvgrace-gpu-vfio-pci"));
}

#[test]
fn a_gpu_already_on_vfio_is_used_and_left_there() {
    let f = Fixture::new("workstation");
    let bdf = f.inventory.gpus[0].info.pci.bus_id.clone();
    let first = binder(&f.host).bind(&bdf, None).unwrap();
    f.host.clear_events();
    let second = binder(&f.host).bind(&bdf, None).unwrap();
    assert_eq!(second.previous_driver.as_deref(), Some("vfio-pci"));
    assert!(!second.rebound());
    binder(&f.host).restore(&second).unwrap();
    assert_eq!(f.host.events(), []);
    assert_eq!(f.bound_driver(&bdf).as_deref(), Some("vfio-pci"));
    binder(&f.host).restore(&first).unwrap();
    assert_eq!(f.bound_driver(&bdf).as_deref(), Some("nvidia"));
}

// ---- whole claims through the kubelet simulator ------------------------------------------

struct Running {
    f: Fixture,
    cluster: TestCluster,
    driver: NvidiaDriver,
    plugin: KubeletPlugin,
    kubelet: RegisteredPlugin,
}

async fn start(profile: &str, gates: &str) -> Running {
    let f = Fixture::new(profile);
    let driver = f.driver(gates);
    start_driver(f, driver).await
}

/// A plugin serving `driver` (built on `f`) in a fresh test cluster.
async fn start_driver(f: Fixture, driver: NvidiaDriver) -> Running {
    let cluster = TestCluster::start().await.unwrap();
    let plugin = cluster
        .plugin(driver.clone(), DRIVER_NAME)
        .start()
        .await
        .unwrap();
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    Running {
        f,
        cluster,
        driver,
        plugin,
        kubelet,
    }
}

fn claim_ref(claim: &ResourceClaim) -> ClaimRef {
    ClaimRef {
        uid: claim.metadata.uid.clone().unwrap(),
        namespace: claim.metadata.namespace.clone().unwrap(),
        name: claim.metadata.name.clone().unwrap(),
    }
}

impl Running {
    async fn claim(&self, builder: AllocatedClaim) -> ClaimRef {
        claim_ref(&builder.create(&self.cluster.client()).await.unwrap())
    }

    /// The claim's CDI spec, as the container runtime would read it.
    fn spec(&self, claim: &ClaimRef) -> Value {
        let dir = self.cluster.cdi_root();
        let path = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .find(|path| path.to_string_lossy().contains(&claim.uid))
            .unwrap_or_else(|| panic!("no CDI spec for {} in {}", claim.uid, dir.display()));
        serde_json::to_value(Spec::read_file(path).unwrap()).unwrap()
    }

    fn spec_files(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.cluster.cdi_root())
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .collect()
    }

    /// Prepares one claim; its outcome.
    async fn prepare_one(&self, claim: &ClaimRef) -> dra_sdk_testing::kubelet::PrepareOutcome {
        let mut outcomes = self
            .kubelet
            .prepare(std::slice::from_ref(claim))
            .await
            .unwrap();
        outcomes.remove(&claim.uid).unwrap()
    }

    /// Unprepares one claim; its outcome.
    async fn unprepare_one(&self, claim: &ClaimRef) -> Result<(), String> {
        let mut outcomes = self
            .kubelet
            .unprepare(std::slice::from_ref(claim))
            .await
            .unwrap();
        outcomes.remove(&claim.uid).unwrap()
    }

    async fn shutdown(self) {
        self.plugin.shutdown().await.unwrap();
    }
}

fn device_paths(edits: &Value) -> Vec<String> {
    edits["deviceNodes"]
        .as_array()
        .map(|nodes| {
            nodes
                .iter()
                .map(|node| node["path"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A claim for `gpu-vfio-0` with a VFIO config, as KubeVirt makes one.
fn vfio_claim_of_gpu_0() -> AllocatedClaim {
    AllocatedClaim::new("default", "vm")
        .device("vm", DRIVER_NAME, NODE_NAME, "gpu-vfio-0")
        .claim_config(
            &["vm"],
            DRIVER_NAME,
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig"}),
        )
}

fn gpu_config() -> Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"})
}

#[tokio::test]
async fn a_full_gpu_claim_is_prepared_and_unprepared() {
    full_gpu_claim(Fixture::new("dgx-a100")).await;
}

/// The same, on the NVML backend over the libnvidia-ml double.
#[cfg(feature = "nvml")]
#[tokio::test]
async fn a_full_gpu_claim_is_prepared_and_unprepared_over_nvml() {
    full_gpu_claim(Fixture::over_nvml("dgx-a100")).await;
}

async fn full_gpu_claim(f: Fixture) {
    let driver = f.driver("");
    let r = start_driver(f, driver).await;
    let claim = r
        .claim(
            AllocatedClaim::new("default", "one-gpu")
                .device("gpu", DRIVER_NAME, NODE_NAME, "gpu-4")
                .claim_config(&["gpu"], DRIVER_NAME, gpu_config()),
        )
        .await;
    let result = r
        .kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    let devices = result[&claim.uid].as_ref().unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].device, "gpu-4");
    assert_eq!(devices[0].cdi_device_ids.len(), 1);

    let spec = r.spec(&claim);
    assert_eq!(
        device_paths(&spec["devices"][0]["containerEdits"]),
        ["/dev/nvidia4"]
    );
    assert_eq!(
        device_paths(&spec["containerEdits"]),
        ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    );
    assert!(
        spec["containerEdits"]["env"]
            .as_array()
            .unwrap()
            .contains(&json!("NVIDIA_VISIBLE_DEVICES=void"))
    );
    assert!(
        spec["containerEdits"]["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["hostPath"] == json!(r.f.library("libcuda.so")))
    );
    assert_eq!(r.driver.prepared_devices().get("gpu-4"), Some(&claim.uid));

    let unprepared = r
        .kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(unprepared[&claim.uid], Ok(()));
    assert!(r.driver.prepared_devices().is_empty());
    assert!(r.spec_files().is_empty());
    // Unprepare again: nothing to do, still fine.
    let again = r
        .kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(again[&claim.uid], Ok(()));
    r.shutdown().await;
}

#[tokio::test]
async fn a_mig_claim_gets_its_capability_nodes() {
    mig_claim(Fixture::new("dgx-a100")).await;
}

/// The same, on the NVML backend over the libnvidia-ml double.
#[cfg(feature = "nvml")]
#[tokio::test]
async fn a_mig_claim_gets_its_capability_nodes_over_nvml() {
    mig_claim(Fixture::over_nvml("dgx-a100")).await;
}

async fn mig_claim(f: Fixture) {
    let driver = f.driver("");
    let r = start_driver(f, driver).await;
    let parent = &r.f.inventory.gpus[1];
    let mig = parent
        .mig_devices
        .iter()
        .find(|m| m.profile == "3g.40gb")
        .unwrap();
    let name = format!(
        "gpu-{}-mig-3g40gb-{}-{}",
        parent.info.minor, mig.profile_id, mig.placement.start
    );
    let claim = r
        .claim(
            AllocatedClaim::new("default", "mig")
                .device("mig", DRIVER_NAME, NODE_NAME, &name)
                .claim_config(
                    &["mig"],
                    DRIVER_NAME,
                    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig"}),
                )
                // A GpuConfig for all requests does not apply to MIG devices.
                .claim_config(&[], DRIVER_NAME, gpu_config()),
        )
        .await;
    let result = r
        .kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(result[&claim.uid].as_ref().unwrap()[0].device, name);
    let spec = r.spec(&claim);
    let minor = parent.info.minor;
    let (gi, ci) = (mig.gpu_instance_id, mig.compute_instance_id);
    assert_eq!(
        device_paths(&spec["devices"][0]["containerEdits"]),
        [
            format!("/dev/nvidia{minor}"),
            format!("/dev/nvidia-caps/nvidia-cap{}", gi_cap_minor(minor, gi)),
            format!("/dev/nvidia-caps/nvidia-cap{}", ci_cap_minor(minor, gi, ci)),
        ]
    );
    let unprepared = r
        .kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(unprepared[&claim.uid], Ok(()));
    r.shutdown().await;
}

#[tokio::test]
async fn a_bad_config_fails_its_claim_only() {
    let r = start("dgx-a100", "").await;
    let parent = &r.f.inventory.gpus[0];
    let mig = &parent.mig_devices[0];
    let mig_name = format!(
        "gpu-{}-mig-1g10gb-{}-{}",
        parent.info.minor, mig.profile_id, mig.placement.start
    );
    let wrong_kind = r
        .claim(
            AllocatedClaim::new("default", "wrong-kind")
                .device("mig", DRIVER_NAME, NODE_NAME, &mig_name)
                .claim_config(&["mig"], DRIVER_NAME, gpu_config()),
        )
        .await;
    let time_sliced = r
        .claim(
            AllocatedClaim::new("default", "time-sliced")
                .device("gpu", DRIVER_NAME, NODE_NAME, "gpu-5")
                .claim_config(
                    &[],
                    DRIVER_NAME,
                    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                           "sharing": {"strategy": "TimeSlicing"}}),
                ),
        )
        .await;
    let typo = r
        .claim(
            AllocatedClaim::new("default", "typo")
                .device("gpu", DRIVER_NAME, NODE_NAME, "gpu-6")
                .claim_config(
                    &[],
                    DRIVER_NAME,
                    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                           "sharng": {}}),
                ),
        )
        .await;
    let good = r
        .claim(AllocatedClaim::new("default", "good").device(
            "gpu",
            DRIVER_NAME,
            NODE_NAME,
            "gpu-3",
        ))
        .await;
    let claims = [
        wrong_kind.clone(),
        time_sliced.clone(),
        typo.clone(),
        good.clone(),
    ];
    let result = r.kubelet.prepare(&claims).await.unwrap();

    assert_eq!(result[&good.uid].as_ref().unwrap()[0].device, "gpu-3");
    let error = |claim: &ClaimRef| result[&claim.uid].clone().unwrap_err();
    assert!(
        error(&wrong_kind).contains(&format!(
            "GpuConfig (resource.nvidia.com/v1beta1) cannot configure MIG device \"{mig_name}\" \
             (request \"mig\"); use MigDeviceConfig (resource.nvidia.com/v1beta1)"
        )),
        "{}",
        error(&wrong_kind)
    );
    assert_contains(
        error(&time_sliced),
        "GpuConfig (resource.nvidia.com/v1beta1) for gpu-5: \"TimeSlicing\" is selected as \
             the GPU sharing strategy, but the \"TimeSlicingSettings\" feature gate is not enabled",
    );
    assert_contains(
        error(&typo),
        "unknown field `sharng` (did you mean `sharing`?)",
    );
    // Nothing of the failed claims stays reserved.
    assert_eq!(
        r.driver.prepared_devices().into_keys().collect::<Vec<_>>(),
        ["gpu-3"]
    );
    r.shutdown().await;
}

#[tokio::test]
async fn a_device_prepared_for_another_claim_is_refused_except_for_admin_access() {
    let r = start("dgx-a100", "").await;
    let first = r
        .claim(AllocatedClaim::new("default", "first").device(
            "gpu",
            DRIVER_NAME,
            NODE_NAME,
            "gpu-7",
        ))
        .await;
    let second = r
        .claim(AllocatedClaim::new("default", "second").device(
            "gpu",
            DRIVER_NAME,
            NODE_NAME,
            "gpu-7",
        ))
        .await;
    let monitor = r
        .claim(
            AllocatedClaim::new("default", "monitor").result(DeviceRequestAllocationResult {
                request: "gpu".into(),
                driver: DRIVER_NAME.into(),
                pool: NODE_NAME.into(),
                device: "gpu-7".into(),
                admin_access: Some(true),
                ..Default::default()
            }),
        )
        .await;
    assert!(
        r.kubelet
            .prepare(std::slice::from_ref(&first))
            .await
            .unwrap()[&first.uid]
            .is_ok()
    );
    let refused = r
        .kubelet
        .prepare(std::slice::from_ref(&second))
        .await
        .unwrap();
    assert_eq!(
        refused[&second.uid].clone().unwrap_err(),
        format!(
            "device gpu-7: it is already prepared for claim default/first ({}); a device is \
             prepared for one claim at a time unless allocated with admin access",
            first.uid
        )
    );
    let admin = r
        .kubelet
        .prepare(std::slice::from_ref(&monitor))
        .await
        .unwrap();
    assert!(admin[&monitor.uid].is_ok(), "{:?}", admin[&monitor.uid]);

    // Once the first claim is gone, the second one gets the GPU.
    r.kubelet
        .unprepare(std::slice::from_ref(&first))
        .await
        .unwrap();
    let retried = r
        .kubelet
        .prepare(std::slice::from_ref(&second))
        .await
        .unwrap();
    assert!(retried[&second.uid].is_ok(), "{:?}", retried[&second.uid]);
    r.shutdown().await;
}

/// On the NVML backend over the double, the plugin holds the GPU's node through NVML until a
/// VFIO prepare releases it: the idle check (the fake host's `/proc`, where the double shows
/// its hold as the kernel would) finds nobody, and the GPU is rebound.
#[cfg(feature = "nvml")]
#[tokio::test]
async fn a_vfio_prepare_over_nvml_finds_no_hold_by_the_plugin() {
    let f = Fixture::over_nvml("workstation");
    let driver = f.driver("PassthroughSupport=true");
    let r = start_driver(f, driver).await;
    let gpu = r.f.inventory.gpus[0].info.clone();
    r.f.hardware().inventory().unwrap();
    assert_eq!(
        r.f.double().open_node_count().unwrap(),
        1,
        "NVML holds the GPU"
    );
    let node = format!("/dev/nvidia{}", gpu.minor);
    let holders =
        dra_driver_nvidia::host::facts::node_holders(&r.f.host, std::path::Path::new(&node))
            .unwrap();
    assert_eq!(
        holders.iter().map(|h| h.pid).collect::<Vec<_>>(),
        [std::process::id()],
        "the fake /proc shows this process (the plugin) holding {node}"
    );
    let claim = r.claim(vfio_claim_of_gpu_0()).await;
    let result = r.prepare_one(&claim).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(
        r.f.bound_driver(&gpu.pci.bus_id).as_deref(),
        Some("vfio-pci")
    );
    r.shutdown().await;
}

#[tokio::test]
async fn vfio_claims_rebind_the_gpu_and_give_it_back() {
    let r = start("mixed", "PassthroughSupport=true").await;
    // gpu-vfio-0 is the first NVIDIA GPU function in bus-ID order.
    let mut bus_ids: Vec<String> =
        r.f.inventory
            .gpus
            .iter()
            .map(|g| g.info.pci.bus_id.clone())
            .collect();
    bus_ids.sort();
    let bdf = bus_ids[0].clone();
    let group = 20
        + r.f
            .inventory
            .gpus
            .iter()
            .position(|g| g.info.pci.bus_id == bdf)
            .unwrap();
    let claim = r.claim(vfio_claim_of_gpu_0()).await;
    let result = r
        .kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(result[&claim.uid].is_ok(), "{:?}", result[&claim.uid]);
    assert_eq!(r.f.bound_driver(&bdf).as_deref(), Some("vfio-pci"));
    let spec = r.spec(&claim);
    assert_eq!(
        device_paths(&spec["devices"][0]["containerEdits"]),
        [format!("/dev/vfio/{group}"), "/dev/vfio/vfio".to_owned()]
    );
    assert_eq!(
        spec["devices"][0]["containerEdits"]["env"],
        json!(["NVIDIA_VISIBLE_DEVICES=void"])
    );

    // The GPU's full-GPU twin is refused while it is passed through.
    let twin_minor =
        r.f.inventory
            .gpus
            .iter()
            .find(|g| g.info.pci.bus_id == bdf)
            .unwrap()
            .info
            .minor;
    let twin = r
        .claim(AllocatedClaim::new("default", "twin").device(
            "gpu",
            DRIVER_NAME,
            NODE_NAME,
            &format!("gpu-{twin_minor}"),
        ))
        .await;
    let refused = r
        .kubelet
        .prepare(std::slice::from_ref(&twin))
        .await
        .unwrap();
    assert!(
        refused[&twin.uid].clone().unwrap_err().contains(&format!(
            "its PCI function {bdf} is already prepared for claim default/vm"
        )),
        "{:?}",
        refused[&twin.uid]
    );

    let unprepared = r
        .kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(unprepared[&claim.uid], Ok(()));
    assert_eq!(r.f.bound_driver(&bdf).as_deref(), Some("nvidia"));
    r.shutdown().await;
}

#[tokio::test]
async fn a_vfio_prepare_that_fails_after_binding_is_rolled_back() {
    let r = start("mixed", "PassthroughSupport=true").await;
    // No vfio major and no /dev/vfio nodes: the edits cannot be built after the bind.
    std::fs::write(
        r.f.host_path("/proc/devices"),
        "Character devices:\n 10 misc\n",
    )
    .unwrap();
    let mut bus_ids: Vec<String> =
        r.f.inventory
            .gpus
            .iter()
            .map(|g| g.info.pci.bus_id.clone())
            .collect();
    bus_ids.sort();
    let claim = r
        .claim(AllocatedClaim::new("default", "vm").device(
            "vm",
            DRIVER_NAME,
            NODE_NAME,
            "gpu-vfio-0",
        ))
        .await;
    let result = r
        .kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    let error = result[&claim.uid].clone().unwrap_err();
    assert_contains(&error, "device gpu-vfio-0: /dev/vfio/");
    assert_eq!(r.f.bound_driver(&bus_ids[0]).as_deref(), Some("nvidia"));
    assert!(r.driver.prepared_devices().is_empty());
    // The kubelet's unprepare of the failed claim is a no-op.
    let unprepared = r
        .kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(unprepared[&claim.uid], Ok(()));
    r.shutdown().await;
}

#[tokio::test]
async fn vfio_devices_need_the_passthrough_gate() {
    let r = start("mixed", "").await;
    let claim = r
        .claim(AllocatedClaim::new("default", "vm").device(
            "vm",
            DRIVER_NAME,
            NODE_NAME,
            "gpu-vfio-0",
        ))
        .await;
    let result = r
        .kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(
        result[&claim.uid].clone().unwrap_err(),
        "device gpu-vfio-0: VFIO devices need the \"PassthroughSupport\" feature gate, which is \
         not enabled on this node"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn unknown_devices_are_refused() {
    let r = start("workstation", "").await;
    let claim = r
        .claim(
            AllocatedClaim::new("default", "ghost")
                .device("gpu", DRIVER_NAME, NODE_NAME, "gpu-9")
                .device("gpu", DRIVER_NAME, NODE_NAME, "tpu-0"),
        )
        .await;
    let result = r
        .kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(
        result[&claim.uid].clone().unwrap_err(),
        "device gpu-9: no such device on this node now"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn reservations_survive_a_restart_through_the_checkpoint() {
    let r = start("dgx-a100", "").await;
    let claim = r
        .claim(AllocatedClaim::new("default", "kept").device(
            "gpu",
            DRIVER_NAME,
            NODE_NAME,
            "gpu-6",
        ))
        .await;
    assert!(
        r.kubelet
            .prepare(std::slice::from_ref(&claim))
            .await
            .unwrap()[&claim.uid]
            .is_ok()
    );
    let Running {
        f, cluster, plugin, ..
    } = r;
    plugin.shutdown().await.unwrap();

    // A restart: the start-up reconcile reserves what the checkpoint records as completed.
    let completed = completed_claims(&cluster);
    assert!(
        completed
            .iter()
            .any(|recorded| recorded.claim.uid == claim.uid),
        "{completed:?}"
    );
    let restarted = f.builder("").build();
    dra_sdk::driver::Driver::reconcile(&restarted, &completed)
        .await
        .unwrap();
    assert_eq!(restarted.prepared_devices().get("gpu-6"), Some(&claim.uid));
}

/// The mock plugin's setup: every device each shipped profile publishes prepares and
/// unprepares on the profile's `FakeHostTree`, with a driver root without libraries (a node
/// without GPUs), and the SDK accepts the resulting CDI spec.
#[tokio::test]
async fn every_published_device_of_every_shipped_profile_prepares_on_its_fake_host() {
    use dra_driver_nvidia::backend::mock::MockBackend;
    use dra_driver_nvidia::cdi::DriverRoot;
    use dra_driver_nvidia::devices::{Discovery, DiscoveryOptions};
    use dra_driver_nvidia::host::FakeHostTree;
    use std::sync::Arc;

    for backend in MockBackend::shipped().unwrap() {
        let profile = backend.profile_name().to_owned();
        let dir = tempfile::tempdir().unwrap();
        let host = FakeHostTree::new(dir.path())
            .iommu(true)
            .vfio_pci_loaded(true)
            .build(backend.hardware())
            .unwrap();
        // Nothing scripted, as in the plugin's mock mode: the idle check reads the (empty)
        // fake /proc.
        let discovery =
            Discovery::discover(&backend, &host, &DiscoveryOptions::new().passthrough(true))
                .unwrap();
        let names: Vec<String> = discovery.iter().map(|d| d.name().to_owned()).collect();
        let host = Arc::new(host);
        let driver = NvidiaDriver::builder(Arc::new(backend), host.clone())
            .driver_root(DriverRoot::new(host.clone(), "/"))
            .feature_gates("PassthroughSupport=true".parse().unwrap())
            .vfio_idle_wait(Duration::from_millis(1), Duration::from_millis(10))
            .build();
        let cluster = TestCluster::start().await.unwrap();
        let plugin = cluster.plugin(driver, DRIVER_NAME).start().await.unwrap();
        let kubelet = cluster
            .register(&plugin, KubeletVersion::V1_36)
            .await
            .unwrap();
        for (index, name) in names.iter().enumerate() {
            let claim = claim_ref(
                &AllocatedClaim::new("default", format!("c{index}"))
                    .device("dev", DRIVER_NAME, NODE_NAME, name)
                    .create(&cluster.client())
                    .await
                    .unwrap(),
            );
            let prepared = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
            let devices = prepared[&claim.uid]
                .as_ref()
                .unwrap_or_else(|error| panic!("{profile} {name}: {error}"));
            assert_eq!(devices[0].cdi_device_ids.len(), 1, "{profile} {name}");
            let unprepared = kubelet
                .unprepare(std::slice::from_ref(&claim))
                .await
                .unwrap();
            assert_eq!(unprepared[&claim.uid], Ok(()), "{profile} {name}");
        }
        // Every GPU is back on nvidia.
        for gpu in &discovery.inventory.gpus {
            assert_eq!(
                dra_driver_nvidia::host::facts::pci_driver(host.as_ref(), &gpu.info.pci.bus_id)
                    .unwrap()
                    .as_deref(),
                Some("nvidia"),
                "{profile} {}",
                gpu.info.pci.bus_id
            );
        }
        plugin.shutdown().await.unwrap();
    }
}

/// Class configs come before claim configs; whether a config names the request is read back
/// from the claim for both.
#[tokio::test]
async fn class_configs_are_matched_like_claim_configs() {
    let r = start("dgx-a100", "").await;
    let parent = &r.f.inventory.gpus[2];
    let mig = &parent.mig_devices[0];
    let name = format!(
        "gpu-{}-mig-{}-{}-{}",
        parent.info.minor,
        dra_driver_nvidia::driver::DeviceName::mig_profile_part(&mig.profile),
        mig.profile_id,
        mig.placement.start
    );
    let mig_config =
        json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig"});
    // A MigDeviceConfig from the class naming the request, and a claim GpuConfig for all
    // requests: the GpuConfig does not apply to the MIG device, the class config does.
    let fine = r
        .claim(
            AllocatedClaim::new("default", "class-ok")
                .device("mig", DRIVER_NAME, NODE_NAME, &name)
                .class_config(&["mig"], DRIVER_NAME, mig_config.clone())
                .claim_config(&[], DRIVER_NAME, gpu_config()),
        )
        .await;
    // A class GpuConfig naming the MIG request is an error, even below a claim config for
    // all requests of the same wrong kind.
    let wrong = r
        .claim(
            AllocatedClaim::new("default", "class-wrong")
                .device("mig", DRIVER_NAME, NODE_NAME, &name)
                .class_config(&["mig"], DRIVER_NAME, gpu_config())
                .claim_config(&[], DRIVER_NAME, gpu_config()),
        )
        .await;
    let result = r
        .kubelet
        .prepare(&[fine.clone(), wrong.clone()])
        .await
        .unwrap();
    assert!(result[&fine.uid].is_ok(), "{:?}", result[&fine.uid]);
    let error = result[&wrong.uid].clone().unwrap_err();
    assert_contains(
        &error,
        format!("GpuConfig (resource.nvidia.com/v1beta1) cannot configure MIG device \"{name}\""),
    );
    r.shutdown().await;
}

/// Admin access shares a device, but never passes through a GPU another claim uses whole.
#[tokio::test]
async fn admin_access_does_not_take_a_gpu_away_for_passthrough() {
    let r = start("mixed", "PassthroughSupport=true").await;
    let mut gpus: Vec<_> = r.f.inventory.gpus.iter().map(|g| g.info.clone()).collect();
    gpus.sort_by(|a, b| a.pci.bus_id.cmp(&b.pci.bus_id));
    let first = &gpus[0];
    let holder = r
        .claim(AllocatedClaim::new("default", "holder").device(
            "gpu",
            DRIVER_NAME,
            NODE_NAME,
            &format!("gpu-{}", first.minor),
        ))
        .await;
    assert!(
        r.kubelet
            .prepare(std::slice::from_ref(&holder))
            .await
            .unwrap()[&holder.uid]
            .is_ok()
    );
    let admin = r
        .claim(
            AllocatedClaim::new("default", "admin").result(DeviceRequestAllocationResult {
                request: "vm".into(),
                driver: DRIVER_NAME.into(),
                pool: NODE_NAME.into(),
                device: "gpu-vfio-0".into(),
                admin_access: Some(true),
                ..Default::default()
            }),
        )
        .await;
    let result = r
        .kubelet
        .prepare(std::slice::from_ref(&admin))
        .await
        .unwrap();
    assert_eq!(
        result[&admin.uid].clone().unwrap_err(),
        format!(
            "device gpu-vfio-0: its GPU {} is prepared as a full GPU for claim default/holder \
             ({}); admin access cannot pass it through",
            first.pci.bus_id, holder.uid
        )
    );
    assert_eq!(
        r.f.bound_driver(&first.pci.bus_id).as_deref(),
        Some("nvidia")
    );
    r.shutdown().await;
}

/// The open file descriptors in `/proc` tell whether the GPU is in use: no program needed.
#[test]
fn proc_tells_whether_the_gpu_is_busy() {
    let f = Fixture::new("workstation");
    let gpu = &f.inventory.gpus[0].info;
    let fd = f.host_path("/proc/4242/fd/7");
    std::fs::create_dir_all(fd.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(format!("/dev/nvidia{}", gpu.minor), &fd).unwrap();
    // An unrelated process with an unrelated file.
    let other = f.host_path("/proc/77/fd/1");
    std::fs::create_dir_all(other.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink("/dev/null", &other).unwrap();

    let error = binder(&f.host)
        .bind(&gpu.pci.bus_id, Some(&on_nvidia(gpu)))
        .unwrap_err()
        .to_string();
    assert_contains(&error, "is still in use");
    assert_contains(&error, "held by PID 4242;");
    assert_eq!(f.bound_driver(&gpu.pci.bus_id).as_deref(), Some("nvidia"));

    std::fs::remove_file(&fd).unwrap();
    binder(&f.host)
        .bind(&gpu.pci.bus_id, Some(&on_nvidia(gpu)))
        .unwrap();
    assert_eq!(f.bound_driver(&gpu.pci.bus_id).as_deref(), Some("vfio-pci"));
}

/// The SDK can fail a claim after the driver prepared it (the CDI spec cannot be written):
/// the checkpoint then has no driver state, and the driver's own memory of the claim is what
/// gives the GPU back, on a retry as on unprepare.
#[tokio::test]
async fn a_vfio_claim_failed_by_the_sdk_after_prepare_still_gives_the_gpu_back() {
    let r = start("mixed", "PassthroughSupport=true").await;
    let mut bus_ids: Vec<String> =
        r.f.inventory
            .gpus
            .iter()
            .map(|g| g.info.pci.bus_id.clone())
            .collect();
    bus_ids.sort();
    let bdf = &bus_ids[0];
    let claim = r
        .claim(AllocatedClaim::new("default", "vm").device(
            "vm",
            DRIVER_NAME,
            NODE_NAME,
            "gpu-vfio-0",
        ))
        .await;

    // The CDI directory is not writable: the SDK fails the claim after the bind.
    let cdi_root = r.cluster.cdi_root();
    std::fs::remove_dir_all(&cdi_root).unwrap();
    std::fs::write(&cdi_root, "not a directory").unwrap();
    let failed = r
        .kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(failed[&claim.uid].is_err());
    assert_eq!(r.f.bound_driver(bdf).as_deref(), Some("vfio-pci"));

    // The kubelet retries once the directory is back; the retry finds the GPU on VFIO and
    // still remembers it came from nvidia.
    std::fs::remove_file(&cdi_root).unwrap();
    std::fs::create_dir(&cdi_root).unwrap();
    let retried = r
        .kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(retried[&claim.uid].is_ok(), "{:?}", retried[&claim.uid]);
    let unprepared = r
        .kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(unprepared[&claim.uid], Ok(()));
    assert_eq!(r.f.bound_driver(bdf).as_deref(), Some("nvidia"));

    // Failed and then unprepared without a retry: given back too.
    let other = r
        .claim(AllocatedClaim::new("default", "vm2").device(
            "vm",
            DRIVER_NAME,
            NODE_NAME,
            "gpu-vfio-0",
        ))
        .await;
    std::fs::remove_dir_all(&cdi_root).unwrap();
    std::fs::write(&cdi_root, "not a directory").unwrap();
    assert!(
        r.kubelet
            .prepare(std::slice::from_ref(&other))
            .await
            .unwrap()[&other.uid]
            .is_err()
    );
    assert_eq!(r.f.bound_driver(bdf).as_deref(), Some("vfio-pci"));
    std::fs::remove_file(&cdi_root).unwrap();
    std::fs::create_dir(&cdi_root).unwrap();
    let unprepared = r
        .kubelet
        .unprepare(std::slice::from_ref(&other))
        .await
        .unwrap();
    assert_eq!(unprepared[&other.uid], Ok(()));
    assert_eq!(r.f.bound_driver(bdf).as_deref(), Some("nvidia"));
    assert!(r.driver.prepared_devices().is_empty());
    r.shutdown().await;
}

mod dynamic_mig;

/// A GPU lost after discovery fails the claims of its own devices only; another GPU's claim in
/// the same call prepares.
#[cfg(feature = "nvml")]
#[tokio::test]
async fn a_lost_gpu_fails_only_its_own_claims_over_nvml() {
    let f = Fixture::over_nvml("dgx-a100");
    let lost = f.inventory.gpus[4].info.clone();
    let driver = f.driver("");
    let r = start_driver(f, driver).await;
    r.f.double().lose_gpu(&lost.uuid).unwrap();
    let on_lost = r
        .claim(AllocatedClaim::new("default", "on-lost").device(
            "gpu",
            DRIVER_NAME,
            NODE_NAME,
            &format!("gpu-{}", lost.minor),
        ))
        .await;
    let healthy = r
        .claim(AllocatedClaim::new("default", "healthy").device(
            "gpu",
            DRIVER_NAME,
            NODE_NAME,
            "gpu-5",
        ))
        .await;
    let results = r
        .kubelet
        .prepare(&[on_lost.clone(), healthy.clone()])
        .await
        .unwrap();
    let error = results[&on_lost.uid].clone().unwrap_err();
    assert_contains(&error, "is gone");
    assert_contains(&error, &lost.uuid);
    assert!(results[&healthy.uid].is_ok(), "{:?}", results[&healthy.uid]);
    r.shutdown().await;
}
