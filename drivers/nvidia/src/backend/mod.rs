//! What the driver asks of the GPU hardware, behind one trait: [`GpuBackend`].
//!
//! Two implementations ship with the crate:
//!
//! * [`mock::MockBackend`]: a machine described by a hardware profile (YAML). The shipped
//!   profiles (`dgx-a100`, `dgx-h100`, `mixed`, `workstation`) hold the values real hardware
//!   reports; see `drivers/nvidia/profiles/README.md` for the schema and the sources.
//! * `nvml::NvmlBackend` (feature `nvml`): the NVIDIA Management Library, loaded at run time,
//!   so the crate builds and its tests run on machines without the NVIDIA driver.
//!
//! Beside it, the backend's other two faces: [`mig::MigManager`], the one trait that changes MIG
//! state, and [`events::HealthEventStream`], the hardware's health events.
//!
//! The trait reads, with one exception: [`GpuBackend::set_persistence_mode`], which the VFIO
//! path uses to let go of a GPU before it is bound to vfio-pci and to give the setting back
//! afterwards. MIG changes are [`mig::MigManager`]'s. All calls are synchronous, like NVML
//! itself; async callers run them on a blocking thread.
//!
//! ```
//! use dra_driver_nvidia::backend::{GpuBackend, mock::MockBackend};
//!
//! let backend = MockBackend::from_profile("dgx-h100")?;
//! let inventory = backend.inventory()?;
//! assert_eq!(inventory.gpus.len(), 8);
//! assert_eq!(inventory.gpus[0].info.product_name, "NVIDIA H100 80GB HBM3");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub mod events;
pub mod mig;
pub mod mock;
mod nvlink;
#[cfg(feature = "nvml")]
pub mod nvml;

pub use nvlink::{NvLink, nvlinks_connect};

/// Everything the driver asks of the GPU hardware. Read-only, except persistence mode.
///
/// GPUs are addressed by UUID (`GPU-…`), the one identity that survives re-enumeration.
/// Implementations are cheap to share (`Arc<dyn GpuBackend>`).
pub trait GpuBackend: Send + Sync + fmt::Debug {
    /// A short description for logs: `nvml`, `mock:dgx-a100`.
    fn name(&self) -> String;

    /// The kernel driver version, as NVML prints it (`580.126.20`, `535.104.05`).
    fn driver_version(&self) -> Result<String, BackendError>;

    /// The CUDA version the driver supports.
    fn cuda_driver_version(&self) -> Result<CudaDriverVersion, BackendError>;

    /// All GPUs, in NVML index order.
    fn gpus(&self) -> Result<Vec<GpuInfo>, BackendError>;

    /// One GPU by UUID, `None` when there is no such GPU any more (removed, fallen off the
    /// bus, bound to another driver). Asks about that GPU only: what prepare and unprepare
    /// use, so that a call on one GPU does not read every GPU. Default: through
    /// [`GpuBackend::gpus`].
    fn gpu(&self, uuid: &str) -> Result<Option<GpuInfo>, BackendError> {
        Ok(self.gpus()?.into_iter().find(|gpu| gpu.uuid == uuid))
    }

    /// MIG mode of a GPU; `None` when the GPU does not support MIG.
    fn mig_mode(&self, gpu_uuid: &str) -> Result<Option<MigMode>, BackendError>;

    /// The MIG devices (GPU instance + compute instance) that exist on a GPU. Empty when MIG
    /// is off or unsupported.
    fn mig_devices(&self, gpu_uuid: &str) -> Result<Vec<MigDeviceInfo>, BackendError>;

    /// The GPU-instance profiles a GPU supports, with their possible placements. Empty when
    /// the GPU does not support MIG.
    fn mig_profiles(&self, gpu_uuid: &str) -> Result<Vec<MigProfileInfo>, BackendError>;

    /// Registers for the health events of these GPUs (critical XIDs, double-bit ECC, GPU
    /// lost) and returns the stream that delivers them, on the calling (blocking) thread. An
    /// error means events cannot be watched: the health monitor marks the devices
    /// unmonitored. Default: [`BackendError::Unsupported`].
    fn health_events(
        &self,
        gpu_uuids: &[String],
    ) -> Result<Box<dyn crate::backend::events::HealthEventStream + '_>, BackendError> {
        let _ = gpu_uuids;
        Err(BackendError::Unsupported {
            what: "health events".into(),
            backend: self.name(),
        })
    }

    /// What the GPU needs before its health taints may be cleared (NVML's recovery action);
    /// `None` when the backend or the driver does not report one. Default: `None`.
    fn recovery_action(
        &self,
        gpu_uuid: &str,
    ) -> Result<Option<crate::backend::events::RecoveryAction>, BackendError> {
        let _ = gpu_uuid;
        Ok(None)
    }

    /// Whether the GPU is in persistence mode (NVML's `nvmlDeviceGetPersistenceMode`: the
    /// driver keeps the GPU initialised with no client); `None` when the backend or the GPU
    /// does not report it. Default: `None`.
    fn persistence_mode(&self, gpu_uuid: &str) -> Result<Option<bool>, BackendError> {
        let _ = gpu_uuid;
        Ok(None)
    }

    /// Turns persistence mode on or off (NVML's `nvmlDeviceSetPersistenceMode`, the driver's
    /// own setting, not `nvidia-persistenced`'s; Linux only, needs root). The one setting this
    /// trait changes: a GPU going to vfio-pci must be let go of first, and gets its setting
    /// back when it returns to `nvidia`. Default: [`BackendError::Unsupported`].
    fn set_persistence_mode(&self, gpu_uuid: &str, enabled: bool) -> Result<(), BackendError> {
        let _ = (gpu_uuid, enabled);
        Err(BackendError::Unsupported {
            what: "setting persistence mode".into(),
            backend: self.name(),
        })
    }

    /// The GPU's NVLinks by link number: NVML's link state (`nvmlDeviceGetNvLinkState`) and,
    /// for an active link, the PCI bus ID of its far end (`nvmlDeviceGetNvLinkRemotePciInfo_v2`:
    /// another GPU's on a bridge or direct mesh, an NVSwitch's on NVSwitch machines). Empty when
    /// the GPU has no NVLink (NVML: `NOT_SUPPORTED`). Default: empty.
    fn nvlinks(&self, gpu_uuid: &str) -> Result<Vec<NvLink>, BackendError> {
        let _ = gpu_uuid;
        Ok(Vec::new())
    }

    /// Whether NVML reports peer-to-peer over NVLink between two GPUs
    /// (`nvmlDeviceGetP2PStatus` with `NVML_P2P_CAPS_INDEX_NVLINK`); `None` when it does not
    /// say. Default: `None`.
    fn nvlink_p2p(&self, gpu_uuid: &str, peer_uuid: &str) -> Result<Option<bool>, BackendError> {
        let _ = (gpu_uuid, peer_uuid);
        Ok(None)
    }

    /// Lets go of every GPU for as long as the returned guard lives, so that a check for
    /// processes holding `/dev/nvidia<N>` (before a GPU is bound to vfio-pci) does not find
    /// this plugin: NVML is shut down between calls until the guard is dropped. Default:
    /// the backend holds nothing.
    fn release_devices(&self) -> DeviceRelease {
        DeviceRelease::default()
    }

    /// One consistent read of everything above.
    fn inventory(&self) -> Result<Inventory, BackendError> {
        let driver_version = self.driver_version()?;
        let cuda_driver_version = self.cuda_driver_version()?;
        let gpus = self
            .gpus()?
            .into_iter()
            .map(|info| {
                let mig_mode = self.mig_mode(&info.uuid)?;
                let (mig_devices, mig_profiles) = match mig_mode {
                    Some(_) => (
                        self.mig_devices(&info.uuid)?,
                        self.mig_profiles(&info.uuid)?,
                    ),
                    None => (Vec::new(), Vec::new()),
                };
                Ok(GpuInventory {
                    nvlinks: optional_nvlinks(self, &info.uuid),
                    nvlink_peers: None,
                    info,
                    mig_mode,
                    mig_devices,
                    mig_profiles,
                })
            })
            .collect::<Result<Vec<_>, BackendError>>()?;
        let mut inventory = Inventory {
            driver_version,
            cuda_driver_version,
            gpus,
        };
        ask_nvlink_peers(self, &mut inventory);
        Ok(inventory)
    }
}

/// A GPU's NVLinks, or none with a warning when the backend fails to say: topology is
/// published as an extra, and a GPU without it is still a GPU (a claim that asks for a
/// connected pair then just does not get this one).
fn optional_nvlinks<B: GpuBackend + ?Sized>(backend: &B, uuid: &str) -> Vec<NvLink> {
    backend.nvlinks(uuid).unwrap_or_else(|error| {
        tracing::warn!(gpu = %uuid, %error, "NVLink state unreadable; no NVLink attributes for this GPU");
        Vec::new()
    })
}

/// Fills [`GpuInventory::nvlink_peers`]: NVML's peer-to-peer answer for every pair of GPUs
/// that both have an active link. A GPU's list stays `None` when NVML fails or does not answer
/// for one of its pairs, so that a partial answer is never taken for a whole one.
pub(crate) fn ask_nvlink_peers<B: GpuBackend + ?Sized>(backend: &B, inventory: &mut Inventory) {
    let linked: Vec<String> = inventory
        .gpus
        .iter()
        .filter(|gpu| gpu.nvlinks.iter().any(|link| link.active))
        .map(|gpu| gpu.info.uuid.clone())
        .collect();
    for gpu in &mut inventory.gpus {
        if !linked.contains(&gpu.info.uuid) {
            continue;
        }
        let mut peers = Some(Vec::new());
        for other in linked.iter().filter(|other| **other != gpu.info.uuid) {
            match backend.nvlink_p2p(&gpu.info.uuid, other) {
                Ok(Some(true)) => {
                    if let Some(peers) = peers.as_mut() {
                        peers.push(other.clone());
                    }
                }
                Ok(Some(false)) => {}
                Ok(None) => peers = None,
                Err(error) => {
                    tracing::warn!(gpu = %gpu.info.uuid, peer = %other, %error, "NVLink peer-to-peer status unreadable; using the links alone");
                    peers = None;
                }
            }
        }
        gpu.nvlink_peers = peers;
    }
}

/// What [`GpuBackend::release_devices`] returns: the devices stay released until it is
/// dropped.
#[derive(Default)]
#[must_use = "the devices are held again as soon as this is dropped"]
pub struct DeviceRelease {
    on_drop: Option<Box<dyn FnOnce() + Send>>,
}

impl DeviceRelease {
    /// A release that runs `end` when dropped.
    pub fn new(end: impl FnOnce() + Send + 'static) -> Self {
        Self {
            on_drop: Some(Box::new(end)),
        }
    }
}

impl fmt::Debug for DeviceRelease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceRelease").finish_non_exhaustive()
    }
}

impl Drop for DeviceRelease {
    fn drop(&mut self) {
        if let Some(end) = self.on_drop.take() {
            end();
        }
    }
}

/// The hardware of one node, as one [`GpuBackend::inventory`] call saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Inventory {
    /// Kernel driver version as NVML prints it.
    pub driver_version: String,
    /// CUDA version supported by the driver.
    pub cuda_driver_version: CudaDriverVersion,
    /// The GPUs, in NVML index order.
    pub gpus: Vec<GpuInventory>,
}

impl Inventory {
    /// The GPU with this UUID.
    pub fn gpu(&self, uuid: &str) -> Option<&GpuInventory> {
        self.gpus.iter().find(|gpu| gpu.info.uuid == uuid)
    }
}

/// One GPU and its MIG state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct GpuInventory {
    /// Identity and properties.
    pub info: GpuInfo,
    /// MIG mode; `None` when the GPU does not support MIG.
    pub mig_mode: Option<MigMode>,
    /// Existing MIG devices.
    pub mig_devices: Vec<MigDeviceInfo>,
    /// Supported GPU-instance profiles with their placements.
    pub mig_profiles: Vec<MigProfileInfo>,
    /// NVLinks by link number ([`GpuBackend::nvlinks`]); empty when the GPU has none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlinks: Vec<NvLink>,
    /// The UUIDs of the GPUs NVML reports peer-to-peer over NVLink with
    /// ([`GpuBackend::nvlink_p2p`]); `None` when it was not asked (no active link) or did not
    /// answer for every pair. See [`crate::devices::topology`] for how it is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_peers: Option<Vec<String>>,
}

impl GpuInventory {
    /// The profile with this GPU-instance profile ID.
    pub fn mig_profile(&self, profile_id: u32) -> Option<&MigProfileInfo> {
        self.mig_profiles
            .iter()
            .find(|profile| profile.id == profile_id)
    }
}

/// Identity and properties of one physical GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct GpuInfo {
    /// NVML index. Changes when a GPU falls off the bus: never use it as an identity.
    pub index: u32,
    /// Device minor number (`/dev/nvidia<minor>`); stable across reboots on the same
    /// hardware, which is why device names are built from it.
    pub minor: u32,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// Product name as NVML reports it (`NVIDIA A100-SXM4-80GB`, `Tesla T4`).
    pub product_name: String,
    /// Brand, as the upstream driver spells it (`Nvidia`, `Tesla`, `Quadro` …).
    pub brand: String,
    /// Architecture family (`Turing`, `Ampere`, `Hopper` …).
    pub architecture: String,
    /// CUDA compute capability.
    pub cuda_compute_capability: ComputeCapability,
    /// Total framebuffer memory in bytes.
    pub memory_bytes: u64,
    /// PCI identity.
    pub pci: PciInfo,
    /// NUMA node of the GPU, when the platform reports one.
    pub numa_node: Option<u32>,
    /// PCIe root complex (`pci0000:00`), when known. NVML does not report it; the driver
    /// derives it from sysfs through the host (see [`crate::host`]).
    pub pcie_root: Option<String>,
    /// Addressing mode (`HMM`, `ATS`), when the driver reports one.
    pub addressing_mode: Option<String>,
}

/// PCI identity of a GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct PciInfo {
    /// Bus ID in the sysfs form: lowercase, 4-digit domain (`0000:07:00.0`). NVML prints
    /// `00000000:07:00.0`; [`normalize_pci_bus_id`] converts.
    pub bus_id: String,
    /// PCI vendor ID (`0x10de` for NVIDIA).
    pub vendor_id: u16,
    /// PCI device ID (`0x20b2` for A100-SXM4-80GB).
    pub device_id: u16,
    /// PCI subsystem ID (subsystem device << 16 | subsystem vendor), when known.
    pub subsystem_id: Option<u32>,
}

impl PciInfo {
    /// A PCI identity; the bus ID is normalized with [`normalize_pci_bus_id`].
    pub fn new(bus_id: &str, vendor_id: u16, device_id: u16) -> Result<Self, BackendError> {
        Ok(Self {
            bus_id: normalize_pci_bus_id(bus_id)?,
            vendor_id,
            device_id,
            subsystem_id: None,
        })
    }

    /// `0x10de`: the form of the upstream `vendorID` attribute.
    pub fn vendor_id_hex(&self) -> String {
        format!("{:#06x}", self.vendor_id)
    }

    /// `0x20b2`: the form of the upstream `deviceID` attribute.
    pub fn device_id_hex(&self) -> String {
        format!("{:#06x}", self.device_id)
    }
}

/// Converts an NVML (`00000000:07:00.0`) or sysfs (`0000:07:00.0`) PCI bus ID to the sysfs
/// form, lowercase with a 4-digit domain.
///
/// ```
/// use dra_driver_nvidia::backend::normalize_pci_bus_id;
/// assert_eq!(normalize_pci_bus_id("00000000:0F:00.0")?, "0000:0f:00.0");
/// assert_eq!(normalize_pci_bus_id("0000:b7:00.0")?, "0000:b7:00.0");
/// assert!(normalize_pci_bus_id("07:00").is_err());
/// # Ok::<(), dra_driver_nvidia::backend::BackendError>(())
/// ```
pub fn normalize_pci_bus_id(bus_id: &str) -> Result<String, BackendError> {
    let invalid = || BackendError::InvalidValue {
        field: "pci bus id".into(),
        value: bus_id.to_owned(),
        reason: "expected [domain:]bus:device.function in hex, e.g. 0000:07:00.0".into(),
    };
    let parts: Vec<&str> = bus_id.trim().split(':').collect();
    let (domain, bus, rest) = match parts.as_slice() {
        [domain, bus, rest] => (*domain, *bus, *rest),
        [bus, rest] => ("0", *bus, *rest),
        _ => return Err(invalid()),
    };
    let (device, function) = rest.split_once('.').ok_or_else(invalid)?;
    let hex = |text: &str, max: u32| {
        u32::from_str_radix(text, 16)
            .ok()
            .filter(|value| *value <= max)
            .ok_or_else(invalid)
    };
    let domain = hex(domain, 0xffff)?;
    let bus = hex(bus, 0xff)?;
    let device = hex(device, 0x1f)?;
    let function = hex(function, 0x7)?;
    Ok(format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"))
}

/// CUDA compute capability, `major.minor` (`8.0` for A100, `9.0` for H100).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ComputeCapability {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl ComputeCapability {
    /// `major.minor`.
    pub fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }
}

/// CUDA version supported by the driver, `major.minor` (`12.2`, `13.0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CudaDriverVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl CudaDriverVersion {
    /// `major.minor`.
    pub fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// From NVML's integer form (`12020` is 12.2).
    pub fn from_nvml(version: i32) -> Self {
        let version = u32::try_from(version).unwrap_or(0);
        Self {
            major: version / 1000,
            minor: (version % 1000) / 10,
        }
    }
}

macro_rules! major_minor_text {
    ($type:ident, $what:literal) => {
        impl fmt::Display for $type {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}.{}", self.major, self.minor)
            }
        }

        impl FromStr for $type {
            type Err = BackendError;

            fn from_str(text: &str) -> Result<Self, Self::Err> {
                let invalid = || BackendError::InvalidValue {
                    field: $what.into(),
                    value: text.to_owned(),
                    reason: "expected <major>.<minor>, e.g. 8.0".into(),
                };
                let (major, minor) = text.trim().split_once('.').ok_or_else(invalid)?;
                Ok(Self {
                    major: major.parse().map_err(|_| invalid())?,
                    minor: minor.parse().map_err(|_| invalid())?,
                })
            }
        }

        impl TryFrom<String> for $type {
            type Error = BackendError;

            fn try_from(text: String) -> Result<Self, Self::Error> {
                text.parse()
            }
        }

        impl From<$type> for String {
            fn from(value: $type) -> Self {
                value.to_string()
            }
        }
    };
}

major_minor_text!(ComputeCapability, "compute capability");
major_minor_text!(CudaDriverVersion, "CUDA driver version");

/// MIG mode of a MIG-capable GPU. A change of mode is pending until the GPU is reset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigMode {
    /// MIG is on now.
    pub current: bool,
    /// MIG will be on after the next GPU reset.
    pub pending: bool,
}

impl MigMode {
    /// The same mode now and after a reset.
    pub fn settled(enabled: bool) -> Self {
        Self {
            current: enabled,
            pending: enabled,
        }
    }
}

/// A placement of a GPU instance, in memory slices (8 per GPU on A100 and H100), as NVML's
/// `nvmlGpuInstancePlacement_t` and `nvidia-smi mig -lgipp` report it: `{0,4}:4` means
/// starts 0 and 4, size 4.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct MigPlacement {
    /// First memory slice.
    pub start: u32,
    /// Number of memory slices.
    pub size: u32,
}

impl MigPlacement {
    /// `start:size`.
    pub fn new(start: u32, size: u32) -> Self {
        Self { start, size }
    }

    /// The memory slices it covers.
    pub fn slices(&self) -> std::ops::Range<u32> {
        self.start..self.start.saturating_add(self.size)
    }

    /// Whether two placements share a memory slice.
    pub fn overlaps(&self, other: &MigPlacement) -> bool {
        let (a, b) = (self.slices(), other.slices());
        a.start < b.end && b.start < a.end
    }
}

impl fmt::Display for MigPlacement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.start, self.size)
    }
}

/// Compute and engine counts of a MIG profile or device (NVML's
/// `nvmlGpuInstanceProfileInfo_t` / `nvmlDeviceAttributes_t` fields).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigEngines {
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Copy engines.
    pub copy_engines: u32,
    /// Video decoders (NVDEC).
    pub decoders: u32,
    /// Video encoders (NVENC).
    pub encoders: u32,
    /// JPEG engines.
    pub jpeg_engines: u32,
    /// Optical flow accelerators.
    pub ofa_engines: u32,
}

/// A GPU-instance profile (one row of `nvidia-smi mig -lgip`) and its possible placements
/// (`-lgipp`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct MigProfileInfo {
    /// The profile ID nvidia-smi prints (19 for `1g.10gb` on A100-80GB), not NVML's enum
    /// index.
    pub id: u32,
    /// Profile name without the `MIG ` prefix: `1g.10gb`, `1g.10gb+me`.
    pub name: String,
    /// Compute slices (the `g` number).
    pub slice_count: u32,
    /// Most instances of this profile one GPU holds.
    pub max_instances: u32,
    /// Memory in MiB (NVML's `memorySizeMB`, which is MiB).
    pub memory_mib: u64,
    /// Compute and engine counts.
    #[serde(flatten)]
    pub engines: MigEngines,
    /// Possible placements, in memory slices.
    pub placements: Vec<MigPlacement>,
}

impl MigProfileInfo {
    /// Memory in bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib.saturating_mul(1024 * 1024)
    }
}

/// Sorts GPU-instance profiles as `nvidia-smi mig -lgip` lists them: by memory, then compute
/// slices, then profile ID (`1g.10gb`, `1g.10gb+me`, `1g.20gb`, `2g.20gb` …). Both backends
/// return them in this order, whatever the order of NVML's enum or of a profile file.
pub fn sort_mig_profiles(profiles: &mut [MigProfileInfo]) {
    profiles.sort_by_key(|profile| (profile.memory_mib, profile.slice_count, profile.id));
}

/// A MIG device that exists: a GPU instance with one compute instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct MigDeviceInfo {
    /// `MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// GPU instance ID (assigned by the driver).
    pub gpu_instance_id: u32,
    /// Compute instance ID within the GPU instance.
    pub compute_instance_id: u32,
    /// GPU-instance profile ID (19, 20, 15, 14, 9, 5, 0 on A100 and H100).
    pub profile_id: u32,
    /// GPU-instance profile name (`1g.10gb`).
    pub profile: String,
    /// Placement of the GPU instance, in memory slices.
    pub placement: MigPlacement,
    /// Memory of the device in bytes, as the device reports it (may differ slightly from the
    /// profile's memory, see `nvidia-mig.md`).
    pub memory_bytes: u64,
    /// Compute and engine counts of the device.
    pub engines: MigEngines,
}

/// Why a backend call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The NVML library could not be loaded.
    #[error(
        "cannot load the NVML library ({library}): {reason}; is the NVIDIA driver installed and \
         its libraries visible under the driver root?"
    )]
    LibraryNotFound {
        /// The library looked for.
        library: String,
        /// What the loader said.
        reason: String,
    },
    /// NVML is there but did not initialize.
    #[error("NVML did not initialize: {reason}")]
    Init {
        /// What NVML said.
        reason: String,
    },
    /// A query failed.
    #[error("{what}{}: {reason}", gpu.as_deref().map(|gpu| format!(" of {gpu}")).unwrap_or_default())]
    Query {
        /// What was asked.
        what: String,
        /// The GPU asked about, if any.
        gpu: Option<String>,
        /// Why it failed.
        reason: String,
    },
    /// No GPU has this UUID.
    #[error("no GPU with UUID {uuid}")]
    NoSuchGpu {
        /// The UUID asked for.
        uuid: String,
    },
    /// The backend does not implement this query.
    #[error("{what} is not supported by the {backend} backend")]
    Unsupported {
        /// What was asked.
        what: String,
        /// The backend.
        backend: String,
    },
    /// A value does not have the expected form.
    #[error("invalid {field} {value:?}: {reason}")]
    InvalidValue {
        /// What the value is.
        field: String,
        /// The value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_capability_round_trips_as_text() {
        let cc: ComputeCapability = "8.0".parse().unwrap();
        assert_eq!(cc, ComputeCapability::new(8, 0));
        assert_eq!(cc.to_string(), "8.0");
        assert!("8".parse::<ComputeCapability>().is_err());
        assert!("x.0".parse::<ComputeCapability>().is_err());
    }

    #[test]
    fn cuda_version_from_nvml_integer() {
        assert_eq!(
            CudaDriverVersion::from_nvml(12020),
            CudaDriverVersion::new(12, 2)
        );
        assert_eq!(
            CudaDriverVersion::from_nvml(13000),
            CudaDriverVersion::new(13, 0)
        );
        assert_eq!(
            CudaDriverVersion::from_nvml(-1),
            CudaDriverVersion::new(0, 0)
        );
    }

    #[test]
    fn pci_bus_ids_are_normalized() {
        assert_eq!(
            normalize_pci_bus_id("00000000:BD:00.0").unwrap(),
            "0000:bd:00.0"
        );
        assert_eq!(normalize_pci_bus_id("07:00.0").unwrap(), "0000:07:00.0");
        for bad in ["", "0000:07:00", "0000:07:20.0", "0000:07:00.8", "zz:00.0"] {
            assert!(normalize_pci_bus_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn placements_overlap_by_memory_slices() {
        let a = MigPlacement::new(0, 4);
        assert!(a.overlaps(&MigPlacement::new(3, 1)));
        assert!(!a.overlaps(&MigPlacement::new(4, 4)));
        assert_eq!(MigPlacement::new(4, 4).to_string(), "4:4");
    }

    #[test]
    fn pci_ids_print_like_upstream() {
        let pci = PciInfo::new("0000:07:00.0", 0x10de, 0x20b2).unwrap();
        assert_eq!(pci.vendor_id_hex(), "0x10de");
        assert_eq!(pci.device_id_hex(), "0x20b2");
    }
}
