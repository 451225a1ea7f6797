//! The NVML backend (feature `nvml`), on nvml-wrapper.
//!
//! The library (`libnvidia-ml.so.1`, or a path under the driver root) is loaded when
//! [`NvmlBackend::open`] runs, not at link time, so the crate builds and its tests run on
//! machines without the NVIDIA driver; a missing library is [`BackendError::LibraryNotFound`]
//! with a hint.
//!
//! Reads, except persistence mode ([`GpuBackend::set_persistence_mode`], for VFIO) and the
//! MIG changes of [`MigManager`].
//!
//! nvml-wrapper 0.11 wraps the GPU queries but none of the MIG instance queries
//! (`nvmlDeviceGetMigDeviceHandleByIndex`, `nvmlDeviceGetGpuInstanceId`,
//! `nvmlGpuInstanceGetInfo`, the GPU-instance profile and placement queries). Those go
//! through the raw bindings of nvml-wrapper-sys in the `ffi` submodule, the one place in the
//! crate that allows `unsafe`; every call checks that the driver exports the symbol first
//! (an older driver is [`BackendError::Unsupported`], not a panic).
//!
//! NVLink: each GPU's links are asked by number (`nvmlDeviceGetNvLinkState`) until NVML says
//! there are no more, an active link's far end with `nvmlDeviceGetNvLinkRemotePciInfo_v2`, and
//! peers with `nvmlDeviceGetP2PStatus` (`NVML_P2P_CAPS_INDEX_NVLINK`). What NVML cannot say
//! (no NVLink, a far end it cannot name, no P2P answer) is left out, never an error.
//!
//! Derived values, as upstream derives them: the architecture from the compute capability
//! (`8.0` Ampere, `9.0` Hopper …), the brand from NVML's brand enum in upstream's spelling
//! (`Nvidia`, `Tesla` …). NVML does not report the PCIe root; discovery reads it from sysfs.

use std::ffi::OsStr;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::InitFlags;
use nvml_wrapper::enum_wrappers::device::{Brand, P2pCapabilitiesIndex, P2pStatus};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::NVML_NVLINK_MAX_LINKS;

use crate::backend::events::HealthEventStream;

use super::{
    BackendError, ComputeCapability, CudaDriverVersion, DeviceRelease, GpuBackend, GpuInfo,
    MigDeviceInfo, MigMode, MigPlacement, MigProfileInfo, NvLink, PciInfo,
};
use crate::backend::mig::{GpuInstanceInfo, MigError, MigManager};

/// The NVML library's default name, found through the dynamic loader's search path.
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

/// A [`GpuBackend`] on NVML.
///
/// NVML stays initialised between calls (one session, shared), except while a
/// [`DeviceRelease`] from [`GpuBackend::release_devices`] lives: then each call initialises
/// NVML and shuts it down again, so the library holds no GPU's device node between calls
/// (the VFIO idle check must not find the plugin itself holding `/dev/nvidia<N>`).
pub struct NvmlBackend {
    sessions: Arc<Mutex<Sessions>>,
    mig: ffi::MigLib,
    library: String,
}

/// The shared NVML session and the releases in force.
#[derive(Default)]
struct Sessions {
    /// NVML initialised, kept between calls while no release is in force.
    shared: Option<Arc<Nvml>>,
    /// Live [`DeviceRelease`] guards.
    releases: usize,
}

fn lock(sessions: &Mutex<Sessions>) -> MutexGuard<'_, Sessions> {
    // Every update is one assignment or counter step: a poisoned lock is consistent.
    sessions
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NvmlBackend")
            .field("library", &self.library)
            .finish_non_exhaustive()
    }
}

impl NvmlBackend {
    /// Loads [`DEFAULT_LIBRARY`] and initializes NVML.
    pub fn open_default() -> Result<Self, BackendError> {
        Self::open(DEFAULT_LIBRARY)
    }

    /// Loads the NVML library at `library` (a name for the loader's search path, or a path
    /// such as `/driver-root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1`) and initializes
    /// NVML.
    ///
    /// NVML is initialised with `NVML_INIT_FLAG_NO_GPUS`: a node whose GPUs are all bound to
    /// vfio-pci still starts the plugin, which then unprepares what it prepared before.
    pub fn open(library: impl AsRef<OsStr>) -> Result<Self, BackendError> {
        let library_name = library.as_ref().to_string_lossy().into_owned();
        let nvml = init(&library_name)?;
        let mig = ffi::MigLib::load(library.as_ref()).map_err(|reason| {
            BackendError::LibraryNotFound {
                library: library_name.clone(),
                reason,
            }
        })?;
        tracing::info!(library = %library_name, "NVML initialized");
        Ok(Self {
            sessions: Arc::new(Mutex::new(Sessions {
                shared: Some(Arc::new(nvml)),
                releases: 0,
            })),
            mig,
            library: library_name,
        })
    }

    /// NVML, initialised: the shared session, or (while a release is in force) one for this
    /// call, shut down when the caller drops it.
    fn nvml(&self) -> Result<Arc<Nvml>, BackendError> {
        let mut sessions = lock(&self.sessions);
        if let Some(nvml) = &sessions.shared {
            return Ok(Arc::clone(nvml));
        }
        let nvml = Arc::new(init(&self.library)?);
        if sessions.releases == 0 {
            sessions.shared = Some(Arc::clone(&nvml));
        }
        Ok(nvml)
    }
}

/// `nvmlInitWithFlags(NO_GPUS)` on the library: a node whose GPUs are all bound to vfio-pci
/// still starts the plugin.
fn init(library: &str) -> Result<Nvml, BackendError> {
    Nvml::builder()
        .lib_path(OsStr::new(library))
        .flags(InitFlags::NO_GPUS)
        .init()
        .map_err(|error| match error {
            NvmlError::LibloadingError(error) => BackendError::LibraryNotFound {
                library: library.to_owned(),
                reason: error.to_string(),
            },
            NvmlError::LibraryNotFound => BackendError::LibraryNotFound {
                library: library.to_owned(),
                reason: "NVML reports its library missing".into(),
            },
            other => BackendError::Init {
                reason: other.to_string(),
            },
        })
}

/// The device handle of a GPU.
fn device<'nvml>(
    nvml: &'nvml Nvml,
    uuid: &str,
) -> Result<nvml_wrapper::Device<'nvml>, BackendError> {
    nvml.device_by_uuid(uuid).map_err(|error| match error {
        NvmlError::NotFound | NvmlError::InvalidArg => BackendError::NoSuchGpu {
            uuid: uuid.to_owned(),
        },
        other => query("device handle", Some(uuid), other),
    })
}

impl NvmlBackend {
    fn gpu_info(&self, nvml: &Nvml, index: u32) -> Result<GpuInfo, BackendError> {
        let device = nvml
            .device_by_index(index)
            .map_err(|error| query(&format!("GPU {index}"), None, error))?;
        let uuid = device
            .uuid()
            .map_err(|error| query(&format!("UUID of GPU {index}"), None, error))?;
        self.device_info(&device, index, uuid)
    }

    fn device_info(
        &self,
        device: &nvml_wrapper::Device<'_>,
        index: u32,
        uuid: String,
    ) -> Result<GpuInfo, BackendError> {
        let gpu = Some(uuid.as_str());
        let minor = device
            .minor_number()
            .map_err(|error| query("minor number", gpu, error))?;
        let product_name = device.name().map_err(|error| query("name", gpu, error))?;
        // A brand a newer driver added is not a reason to lose the GPU.
        let brand = match device.brand() {
            Ok(brand) => brand_name(brand),
            Err(NvmlError::UnexpectedVariant(raw)) => {
                tracing::warn!(gpu = %uuid, raw, "brand unknown to this plugin; published as Unknown");
                "Unknown".to_owned()
            }
            Err(error) => return Err(query("brand", gpu, error)),
        };
        let capability = device
            .cuda_compute_capability()
            .map_err(|error| query("compute capability", gpu, error))?;
        let cuda_compute_capability = ComputeCapability::new(
            u32::try_from(capability.major).unwrap_or(0),
            u32::try_from(capability.minor).unwrap_or(0),
        );
        // NOT_SUPPORTED on GPUs without a framebuffer of their own (integrated memory): the
        // GPU is published with memory 0 rather than not at all.
        let memory_bytes = match device.memory_info() {
            Ok(memory) => memory.total,
            Err(NvmlError::NotSupported) => {
                tracing::warn!(gpu = %uuid, "NVML reports no memory size for this GPU; publishing 0");
                0
            }
            Err(error) => return Err(query("memory", gpu, error)),
        };
        let pci = device
            .pci_info()
            .map_err(|error| query("PCI info", gpu, error))?;
        // NVML's pciDeviceId is device << 16 | vendor.
        let mut pci_info = PciInfo::new(
            &pci.bus_id,
            (pci.pci_device_id & 0xffff) as u16,
            (pci.pci_device_id >> 16) as u16,
        )?;
        // 0 is NVML's "not reported": every real board has a subsystem ID.
        pci_info.subsystem_id = pci.pci_sub_system_id.filter(|id| *id != 0);
        Ok(GpuInfo {
            index,
            minor,
            numa_node: self.mig.numa_node(device),
            uuid,
            product_name,
            brand,
            architecture: architecture(cuda_compute_capability).to_owned(),
            cuda_compute_capability,
            memory_bytes,
            pci: pci_info,
            pcie_root: None,
            addressing_mode: self.mig.addressing_mode(device),
        })
    }
}

impl GpuBackend for NvmlBackend {
    fn name(&self) -> String {
        "nvml".to_owned()
    }

    fn health_events(
        &self,
        gpu_uuids: &[String],
    ) -> Result<Box<dyn HealthEventStream + '_>, BackendError> {
        events::register(self, gpu_uuids).map(|stream| Box::new(stream) as _)
    }

    fn recovery_action(
        &self,
        gpu_uuid: &str,
    ) -> Result<Option<crate::backend::events::RecoveryAction>, BackendError> {
        let nvml = self.nvml()?;
        let device = device(&nvml, gpu_uuid)?;
        Ok(self.mig.recovery_action(&device))
    }

    fn persistence_mode(&self, gpu_uuid: &str) -> Result<Option<bool>, BackendError> {
        let nvml = self.nvml()?;
        match device(&nvml, gpu_uuid)?.is_in_persistent_mode() {
            Ok(enabled) => Ok(Some(enabled)),
            // Not a Linux driver, or a GPU that has no such setting.
            Err(NvmlError::NotSupported) => Ok(None),
            Err(error) => Err(query("persistence mode", Some(gpu_uuid), error)),
        }
    }

    fn set_persistence_mode(&self, gpu_uuid: &str, enabled: bool) -> Result<(), BackendError> {
        let nvml = self.nvml()?;
        let mut device = device(&nvml, gpu_uuid)?;
        device.set_persistent(enabled).map_err(|error| {
            let what = if enabled {
                "turning persistence mode on"
            } else {
                "turning persistence mode off"
            };
            query(what, Some(gpu_uuid), error)
        })
    }

    fn nvlinks(&self, gpu_uuid: &str) -> Result<Vec<NvLink>, BackendError> {
        let nvml = self.nvml()?;
        let device = device(&nvml, gpu_uuid)?;
        let mut links = Vec::new();
        // NVML has no call for how many links a GPU has: every link number up to its maximum
        // is asked (A100: 12 links, H100: 18).
        for link in 0..NVML_NVLINK_MAX_LINKS {
            let wrapper = device.link_wrapper_for(link);
            let active = match wrapper.is_active() {
                Ok(active) => active,
                // No such link: on every number, the GPU has no NVLink (a T4; an A100 PCIe
                // board without its bridge has links, all down); on some, the GPU has fewer
                // links than NVML's maximum. INVALID_ARGUMENT is what NVML
                // documents for a link number past them; a GPU may answer NOT_SUPPORTED
                // instead. Skipped rather than ending the list, so that a gap in the numbering
                // loses no link after it.
                Err(NvmlError::NotSupported | NvmlError::InvalidArg) => continue,
                // A libnvidia-ml without nvmlDeviceGetNvLinkState (older than any driver this
                // plugin supports, or a stripped-down one): no NVLink to report.
                Err(NvmlError::FailedToLoadSymbol(symbol)) => {
                    tracing::debug!(gpu = %gpu_uuid, %symbol, "NVML has no NVLink state call; no NVLinks read");
                    return Ok(Vec::new());
                }
                Err(error) => {
                    return Err(query(
                        &format!("state of NVLink {link}"),
                        Some(gpu_uuid),
                        error,
                    ));
                }
            };
            if !active {
                links.push(NvLink::inactive(link));
                continue;
            }
            links.push(match wrapper.remote_pci_info() {
                // A bus ID that does not parse names nothing: the link is up, its far end
                // unknown, rather than the GPU losing all its links.
                Ok(pci) => NvLink::active(link, Some(&pci.bus_id)).or_else(|error| {
                    tracing::warn!(gpu = %gpu_uuid, link, %error, "far end of an NVLink unreadable; taken as unknown");
                    NvLink::active(link, None)
                })?,
                // The link is up but NVML cannot name its far end: NVSwitches are invisible in
                // some VMs (NVSwitch passthrough stays with the host). The link still counts
                // as up; only the group it leads to is not known.
                Err(
                    NvmlError::NotSupported | NvmlError::Unknown | NvmlError::FailedToLoadSymbol(_),
                ) => NvLink::active(link, None)?,
                Err(error) => {
                    return Err(query(
                        &format!("far end of NVLink {link}"),
                        Some(gpu_uuid),
                        error,
                    ));
                }
            });
        }
        Ok(links)
    }

    fn nvlink_p2p(&self, gpu_uuid: &str, peer_uuid: &str) -> Result<Option<bool>, BackendError> {
        let nvml = self.nvml()?;
        let (gpu, peer) = (device(&nvml, gpu_uuid)?, device(&nvml, peer_uuid)?);
        match gpu.p2p_status(&peer, P2pCapabilitiesIndex::NvLink) {
            Ok(P2pStatus::Ok) => Ok(Some(true)),
            // NOT_SUPPORTED, GPU_NOT_SUPPORTED, DISABLED_BY_REGKEY …: NVML says no.
            Ok(_) => Ok(Some(false)),
            // A status value newer than nvml-wrapper: OK is 0 and known, so it is a no.
            Err(NvmlError::UnexpectedVariant(raw)) => {
                tracing::debug!(gpu = %gpu_uuid, peer = %peer_uuid, raw, "P2P status unknown to this plugin; taken as no NVLink P2P");
                Ok(Some(false))
            }
            // NVML does not answer: the links alone decide (`devices::topology`).
            Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => Ok(None),
            Err(error) => Err(query(
                &format!("NVLink peer-to-peer status with {peer_uuid}"),
                Some(gpu_uuid),
                error,
            )),
        }
    }

    fn release_devices(&self) -> DeviceRelease {
        let mut sessions = lock(&self.sessions);
        sessions.releases += 1;
        // Calls in flight keep their session until they return; the last one shuts NVML down.
        sessions.shared = None;
        drop(sessions);
        let sessions = Arc::clone(&self.sessions);
        DeviceRelease::new(move || lock(&sessions).releases -= 1)
    }

    fn driver_version(&self) -> Result<String, BackendError> {
        self.nvml()?
            .sys_driver_version()
            .map_err(|error| query("driver version", None, error))
    }

    fn cuda_driver_version(&self) -> Result<CudaDriverVersion, BackendError> {
        self.nvml()?
            .sys_cuda_driver_version()
            .map(CudaDriverVersion::from_nvml)
            .map_err(|error| query("CUDA driver version", None, error))
    }

    fn gpus(&self) -> Result<Vec<GpuInfo>, BackendError> {
        let nvml = self.nvml()?;
        let count = nvml
            .device_count()
            .map_err(|error| query("GPU count", None, error))?;
        // A GPU that cannot be read (fallen off the bus) is left out with a warning: the
        // others are published and keep preparing; the health monitor reports the lost one.
        Ok((0..count)
            .filter_map(|index| match self.gpu_info(&nvml, index) {
                Ok(info) => Some(info),
                Err(error) => {
                    tracing::warn!(index, %error, "GPU left out of discovery");
                    None
                }
            })
            .collect())
    }

    fn gpu(&self, uuid: &str) -> Result<Option<GpuInfo>, BackendError> {
        let nvml = self.nvml()?;
        let device = match nvml.device_by_uuid(uuid) {
            Ok(device) => device,
            Err(NvmlError::NotFound | NvmlError::InvalidArg | NvmlError::GpuLost) => {
                return Ok(None);
            }
            Err(error) => return Err(query("device handle", Some(uuid), error)),
        };
        let index = match device.index() {
            Ok(index) => index,
            Err(NvmlError::GpuLost) => return Ok(None),
            Err(error) => return Err(query("index", Some(uuid), error)),
        };
        self.device_info(&device, index, uuid.to_owned()).map(Some)
    }

    fn mig_mode(&self, gpu_uuid: &str) -> Result<Option<MigMode>, BackendError> {
        match device(&*self.nvml()?, gpu_uuid)?.mig_mode() {
            Ok(mode) => Ok(Some(MigMode {
                current: mode.current == 1,
                pending: mode.pending == 1,
            })),
            Err(NvmlError::NotSupported) => Ok(None),
            Err(error) => Err(query("MIG mode", Some(gpu_uuid), error)),
        }
    }

    fn mig_devices(&self, gpu_uuid: &str) -> Result<Vec<MigDeviceInfo>, BackendError> {
        if !self.mig_mode(gpu_uuid)?.is_some_and(|mode| mode.current) {
            return Ok(Vec::new());
        }
        let nvml = self.nvml()?;
        let device = device(&nvml, gpu_uuid)?;
        let profiles = self.mig.profiles(&device, gpu_uuid)?;
        self.mig.mig_devices(&nvml, &device, gpu_uuid, &profiles)
    }

    fn mig_profiles(&self, gpu_uuid: &str) -> Result<Vec<MigProfileInfo>, BackendError> {
        if self.mig_mode(gpu_uuid)?.is_none() {
            return Ok(Vec::new());
        }
        let nvml = self.nvml()?;
        let device = device(&nvml, gpu_uuid)?;
        self.mig.profiles(&device, gpu_uuid)
    }
}

impl MigManager for NvmlBackend {
    fn create_gpu_instance(
        &self,
        gpu_uuid: &str,
        profile_id: u32,
        placement: MigPlacement,
    ) -> Result<u32, MigError> {
        let nvml = self.nvml()?;
        let device = device(&nvml, gpu_uuid)?;
        let created = self
            .mig
            .create_gpu_instance(&device, gpu_uuid, profile_id, placement);
        // NVML says INSUFFICIENT_RESOURCES; the driver wants to know who holds the placement.
        if created.is_err()
            && let Ok(instances) = self.gpu_instances(gpu_uuid)
            && let Some(holder) = instances
                .iter()
                .find(|instance| instance.placement.overlaps(&placement))
        {
            return Err(MigError::PlacementTaken {
                gpu: gpu_uuid.to_owned(),
                placement,
                gpu_instance_id: holder.gpu_instance_id,
            });
        }
        created
    }

    fn create_compute_instance(
        &self,
        gpu_uuid: &str,
        gpu_instance_id: u32,
    ) -> Result<u32, MigError> {
        let nvml = self.nvml()?;
        let device = device(&nvml, gpu_uuid)?;
        self.mig
            .create_compute_instance(&device, gpu_uuid, gpu_instance_id)
    }

    fn destroy_compute_instance(
        &self,
        gpu_uuid: &str,
        gpu_instance_id: u32,
        compute_instance_id: u32,
    ) -> Result<(), MigError> {
        let nvml = self.nvml()?;
        let device = device(&nvml, gpu_uuid)?;
        self.mig
            .destroy_compute_instance(&device, gpu_uuid, gpu_instance_id, compute_instance_id)
    }

    fn destroy_gpu_instance(&self, gpu_uuid: &str, gpu_instance_id: u32) -> Result<(), MigError> {
        let nvml = self.nvml()?;
        let device = device(&nvml, gpu_uuid)?;
        self.mig
            .destroy_gpu_instance(&device, gpu_uuid, gpu_instance_id)
    }

    fn gpu_instances(&self, gpu_uuid: &str) -> Result<Vec<GpuInstanceInfo>, MigError> {
        if !self.mig_mode(gpu_uuid)?.is_some_and(|mode| mode.current) {
            return Ok(Vec::new());
        }
        let nvml = self.nvml()?;
        let device = device(&nvml, gpu_uuid)?;
        let profiles: Vec<u32> = self
            .mig
            .profiles(&device, gpu_uuid)?
            .iter()
            .map(|profile| profile.id)
            .collect();
        self.mig.gpu_instances(&device, gpu_uuid, &profiles)
    }

    fn set_mig_mode(&self, gpu_uuid: &str, enabled: bool) -> Result<MigMode, MigError> {
        let nvml = self.nvml()?;
        let device = device(&nvml, gpu_uuid)?;
        self.mig.set_mig_mode(&device, gpu_uuid, enabled)
    }
}

/// Health events through an NVML event set.
mod events {
    use std::collections::VecDeque;
    use std::sync::Arc;
    use std::time::Duration;

    use nvml_wrapper::Nvml;
    use nvml_wrapper::bitmasks::event::EventTypes;
    use nvml_wrapper::error::NvmlError;

    use super::ffi::RawEventSet;
    use super::{NvmlBackend, device, query};
    use crate::backend::BackendError;
    use crate::backend::events::{HealthEvent, HealthEventKind, HealthEventStream};

    /// The UUID of an event whose device cannot be named: the monitor treats a lost GPU of
    /// unknown identity as affecting every device.
    const UNKNOWN_DEVICE: &str = "unknown";

    /// An event set with every GPU registered for critical XIDs and double-bit ECC errors.
    /// Upstream also registers single-bit ECC errors, which the hardware corrects and which
    /// never taint a device; they are left out here.
    ///
    /// The stream holds its own NVML session for as long as it lives: an event set keeps
    /// NVML attached to every GPU registered in it.
    pub(super) struct NvmlEventStream<'nvml> {
        backend: &'nvml NvmlBackend,
        /// Declared before `nvml`: the set is freed before the session ends.
        set: RawEventSet<'nvml>,
        nvml: Arc<Nvml>,
        /// The GPUs registered, to find which one NVML reports lost.
        registered: Vec<String>,
        /// GPUs that could not be resolved at registration: reported as lost first.
        pending: VecDeque<HealthEvent>,
    }

    pub(super) fn register<'nvml>(
        backend: &'nvml NvmlBackend,
        gpu_uuids: &[String],
    ) -> Result<NvmlEventStream<'nvml>, BackendError> {
        let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
        let nvml = backend.nvml()?;
        let set = backend
            .mig
            .create_event_set()
            .map_err(|error| query("event set", None, error))?;
        let mut pending = VecDeque::new();
        let mut registered = Vec::new();
        for uuid in gpu_uuids {
            let device = match device(&nvml, uuid) {
                Ok(device) => device,
                Err(error) => {
                    tracing::warn!(%uuid, %error, "GPU cannot be resolved for event registration; reporting it lost");
                    pending.push_back(HealthEvent::new(uuid.clone(), HealthEventKind::GpuLost));
                    continue;
                }
            };
            // A GPU that supports only some of the events is registered for those; one that
            // supports none, or refuses registration, is unmonitored alone: the other GPUs
            // stay watched.
            let unmonitored = |why: String| {
                tracing::warn!(%uuid, reason = %why, "health events of this GPU cannot be watched; its devices are unmonitored");
                HealthEvent::new(uuid.clone(), HealthEventKind::Unmonitored)
            };
            let events = match device.supported_event_types() {
                Ok(supported) => wanted & supported,
                Err(error) => {
                    pending.push_back(unmonitored(format!("supported event types: {error}")));
                    continue;
                }
            };
            if events.is_empty() {
                pending.push_back(unmonitored("no XID or ECC events on this GPU".into()));
                continue;
            }
            // The raw call: nvml-wrapper frees the whole set when one GPU refuses.
            match backend.mig.register_events(&device, events.bits(), &set) {
                Ok(()) => registered.push(uuid.clone()),
                Err(NvmlError::Unknown) => {
                    // NVML leaves the set undefined after UNKNOWN: nothing can be watched.
                    return Err(query("event registration", Some(uuid), NvmlError::Unknown));
                }
                Err(error) => pending.push_back(unmonitored(format!("registration: {error}"))),
            }
        }
        Ok(NvmlEventStream {
            backend,
            set,
            nvml,
            registered,
            pending,
        })
    }

    impl HealthEventStream for NvmlEventStream<'_> {
        fn wait(&mut self, timeout: Duration) -> Result<Option<HealthEvent>, BackendError> {
            if let Some(event) = self.pending.pop_front() {
                return Ok(Some(event));
            }
            let timeout_ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
            // The raw wait: nvml-wrapper's drops the GPU and compute instance IDs.
            let data = match self.backend.mig.wait_event(&self.set, timeout_ms) {
                Ok(data) => data,
                Err(NvmlError::Timeout) => return Ok(None),
                Err(NvmlError::GpuLost) => return Ok(self.lost_gpus()),
                Err(error) => return Err(query("event wait", None, error)),
            };
            let event_type = EventTypes::from_bits_truncate(data.eventType);
            let device = super::ffi::event_device(&data, &self.nvml);
            let uuid = match device.uuid() {
                Ok(uuid) => uuid,
                Err(error) => {
                    tracing::warn!(%error, "event on a device that cannot be named; reporting a lost GPU");
                    return Ok(Some(HealthEvent::new(
                        UNKNOWN_DEVICE,
                        HealthEventKind::GpuLost,
                    )));
                }
            };
            let kind = if event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                // NVML's 999 is an XID it could not decode: kept as is, as upstream does.
                HealthEventKind::Xid(data.eventData)
            } else if event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
                HealthEventKind::DoubleBitEcc
            } else {
                return Ok(None);
            };
            // An event inside a MIG device carries its GPU and compute instance IDs
            // (0xFFFFFFFF: the whole GPU): it affects that MIG device only.
            let uuid = match self.mig_device(&uuid, data.gpuInstanceId, data.computeInstanceId) {
                Some(mig) => mig,
                None => uuid,
            };
            Ok(Some(HealthEvent::new(uuid, kind)))
        }
    }

    impl NvmlEventStream<'_> {
        /// NVML said a registered GPU is lost without saying which: every registered GPU
        /// that no longer answers is reported; if none can be singled out, an unknown one.
        fn lost_gpus(&mut self) -> Option<HealthEvent> {
            for uuid in &self.registered {
                let answers = self
                    .nvml
                    .device_by_uuid(uuid.as_str())
                    .and_then(|device| device.uuid());
                if matches!(answers, Err(NvmlError::GpuLost)) {
                    self.pending
                        .push_back(HealthEvent::new(uuid.clone(), HealthEventKind::GpuLost));
                }
            }
            self.pending
                .pop_front()
                .or_else(|| Some(HealthEvent::new(UNKNOWN_DEVICE, HealthEventKind::GpuLost)))
        }

        /// The UUID of the MIG device with these instance IDs on this GPU.
        fn mig_device(
            &self,
            gpu: &str,
            gpu_instance: u32,
            compute_instance: u32,
        ) -> Option<String> {
            if gpu_instance == u32::MAX {
                return None;
            }
            let devices = match crate::backend::GpuBackend::mig_devices(self.backend, gpu) {
                Ok(devices) => devices,
                Err(error) => {
                    tracing::warn!(gpu, gpu_instance, %error, "MIG device of an event cannot be listed; the event counts for the GPU");
                    return None;
                }
            };
            devices
                .into_iter()
                .find(|device| {
                    device.gpu_instance_id == gpu_instance
                        && (compute_instance == u32::MAX
                            || device.compute_instance_id == compute_instance)
                })
                .map(|device| device.uuid)
        }
    }
}

fn query(what: &str, gpu: Option<&str>, error: NvmlError) -> BackendError {
    BackendError::Query {
        what: what.to_owned(),
        gpu: gpu.map(str::to_owned),
        reason: error.to_string(),
    }
}

/// The architecture family of a compute capability, as upstream names it.
pub fn architecture(capability: ComputeCapability) -> &'static str {
    match (capability.major, capability.minor) {
        (1, _) => "Tesla",
        (2, _) => "Fermi",
        (3, _) => "Kepler",
        (5, _) => "Maxwell",
        (6, _) => "Pascal",
        (7, minor) if minor < 5 => "Volta",
        (7, _) => "Turing",
        (8, 9) => "Ada Lovelace",
        (8, _) => "Ampere",
        (9, _) => "Hopper",
        (10 | 12, _) => "Blackwell",
        _ => "Unknown",
    }
}

/// NVML's brand, in upstream's spelling.
fn brand_name(brand: Brand) -> String {
    let name = match brand {
        Brand::Unknown => "Unknown",
        Brand::Quadro => "Quadro",
        Brand::Tesla => "Tesla",
        Brand::NVS => "NVS",
        Brand::GRID => "Grid",
        Brand::GeForce => "GeForce",
        Brand::Titan => "Titan",
        Brand::VApps => "NvidiaVApps",
        Brand::VPC => "NvidiaVPC",
        Brand::VCS => "NvidiaVCS",
        Brand::VWS => "NvidiaVWS",
        Brand::CloudGaming => "NvidiaCloudGaming",
        Brand::QuadroRTX => "QuadroRTX",
        Brand::NvidiaRTX => "NvidiaRTX",
        Brand::Nvidia => "Nvidia",
        Brand::GeForceRTX => "GeForceRTX",
        Brand::TitanRTX => "TitanRTX",
        #[allow(unreachable_patterns)] // newer nvml-wrapper releases add brands
        _ => "Unknown",
    };
    name.to_owned()
}

/// The raw NVML calls nvml-wrapper 0.11 does not wrap.
#[allow(unsafe_code)]
mod ffi {
    mod mig;

    use std::ffi::{CStr, OsStr};

    use nvml_wrapper::error::nvml_try;
    use nvml_wrapper::{Device, Nvml};
    use nvml_wrapper_sys::bindings::{
        NvmlLib, nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t, nvmlFieldValue_t,
        nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
        nvmlGpuInstanceProfileInfo_v2_t, nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        nvmlReturn_enum_NVML_ERROR_NOT_FOUND, nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        nvmlReturn_enum_NVML_SUCCESS, nvmlReturn_t,
    };

    use crate::backend::{BackendError, MigDeviceInfo, MigEngines, MigPlacement, MigProfileInfo};

    /// GPU-instance profiles by NVML enum index: `NVML_GPU_INSTANCE_PROFILE_COUNT` is 0x11 in
    /// current headers (1- to 8-slice profiles, REV1/REV2, and the `+gfx`, `-me` and
    /// `+me.all` variants of Blackwell and RTX PRO); nvml-wrapper-sys 0.9 stops at 13.
    const GPU_INSTANCE_PROFILE_COUNT: u32 = 17;

    /// `nvmlDeviceGetAddressingMode` (NVML 580 and later), not in nvml-wrapper-sys 0.9.
    type GetAddressingMode =
        unsafe extern "C" fn(nvmlDevice_t, *mut AddressingMode) -> nvmlReturn_t;

    /// `nvmlDeviceAddressingMode_v1_t`.
    #[repr(C)]
    struct AddressingMode {
        version: u32,
        value: u32,
    }

    /// A second handle on the NVML library nvml-wrapper loaded (the dynamic loader returns the
    /// same instance, so NVML's initialization and device handles are shared), for the raw
    /// MIG calls.
    pub(super) struct MigLib {
        lib: NvmlLib,
        /// The same library, for the functions nvml-wrapper-sys has no binding for.
        raw: libloading::Library,
    }

    fn failed(what: &str, gpu: &str, code: nvmlReturn_t) -> BackendError {
        BackendError::Query {
            what: what.to_owned(),
            gpu: Some(gpu.to_owned()),
            reason: describe(code),
        }
    }

    /// NVML's meaning of a return code; nvml-wrapper 0.11 does not know every code the MIG
    /// calls return (INSUFFICIENT_RESOURCES is "unexpected enum variant value: 23" there).
    pub(super) fn describe(code: nvmlReturn_t) -> String {
        match code {
            19 => "in use by another client (NVML_ERROR_IN_USE)".to_owned(),
            23 => "insufficient resources: the placement is taken or no instance is left \
                   (NVML_ERROR_INSUFFICIENT_RESOURCES)"
                .to_owned(),
            29 => "the GPU is not in a state that allows it (NVML_ERROR_INVALID_STATE)".to_owned(),
            _ => match nvml_try(code) {
                Err(error) => format!("{error} (NVML error {code})"),
                Ok(()) => format!("NVML returned {code}"),
            },
        }
    }

    fn unsupported(function: &str) -> BackendError {
        BackendError::Unsupported {
            what: format!("{function} (not exported by this NVIDIA driver)"),
            backend: "nvml".into(),
        }
    }

    /// An NVML event set, freed when dropped.
    pub(super) struct RawEventSet<'lib> {
        lib: &'lib MigLib,
        set: nvmlEventSet_t,
    }

    impl Drop for RawEventSet<'_> {
        fn drop(&mut self) {
            // SAFETY: the set NVML created (the symbol was checked then) and nothing else
            // frees; the stream holding it keeps NVML initialised until after this runs.
            let code = unsafe { self.lib.lib.nvmlEventSetFree(self.set) };
            if let Err(error) = nvml_try(code) {
                tracing::warn!(%error, "freeing an NVML event set failed");
            }
        }
    }

    /// The device of an event NVML just delivered.
    pub(super) fn event_device<'nvml>(data: &nvmlEventData_t, nvml: &'nvml Nvml) -> Device<'nvml> {
        // SAFETY: the device handle NVML returned with the event, of this NVML instance;
        // the wrapper only reads through it.
        unsafe { Device::new(data.device, nvml) }
    }

    impl MigLib {
        pub(super) fn load(library: &OsStr) -> Result<Self, String> {
            // SAFETY: loading the NVML library runs no code beyond its initializers, which
            // nvml-wrapper has already run by loading the same library.
            let lib = unsafe { NvmlLib::new(library) }.map_err(|error| error.to_string())?;
            // SAFETY: as above.
            let raw =
                unsafe { libloading::Library::new(library) }.map_err(|error| error.to_string())?;
            Ok(Self { lib, raw })
        }

        /// NVML's recovery action for the GPU (field `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`,
        /// 230, R565 and later); `None` when the driver does not report it.
        pub(super) fn recovery_action(
            &self,
            device: &Device<'_>,
        ) -> Option<crate::backend::events::RecoveryAction> {
            /// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`.
            const RECOVERY_ACTION_FIELD: u32 = 230;
            self.lib.nvmlDeviceGetFieldValues.as_ref().ok()?;
            // SAFETY: a plain C struct of integers and a union of integers; all zero is valid.
            let mut value: nvmlFieldValue_t = unsafe { std::mem::zeroed() };
            value.fieldId = RECOVERY_ACTION_FIELD;
            // SAFETY: symbol checked; a live device handle; one valid field value to fill.
            let code = unsafe {
                self.lib
                    .nvmlDeviceGetFieldValues(device.handle(), 1, &mut value)
            };
            if code != nvmlReturn_enum_NVML_SUCCESS
                || value.nvmlReturn != nvmlReturn_enum_NVML_SUCCESS
            {
                return None;
            }
            // SAFETY: NVML reports this field as an unsigned int (`uiVal`).
            let raw = unsafe { value.value.uiVal };
            Some(crate::backend::events::RecoveryAction::from_nvml(raw))
        }

        /// `HMM` or `ATS` when the driver exports `nvmlDeviceGetAddressingMode` and the GPU
        /// uses one; `None` otherwise (older drivers, mode NONE).
        pub(super) fn addressing_mode(&self, device: &Device<'_>) -> Option<String> {
            // SAFETY: the symbol, when present, has NVML's signature for this function.
            let function = unsafe {
                self.raw
                    .get::<GetAddressingMode>(b"nvmlDeviceGetAddressingMode\0")
            }
            .ok()?;
            let mut mode = AddressingMode {
                // NVML's versioned-struct convention: size | version << 24.
                version: (std::mem::size_of::<AddressingMode>() as u32) | (1 << 24),
                value: 0,
            };
            // SAFETY: a live device handle of the same NVML instance; `mode` a valid,
            // versioned out-struct.
            let code = unsafe { function(device.handle(), &mut mode) };
            if code != nvmlReturn_enum_NVML_SUCCESS {
                return None;
            }
            match mode.value {
                1 => Some("HMM".to_owned()),
                2 => Some("ATS".to_owned()),
                _ => None,
            }
        }

        /// `nvmlEventSetCreate`: a set that is freed when dropped. Raw, because
        /// nvml-wrapper's set borrows the session it was made in and frees itself when one
        /// GPU refuses registration.
        pub(super) fn create_event_set(
            &self,
        ) -> Result<RawEventSet<'_>, nvml_wrapper::error::NvmlError> {
            if self.lib.nvmlEventSetCreate.is_err() || self.lib.nvmlEventSetFree.is_err() {
                return Err(nvml_wrapper::error::NvmlError::FailedToLoadSymbol(
                    "nvmlEventSetCreate".to_owned(),
                ));
            }
            let mut set: nvmlEventSet_t = std::ptr::null_mut();
            // SAFETY: symbol checked; `set` a valid out-pointer.
            nvml_try(unsafe { self.lib.nvmlEventSetCreate(&mut set) })?;
            Ok(RawEventSet { lib: self, set })
        }

        /// `nvmlDeviceRegisterEvents`, leaving the set as it was when NVML refuses.
        pub(super) fn register_events(
            &self,
            device: &Device<'_>,
            events: u64,
            set: &RawEventSet<'_>,
        ) -> Result<(), nvml_wrapper::error::NvmlError> {
            if self.lib.nvmlDeviceRegisterEvents.is_err() {
                return Err(nvml_wrapper::error::NvmlError::FailedToLoadSymbol(
                    "nvmlDeviceRegisterEvents".to_owned(),
                ));
            }
            // SAFETY: symbol checked; a live device handle and a live set (borrowed), both of
            // this NVML instance.
            let code = unsafe {
                self.lib
                    .nvmlDeviceRegisterEvents(device.handle(), events, set.set)
            };
            nvml_try(code)
        }

        /// `nvmlEventSetWait_v2`, keeping the GPU and compute instance IDs nvml-wrapper drops.
        pub(super) fn wait_event(
            &self,
            set: &RawEventSet<'_>,
            timeout_ms: u32,
        ) -> Result<nvmlEventData_t, nvml_wrapper::error::NvmlError> {
            if self.lib.nvmlEventSetWait_v2.is_err() {
                return Err(nvml_wrapper::error::NvmlError::FailedToLoadSymbol(
                    "nvmlEventSetWait_v2".to_owned(),
                ));
            }
            // SAFETY: a plain C struct of a pointer and integers; all zero is valid.
            let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
            // SAFETY: symbol checked; the set is live (borrowed) and of this NVML instance;
            // `data` is a valid out-struct.
            let code = unsafe { self.lib.nvmlEventSetWait_v2(set.set, &mut data, timeout_ms) };
            nvml_try(code).map(|()| data)
        }

        /// NUMA node of a GPU, when the driver exports `nvmlDeviceGetNumaNodeId` and knows it.
        pub(super) fn numa_node(&self, device: &Device<'_>) -> Option<u32> {
            self.lib.nvmlDeviceGetNumaNodeId.as_ref().ok()?;
            let mut node = 0;
            // SAFETY: the symbol exists (checked above), the handle is a live device handle
            // of the same NVML instance, and `node` is a valid out-pointer.
            let code = unsafe { self.lib.nvmlDeviceGetNumaNodeId(device.handle(), &mut node) };
            (code == nvmlReturn_enum_NVML_SUCCESS).then_some(node)
        }

        /// The GPU-instance profiles of a GPU with their placements. Profiles NVML answers
        /// NOT_SUPPORTED or INVALID_ARGUMENT for are skipped, as upstream does.
        pub(super) fn profiles(
            &self,
            device: &Device<'_>,
            gpu: &str,
        ) -> Result<Vec<MigProfileInfo>, BackendError> {
            if self.lib.nvmlDeviceGetGpuInstanceProfileInfoV.is_err() {
                return Err(unsupported("nvmlDeviceGetGpuInstanceProfileInfoV"));
            }
            if self
                .lib
                .nvmlDeviceGetGpuInstancePossiblePlacements_v2
                .is_err()
            {
                return Err(unsupported("nvmlDeviceGetGpuInstancePossiblePlacements_v2"));
            }
            // SAFETY: a live device handle of the same NVML instance.
            let handle: nvmlDevice_t = unsafe { device.handle() };
            let mut profiles = Vec::new();
            for profile in 0..GPU_INSTANCE_PROFILE_COUNT {
                // SAFETY: a plain C struct of integers and a char array; all zero is valid.
                let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
                // NVML's versioned-struct convention: size | version << 24.
                info.version =
                    (std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32) | (2 << 24);
                // SAFETY: symbol checked above; `info` is a valid, versioned out-struct.
                let code = unsafe {
                    self.lib
                        .nvmlDeviceGetGpuInstanceProfileInfoV(handle, profile, &mut info)
                };
                if code == nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
                    || code == nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
                {
                    continue;
                }
                if code != nvmlReturn_enum_NVML_SUCCESS {
                    return Err(failed(
                        &format!("GPU-instance profile {profile}"),
                        gpu,
                        code,
                    ));
                }
                // The name is NUL-terminated within its 96 bytes ("MIG 1g.10gb").
                let bytes: Vec<u8> = info.name.iter().map(|c| *c as u8).collect();
                let name = CStr::from_bytes_until_nul(&bytes)
                    .map(|name| name.to_string_lossy().into_owned())
                    .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
                let name = name.trim().trim_start_matches("MIG ").to_owned();
                // A profile whose placements NVML will not give is left out, not fatal: the
                // GPU's other profiles still partition it.
                let placements = match self.placements(handle, info.id, gpu) {
                    Ok(placements) => placements,
                    Err(error) => {
                        tracing::warn!(gpu, profile = %name, %error, "MIG profile left out: no placements");
                        continue;
                    }
                };
                profiles.push(MigProfileInfo {
                    id: info.id,
                    name,
                    slice_count: info.sliceCount,
                    max_instances: info.instanceCount,
                    memory_mib: info.memorySizeMB,
                    engines: MigEngines {
                        multiprocessors: info.multiprocessorCount,
                        copy_engines: info.copyEngineCount,
                        decoders: info.decoderCount,
                        encoders: info.encoderCount,
                        jpeg_engines: info.jpegCount,
                        ofa_engines: info.ofaCount,
                    },
                    placements,
                });
            }
            crate::backend::sort_mig_profiles(&mut profiles);
            Ok(profiles)
        }

        fn placements(
            &self,
            handle: nvmlDevice_t,
            profile_id: u32,
            gpu: &str,
        ) -> Result<Vec<MigPlacement>, BackendError> {
            let what = || format!("placements of GPU-instance profile {profile_id}");
            // A profile has at most 8 placements (one per memory slice); ask for room for
            // more so that a future GPU is not cut short.
            let mut placements = [nvmlGpuInstancePlacement_t { start: 0, size: 0 }; 32];
            let mut count = placements.len() as u32;
            // SAFETY: symbol checked by the caller; the array has room for `count` entries.
            let code = unsafe {
                self.lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(
                    handle,
                    profile_id,
                    placements.as_mut_ptr(),
                    &mut count,
                )
            };
            if code != nvmlReturn_enum_NVML_SUCCESS {
                return Err(failed(&what(), gpu, code));
            }
            Ok(placements
                .iter()
                .take(count as usize)
                .map(|placement| MigPlacement::new(placement.start, placement.size))
                .collect())
        }

        /// The MIG devices of a GPU in MIG mode.
        pub(super) fn mig_devices(
            &self,
            nvml: &Nvml,
            device: &Device<'_>,
            gpu: &str,
            profiles: &[MigProfileInfo],
        ) -> Result<Vec<MigDeviceInfo>, BackendError> {
            for (present, name) in [
                (
                    self.lib.nvmlDeviceGetMaxMigDeviceCount.is_ok(),
                    "nvmlDeviceGetMaxMigDeviceCount",
                ),
                (
                    self.lib.nvmlDeviceGetMigDeviceHandleByIndex.is_ok(),
                    "nvmlDeviceGetMigDeviceHandleByIndex",
                ),
                (
                    self.lib.nvmlDeviceGetGpuInstanceId.is_ok(),
                    "nvmlDeviceGetGpuInstanceId",
                ),
                (
                    self.lib.nvmlDeviceGetComputeInstanceId.is_ok(),
                    "nvmlDeviceGetComputeInstanceId",
                ),
                (
                    self.lib.nvmlDeviceGetGpuInstanceById.is_ok(),
                    "nvmlDeviceGetGpuInstanceById",
                ),
                (
                    self.lib.nvmlGpuInstanceGetInfo.is_ok(),
                    "nvmlGpuInstanceGetInfo",
                ),
            ] {
                if !present {
                    return Err(unsupported(name));
                }
            }
            // SAFETY: a live device handle of the same NVML instance.
            let handle: nvmlDevice_t = unsafe { device.handle() };
            let mut max = 0;
            // SAFETY: symbols checked above; out-pointers are valid locals.
            let code = unsafe { self.lib.nvmlDeviceGetMaxMigDeviceCount(handle, &mut max) };
            if code != nvmlReturn_enum_NVML_SUCCESS {
                return Err(failed("MIG device count", gpu, code));
            }
            let mut devices = Vec::new();
            for index in 0..max {
                let mut mig: nvmlDevice_t = std::ptr::null_mut();
                // SAFETY: as above.
                let code = unsafe {
                    self.lib
                        .nvmlDeviceGetMigDeviceHandleByIndex(handle, index, &mut mig)
                };
                if code == nvmlReturn_enum_NVML_ERROR_NOT_FOUND {
                    continue; // an empty slot
                }
                if code != nvmlReturn_enum_NVML_SUCCESS {
                    return Err(failed(&format!("MIG device {index}"), gpu, code));
                }
                let (mut gi, mut ci) = (0, 0);
                // SAFETY: `mig` is the MIG device handle NVML just returned.
                let code = unsafe { self.lib.nvmlDeviceGetGpuInstanceId(mig, &mut gi) };
                if code != nvmlReturn_enum_NVML_SUCCESS {
                    return Err(failed(
                        &format!("GPU instance of MIG device {index}"),
                        gpu,
                        code,
                    ));
                }
                // SAFETY: as above.
                let code = unsafe { self.lib.nvmlDeviceGetComputeInstanceId(mig, &mut ci) };
                if code != nvmlReturn_enum_NVML_SUCCESS {
                    return Err(failed(
                        &format!("compute instance of MIG device {index}"),
                        gpu,
                        code,
                    ));
                }
                let mut instance: nvmlGpuInstance_t = std::ptr::null_mut();
                // SAFETY: as above.
                let code = unsafe {
                    self.lib
                        .nvmlDeviceGetGpuInstanceById(handle, gi, &mut instance)
                };
                if code != nvmlReturn_enum_NVML_SUCCESS {
                    return Err(failed(&format!("GPU instance {gi}"), gpu, code));
                }
                // SAFETY: a plain C struct; all zero (null device pointer) is valid.
                let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
                // SAFETY: `instance` is the handle NVML just returned; `info` a valid out-struct.
                let code = unsafe { self.lib.nvmlGpuInstanceGetInfo(instance, &mut info) };
                if code != nvmlReturn_enum_NVML_SUCCESS {
                    return Err(failed(&format!("info of GPU instance {gi}"), gpu, code));
                }
                // SAFETY: `mig` is a live MIG device handle of this NVML instance; the
                // wrapper only reads through it.
                let mig_device = unsafe { Device::new(mig, nvml) };
                let wrap =
                    |what: &str, error: nvml_wrapper::error::NvmlError| BackendError::Query {
                        what: format!("{what} of MIG device {index} (GPU instance {gi})"),
                        gpu: Some(gpu.to_owned()),
                        reason: error.to_string(),
                    };
                let uuid = mig_device.uuid().map_err(|error| wrap("UUID", error))?;
                let attributes = mig_device
                    .attributes()
                    .map_err(|error| wrap("attributes", error))?;
                let memory_bytes = match mig_device.memory_info() {
                    Ok(memory) => memory.total,
                    Err(_) => attributes.memory_size_mb.saturating_mul(1024 * 1024),
                };
                let profile = profiles
                    .iter()
                    .find(|profile| profile.id == info.profileId)
                    .map(|profile| profile.name.clone())
                    .unwrap_or_else(|| {
                        format!(
                            "{}g.{}gb",
                            attributes.gpu_instance_slice_count,
                            attributes.memory_size_mb.div_ceil(1024)
                        )
                    });
                devices.push(MigDeviceInfo {
                    uuid,
                    gpu_instance_id: gi,
                    compute_instance_id: ci,
                    profile_id: info.profileId,
                    profile,
                    placement: MigPlacement::new(info.placement.start, info.placement.size),
                    memory_bytes,
                    engines: MigEngines {
                        multiprocessors: attributes.multiprocessor_count,
                        copy_engines: attributes.shared_copy_engine_count,
                        decoders: attributes.shared_decoder_count,
                        encoders: attributes.shared_encoder_count,
                        jpeg_engines: attributes.shared_jpeg_count,
                        ofa_engines: attributes.shared_ofa_count,
                    },
                });
            }
            Ok(devices)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_a_clear_error() {
        let error = NvmlBackend::open("/nonexistent/libnvidia-ml.so.1").unwrap_err();
        assert!(
            matches!(error, BackendError::LibraryNotFound { .. }),
            "{error}"
        );
        let message = error.to_string();
        assert!(
            message.contains("/nonexistent/libnvidia-ml.so.1"),
            "{message}"
        );
        assert!(message.contains("NVIDIA driver installed"), "{message}");
    }

    #[test]
    fn architectures_follow_the_compute_capability() {
        assert_eq!(architecture(ComputeCapability::new(7, 5)), "Turing");
        assert_eq!(architecture(ComputeCapability::new(8, 0)), "Ampere");
        assert_eq!(architecture(ComputeCapability::new(8, 9)), "Ada Lovelace");
        assert_eq!(architecture(ComputeCapability::new(9, 0)), "Hopper");
    }

    #[test]
    fn brands_are_spelled_as_upstream() {
        assert_eq!(brand_name(Brand::Nvidia), "Nvidia");
        assert_eq!(brand_name(Brand::Tesla), "Tesla");
    }
}
