//! [`NvidiaDriver`]: the [`dra_sdk::driver::Driver`] of `gpu.nvidia.com`.
//!
//! Prepare, per claim:
//!
//! 1. read the hardware now ([`Discovery`]: the backend's
//!    inventory completed with the host's PCI facts, devices named exactly as published) and
//!    resolve every allocated device name to a full GPU, a MIG device or a VFIO device; a
//!    name not published now fails the claim;
//! 2. pick each device's config ([`select_config`]; defaults when none applies) and check
//!    that this node honours it ([`NvidiaConfig::check_supported`]);
//! 3. reserve the devices: a device (or, for a GPU and its VFIO twin, the PCI function)
//!    already prepared for another claim is refused, unless one of the two allocations has
//!    admin access, or both are consumable shares with identical configs;
//! 4. bind VFIO devices to their VFIO driver ([`VfioBinder`]), then compute every device's
//!    container edits from the host state ([`CdiEdits`]). Any failure restores the VFIO
//!    devices bound so far and releases the reservations, so a failed prepare leaves the
//!    node as it found it;
//! 5. apply the sharing strategy of each config group (time slices, MPS daemons, see
//!    [`crate::sharing`]), adding the MPS edits; a failure undoes it with the rest;
//! 6. return the edits, with [`ClaimState`] as the checkpoint's `driver_state`.
//!
//! From step 4 on, each step that changes the node registers its undo in the prepare's undo
//! log (`driver/undo.rs`) as it succeeds; a failure rolls the log back newest first, down to
//! the reservations.
//!
//! With `DynamicMIG`, step 4 also creates the GPU and compute instance of each MIG partition
//! (and a failure destroys the ones created), and unprepare destroys them; a partition shared
//! by several claims (consumable shares) is created by the first and destroyed with the last.
//! See `driver/dynamic_mig.rs`.
//!
//! Unprepare reads [`ClaimState`] back (leniently: fields of a newer version are ignored; an
//! unreadable state is logged and nothing is undone),
//! returns VFIO devices to their previous driver (and their persistence mode), undoes sharing (MPS daemons stopped; time
//! slices and compute modes reset unless another claim still uses the GPU) and releases the
//! reservations. It tolerates a missing state (a prepare that failed or was interrupted undid
//! its own work) and a GPU already back on its driver, so it is idempotent.
//!
//! The reservations live in memory (`driver/reservations.rs`). A plugin restart rebuilds them
//! in one place, the start-up reconcile ([`Driver::reconcile`], `driver/reconcile.rs`), from
//! the claims the SDK's checkpoint records as completed; it runs before the plugin registers
//! with the kubelet, so no prepare races it.
//!
//! ```no_run
//! use std::sync::Arc;
//! use dra_driver_nvidia::backend::mock::MockBackend;
//! use dra_driver_nvidia::cdi::DriverRoot;
//! use dra_driver_nvidia::config::FeatureGates;
//! use dra_driver_nvidia::driver::NvidiaDriver;
//! use dra_driver_nvidia::host::SystemHost;
//!
//! let driver = NvidiaDriver::builder(
//!     Arc::new(MockBackend::from_profile("dgx-a100")?),
//!     Arc::new(SystemHost::rooted("/host-root")),
//! )
//! .driver_root(DriverRoot::new(Arc::new(SystemHost::rooted("/driver-root")), "/"))
//! .feature_gates("PassthroughSupport=true".parse::<FeatureGates>()?)
//! .build();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod claim_sharing;
mod dynamic_mig;
mod names;
pub mod persistenced;
mod reconcile;
mod reservations;
mod undo;
mod upstream_checkpoint;
mod vfio;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use dra_sdk::cdi::ContainerEdits;
use dra_sdk::claim::{AllocatedDevice, Claim, ClaimRef, DriverError, RecordedClaim};
use dra_sdk::config::ConfigRegistry;
use dra_sdk::context::DriverContext;
use dra_sdk::driver::{Driver, PreparedClaim, PreparedDevice, ReconcileError};
use serde::{Deserialize, Serialize};

pub use dynamic_mig::{KeptMigInstance, MigCleanup, MigInstance, OrphanMigInstance};
pub use names::DeviceName;
pub use reconcile::{ReconcileReport, UnownedBinding};
pub use upstream_checkpoint::{UPSTREAM_LABEL, UpstreamCheckpoint, kubelet_checksum};
pub use vfio::{NVIDIA, NvidiaGpu, PriorPersistence, VFIO_PCI, VfioBinder, VfioBinding, VfioError};

use reservations::{PCI_KEY_PREFIX, Reservations, pci_key};
use undo::UndoLog;

use crate::backend::mig::MigManager;
use crate::backend::{GpuBackend, GpuInfo, MigDeviceInfo};
use crate::cdi::{CdiEdits, DriverRoot};
use crate::config::{
    CandidateConfig, DeviceType, FeatureGate, FeatureGates, NvidiaConfig, VfioDeviceConfig,
    registry, select_config,
};
use crate::devices::{Discovery, DiscoveryOptions, NodeDevice};
use crate::health::{HealthMonitor, HealthPolicy};
use crate::host::{Host, SystemHost};
use crate::sharing::mps::{DeploymentRunner, MpsDeploymentConfig};
use crate::sharing::{AppliedSharing, ConsumableShares, MpsRunner, MpsSettings, SharedAllocation};

/// The driver name upstream uses.
pub const DRIVER_NAME: &str = "gpu.nvidia.com";
/// Upstream's wait for a GPU to become idle before it is rebound to VFIO.
pub const DEFAULT_VFIO_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Upstream's polling interval during that wait.
pub const DEFAULT_VFIO_IDLE_POLL: Duration = Duration::from_secs(1);

/// Builds an [`NvidiaDriver`]: the backend and the host are required, the rest has
/// upstream's defaults.
#[derive(Debug)]
pub struct NvidiaDriverBuilder {
    backend: Arc<dyn GpuBackend>,
    host: Arc<dyn Host>,
    driver_root: Option<DriverRoot>,
    hook: Option<crate::cdi::CdiHook>,
    gates: FeatureGates,
    driver_name: String,
    vfio_poll: Duration,
    vfio_timeout: Duration,
    health: Option<HealthPolicy>,
    mps: MpsSettings,
    mps_deployments: Option<MpsDeploymentConfig>,
    consumable: ConsumableShares,
    mig: Option<Arc<dyn MigManager>>,
}

impl NvidiaDriverBuilder {
    /// Where MPS control daemons keep their directories and how long the driver waits for
    /// them (gate `MPSSupport`, see [`crate::sharing::mps`]). Default: upstream's
    /// `/var/lib/kubelet/plugins/gpu.nvidia.com/mps` and readiness backoff.
    pub fn mps(mut self, settings: MpsSettings) -> Self {
        self.mps = settings;
        self
    }

    /// Runs MPS control daemons as Deployments in `config.namespace` with `config.image`
    /// (the plugin's `--namespace` and `--image-name`), as upstream, so that they outlive the
    /// plugin's container; see [`crate::sharing::mps::deployment`]. The plugin's API client
    /// comes from the [`DriverContext`] at start. Default: none, daemons run as detached host
    /// processes, which do not survive a restart of the plugin's container.
    pub fn mps_deployments(mut self, config: MpsDeploymentConfig) -> Self {
        self.mps_deployments = Some(config);
        self
    }

    /// Lets several claims share a device (`--consumable-shares`, gate `ConsumableShares`):
    /// they must then have identical configs. Default: disabled.
    pub fn consumable_shares(mut self, mode: ConsumableShares) -> Self {
        self.consumable = mode;
        self
    }

    /// What creates and destroys MIG instances (gate `DynamicMIG`): the backend, when it
    /// implements [`MigManager`] (the mock and NVML backends do). Without it, preparing a
    /// MIG partition fails.
    pub fn mig_manager(mut self, manager: Arc<dyn MigManager>) -> Self {
        self.mig = Some(manager);
        self
    }

    /// The driver installation (`--nvidia-driver-root` and `--container-driver-root`).
    /// Default: the host's `/`, read through the host.
    pub fn driver_root(mut self, driver_root: DriverRoot) -> Self {
        self.driver_root = Some(driver_root);
        self
    }

    /// The `nvidia-cdi-hook` binary on the node (`--nvidia-cdi-hook-path`, or the copy the
    /// plugin installs): a path, or a [`CdiHook`](crate::cdi::CdiHook) that says where its
    /// existence is checked. Without it, the edits carry no hooks (see [`crate::cdi`]).
    pub fn cdi_hook(mut self, hook: impl Into<crate::cdi::CdiHook>) -> Self {
        self.hook = Some(hook.into());
        self
    }

    /// Feature gates (validated by their parser). Default: upstream's defaults.
    pub fn feature_gates(mut self, gates: FeatureGates) -> Self {
        self.gates = gates;
        self
    }

    /// The DRA driver name, for finding this driver's configs in claims. Default
    /// [`DRIVER_NAME`].
    pub fn driver_name(mut self, name: impl Into<String>) -> Self {
        self.driver_name = name.into();
        self
    }

    /// How often and how long to wait for a GPU to become idle before rebinding it to VFIO.
    pub fn vfio_idle_wait(mut self, poll: Duration, timeout: Duration) -> Self {
        self.vfio_poll = poll;
        self.vfio_timeout = timeout;
        self
    }

    /// Watches device health with this policy (gate `NVMLDeviceHealthCheck`, see
    /// [`crate::health`]): the driver then reports health and taints failed devices.
    /// Default: off.
    pub fn health(mut self, policy: HealthPolicy) -> Self {
        self.health = Some(policy);
        self
    }

    /// The driver.
    pub fn build(self) -> NvidiaDriver {
        let driver_root = self
            .driver_root
            .unwrap_or_else(|| DriverRoot::new(Arc::clone(&self.host), "/"));
        let mut cdi = CdiEdits::new(Arc::clone(&self.host), driver_root);
        if let Some(hook) = self.hook {
            cdi = cdi.with_hook(hook);
        }
        NvidiaDriver {
            inner: Arc::new(Inner {
                backend: self.backend,
                host: self.host,
                cdi,
                gates: self.gates,
                driver_name: self.driver_name,
                vfio_poll: self.vfio_poll,
                vfio_timeout: self.vfio_timeout,
                reservations: Mutex::new(Reservations::default()),
                health: self.health,
                mps: self.mps,
                mps_deployments: self.mps_deployments,
                mps_runner: Mutex::new(MpsRunner::HostProcess),
                consumable: self.consumable,
                context: Mutex::new(None),
                mig: self.mig,
                mig_instances: dynamic_mig::MigInstances::default(),
                discovery: Mutex::new(None),
            }),
        }
    }
}

/// The NVIDIA GPU driver. Cheap to clone; clones share their state.
#[derive(Clone, Debug)]
pub struct NvidiaDriver {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    backend: Arc<dyn GpuBackend>,
    host: Arc<dyn Host>,
    cdi: CdiEdits,
    gates: FeatureGates,
    driver_name: String,
    vfio_poll: Duration,
    vfio_timeout: Duration,
    reservations: Mutex<Reservations>,
    health: Option<HealthPolicy>,
    mps: MpsSettings,
    /// Set: new MPS daemons run as Deployments (once `start` gave the API client).
    mps_deployments: Option<MpsDeploymentConfig>,
    /// Where daemons run: [`MpsRunner::Deployment`] from `start` on when `mps_deployments`
    /// is set.
    mps_runner: Mutex<MpsRunner>,
    consumable: ConsumableShares,
    /// The context of the plugin that started the driver last (`start`): reconcile writes
    /// restarted daemons' records with it.
    context: Mutex<Option<DriverContext>>,
    mig: Option<Arc<dyn MigManager>>,
    /// Dynamic MIG partitions with an instance and the claims holding them; also the lock
    /// of MIG operations.
    mig_instances: dynamic_mig::MigInstances,
    /// The node's devices as last read: prepare resolves names against it and reads the
    /// hardware again only for a name it does not know (the node changed since).
    discovery: Mutex<Option<Arc<Discovery>>>,
}

impl NvidiaDriver {
    /// A builder for a driver on `backend` and `host`.
    pub fn builder(backend: Arc<dyn GpuBackend>, host: Arc<dyn Host>) -> NvidiaDriverBuilder {
        NvidiaDriverBuilder {
            backend,
            host,
            driver_root: None,
            hook: None,
            gates: FeatureGates::default(),
            driver_name: DRIVER_NAME.to_owned(),
            vfio_poll: DEFAULT_VFIO_IDLE_POLL,
            vfio_timeout: DEFAULT_VFIO_IDLE_TIMEOUT,
            health: None,
            mps: MpsSettings::default(),
            mps_deployments: None,
            consumable: ConsumableShares::Disabled,
            mig: None,
        }
    }

    /// A driver on the real host seen at `/`.
    pub fn on_system(backend: Arc<dyn GpuBackend>) -> NvidiaDriverBuilder {
        Self::builder(backend, Arc::new(SystemHost::new()))
    }

    /// The feature gates the driver runs with.
    pub fn feature_gates(&self) -> &FeatureGates {
        &self.inner.gates
    }

    /// Where new MPS control daemons go as Deployments
    /// ([`NvidiaDriverBuilder::mps_deployments`]); `None`: they run as host processes.
    pub fn mps_deployments(&self) -> Option<&MpsDeploymentConfig> {
        self.inner.mps_deployments.as_ref()
    }

    /// Whether the plugin must serialize prepare and unprepare node-wide
    /// (`PluginBuilder::serialize_operations`): with `DynamicMIG`, so that the start-up
    /// clean-up of one plugin instance never destroys the instance another is creating for a
    /// claim not recorded as prepared yet (see `driver/dynamic_mig.rs`).
    pub fn serializes_operations(&self) -> bool {
        self.inner.gates.is_enabled(FeatureGate::DynamicMig)
    }

    /// Device names currently prepared, with the UID of the claim that holds each (admin
    /// access allocations and consumable shares excluded: see
    /// [`shared_devices`](Self::shared_devices)).
    pub fn prepared_devices(&self) -> BTreeMap<String, String> {
        self.inner
            .reservations()
            .by_key
            .iter()
            .filter(|(key, _)| !key.starts_with(PCI_KEY_PREFIX))
            .map(|(key, owner)| (key.clone(), owner.uid.clone()))
            .collect()
    }

    /// Devices currently prepared as consumable shares, with the UIDs of the claims holding
    /// them.
    pub fn shared_devices(&self) -> BTreeMap<String, Vec<String>> {
        self.inner
            .reservations()
            .shared
            .iter()
            .map(|(device, holders)| (device.clone(), holders.owners.keys().cloned().collect()))
            .collect()
    }
}

/// What the checkpoint keeps of a prepared claim (`driver_state`), for unprepare and for
/// rebuilding reservations after a restart.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimState {
    /// The claim's devices, in allocation order.
    pub devices: Vec<PreparedDeviceState>,
    /// What sharing set up (time slices, MPS daemons), for unprepare and restarts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sharing: Vec<AppliedSharing>,
    /// Devices prepared as consumable shares, with the config later claims must match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<SharedAllocation>,
}

impl ClaimState {
    /// Reads a state written by this or a newer version (unknown fields are ignored).
    pub fn from_value(value: &serde_json::Value) -> Result<Self, serde_json::Error> {
        Self::deserialize(value)
    }
}

/// One prepared device in [`ClaimState`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDeviceState {
    /// The device name.
    pub device: String,
    /// Whether it was allocated with admin access (then it reserves nothing).
    #[serde(default)]
    pub admin_access: bool,
    /// What the device is.
    #[serde(flatten)]
    pub kind: PreparedKind,
}

/// The identity of a prepared device, by type.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum PreparedKind {
    /// A full GPU.
    Gpu {
        /// `GPU-…`.
        uuid: String,
        /// Device minor.
        minor: u32,
        /// PCI bus ID.
        #[serde(rename = "pciBusID")]
        pci_bus_id: String,
    },
    /// A MIG device.
    Mig {
        /// `MIG-…`.
        uuid: String,
        /// The parent GPU's UUID.
        #[serde(rename = "parentUUID")]
        parent_uuid: String,
        /// The parent GPU's minor.
        #[serde(rename = "parentMinor")]
        parent_minor: u32,
        /// GPU instance ID.
        #[serde(rename = "gpuInstanceID")]
        gpu_instance_id: u32,
        /// Compute instance ID.
        #[serde(rename = "computeInstanceID")]
        compute_instance_id: u32,
    },
    /// A GPU passed through with VFIO.
    Vfio(VfioBinding),
    /// A MIG partition created at prepare (dynamic MIG); unprepare destroys it.
    #[serde(rename = "migdyn")]
    MigDynamic(MigInstance),
}

impl PreparedKind {
    fn pci_bus_id(&self) -> Option<&str> {
        match self {
            PreparedKind::Gpu { pci_bus_id, .. } => Some(pci_bus_id),
            PreparedKind::Vfio(binding) => Some(&binding.bus_id),
            PreparedKind::Mig { .. } | PreparedKind::MigDynamic(_) => None,
        }
    }
}

impl Inner {
    fn reservations(&self) -> MutexGuard<'_, Reservations> {
        // The map stays consistent even if a holder panicked: every update is one insert or
        // one retain.
        self.reservations
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Where MPS daemons run now.
    fn mps_runner(&self) -> MpsRunner {
        self.mps_runner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn binder(&self) -> VfioBinder<'_> {
        // nvidia-persistenced's socket on the host, or under the driver root when the daemon
        // runs in the driver's container (the GPU operator).
        let driver_root = self.cdi.driver_root().node_path();
        let mut sockets: Vec<PathBuf> = persistenced::SOCKET_PATHS
            .iter()
            .map(PathBuf::from)
            .collect();
        if driver_root != std::path::Path::new("/") {
            sockets.insert(0, driver_root.join(persistenced::DRIVER_ROOT_SOCKET));
        }
        VfioBinder::new(self.host.as_ref(), self.vfio_poll, self.vfio_timeout)
            .with_backend(self.backend.as_ref())
            .persistenced_sockets(sockets)
    }
}

/// One allocated device, resolved against the hardware, with its config.
#[derive(Debug)]
struct Planned {
    device: String,
    admin_access: bool,
    /// The share of a device allocated with consumable capacity.
    share_id: Option<String>,
    target: Target,
    config: NvidiaConfig,
}

#[derive(Debug)]
enum Target {
    Gpu(GpuInfo),
    Mig {
        parent: GpuInfo,
        mig: MigDeviceInfo,
    },
    Vfio {
        bus_id: String,
        /// The GPU while it is on `nvidia`.
        gpu: Option<NvidiaGpu>,
    },
    Partition(dynamic_mig::PlannedPartition),
}

impl Target {
    fn device_type(&self) -> DeviceType {
        match self {
            Target::Gpu(_) => DeviceType::Gpu,
            Target::Mig { .. } | Target::Partition(_) => DeviceType::Mig,
            Target::Vfio { .. } => DeviceType::Vfio,
        }
    }

    /// The identity reserved before any side effect; a VFIO device's binding is filled in
    /// once it is bound.
    fn provisional_kind(&self) -> PreparedKind {
        match self {
            Target::Gpu(gpu) => PreparedKind::Gpu {
                uuid: gpu.uuid.clone(),
                minor: gpu.minor,
                pci_bus_id: gpu.pci.bus_id.clone(),
            },
            Target::Mig { parent, mig } => PreparedKind::Mig {
                uuid: mig.uuid.clone(),
                parent_uuid: parent.uuid.clone(),
                parent_minor: parent.minor,
                gpu_instance_id: mig.gpu_instance_id,
                compute_instance_id: mig.compute_instance_id,
            },
            Target::Vfio { bus_id, .. } => PreparedKind::Vfio(VfioBinding {
                bus_id: bus_id.clone(),
                iommu_group: 0,
                vfio_driver: String::new(),
                previous_driver: None,
                persistence: None,
            }),
            // The instance IDs are filled in once it is created.
            Target::Partition(plan) => PreparedKind::MigDynamic(MigInstance {
                uuid: String::new(),
                parent_uuid: plan.parent.uuid.clone(),
                parent_minor: plan.parent.minor,
                profile_id: plan.profile.id,
                placement_start: plan.placement.start,
                placement_size: plan.placement.size,
                gpu_instance_id: 0,
                compute_instance_id: 0,
            }),
        }
    }
}

fn device_error(device: &str, reason: impl std::fmt::Display) -> DriverError {
    DriverError::Device {
        device: device.to_owned(),
        reason: reason.to_string(),
    }
}

/// Reads the hardware now: the backend's inventory, completed with the host's PCI facts, with
/// the devices named exactly as they are published ([`Discovery`]); kept for the next
/// prepare.
fn discover(inner: &Inner) -> Result<Arc<Discovery>, DriverError> {
    let options = DiscoveryOptions::new()
        .passthrough(inner.gates.is_enabled(FeatureGate::PassthroughSupport))
        .dynamic_mig(inner.gates.is_enabled(FeatureGate::DynamicMig));
    let discovery = Arc::new(
        Discovery::discover(inner.backend.as_ref(), inner.host.as_ref(), &options)
            .map_err(|error| DriverError::Unavailable(format!("reading the GPUs: {error}")))?,
    );
    *inner
        .discovery
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Arc::clone(&discovery));
    Ok(discovery)
}

/// The devices as last read, or read now when they never were or `names` holds one they do
/// not know (the node changed: a GPU back from vfio-pci, MIG reconfigured by hand). Prepare
/// therefore reads the whole inventory once, not per call; what a call needs of the hardware
/// now it asks about the GPU concerned.
async fn discovery_for(inner: &Arc<Inner>, names: &[&str]) -> Result<Arc<Discovery>, DriverError> {
    let known = inner
        .discovery
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone()
        .filter(|discovery| names.iter().all(|name| discovery.device(name).is_some()));
    if let Some(discovery) = known {
        return Ok(discovery);
    }
    let inner = Arc::clone(inner);
    tokio::task::spawn_blocking(move || discover(&inner))
        .await
        .map_err(join_error)?
}

/// The GPU a device is (on) still answers: one lost since discovery fails the claims of its
/// own devices only (the health monitor reports it); the backend is asked about that GPU
/// alone.
fn present(inner: &Inner, device: &str, gpu_uuid: &str) -> Result<(), DriverError> {
    match inner.backend.gpu(gpu_uuid) {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(device_error(
            device,
            format!(
                "GPU {gpu_uuid} is gone (fallen off the bus, removed, or bound to another \
                 driver); nothing was prepared"
            ),
        )),
        Err(error) => Err(device_error(
            device,
            format!("GPU {gpu_uuid} cannot be read: {error}"),
        )),
    }
}

/// Resolves an allocated device name to what it is on this node now.
fn resolve(inner: &Inner, discovery: &Discovery, device: &str) -> Result<Target, DriverError> {
    match discovery.device(device) {
        Some(NodeDevice::Gpu(gpu)) => {
            present(inner, device, &gpu.info.uuid)?;
            Ok(Target::Gpu(gpu.info.clone()))
        }
        Some(NodeDevice::Mig(mig)) => {
            present(inner, device, &mig.parent.uuid)?;
            Ok(Target::Mig {
                parent: mig.parent.clone(),
                mig: mig.mig.clone(),
            })
        }
        Some(NodeDevice::Vfio(vfio)) => Ok(Target::Vfio {
            bus_id: vfio.pci_bus_id.clone(),
            gpu: vfio.gpu.as_ref().map(|gpu| NvidiaGpu {
                uuid: gpu.uuid.clone(),
                minor: gpu.minor,
            }),
        }),
        Some(NodeDevice::Partition(partition)) => Ok(Target::Partition(partition.into())),
        None => Err(device_error(
            device,
            match DeviceName::parse(device) {
                Some(DeviceName::Vfio { .. })
                    if !inner.gates.is_enabled(FeatureGate::PassthroughSupport) =>
                {
                    "VFIO devices need the \"PassthroughSupport\" feature gate, which is not \
                     enabled on this node"
                }
                Some(_) => "no such device on this node now",
                None => "not a device name this driver publishes",
            },
        )),
    }
}

/// Whether each config applying to `device` names its request explicitly, in the order of
/// `device.configs`. The SDK resolves configs without keeping their `requests`; this reads
/// them back from the claim with the same rules (claim configs after class configs, each in
/// declaration order; empty `requests` = all requests).
fn names_request(
    claim: &Claim<NvidiaConfig>,
    driver_name: &str,
    device: &AllocatedDevice<NvidiaConfig>,
) -> Vec<bool> {
    let configs = claim
        .resource_claim
        .status
        .as_ref()
        .and_then(|status| status.allocation.as_ref())
        .and_then(|allocation| allocation.devices.as_ref())
        .and_then(|devices| devices.config.as_ref());
    let full_request = match &device.subrequest {
        Some(sub) => format!("{}/{sub}", device.request),
        None => device.request.clone(),
    };
    let mut scoped: Vec<(bool, bool)> = configs
        .into_iter()
        .flatten()
        .filter(|config| {
            config
                .opaque
                .as_ref()
                .is_some_and(|opaque| opaque.driver == driver_name)
        })
        .filter_map(|config| {
            let requests = config.requests.as_deref().unwrap_or_default();
            let explicit = requests
                .iter()
                .any(|r| *r == full_request || *r == device.request);
            (requests.is_empty() || explicit).then_some((config.source == "FromClass", explicit))
        })
        .collect();
    // Stable sort: class configs first, as the SDK orders them.
    scoped.sort_by_key(|(from_class, _)| !*from_class);
    let flags: Vec<bool> = scoped.into_iter().map(|(_, explicit)| explicit).collect();
    if flags.len() == device.configs.len() {
        flags
    } else {
        // Cannot happen with the SDK's documented order; treat every config as explicit,
        // which turns a kind mismatch into an error rather than silently skipping it.
        vec![true; device.configs.len()]
    }
}

/// The result of the blocking part of prepare.
struct Prepared {
    edits: Vec<ContainerEdits>,
    common: ContainerEdits,
    state: ClaimState,
}

fn prepare_blocking(
    inner: &Inner,
    claim: &ClaimRef,
    planned: Vec<Planned>,
) -> Result<Prepared, DriverError> {
    let shares = shared_allocations(planned.as_slice())?;
    let reserved: Vec<(String, bool, PreparedKind)> = planned
        .iter()
        .filter(|p| p.share_id.is_none())
        .map(|p| {
            (
                p.device.clone(),
                p.admin_access,
                p.target.provisional_kind(),
            )
        })
        .collect();
    let earlier = {
        let mut reservations = inner.reservations();
        reservations.reserve(claim, &reserved)?;
        if let Err(error) = reservations.reserve_shares(claim, &shares) {
            reservations.release(&claim.uid);
            if let Some(earlier) = reservations.states.get(&claim.uid).cloned() {
                reservations.restore(&claim.uid, &claim.namespace, &claim.name, &earlier);
            }
            return Err(error);
        }
        reservations.states.get(&claim.uid).cloned()
    };
    // A retry of a claim the SDK failed after an earlier successful prepare: that attempt's
    // daemons would be orphaned by this one.
    if let Some(earlier) = &earlier {
        let daemons: Vec<AppliedSharing> = earlier
            .sharing
            .iter()
            .filter(|s| matches!(s, AppliedSharing::Mps(_)))
            .cloned()
            .collect();
        for failure in claim_sharing::undo(inner, &claim.uid, &daemons) {
            tracing::warn!(claim = %claim, failure, "stopping the MPS daemon of an earlier attempt");
        }
    }

    // From here on every step that changes the node registers its undo; a failure rolls the
    // log back, newest first, down to the reservations (see `driver/undo.rs`).
    let mut log = UndoLog::reserved(inner, claim, earlier.as_ref());
    let result = prepare_devices(inner, claim, &planned, &mut log).and_then(|mut prepared| {
        // Sharing undoes its own steps when it fails.
        prepared.state.sharing = claim_sharing::apply(inner, claim, &planned, &mut prepared.edits)?;
        prepared.state.shares = shares.into_iter().map(|(share, _)| share).collect();
        Ok(prepared)
    });
    let prepared = match result {
        Ok(prepared) => prepared,
        Err(error) => {
            log.rollback();
            return Err(error);
        }
    };
    // Reserve with the final identities (the VFIO bindings are known now).
    let mut reservations = inner.reservations();
    reservations.release(&claim.uid);
    reservations.restore(&claim.uid, &claim.namespace, &claim.name, &prepared.state);
    Ok(prepared)
}

/// The consumable shares of a claim, with their normalised configs and the devices'
/// identities.
fn shared_allocations(
    planned: &[Planned],
) -> Result<Vec<(SharedAllocation, PreparedKind)>, DriverError> {
    planned
        .iter()
        .filter_map(|plan| Some((plan, plan.share_id.as_ref()?)))
        .map(|(plan, share_id)| {
            let share = SharedAllocation {
                device: plan.device.clone(),
                share_id: share_id.clone(),
                config: serde_json::to_value(&plan.config).map_err(DriverError::other)?,
            };
            Ok((share, plan.target.provisional_kind()))
        })
        .collect()
}

/// Prepares each device. What it binds and the partitions it gives the claim go to `log` as
/// it goes, for the caller to undo on failure.
fn prepare_devices(
    inner: &Inner,
    claim: &ClaimRef,
    planned: &[Planned],
    log: &mut UndoLog<'_>,
) -> Result<Prepared, DriverError> {
    let earlier = log.earlier();
    let cdi = &inner.cdi;
    let mut edits = Vec::with_capacity(planned.len());
    let mut state = ClaimState::default();
    let mut needs_driver = false;
    // (`state.sharing` and `state.shares` are filled by the caller.)
    for plan in planned {
        let (device_edits, kind) = match &plan.target {
            Target::Gpu(gpu) => {
                needs_driver = true;
                let device_edits = cdi
                    .gpu(gpu.minor, &gpu.pci.bus_id)
                    .map_err(|error| device_error(&plan.device, error))?;
                (device_edits, plan.target.provisional_kind())
            }
            Target::Mig { parent, mig } => {
                needs_driver = true;
                let device_edits = cdi
                    .mig(parent.minor, mig.gpu_instance_id, mig.compute_instance_id)
                    .map_err(|error| device_error(&plan.device, error))?;
                (device_edits, plan.target.provisional_kind())
            }
            Target::Partition(partition) => {
                needs_driver = true;
                let (device_edits, instance) =
                    dynamic_mig::create(inner, &claim.uid, &plan.device, partition)?;
                log.partition(&plan.device, &instance);
                (device_edits, PreparedKind::MigDynamic(instance))
            }
            Target::Vfio { bus_id, gpu } => {
                let NvidiaConfig::Vfio(config) = &plan.config else {
                    return Err(device_error(
                        &plan.device,
                        "internal: VFIO device without a VFIO config",
                    ));
                };
                // NVML lets go of the GPUs while the binder waits for the GPU to be idle:
                // the plugin itself must not be what holds /dev/nvidia<minor>.
                let released = inner.backend.release_devices();
                let binding = inner
                    .binder()
                    .bind(bus_id, gpu.as_ref())
                    .map_err(|error| device_error(&plan.device, error))?;
                drop(released);
                log.binding(&binding);
                // A retry finds the GPU on VFIO already; what to restore is what the earlier
                // attempt found.
                let binding = earlier
                    .into_iter()
                    .flat_map(|state| &state.devices)
                    .find_map(|device| match &device.kind {
                        PreparedKind::Vfio(old)
                            if old.bus_id == binding.bus_id && old.rebound() =>
                        {
                            Some(old.clone())
                        }
                        _ => None,
                    })
                    .filter(|_| !binding.rebound())
                    .unwrap_or(binding);
                let device_edits = vfio_edits(cdi, &binding, config)
                    .map_err(|error| device_error(&plan.device, error))?;
                (device_edits, PreparedKind::Vfio(binding))
            }
        };
        edits.push(device_edits);
        state.devices.push(PreparedDeviceState {
            device: plan.device.clone(),
            admin_access: plan.admin_access,
            kind,
        });
    }
    let common = if needs_driver {
        let version = inner.backend.driver_version().map_err(|error| {
            DriverError::Unavailable(format!("reading the driver version: {error}"))
        })?;
        cdi.common(&version)
            .map_err(|error| DriverError::Unavailable(error.to_string()))?
    } else {
        ContainerEdits::new()
    };
    Ok(Prepared {
        edits,
        common,
        state,
    })
}

fn vfio_edits(
    cdi: &CdiEdits,
    binding: &VfioBinding,
    config: &VfioDeviceConfig,
) -> Result<ContainerEdits, crate::cdi::CdiError> {
    cdi.vfio(
        &binding.bus_id,
        binding.iommu_group,
        config.backend_policy(),
        config.enable_api_device(),
    )
}

fn unprepare_blocking(inner: &Inner, recorded: &RecordedClaim) -> Result<(), DriverError> {
    let claim = &recorded.claim;
    let remembered = inner.reservations().states.get(&claim.uid).cloned();
    let state = match recorded.driver_state.as_ref().map(ClaimState::from_value) {
        None => match remembered {
            Some(state) => state,
            None => {
                // Prepare failed or was interrupted before it returned: it undid its own work.
                inner.reservations().forget(&claim.uid);
                return Ok(());
            }
        },
        Some(Ok(state)) => state,
        Some(Err(error)) => {
            // Failing would block the pod's termination forever, and guessing what to undo
            // could take a GPU from another claim: report it, undo nothing, release the claim.
            tracing::error!(
                claim = %claim,
                %error,
                "the checkpointed driver state of this claim is unreadable; nothing was undone \
                 (a GPU it passed through may still be bound to its VFIO driver)"
            );
            inner.reservations().forget(&claim.uid);
            return Ok(());
        }
    };
    let binder = inner.binder();
    let mut failures = Vec::new();
    for device in state.devices.iter().rev() {
        if let PreparedKind::MigDynamic(instance) = &device.kind {
            if let Err(error) = dynamic_mig::release(inner, &claim.uid, &device.device, instance) {
                failures.push(format!(
                    "{}: destroying its MIG instance: {error}",
                    device.device
                ));
            }
            continue;
        }
        let PreparedKind::Vfio(binding) = &device.kind else {
            continue;
        };
        // Another claim holds the GPU now (an admin-access allocation ending while a VM
        // uses it): leave the binding to that claim.
        if let Some(owner) = inner.reservations().by_key.get(&pci_key(&binding.bus_id))
            && owner.uid != claim.uid
        {
            tracing::info!(bus_id = %binding.bus_id, holder = %owner.uid, "GPU held by another claim; leaving its VFIO binding");
            continue;
        }
        if let Err(error) = binder.restore(binding) {
            failures.push(format!("{}: {error}", device.device));
        }
    }
    failures.extend(claim_sharing::undo(inner, &claim.uid, &state.sharing));
    if !failures.is_empty() {
        // Keep the reservations: the devices are not back yet; the kubelet retries.
        return Err(DriverError::Unavailable(format!(
            "undoing the prepare (VFIO bindings, sharing, MIG instances): {}",
            failures.join("; ")
        )));
    }
    inner.reservations().forget(&claim.uid);
    Ok(())
}

fn join_error(error: tokio::task::JoinError) -> DriverError {
    DriverError::other(format!("prepare task failed: {error}"))
}

#[async_trait::async_trait]
impl Driver for NvidiaDriver {
    type Config = NvidiaConfig;

    fn config_registry(&self) -> ConfigRegistry<NvidiaConfig> {
        registry()
    }

    /// Starts the health monitor when health is on: the devices found now, in the pool
    /// named after the node.
    async fn start(&self, ctx: &DriverContext) -> Result<(), DriverError> {
        // Kept for reconcile, which records restarted MPS daemons in the checkpoint.
        *self
            .inner
            .context
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(ctx.clone());
        if let Some(config) = &self.inner.mps_deployments {
            let runner = DeploymentRunner::new(
                ctx.client()?,
                tokio::runtime::Handle::current(),
                ctx.node_name(),
                config.clone(),
            );
            tracing::info!(namespace = %config.namespace, image = %config.image, "MPS control daemons run as Deployments");
            *self
                .inner
                .mps_runner
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = MpsRunner::Deployment(runner);
        }
        // The devices as they are at start: prepares resolve names against them, and a GPU
        // lost later fails its own claims by name (`present`) instead of being unknown.
        let inner = Arc::clone(&self.inner);
        let discovery = tokio::task::spawn_blocking(move || discover(&inner))
            .await
            .map_err(join_error)?;
        let Some(policy) = self.inner.health.clone() else {
            // Without health monitoring nothing needs the devices now: the first prepare
            // reads them again.
            if let Err(error) = discovery {
                tracing::warn!(%error, "the devices cannot be read at start; prepares will retry");
            }
            return Ok(());
        };
        let discovery = discovery?;
        HealthMonitor::new(
            Arc::clone(&self.inner.backend),
            &discovery,
            ctx.node_name(),
            policy,
        )
        .spawn(ctx.clone());
        Ok(())
    }

    fn reports_health(&self) -> bool {
        self.inner.health.is_some()
    }

    /// With `DeviceMetadata`: the SDK writes a KEP-5304 metadata file per request of every
    /// claim, holding the attributes the devices are published with, so KubeVirt's
    /// virt-launcher finds a VFIO device's `resource.kubernetes.io/pciBusID` there (see
    /// `dra_sdk::advanced::metadata`).
    fn device_metadata(&self) -> bool {
        self.inner.gates.is_enabled(FeatureGate::DeviceMetadata)
    }

    async fn prepare(&self, claim: &Claim<NvidiaConfig>) -> Result<PreparedClaim, DriverError> {
        let inner = Arc::clone(&self.inner);
        let names: Vec<&str> = claim
            .devices
            .iter()
            .map(|device| device.device.name.as_str())
            .collect();
        let discovery = discovery_for(&inner, &names).await?;

        let mut planned = Vec::with_capacity(claim.devices.len());
        for device in &claim.devices {
            let target = resolve(&inner, &discovery, &device.device.name)?;
            let explicit = names_request(claim, &inner.driver_name, device);
            let candidates: Vec<CandidateConfig<'_>> = device
                .configs
                .iter()
                .zip(explicit)
                .map(|(applied, names_request)| CandidateConfig {
                    config: applied.config.as_ref(),
                    names_request,
                })
                .collect();
            let config = select_config(
                target.device_type(),
                &device.device.name,
                &device.request,
                &candidates,
            )
            .map_err(|error| DriverError::InvalidConfig(error.to_string()))?;
            config.check_supported(&inner.gates).map_err(|error| {
                DriverError::InvalidConfig(format!(
                    "{} for {}: {error}",
                    config.kind(),
                    device.device.name
                ))
            })?;
            planned.push(Planned {
                device: device.device.name.clone(),
                admin_access: device.admin_access,
                share_id: device.share_id.clone(),
                target,
                config,
            });
        }
        claim_sharing::check(&inner, &planned)?;

        let claim_ref = claim.claim.clone();
        let task_inner = Arc::clone(&inner);
        let prepared =
            tokio::task::spawn_blocking(move || prepare_blocking(&task_inner, &claim_ref, planned))
                .await
                .map_err(join_error)??;

        let devices = claim
            .devices
            .iter()
            .zip(prepared.edits)
            .map(|(allocated, edits)| PreparedDevice::new(allocated, edits))
            .collect();
        let state = serde_json::to_value(&prepared.state).map_err(DriverError::other)?;
        tracing::info!(claim = %claim.claim, devices = claim.devices.len(), "prepared");
        Ok(PreparedClaim::new(devices)
            .with_common_edits(prepared.common)
            .with_driver_state(state))
    }

    async fn unprepare(&self, claim: &RecordedClaim) -> Result<(), DriverError> {
        let inner = Arc::clone(&self.inner);
        let claim = claim.clone();
        tokio::task::spawn_blocking(move || unprepare_blocking(&inner, &claim))
            .await
            .map_err(join_error)?
    }

    /// Rebuilds the reservations from the claims the checkpoint records as completed, the one
    /// place they are restored after a restart (claims reserved before that are not completed
    /// any more are released),
    /// gives back GPUs a released claim had bound to VFIO, and reports VFIO bindings no
    /// completed claim owns without touching them (see [`NvidiaDriver::reconcile_claims`]).
    /// Unreadable driver states and failed restores are a recoverable error: the plugin
    /// serves, and reports them.
    async fn reconcile(&self, prepared: &[RecordedClaim]) -> Result<(), ReconcileError> {
        let mut completed = Vec::with_capacity(prepared.len());
        let mut unreadable = Vec::new();
        for recorded in prepared {
            match recorded.decode_state::<ClaimState>() {
                Ok(Some(state)) => completed.push((recorded.claim.clone(), state)),
                // Nothing to reserve: the claim recorded no devices of ours.
                Ok(None) => {}
                Err(error) => unreadable.push(format!(
                    "claim {}: unreadable driver state, its devices are not reserved: {error}",
                    recorded.claim
                )),
            }
        }
        let driver = self.clone();
        let report = tokio::task::spawn_blocking(move || driver.reconcile_claims(completed))
            .await
            .map_err(|error| ReconcileError::recoverable(join_error(error)))?;
        tracing::info!(
            reserved = report.reserved.len(),
            released = report.released.len(),
            restored = ?report.restored,
            "reconciled with the checkpoint"
        );
        let context = self
            .inner
            .context
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        if let Some(ctx) = context {
            for (claim, state) in &report.restarted_states {
                if let Err(error) = ctx.update_driver_state(&claim.uid, state).await {
                    unreadable.push(format!(
                        "claim {claim}: recording its restarted MPS daemon: {error}"
                    ));
                }
            }
        }
        for orphan in &report.mig.destroyed {
            tracing::info!(
                gpu = %orphan.gpu,
                gpu_instance_id = orphan.gpu_instance_id,
                profile_id = orphan.profile_id,
                placement = %orphan.placement,
                "destroyed a MIG instance no prepared claim records"
            );
        }
        for kept in &report.mig.kept {
            tracing::warn!(
                gpu = %kept.instance.gpu,
                gpu_instance_id = kept.instance.gpu_instance_id,
                profile_id = kept.instance.profile_id,
                placement = %kept.instance.placement,
                reason = %kept.reason,
                "MIG instance no prepared claim records left as it is"
            );
        }
        for binding in &report.unowned {
            tracing::warn!(
                bus_id = %binding.bus_id,
                driver = %binding.driver,
                reason = %binding.reason,
                "GPU on a VFIO driver that no prepared claim owns; left as it is"
            );
        }
        let failures: Vec<String> = unreadable.into_iter().chain(report.failures).collect();
        if failures.is_empty() {
            Ok(())
        } else {
            Err(ReconcileError::recoverable(DriverError::other(
                failures.join("; "),
            )))
        }
    }
}
