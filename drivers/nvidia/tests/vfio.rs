//! VFIO passthrough for KubeVirt, through the kubelet simulator on a fake host tree: persistence
//! mode off before the GPU leaves `nvidia` and back on once it returns (also after a plugin
//! restart, from the checkpointed binding), `nvidia-persistenced` asked to let go through its
//! socket, a GPU held by a process failing with that process's PID and name, and the
//! KEP-5304 metadata file (`DeviceMetadata`) carrying the PCI address KubeVirt reads. Each on
//! the mock backend and on the NVML backend over the libnvidia-ml double (`*_over_nvml`).
//!
//! The exact sequence is asserted on one timeline: the host's writes (`RootedHost` events),
//! the backend's persistence calls and the fake daemon's requests, in the order they happened.

mod fixture;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dra_driver_nvidia::backend::events::{HealthEventStream, RecoveryAction};
use dra_driver_nvidia::backend::{
    BackendError, CudaDriverVersion, DeviceRelease, GpuBackend, GpuInfo, Inventory, MigDeviceInfo,
    MigMode, MigProfileInfo,
};
use dra_driver_nvidia::devices::{Discovery, DiscoveryOptions};
use dra_driver_nvidia::driver::{DRIVER_NAME, NvidiaDriver};
use dra_driver_nvidia::host::{HostEvent, RootedHost};
use dra_sdk::advanced::cdi::Spec;
use dra_sdk::claim::ClaimRef;
use dra_sdk::plugin::KubeletPlugin;
use dra_sdk_testing::assert_contains;
use dra_sdk_testing::claims::AllocatedClaim;
use dra_sdk_testing::cluster::{NODE_NAME, TestCluster};
use dra_sdk_testing::kubelet::{KubeletVersion, PrepareOutcome, RegisteredPlugin};
use fixture::*;
use nvml_mock::{FakePersistenced, PersistencedRequest};
use serde_json::{Value, json};

/// The fake `nvidia-persistenced`'s PID in the fake `/proc`.
const DAEMON_PID: u32 = 4321;

// ---- one timeline: host writes, backend persistence calls, daemon requests ----------------

/// Notes taken while the driver works, each with the number of host events before it.
#[derive(Clone)]
struct Timeline {
    host: RootedHost,
    notes: Arc<Mutex<Vec<(usize, String)>>>,
}

impl Timeline {
    fn new(host: &RootedHost) -> Self {
        Self {
            host: host.clone(),
            notes: Arc::default(),
        }
    }

    fn note(&self, note: String) {
        let at = self.host.events().len();
        self.notes.lock().unwrap().push((at, note));
    }

    /// Everything since the last take, in order; forgets it.
    fn take(&self) -> Vec<String> {
        let events = self.host.events();
        self.host.clear_events();
        let notes = std::mem::take(&mut *self.notes.lock().unwrap());
        let mut notes = notes.into_iter().peekable();
        let mut out = Vec::new();
        for (index, event) in events.iter().enumerate() {
            while let Some((_, note)) = notes.next_if(|(at, _)| *at <= index) {
                out.push(note);
            }
            out.push(match event {
                HostEvent::Write { path, contents } => {
                    format!("write {contents:?} to {}", path.display())
                }
                HostEvent::Command(command) => format!("run {command}"),
                other => format!("{other:?}"),
            });
        }
        out.extend(notes.map(|(_, note)| note));
        out
    }

    /// Notes the requests `daemon` serves.
    fn watch(&self, daemon: &FakePersistenced) {
        let timeline = self.clone();
        daemon.on_request(move |request| {
            timeline.note(match request {
                PersistencedRequest::Get { bus_id } => format!("persistenced: mode of {bus_id}?"),
                PersistencedRequest::Set { bus_id, enabled } => {
                    format!("persistenced: {bus_id} {}", on_off(*enabled))
                }
            })
        });
    }
}

fn on_off(enabled: bool) -> &'static str {
    if enabled { "on" } else { "off" }
}

/// A backend that notes its persistence calls on the timeline and passes everything on.
#[derive(Debug)]
struct Recording {
    inner: Arc<dyn GpuBackend>,
    timeline: Timeline,
}

impl std::fmt::Debug for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Timeline")
    }
}

impl GpuBackend for Recording {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn driver_version(&self) -> Result<String, BackendError> {
        self.inner.driver_version()
    }
    fn cuda_driver_version(&self) -> Result<CudaDriverVersion, BackendError> {
        self.inner.cuda_driver_version()
    }
    fn gpus(&self) -> Result<Vec<GpuInfo>, BackendError> {
        self.inner.gpus()
    }
    fn gpu(&self, uuid: &str) -> Result<Option<GpuInfo>, BackendError> {
        self.inner.gpu(uuid)
    }
    fn mig_mode(&self, gpu_uuid: &str) -> Result<Option<MigMode>, BackendError> {
        self.inner.mig_mode(gpu_uuid)
    }
    fn mig_devices(&self, gpu_uuid: &str) -> Result<Vec<MigDeviceInfo>, BackendError> {
        self.inner.mig_devices(gpu_uuid)
    }
    fn mig_profiles(&self, gpu_uuid: &str) -> Result<Vec<MigProfileInfo>, BackendError> {
        self.inner.mig_profiles(gpu_uuid)
    }
    fn health_events(
        &self,
        gpu_uuids: &[String],
    ) -> Result<Box<dyn HealthEventStream + '_>, BackendError> {
        self.inner.health_events(gpu_uuids)
    }
    fn recovery_action(&self, gpu_uuid: &str) -> Result<Option<RecoveryAction>, BackendError> {
        self.inner.recovery_action(gpu_uuid)
    }
    fn persistence_mode(&self, gpu_uuid: &str) -> Result<Option<bool>, BackendError> {
        self.timeline
            .note(format!("backend: persistence mode of {gpu_uuid}?"));
        self.inner.persistence_mode(gpu_uuid)
    }
    fn set_persistence_mode(&self, gpu_uuid: &str, enabled: bool) -> Result<(), BackendError> {
        self.timeline.note(format!(
            "backend: persistence mode of {gpu_uuid} {}",
            on_off(enabled)
        ));
        self.inner.set_persistence_mode(gpu_uuid, enabled)
    }
    fn release_devices(&self) -> DeviceRelease {
        self.inner.release_devices()
    }
    fn inventory(&self) -> Result<Inventory, BackendError> {
        self.inner.inventory()
    }
}

// ---- a plugin on the fixture ------------------------------------------------------------

struct Node {
    f: Fixture,
    gpu: GpuInfo,
    timeline: Timeline,
    backend: Arc<dyn GpuBackend>,
    cluster: TestCluster,
    plugin: KubeletPlugin,
    kubelet: RegisteredPlugin,
}

fn driver(f: &Fixture, backend: &Arc<dyn GpuBackend>, gates: &str) -> NvidiaDriver {
    NvidiaDriver::builder(Arc::clone(backend), Arc::new(f.host.clone()))
        .driver_root(f.driver_root())
        .feature_gates(gates.parse().unwrap())
        .vfio_idle_wait(Duration::from_millis(1), Duration::from_millis(30))
        .build()
}

/// The plugin of `driver` on `cluster`, publishing the node's devices.
async fn serve(
    f: &Fixture,
    cluster: &TestCluster,
    backend: &Arc<dyn GpuBackend>,
    gates: &str,
) -> (KubeletPlugin, RegisteredPlugin) {
    let discovery = Discovery::discover(
        backend.as_ref(),
        &f.host,
        &DiscoveryOptions::new().passthrough(true),
    )
    .unwrap();
    let plugin = cluster
        .plugin(driver(f, backend, gates), DRIVER_NAME)
        .resources(discovery.resources(NODE_NAME))
        .start()
        .await
        .unwrap();
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    (plugin, kubelet)
}

async fn start(f: Fixture, gates: &str) -> Node {
    // workstation: one Tesla T4, gpu-vfio-0.
    let gpu = f.inventory.gpus[0].info.clone();
    let timeline = Timeline::new(&f.host);
    let backend: Arc<dyn GpuBackend> = Arc::new(Recording {
        inner: f.hardware(),
        timeline: timeline.clone(),
    });
    let cluster = TestCluster::start().await.unwrap();
    let (plugin, kubelet) = serve(&f, &cluster, &backend, gates).await;
    timeline.take();
    Node {
        f,
        gpu,
        timeline,
        backend,
        cluster,
        plugin,
        kubelet,
    }
}

impl Node {
    async fn vm_claim(&self, name: &str) -> ClaimRef {
        let claim = AllocatedClaim::new("default", name)
            .device("vm", DRIVER_NAME, NODE_NAME, "gpu-vfio-0")
            .claim_config(
                &["vm"],
                DRIVER_NAME,
                json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig"}),
            )
            .create(&self.cluster.client())
            .await
            .unwrap();
        ClaimRef {
            uid: claim.metadata.uid.clone().unwrap(),
            namespace: claim.metadata.namespace.clone().unwrap(),
            name: claim.metadata.name.clone().unwrap(),
        }
    }

    async fn prepare(&self, claim: &ClaimRef) -> PrepareOutcome {
        let mut outcomes = self
            .kubelet
            .prepare(std::slice::from_ref(claim))
            .await
            .unwrap();
        outcomes.remove(&claim.uid).unwrap()
    }

    async fn unprepare(&self, claim: &ClaimRef) -> Result<(), String> {
        let mut outcomes = self
            .kubelet
            .unprepare(std::slice::from_ref(claim))
            .await
            .unwrap();
        outcomes.remove(&claim.uid).unwrap()
    }

    fn bdf(&self) -> &str {
        &self.gpu.pci.bus_id
    }

    fn bound(&self) -> Option<String> {
        self.f.bound_driver(self.bdf())
    }

    /// NVML's (or the mock's) persistence mode of the GPU, read without the timeline.
    fn persistence(&self) -> bool {
        self.f
            .hardware()
            .persistence_mode(&self.gpu.uuid)
            .unwrap()
            .unwrap()
    }

    /// Sets the GPU's persistence mode as an operator would.
    fn set_persistence(&self, enabled: bool) {
        #[cfg(feature = "nvml")]
        if self.f.over_nvml_backend() {
            self.f
                .double()
                .set_persistence(&self.gpu.uuid, enabled)
                .unwrap();
            return;
        }
        self.f.backend.persistence().set(&self.gpu.uuid, enabled);
    }

    /// Makes changes of the GPU's persistence mode fail (no root).
    fn refuse_persistence(&self) {
        #[cfg(feature = "nvml")]
        if self.f.over_nvml_backend() {
            self.f.double().refuse_persistence(&self.gpu.uuid).unwrap();
            return;
        }
        self.f.backend.persistence().refuse_changes(
            &self.gpu.uuid,
            "the current user does not have permission to perform this operation",
        );
    }

    /// A fake nvidia-persistenced keeping the node's GPUs open, watched by the timeline.
    fn persistenced(&self) -> FakePersistenced {
        let gpus: Vec<(String, u32)> = self
            .f
            .inventory
            .gpus
            .iter()
            .map(|gpu| (gpu.info.pci.bus_id.clone(), gpu.info.minor))
            .collect();
        let daemon = FakePersistenced::start(&self.f.host_path("/"), DAEMON_PID, &gpus).unwrap();
        self.timeline.watch(&daemon);
        daemon
    }

    /// The claim's driver state as the checkpoint records it.
    fn recorded_state(&self, claim: &ClaimRef) -> Value {
        completed_claims(&self.cluster)
            .into_iter()
            .find(|recorded| recorded.claim.uid == claim.uid)
            .and_then(|recorded| recorded.driver_state)
            .unwrap_or_else(|| panic!("no recorded state for {claim}"))
    }

    /// The writes of a bind of the GPU from `nvidia` to `vfio-pci`.
    fn bind_writes(&self) -> Vec<String> {
        let bdf = self.bdf();
        let device = format!("/sys/bus/pci/devices/{bdf}");
        vec![
            format!("write \"\\n\" to {device}/driver_override"),
            format!("write {bdf:?} to /sys/bus/pci/drivers/nvidia/unbind"),
            format!("write \"vfio-pci\" to {device}/driver_override"),
            format!("write {bdf:?} to /sys/bus/pci/drivers/vfio-pci/bind"),
        ]
    }

    /// The writes that give the GPU back to `nvidia`.
    fn restore_writes(&self) -> Vec<String> {
        let bdf = self.bdf();
        vec![
            format!("write \"\\n\" to /sys/bus/pci/devices/{bdf}/driver_override"),
            format!("write {bdf:?} to /sys/bus/pci/drivers/vfio-pci/unbind"),
            format!("write {bdf:?} to /sys/bus/pci/drivers/nvidia/bind"),
        ]
    }

    fn holders(&self) -> Vec<String> {
        dra_driver_nvidia::host::facts::node_holders(
            &self.f.host,
            Path::new(&format!("/dev/nvidia{}", self.gpu.minor)),
        )
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect()
    }

    async fn shutdown(self) {
        self.plugin.shutdown().await.unwrap();
    }
}

fn mock() -> Fixture {
    Fixture::new("workstation")
}

#[cfg(feature = "nvml")]
fn over_nvml() -> Fixture {
    Fixture::over_nvml("workstation")
}

// ---- persistence mode around the bind -----------------------------------------------------

#[tokio::test]
async fn persistence_goes_off_before_the_unbind_and_back_on_after_the_rebind() {
    persistence_around_the_bind(mock()).await;
}

#[cfg(feature = "nvml")]
#[tokio::test]
async fn persistence_goes_off_before_the_unbind_and_back_on_after_the_rebind_over_nvml() {
    persistence_around_the_bind(over_nvml()).await;
}

async fn persistence_around_the_bind(f: Fixture) {
    let node = start(f, "PassthroughSupport=true").await;
    node.set_persistence(true);
    let daemon = node.persistenced();
    let (bdf, uuid) = (node.bdf().to_owned(), node.gpu.uuid.clone());
    let daemon_holder = format!("PID {DAEMON_PID} (nvidia-persiste)");
    assert!(
        node.holders().contains(&daemon_holder),
        "the daemon holds the GPU: {:?}",
        node.holders()
    );

    let claim = node.vm_claim("vm").await;
    let prepared = node.prepare(&claim).await;
    assert!(prepared.is_ok(), "{prepared:?}");
    let mut expected = vec![
        format!("persistenced: mode of {bdf}?"),
        format!("backend: persistence mode of {uuid}?"),
        format!("persistenced: {bdf} off"),
        format!("backend: persistence mode of {uuid} off"),
    ];
    expected.extend(node.bind_writes());
    assert_eq!(node.timeline.take(), expected);
    assert_eq!(node.bound().as_deref(), Some("vfio-pci"));
    assert!(node.holders().is_empty(), "{:?}", node.holders());
    assert_eq!(daemon.is_enabled(&bdf), Some(false));
    assert!(!node.persistence());
    // What unprepare (of this plugin or a restarted one) turns back on.
    assert_eq!(
        node.recorded_state(&claim)["devices"][0]["persistence"],
        json!({"gpuUUID": uuid, "daemon": true, "nvml": true})
    );

    assert_eq!(node.unprepare(&claim).await, Ok(()));
    let mut expected = node.restore_writes();
    // Back through NVML: the daemon does not take back a GPU that left nvidia.
    expected.push(format!("backend: persistence mode of {uuid} on"));
    assert_eq!(node.timeline.take(), expected);
    assert_eq!(node.bound().as_deref(), Some("nvidia"));
    assert!(node.persistence());
    node.shutdown().await;
}

/// A GPU whose persistence mode was off is left that way.
#[tokio::test]
async fn persistence_mode_that_was_off_stays_off() {
    let node = start(mock(), "PassthroughSupport=true").await;
    let uuid = node.gpu.uuid.clone();
    let claim = node.vm_claim("vm").await;
    assert!(node.prepare(&claim).await.is_ok());
    let mut expected = vec![format!("backend: persistence mode of {uuid}?")];
    expected.extend(node.bind_writes());
    assert_eq!(node.timeline.take(), expected);
    assert_eq!(
        node.recorded_state(&claim)["devices"][0].get("persistence"),
        None
    );
    assert_eq!(node.unprepare(&claim).await, Ok(()));
    assert_eq!(node.timeline.take(), node.restore_writes());
    assert!(!node.persistence());
    node.shutdown().await;
}

#[tokio::test]
async fn a_restarted_plugin_turns_persistence_mode_back_on() {
    restart_in_between(mock()).await;
}

#[cfg(feature = "nvml")]
#[tokio::test]
async fn a_restarted_plugin_turns_persistence_mode_back_on_over_nvml() {
    restart_in_between(over_nvml()).await;
}

async fn restart_in_between(f: Fixture) {
    let node = start(f, "PassthroughSupport=true").await;
    node.set_persistence(true);
    let claim = node.vm_claim("vm").await;
    assert!(node.prepare(&claim).await.is_ok());
    assert!(!node.persistence());
    node.timeline.take();

    // The plugin restarts: a new driver, knowing only the checkpoint.
    let Node {
        f,
        gpu,
        timeline,
        backend,
        cluster,
        plugin,
        ..
    } = node;
    plugin.shutdown().await.unwrap();
    let (plugin, kubelet) = serve(&f, &cluster, &backend, "PassthroughSupport=true").await;
    let node = Node {
        f,
        gpu,
        timeline,
        backend,
        cluster,
        plugin,
        kubelet,
    };
    // The start-up reconcile keeps the claim's GPU on VFIO: the claim is still prepared.
    assert_eq!(node.bound().as_deref(), Some("vfio-pci"));
    node.timeline.take();

    assert_eq!(node.unprepare(&claim).await, Ok(()));
    let mut expected = node.restore_writes();
    expected.push(format!("backend: persistence mode of {} on", node.gpu.uuid));
    assert_eq!(node.timeline.take(), expected);
    assert_eq!(node.bound().as_deref(), Some("nvidia"));
    assert!(node.persistence());
    node.shutdown().await;
}

/// A prepare that fails after the bind (here: the claim's edits cannot be built) gives the GPU
/// back, persistence mode included.
#[tokio::test]
async fn a_prepare_rolled_back_after_the_bind_turns_persistence_mode_back_on() {
    let node = start(mock(), "PassthroughSupport=true").await;
    node.set_persistence(true);
    // No vfio major and no /dev/vfio nodes: the edits fail once the GPU is on vfio-pci.
    std::fs::write(
        node.f.host_path("/proc/devices"),
        "Character devices:\n 10 misc\n",
    )
    .unwrap();
    let uuid = node.gpu.uuid.clone();
    let claim = node.vm_claim("vm").await;
    let error = node.prepare(&claim).await.unwrap_err();
    assert_contains(&error, "device gpu-vfio-0: /dev/vfio/");
    let mut expected = vec![
        format!("backend: persistence mode of {uuid}?"),
        format!("backend: persistence mode of {uuid} off"),
    ];
    expected.extend(node.bind_writes());
    expected.extend(node.restore_writes());
    expected.push(format!("backend: persistence mode of {uuid} on"));
    assert_eq!(node.timeline.take(), expected);
    assert_eq!(node.bound().as_deref(), Some("nvidia"));
    assert!(node.persistence());
    node.shutdown().await;
}

/// Checkpoints written before persistence mode was recorded still unprepare.
#[test]
fn bindings_of_earlier_versions_read_without_persistence() {
    let old = json!({"devices": [{"device": "gpu-vfio-0", "adminAccess": false, "type": "vfio",
        "busId": "0000:07:00.0", "iommuGroup": 20, "vfioDriver": "vfio-pci", "previousDriver": "nvidia"}]});
    let state = dra_driver_nvidia::driver::ClaimState::from_value(&old).unwrap();
    let dra_driver_nvidia::driver::PreparedKind::Vfio(binding) = &state.devices[0].kind else {
        panic!("a VFIO device: {state:?}");
    };
    assert_eq!(binding.persistence, None);
    assert_eq!(serde_json::to_value(&state).unwrap(), old);
}

// ---- busy GPUs ------------------------------------------------------------------------------

#[tokio::test]
async fn a_gpu_held_by_a_process_fails_naming_it_and_keeps_its_persistence_mode() {
    busy_gpu(mock()).await;
}

#[cfg(feature = "nvml")]
#[tokio::test]
async fn a_gpu_held_by_a_process_fails_naming_it_and_keeps_its_persistence_mode_over_nvml() {
    busy_gpu(over_nvml()).await;
}

async fn busy_gpu(f: Fixture) {
    let node = start(f, "PassthroughSupport=true").await;
    node.set_persistence(true);
    let node_path = format!("/dev/nvidia{}", node.gpu.minor);
    node.f.holder(4242, "python3", &node_path);
    let uuid = node.gpu.uuid.clone();
    let claim = node.vm_claim("vm").await;
    let error = node.prepare(&claim).await.unwrap_err();
    assert_contains(
        &error,
        format!("device gpu-vfio-0: {} is still in use after", node.bdf()),
    );
    assert_contains(
        &error,
        format!("{node_path} is held by PID 4242 (python3); stop them and retry"),
    );
    // Persistence mode went off for the wait, and came back: nothing written to sysfs.
    assert_eq!(
        node.timeline.take(),
        [
            format!("backend: persistence mode of {uuid}?"),
            format!("backend: persistence mode of {uuid} off"),
            format!("backend: persistence mode of {uuid} on"),
        ]
    );
    assert_eq!(node.bound().as_deref(), Some("nvidia"));
    assert!(node.persistence());
    // Nothing reserved: the kubelet's unprepare of the failed claim does nothing.
    assert_eq!(node.unprepare(&claim).await, Ok(()));
    assert!(node.timeline.take().is_empty());
    node.shutdown().await;
}

/// A daemon the plugin cannot reach (its socket elsewhere) is named as the holder, with what
/// to do.
#[tokio::test]
async fn an_unreachable_persistenced_is_named_with_what_to_do() {
    let node = start(mock(), "PassthroughSupport=true").await;
    let node_path = format!("/dev/nvidia{}", node.gpu.minor);
    node.f.holder(DAEMON_PID, "nvidia-persiste", &node_path);
    let claim = node.vm_claim("vm").await;
    let error = node.prepare(&claim).await.unwrap_err();
    assert_contains(
        &error,
        format!("{node_path} is held by PID {DAEMON_PID} (nvidia-persiste)"),
    );
    assert_contains(
        &error,
        format!(
            "nvidia-persistenced keeps the GPUs it manages open: its socket was not found at \
             /run/nvidia-persistenced/socket under the host root, or it did not close the GPU; \
             `nvidia-smi -i {} -pm 0` turns persistence off",
            node.bdf()
        ),
    );
    node.shutdown().await;
}

/// A process that holds the GPU for a moment is waited for.
#[test]
fn a_holder_that_lets_go_during_the_wait_is_waited_for() {
    let f = mock();
    let gpu = f.inventory.gpus[0].info.clone();
    f.holder(4242, "python3", &format!("/dev/nvidia{}", gpu.minor));
    let link = f.host_path("/proc/4242/fd/3");
    let letting_go = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        std::fs::remove_file(link).unwrap();
    });
    let binding = dra_driver_nvidia::driver::VfioBinder::new(
        &f.host,
        Duration::from_millis(5),
        Duration::from_secs(20),
    )
    .bind(
        &gpu.pci.bus_id,
        Some(&dra_driver_nvidia::driver::NvidiaGpu {
            uuid: gpu.uuid.clone(),
            minor: gpu.minor,
        }),
    )
    .unwrap();
    letting_go.join().unwrap();
    assert_eq!(binding.vfio_driver, "vfio-pci");
    assert_eq!(f.bound_driver(&gpu.pci.bus_id).as_deref(), Some("vfio-pci"));
}

#[tokio::test]
async fn persistence_mode_that_cannot_be_turned_off_fails_the_claim_untouched() {
    refused_persistence(mock()).await;
}

#[cfg(feature = "nvml")]
#[tokio::test]
async fn persistence_mode_that_cannot_be_turned_off_fails_the_claim_untouched_over_nvml() {
    refused_persistence(over_nvml()).await;
}

async fn refused_persistence(f: Fixture) {
    let node = start(f, "PassthroughSupport=true").await;
    node.set_persistence(true);
    node.refuse_persistence();
    let daemon = node.persistenced();
    let (bdf, uuid) = (node.bdf().to_owned(), node.gpu.uuid.clone());
    let claim = node.vm_claim("vm").await;
    let error = node.prepare(&claim).await.unwrap_err();
    assert_contains(
        &error,
        format!("device gpu-vfio-0: turning persistence mode off for {bdf} failed:"),
    );
    assert_contains(&error, "does not have permission to perform this operation");
    // The daemon got the GPU back; nothing was written to sysfs.
    assert_eq!(
        node.timeline.take(),
        [
            format!("persistenced: mode of {bdf}?"),
            format!("backend: persistence mode of {uuid}?"),
            format!("persistenced: {bdf} off"),
            format!("backend: persistence mode of {uuid} off"),
            format!("persistenced: {bdf} on"),
        ]
    );
    assert_eq!(daemon.is_enabled(&bdf), Some(true));
    assert_eq!(node.bound().as_deref(), Some("nvidia"));
    assert!(node.persistence());
    node.shutdown().await;
}

// ---- DeviceMetadata: the PCI address KubeVirt reads ---------------------------------------

#[tokio::test]
async fn device_metadata_gives_kubevirt_the_pci_address() {
    metadata(mock()).await;
}

#[cfg(feature = "nvml")]
#[tokio::test]
async fn device_metadata_gives_kubevirt_the_pci_address_over_nvml() {
    metadata(over_nvml()).await;
}

async fn metadata(f: Fixture) {
    let node = start(f, "PassthroughSupport=true,DeviceMetadata=true").await;
    let claim = node.vm_claim("vm").await;
    let devices = node.prepare(&claim).await.unwrap();
    // The device's own CDI device, then the metadata spec's.
    let metadata_id = format!("{DRIVER_NAME}/metadata={}_vm", claim.uid);
    assert_eq!(devices[0].cdi_device_ids.len(), 2, "{devices:?}");
    assert_eq!(devices[0].cdi_device_ids[1], metadata_id);

    let spec_path = node
        .cluster
        .cdi_root()
        .join(format!("{DRIVER_NAME}_metadata_{}_vm.json", claim.uid));
    let spec = Spec::read_file(&spec_path).unwrap();
    let mount = &spec.devices[0].container_edits.mounts[0];
    // Where virt-launcher looks for a claim named in the VMI (`resourceclaims/<claim>/<request>`).
    assert_eq!(
        mount.container_path,
        format!(
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm/vm/{DRIVER_NAME}-metadata.json"
        )
    );
    let host_file = PathBuf::from(&mount.host_path);
    assert_eq!(
        host_file,
        node.cluster
            .plugins_dir()
            .join(DRIVER_NAME)
            .join(dra_sdk::advanced::metadata::HOST_SUBDIR)
            .join("default_vm/vm/metadata.json")
    );
    let file: Value = serde_json::from_slice(&std::fs::read(&host_file).unwrap()).unwrap();
    assert_eq!(file["kind"], "DeviceMetadata");
    assert_eq!(file["metadata"]["uid"], claim.uid.as_str());
    let device = &file["requests"][0]["devices"][0];
    assert_eq!(device["name"], "gpu-vfio-0");
    // What KubeVirt reads: requests[].devices[].attributes["resource.kubernetes.io/pciBusID"].
    assert_eq!(
        device["attributes"]["resource.kubernetes.io/pciBusID"],
        json!({"string": node.bdf()})
    );
    assert_eq!(device["attributes"]["type"], json!({"string": "vfio"}));

    assert_eq!(node.unprepare(&claim).await, Ok(()));
    assert!(!spec_path.exists());
    assert!(!host_file.exists());
    assert_eq!(node.bound().as_deref(), Some("nvidia"));
    node.shutdown().await;
}

/// Without the gate, no metadata file and no metadata CDI device.
#[tokio::test]
async fn no_metadata_without_the_gate() {
    let node = start(mock(), "PassthroughSupport=true").await;
    let claim = node.vm_claim("vm").await;
    let devices = node.prepare(&claim).await.unwrap();
    assert_eq!(devices[0].cdi_device_ids.len(), 1, "{devices:?}");
    assert!(
        !node
            .cluster
            .plugins_dir()
            .join(DRIVER_NAME)
            .join(dra_sdk::advanced::metadata::HOST_SUBDIR)
            .join("default_vm")
            .exists()
    );
    assert_eq!(node.unprepare(&claim).await, Ok(()));
    node.shutdown().await;
}
