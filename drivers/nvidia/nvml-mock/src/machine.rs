//! The emulated driver: a mock hardware profile behind NVML's semantics. Safe Rust; the C
//! functions in [`crate::abi`] translate pointers to and from these calls.
//!
//! What it models, from NVML's documentation and `shared/reference/nvidia-mig.md`:
//! initialisation counting (`nvmlInit` / `nvmlShutdown` pairs, every call but init failing
//! with `UNINITIALIZED` outside them), `NVML_INIT_FLAG_NO_GPUS`, device handles by index,
//! UUID and PCI bus ID, each GPU's device node held open while a handle on it is live and
//! NVML is initialised, MIG profiles by NVML enum index with their IDs and placements, GPU
//! and compute instances (on the mock backend's MIG model, so both backends change the same
//! state the same way), MIG mode changes that stay pending while the GPU is in use, event
//! sets, GPUs that fall off the bus, persistence mode (the driver's own, legacy setting:
//! `nvidia-persistenced` is [`crate::FakePersistenced`]), and NVLink: each GPU's links, their
//! far ends and NVLink peer-to-peer, from the profile through the mock backend.
//!
//! With a root, a held device node also shows in the root's `/proc/<pid>/fd` (a link named
//! after the real descriptor, to `/dev/nvidia<minor>`, with `/proc/<pid>/comm`), as the
//! kernel's `/proc` shows it: the driver's scan for processes holding a GPU finds the
//! library's hold there.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dra_driver_nvidia::backend::mig::{GpuInstanceInfo, MigError, MigManager};
use dra_driver_nvidia::backend::mock::MockBackend;
use dra_driver_nvidia::backend::{
    GpuBackend, GpuInfo, MigDeviceInfo, MigMode, MigPlacement, MigProfileInfo, NvLink,
};
use nvml_wrapper_sys::bindings as sys;

/// An NVML return code.
pub(crate) type Code = sys::nvmlReturn_t;

pub(crate) const SUCCESS: Code = sys::nvmlReturn_enum_NVML_SUCCESS;
pub(crate) const UNINITIALIZED: Code = sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
pub(crate) const NO_PERMISSION: Code = sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION;
pub(crate) const INVALID_ARGUMENT: Code = sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
pub(crate) const NOT_SUPPORTED: Code = sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
pub(crate) const NOT_FOUND: Code = sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
pub(crate) const INSUFFICIENT_SIZE: Code = sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
pub(crate) const TIMEOUT: Code = sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT;
pub(crate) const GPU_IS_LOST: Code = sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
pub(crate) const IN_USE: Code = sys::nvmlReturn_enum_NVML_ERROR_IN_USE;
pub(crate) const INSUFFICIENT_RESOURCES: Code =
    sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES;
pub(crate) const ARGUMENT_VERSION_MISMATCH: Code =
    sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
pub(crate) const DRIVER_NOT_LOADED: Code = sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
pub(crate) const UNKNOWN: Code = sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN;

/// GPU-instance profiles NVML defines by enum index today (`NVML_GPU_INSTANCE_PROFILE_COUNT`
/// is 0x11 in current headers; nvml-wrapper-sys 0.9 stops at 13).
pub const GPU_INSTANCE_PROFILE_COUNT: u32 = 17;

/// The most MIG devices a GPU reports (`nvmlDeviceGetMaxMigDeviceCount` on A100 and H100).
const MAX_MIG_DEVICES: u32 = 7;

/// Compute-instance profiles by NVML enum index: index → compute slices (1c, 2c, 3c, 4c, 7c).
const COMPUTE_INSTANCE_SLICES: [u32; 5] = [1, 2, 3, 4, 7];

/// Events a data-centre GPU supports (`nvmlDeviceGetSupportedEventTypes`): single- and
/// double-bit ECC, P-state, critical XID, clock.
const SUPPORTED_EVENTS: u64 = (sys::nvmlEventTypeSingleBitEccError
    | sys::nvmlEventTypeDoubleBitEccError
    | sys::nvmlEventTypePState
    | sys::nvmlEventTypeXidCriticalError
    | sys::nvmlEventTypeClock) as u64;

/// Environment variables a process that loads the double (the plugin binary in a test) sets
/// to pick the machine: the profile (a shipped name or a file), and the mock machine's root
/// (device nodes are opened under it; without it none are).
pub const PROFILE_ENV: &str = "NVML_MOCK_PROFILE";
/// See [`PROFILE_ENV`].
pub const ROOT_ENV: &str = "NVML_MOCK_ROOT";

/// The emulated driver of this copy of the library. One per loaded copy, as the real
/// driver's state is one per process: NVML's C interface has no context argument.
static DRIVER: Mutex<Option<Machine>> = Mutex::new(None);
/// Signalled when an event is queued or a GPU is lost.
static EVENTS: Condvar = Condvar::new();

/// The machine, configured from the environment on first use.
pub(crate) fn lock() -> MutexGuard<'static, Option<Machine>> {
    // Every update below completes before it can panic: a poisoned lock is still consistent.
    DRIVER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Replaces the machine (`nvmlMockConfigure`). Refused while NVML is initialised.
pub(crate) fn configure(profile: &str, root: Option<PathBuf>) -> Result<(), Code> {
    let mut driver = lock();
    if driver.as_ref().is_some_and(|machine| machine.inits > 0) {
        return Err(IN_USE);
    }
    *driver = Some(Machine::load(profile, root)?);
    Ok(())
}

/// One GPU-instance profile as NVML describes it, with its enum index.
pub(crate) struct ProfileRow<'a> {
    pub(crate) index: u32,
    pub(crate) info: &'a MigProfileInfo,
}

/// The NVML enum index of a GPU-instance profile (`nvidia-mig.md`, "NVML enum index vs.
/// profile ID"): by compute slices, with `+me` the REV1 variants, a 1-slice profile on two
/// memory slices the REV2 one, and the `+gfx`, `-me` and `+me.all` variants of current
/// headers.
pub fn nvml_profile_index(profile: &MigProfileInfo) -> Option<u32> {
    let suffix = profile
        .name
        .find(['+', '-'])
        .map(|at| &profile.name[at..])
        .unwrap_or("");
    let memory_slices = profile.placements.first().map(|placement| placement.size);
    Some(match (profile.slice_count, suffix) {
        (1, "") if memory_slices == Some(2) => 9,
        (1, "") => 0,
        (2, "") => 1,
        (3, "") => 2,
        (4, "") => 3,
        (7, "") => 4,
        (8, "") => 5,
        (6, "") => 6,
        (1, "+me") => 7,
        (2, "+me") => 8,
        (1, "+gfx") => 10,
        (2, "+gfx") => 11,
        (4, "+gfx") => 12,
        (1, "-me") => 13,
        (2, "-me") => 14,
        (1, "+me.all") => 15,
        (2, "+me.all") => 16,
        _ => return None,
    })
}

/// An event queued on a set.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Event {
    pub(crate) gpu: u32,
    pub(crate) kind: u64,
    pub(crate) data: u64,
    pub(crate) gpu_instance: u32,
    pub(crate) compute_instance: u32,
}

#[derive(Default)]
struct EventSet {
    /// GPU index → event types registered.
    registered: BTreeMap<u32, u64>,
    queue: VecDeque<Event>,
    /// Lost GPUs this set has reported.
    lost_reported: BTreeSet<u32>,
}

/// The state of the emulated driver.
pub(crate) struct Machine {
    backend: MockBackend,
    /// The GPUs in NVML index order.
    gpus: Vec<GpuInfo>,
    root: Option<PathBuf>,
    inits: u32,
    no_gpus: bool,
    /// Device nodes held open, by GPU index.
    open_nodes: BTreeMap<u32, OpenNode>,
    lost: BTreeSet<u32>,
    /// GPUs bound to another driver (vfio-pci): NVML does not enumerate them.
    detached: BTreeSet<u32>,
    busy: BTreeSet<u32>,
    refuse_events: BTreeSet<u32>,
    memory_not_supported: BTreeSet<u32>,
    raw_brand: BTreeMap<u32, u32>,
    refused_placements: BTreeSet<(u32, u32)>,
    /// GPU → the recovery action field 230 reports (absent: 0, none).
    recovery: BTreeMap<u32, u32>,
    /// GPUs in (legacy) persistence mode.
    persistence: BTreeSet<u32>,
    /// GPUs whose persistence mode cannot be changed (`NO_PERMISSION`, as without root).
    refused_persistence: BTreeSet<u32>,
    sets: BTreeMap<u32, EventSet>,
    next_set: u32,
}

impl Machine {
    fn load(profile: &str, root: Option<PathBuf>) -> Result<Self, Code> {
        let backend = MockBackend::from_profile(profile).map_err(|_| DRIVER_NOT_LOADED)?;
        let mut gpus = backend.hardware().gpus.clone();
        gpus.sort_by_key(|gpu| gpu.info.index);
        Ok(Self {
            gpus: gpus.into_iter().map(|gpu| gpu.info).collect(),
            backend,
            root,
            inits: 0,
            no_gpus: false,
            open_nodes: BTreeMap::new(),
            lost: BTreeSet::new(),
            detached: BTreeSet::new(),
            busy: BTreeSet::new(),
            refuse_events: BTreeSet::new(),
            memory_not_supported: BTreeSet::new(),
            raw_brand: BTreeMap::new(),
            refused_placements: BTreeSet::new(),
            recovery: BTreeMap::new(),
            persistence: BTreeSet::new(),
            refused_persistence: BTreeSet::new(),
            sets: BTreeMap::new(),
            next_set: 1,
        })
    }

    fn from_env() -> Result<Self, Code> {
        let profile = std::env::var(PROFILE_ENV).map_err(|_| DRIVER_NOT_LOADED)?;
        Self::load(&profile, std::env::var_os(ROOT_ENV).map(PathBuf::from))
    }

    // ---- initialisation -------------------------------------------------------------------

    /// `nvmlInitWithFlags`: counted; without `NO_GPUS` a machine without GPUs fails.
    pub(crate) fn init(slot: &mut Option<Machine>, flags: u32) -> Code {
        if slot.is_none() {
            match Machine::from_env() {
                Ok(machine) => *slot = Some(machine),
                Err(code) => return code,
            }
        }
        let Some(machine) = slot.as_mut() else {
            return DRIVER_NOT_LOADED;
        };
        let no_gpus = flags & sys::NVML_INIT_FLAG_NO_GPUS != 0;
        // nvidia-smi's "No devices were found": the driver is loaded, every GPU is bound
        // elsewhere (vfio-pci).
        if machine.visible().next().is_none() && !no_gpus {
            return NOT_FOUND;
        }
        machine.inits += 1;
        machine.no_gpus |= no_gpus;
        SUCCESS
    }

    /// `nvmlShutdown`: the last one closes the device nodes and frees the event sets.
    pub(crate) fn shutdown(&mut self) -> Code {
        if self.inits == 0 {
            return UNINITIALIZED;
        }
        self.inits -= 1;
        if self.inits == 0 {
            self.open_nodes.clear();
            self.sets.clear();
            self.no_gpus = false;
        }
        SUCCESS
    }

    pub(crate) fn initialised(&self) -> Result<(), Code> {
        if self.inits == 0 {
            Err(UNINITIALIZED)
        } else {
            Ok(())
        }
    }

    pub(crate) fn init_count(&self) -> u32 {
        self.inits
    }

    pub(crate) fn open_node_count(&self) -> usize {
        self.open_nodes.len()
    }

    // ---- system ---------------------------------------------------------------------------

    pub(crate) fn driver_version(&self) -> Result<String, Code> {
        self.initialised()?;
        self.backend.driver_version().map_err(|_| UNKNOWN)
    }

    /// NVML's integer form: 13000 is 13.0.
    pub(crate) fn cuda_driver_version(&self) -> Result<i32, Code> {
        self.initialised()?;
        let version = self.backend.cuda_driver_version().map_err(|_| UNKNOWN)?;
        i32::try_from(version.major * 1000 + version.minor * 10).map_err(|_| UNKNOWN)
    }

    pub(crate) fn gpu_count(&self) -> Result<u32, Code> {
        self.initialised()?;
        u32::try_from(self.visible().count()).map_err(|_| UNKNOWN)
    }

    /// Positions of the GPUs NVML enumerates, in index order.
    fn visible(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.gpus.len() as u32).filter(|position| !self.detached.contains(position))
    }

    // ---- handles --------------------------------------------------------------------------

    /// A handle on GPU `index` is taken: its device node is opened (once) if the machine has
    /// a root, as the NVIDIA driver's library does.
    fn attach(&mut self, index: u32) -> Result<u32, Code> {
        self.initialised()?;
        if self.detached.contains(&index) {
            return Err(NOT_FOUND);
        }
        let gpu = self.gpus.get(index as usize).ok_or(INVALID_ARGUMENT)?;
        if self.lost.contains(&index) {
            return Err(GPU_IS_LOST);
        }
        if let Some(root) = &self.root
            && !self.open_nodes.contains_key(&index)
        {
            let node = root.join(format!("dev/nvidia{}", gpu.minor));
            // A machine laid out without the node still answers: NVML on a node whose
            // device files are missing fails at init, which the profile's host tree
            // provides; a test without a host tree has no root.
            if let Ok(file) = File::open(&node) {
                let link = show_in_proc(root, &file, gpu.minor);
                self.open_nodes
                    .insert(index, OpenNode { _file: file, link });
            }
        }
        Ok(index)
    }

    pub(crate) fn gpu_by_index(&mut self, index: u32) -> Result<u32, Code> {
        self.initialised()?;
        let position = self.visible().nth(index as usize).ok_or(INVALID_ARGUMENT)?;
        self.attach(position)
    }

    pub(crate) fn gpu_by_uuid(&mut self, uuid: &str) -> Result<Handle, Code> {
        self.initialised()?;
        if let Some(position) = self.gpus.iter().position(|gpu| gpu.uuid == uuid) {
            return self.attach(position as u32).map(Handle::Gpu);
        }
        // A MIG device's UUID names the MIG device.
        for (position, gpu) in self.gpus.iter().enumerate() {
            let devices = self.backend.mig_devices(&gpu.uuid).unwrap_or_default();
            if let Some(device) = devices.iter().find(|device| device.uuid == uuid) {
                let handle = Handle::MigDevice(
                    position as u32,
                    device.gpu_instance_id,
                    device.compute_instance_id,
                );
                self.attach(position as u32)?;
                return Ok(handle);
            }
        }
        Err(NOT_FOUND)
    }

    pub(crate) fn gpu_by_pci_bus_id(&mut self, bus_id: &str) -> Result<u32, Code> {
        self.initialised()?;
        let wanted = dra_driver_nvidia::backend::normalize_pci_bus_id(bus_id)
            .map_err(|_| INVALID_ARGUMENT)?;
        let position = self
            .gpus
            .iter()
            .position(|gpu| gpu.pci.bus_id == wanted)
            .ok_or(NOT_FOUND)?;
        self.attach(position as u32)
    }

    /// NVML's index of the GPU at `position` (its place among the GPUs NVML enumerates).
    pub(crate) fn index_of(&self, position: u32) -> Result<u32, Code> {
        self.gpu(position)?;
        self.visible()
            .position(|visible| visible == position)
            .map(|index| index as u32)
            .ok_or(INVALID_ARGUMENT)
    }

    /// The GPU a handle's index names, alive.
    pub(crate) fn gpu(&self, index: u32) -> Result<&GpuInfo, Code> {
        self.initialised()?;
        if self.detached.contains(&index) {
            return Err(INVALID_ARGUMENT);
        }
        let gpu = self.gpus.get(index as usize).ok_or(INVALID_ARGUMENT)?;
        if self.lost.contains(&index) {
            return Err(GPU_IS_LOST);
        }
        Ok(gpu)
    }

    // ---- device queries -------------------------------------------------------------------

    /// NVML's brand enum for the profile's brand, or a raw value a test set.
    pub(crate) fn brand(&self, index: u32) -> Result<u32, Code> {
        let gpu = self.gpu(index)?;
        if let Some(raw) = self.raw_brand.get(&index) {
            return Ok(*raw);
        }
        Ok(match gpu.brand.as_str() {
            "Quadro" => sys::nvmlBrandType_enum_NVML_BRAND_QUADRO,
            "Tesla" => sys::nvmlBrandType_enum_NVML_BRAND_TESLA,
            "NVS" => sys::nvmlBrandType_enum_NVML_BRAND_NVS,
            "Grid" => sys::nvmlBrandType_enum_NVML_BRAND_GRID,
            "GeForce" => sys::nvmlBrandType_enum_NVML_BRAND_GEFORCE,
            "Titan" => sys::nvmlBrandType_enum_NVML_BRAND_TITAN,
            "NvidiaVApps" => sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA_VAPPS,
            "NvidiaVPC" => sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA_VPC,
            "NvidiaVCS" => sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA_VCS,
            "NvidiaVWS" => sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA_VWS,
            "NvidiaCloudGaming" => sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA_CLOUD_GAMING,
            "QuadroRTX" => sys::nvmlBrandType_enum_NVML_BRAND_QUADRO_RTX,
            "NvidiaRTX" => sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA_RTX,
            "Nvidia" => sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA,
            "GeForceRTX" => sys::nvmlBrandType_enum_NVML_BRAND_GEFORCE_RTX,
            "TitanRTX" => sys::nvmlBrandType_enum_NVML_BRAND_TITAN_RTX,
            _ => sys::nvmlBrandType_enum_NVML_BRAND_UNKNOWN,
        })
    }

    /// Total memory in bytes of a GPU or a MIG device.
    pub(crate) fn memory(&self, handle: Handle) -> Result<u64, Code> {
        match handle {
            Handle::Gpu(index) => {
                let gpu = self.gpu(index)?;
                if self.memory_not_supported.contains(&index) {
                    return Err(NOT_SUPPORTED);
                }
                Ok(gpu.memory_bytes)
            }
            Handle::MigDevice(..) => Ok(self.mig_device(handle)?.memory_bytes),
            _ => Err(INVALID_ARGUMENT),
        }
    }

    pub(crate) fn mig_mode(&self, index: u32) -> Result<MigMode, Code> {
        let gpu = self.gpu(index)?;
        self.backend
            .mig_mode(&gpu.uuid)
            .map_err(|_| UNKNOWN)?
            .ok_or(NOT_SUPPORTED)
    }

    fn mig_enabled(&self, index: u32) -> Result<(), Code> {
        if self.mig_mode(index)?.current {
            Ok(())
        } else {
            Err(NOT_SUPPORTED)
        }
    }

    /// The GPU-instance profile at NVML enum index `index`.
    pub(crate) fn profile_by_index(&self, gpu: u32, index: u32) -> Result<ProfileRow<'_>, Code> {
        self.mig_mode(gpu)?;
        if index >= GPU_INSTANCE_PROFILE_COUNT {
            return Err(INVALID_ARGUMENT);
        }
        self.profiles(gpu)?
            .into_iter()
            .find(|row| row.index == index)
            .ok_or(NOT_SUPPORTED)
    }

    fn profiles(&self, gpu: u32) -> Result<Vec<ProfileRow<'_>>, Code> {
        let info = self.gpu(gpu)?;
        let inventory = self
            .backend
            .hardware()
            .gpu(&info.uuid)
            .ok_or(INVALID_ARGUMENT)?;
        Ok(inventory
            .mig_profiles
            .iter()
            .filter_map(|info| nvml_profile_index(info).map(|index| ProfileRow { index, info }))
            .collect())
    }

    fn profile_by_id(&self, gpu: u32, profile_id: u32) -> Result<&MigProfileInfo, Code> {
        self.profiles(gpu)?
            .into_iter()
            .find(|row| row.info.id == profile_id)
            .map(|row| row.info)
            .ok_or(INVALID_ARGUMENT)
    }

    /// `nvmlDeviceGetGpuInstancePossiblePlacements_v2` for a profile ID.
    pub(crate) fn placements(&self, gpu: u32, profile_id: u32) -> Result<Vec<MigPlacement>, Code> {
        self.mig_mode(gpu)?;
        let profile = self.profile_by_id(gpu, profile_id)?;
        if self.refused_placements.contains(&(gpu, profile_id)) {
            return Err(NOT_SUPPORTED);
        }
        Ok(profile.placements.clone())
    }

    pub(crate) fn max_mig_devices(&self, gpu: u32) -> Result<u32, Code> {
        self.mig_mode(gpu)?;
        let devices = self.mig_devices(gpu)?.len() as u32;
        Ok(MAX_MIG_DEVICES.max(devices))
    }

    fn mig_devices(&self, gpu: u32) -> Result<Vec<MigDeviceInfo>, Code> {
        let info = self.gpu(gpu)?;
        self.backend.mig_devices(&info.uuid).map_err(|_| UNKNOWN)
    }

    pub(crate) fn mig_device_by_index(&self, gpu: u32, index: u32) -> Result<Handle, Code> {
        self.mig_enabled(gpu)?;
        if index >= self.max_mig_devices(gpu)? {
            return Err(INVALID_ARGUMENT);
        }
        let devices = self.mig_devices(gpu)?;
        let device = devices.get(index as usize).ok_or(NOT_FOUND)?;
        Ok(Handle::MigDevice(
            gpu,
            device.gpu_instance_id,
            device.compute_instance_id,
        ))
    }

    pub(crate) fn mig_device(&self, handle: Handle) -> Result<MigDeviceInfo, Code> {
        let Handle::MigDevice(gpu, gi, ci) = handle else {
            return Err(INVALID_ARGUMENT);
        };
        self.mig_devices(gpu)?
            .into_iter()
            .find(|device| device.gpu_instance_id == gi && device.compute_instance_id == ci)
            .ok_or(INVALID_ARGUMENT)
    }

    /// `nvmlDeviceGetAttributes_v2` of a MIG device: engines, slices, memory in MiB.
    pub(crate) fn mig_attributes(
        &self,
        handle: Handle,
    ) -> Result<sys::nvmlDeviceAttributes_t, Code> {
        let device = self.mig_device(handle)?;
        let Handle::MigDevice(gpu, ..) = handle else {
            return Err(INVALID_ARGUMENT);
        };
        let profile = self.profile_by_id(gpu, device.profile_id)?;
        Ok(sys::nvmlDeviceAttributes_t {
            multiprocessorCount: device.engines.multiprocessors,
            sharedCopyEngineCount: device.engines.copy_engines,
            sharedDecoderCount: device.engines.decoders,
            sharedEncoderCount: device.engines.encoders,
            sharedJpegCount: device.engines.jpeg_engines,
            sharedOfaCount: device.engines.ofa_engines,
            gpuInstanceSliceCount: profile.slice_count,
            computeInstanceSliceCount: profile.slice_count,
            memorySizeMB: device.memory_bytes / (1024 * 1024),
        })
    }

    // ---- NVLink ---------------------------------------------------------------------------

    /// The NVLinks of the GPU a handle names, from the profile (the mock backend's
    /// [`GpuBackend::nvlinks`]): `NOT_SUPPORTED` for a GPU without NVLink, and for a MIG
    /// device (links belong to the GPU; what NVML answers on a MIG handle is a guess).
    fn nvlinks(&self, handle: Handle) -> Result<Vec<NvLink>, Code> {
        let gpu = match handle {
            Handle::Gpu(gpu) => gpu,
            Handle::MigDevice(..) => {
                self.mig_device(handle)?;
                return Err(NOT_SUPPORTED);
            }
            _ => return Err(INVALID_ARGUMENT),
        };
        let info = self.gpu(gpu)?;
        let links = self.backend.nvlinks(&info.uuid).map_err(|_| UNKNOWN)?;
        if links.is_empty() {
            return Err(NOT_SUPPORTED);
        }
        Ok(links)
    }

    /// Link `link` of a GPU: `INVALID_ARGUMENT` past the GPU's links (NVML's answer for a
    /// link number the GPU does not have).
    fn nvlink(&self, handle: Handle, link: u32) -> Result<NvLink, Code> {
        self.nvlinks(handle)?
            .into_iter()
            .nth(link as usize)
            .ok_or(INVALID_ARGUMENT)
    }

    /// `nvmlDeviceGetNvLinkState`: whether the link is up.
    pub(crate) fn nvlink_state(&self, handle: Handle, link: u32) -> Result<bool, Code> {
        Ok(self.nvlink(handle, link)?.active)
    }

    /// `nvmlDeviceGetNvLinkRemotePciInfo_v2`: the PCI bus ID of the link's far end, in the
    /// sysfs form (`0000:c4:00.0`). `NOT_SUPPORTED` for a link that is down (a guess: NVML
    /// documents no code for it) and for a far end NVML cannot identify (the profile's
    /// `unknown`: NVSwitches invisible in a VM).
    pub(crate) fn nvlink_remote_bus_id(&self, handle: Handle, link: u32) -> Result<String, Code> {
        self.nvlink(handle, link)?
            .remote_pci_bus_id
            .ok_or(NOT_SUPPORTED)
    }

    /// `nvmlDeviceGetP2PStatus`: NVML's `nvmlGpuP2PStatus_t` between two GPUs for capability
    /// `index`. Only NVLink is modelled: `OK` where the profile makes the pair NVLink peers
    /// (the mock backend's [`GpuBackend::nvlink_p2p`]), `NOT_SUPPORTED` otherwise, and for
    /// every other capability (read, write, atomics, PCI: a guess that says "no" rather
    /// than inventing a PCIe topology). The same GPU twice is `INVALID_ARGUMENT`, a MIG
    /// device `NOT_SUPPORTED` (both guesses).
    pub(crate) fn p2p_status(
        &self,
        first: Handle,
        second: Handle,
        index: u32,
    ) -> Result<u32, Code> {
        let gpu = |handle: Handle| match handle {
            Handle::Gpu(gpu) => Ok(self.gpu(gpu)?.uuid.as_str()),
            Handle::MigDevice(..) => {
                self.mig_device(handle)?;
                Err(NOT_SUPPORTED)
            }
            _ => Err(INVALID_ARGUMENT),
        };
        let (first_uuid, second_uuid) = (gpu(first)?, gpu(second)?);
        if first == second {
            return Err(INVALID_ARGUMENT);
        }
        let peers = index == sys::nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_NVLINK
            && self
                .backend
                .nvlink_p2p(first_uuid, second_uuid)
                .map_err(|_| UNKNOWN)?
                == Some(true);
        Ok(if peers {
            sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_OK
        } else {
            sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_NOT_SUPPORTED
        })
    }

    // ---- MIG changes ----------------------------------------------------------------------

    /// `nvmlDeviceSetMigMode`: the new mode is pending and the activation status `IN_USE`
    /// while the GPU is busy; otherwise as the mock backend models it (Hopper switches at
    /// once, Ampere at the next reset).
    pub(crate) fn set_mig_mode(&mut self, gpu: u32, enabled: bool) -> Result<Code, Code> {
        let mode = self.mig_mode(gpu)?;
        let info = self.gpu(gpu)?.clone();
        if self.busy.contains(&gpu) {
            let inventory = self
                .backend
                .hardware()
                .gpu(&info.uuid)
                .ok_or(INVALID_ARGUMENT)?;
            self.backend.mig().set_mode(
                inventory,
                MigMode {
                    current: mode.current,
                    pending: enabled,
                },
            );
            return Ok(IN_USE);
        }
        if !enabled && !self.instances(gpu)?.is_empty() {
            return Err(IN_USE);
        }
        let after = self
            .backend
            .set_mig_mode(&info.uuid, enabled)
            .map_err(|_| UNKNOWN)?;
        Ok(if after.current == after.pending {
            SUCCESS
        } else {
            sys::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED
        })
    }

    /// The GPU instances of a GPU, with their compute instances.
    fn instances(&self, gpu: u32) -> Result<Vec<GpuInstanceInfo>, Code> {
        let info = self.gpu(gpu)?;
        self.backend.gpu_instances(&info.uuid).map_err(|_| UNKNOWN)
    }

    pub(crate) fn create_gpu_instance(
        &mut self,
        gpu: u32,
        profile_id: u32,
        placement: MigPlacement,
    ) -> Result<u32, Code> {
        self.mig_enabled(gpu)?;
        let profile = self.profile_by_id(gpu, profile_id)?;
        if !profile.placements.contains(&placement) {
            return Err(INVALID_ARGUMENT);
        }
        if self
            .instances(gpu)?
            .iter()
            .any(|instance| instance.placement.overlaps(&placement))
        {
            return Err(INSUFFICIENT_RESOURCES);
        }
        let uuid = self.gpu(gpu)?.uuid.clone();
        self.backend
            .create_gpu_instance(&uuid, profile_id, placement)
            .map_err(mig_code)
    }

    /// GPU instance `gi` of a GPU in MIG mode.
    pub(crate) fn gpu_instance(&self, gpu: u32, gi: u32) -> Result<GpuInstanceInfo, Code> {
        self.mig_enabled(gpu)?;
        self.instances(gpu)?
            .into_iter()
            .find(|instance| instance.gpu_instance_id == gi)
            .ok_or(NOT_FOUND)
    }

    pub(crate) fn gpu_instances_of(&self, gpu: u32, profile_id: u32) -> Result<Vec<u32>, Code> {
        self.mig_enabled(gpu)?;
        self.profile_by_id(gpu, profile_id)?;
        Ok(self
            .instances(gpu)?
            .into_iter()
            .filter(|instance| instance.profile_id == profile_id)
            .map(|instance| instance.gpu_instance_id)
            .collect())
    }

    /// Compute-instance profile `index` of GPU instance `gi`: its compute slices, and
    /// whether it spans the GPU instance (the only one the double creates, as the driver
    /// does).
    pub(crate) fn compute_profile(
        &self,
        gpu: u32,
        gi: u32,
        index: u32,
    ) -> Result<(u32, bool), Code> {
        let profile_id = self.gpu_instance(gpu, gi)?.profile_id;
        let slices = self.profile_by_id(gpu, profile_id)?.slice_count;
        let compute = *COMPUTE_INSTANCE_SLICES
            .get(index as usize)
            .ok_or(NOT_SUPPORTED)?;
        if compute > slices {
            return Err(NOT_SUPPORTED);
        }
        Ok((compute, compute == slices))
    }

    pub(crate) fn create_compute_instance(
        &mut self,
        gpu: u32,
        gi: u32,
        index: u32,
    ) -> Result<u32, Code> {
        let (_, spans) = self.compute_profile(gpu, gi, index)?;
        if !spans {
            // The mock MIG model has one compute instance per GPU instance.
            return Err(NOT_SUPPORTED);
        }
        if !self.gpu_instance(gpu, gi)?.compute_instance_ids.is_empty() {
            return Err(INSUFFICIENT_RESOURCES);
        }
        let uuid = self.gpu(gpu)?.uuid.clone();
        self.backend
            .create_compute_instance(&uuid, gi)
            .map_err(mig_code)
    }

    /// The profile index of the compute instance that spans GPU instance `gi`.
    pub(crate) fn spanning_compute_profile(&self, gpu: u32, gi: u32) -> Result<u32, Code> {
        (0..COMPUTE_INSTANCE_SLICES.len() as u32)
            .find(|index| matches!(self.compute_profile(gpu, gi, *index), Ok((_, true))))
            .ok_or(NOT_SUPPORTED)
    }

    pub(crate) fn destroy_compute_instance(
        &mut self,
        gpu: u32,
        gi: u32,
        ci: u32,
    ) -> Result<(), Code> {
        if !self
            .gpu_instance(gpu, gi)?
            .compute_instance_ids
            .contains(&ci)
        {
            return Err(INVALID_ARGUMENT);
        }
        let uuid = self.gpu(gpu)?.uuid.clone();
        self.backend
            .destroy_compute_instance(&uuid, gi, ci)
            .map_err(mig_code)
    }

    pub(crate) fn destroy_gpu_instance(&mut self, gpu: u32, gi: u32) -> Result<(), Code> {
        if !self.gpu_instance(gpu, gi)?.compute_instance_ids.is_empty() {
            return Err(IN_USE);
        }
        let uuid = self.gpu(gpu)?.uuid.clone();
        self.backend
            .destroy_gpu_instance(&uuid, gi)
            .map_err(mig_code)
    }

    // ---- events ---------------------------------------------------------------------------

    pub(crate) fn create_event_set(&mut self) -> Result<u32, Code> {
        self.initialised()?;
        let id = self.next_set;
        self.next_set += 1;
        self.sets.insert(id, EventSet::default());
        Ok(id)
    }

    pub(crate) fn free_event_set(&mut self, set: u32) -> Result<(), Code> {
        self.sets.remove(&set).map(|_| ()).ok_or(INVALID_ARGUMENT)
    }

    pub(crate) fn supported_events(&self, gpu: u32) -> Result<u64, Code> {
        self.gpu(gpu)?;
        Ok(if self.refuse_events.contains(&gpu) {
            0
        } else {
            SUPPORTED_EVENTS
        })
    }

    pub(crate) fn register_events(&mut self, gpu: u32, kinds: u64, set: u32) -> Result<(), Code> {
        self.gpu(gpu)?;
        if self.refuse_events.contains(&gpu) || kinds & !SUPPORTED_EVENTS != 0 {
            return Err(NOT_SUPPORTED);
        }
        let set = self.sets.get_mut(&set).ok_or(INVALID_ARGUMENT)?;
        *set.registered.entry(gpu).or_default() |= kinds;
        Ok(())
    }

    /// The next event of a set, or the loss of a registered GPU (`GPU_IS_LOST`, once per GPU
    /// and set), waiting up to `timeout`.
    pub(crate) fn wait(
        mut guard: MutexGuard<'static, Option<Machine>>,
        set: u32,
        timeout: Duration,
    ) -> Result<Event, Code> {
        let deadline = Instant::now() + timeout;
        loop {
            let machine = guard.as_mut().ok_or(UNINITIALIZED)?;
            machine.initialised()?;
            let lost = machine.lost.clone();
            let events = machine.sets.get_mut(&set).ok_or(INVALID_ARGUMENT)?;
            if let Some(gpu) = events
                .registered
                .keys()
                .find(|gpu| lost.contains(gpu) && !events.lost_reported.contains(gpu))
                .copied()
            {
                events.lost_reported.insert(gpu);
                return Err(GPU_IS_LOST);
            }
            if let Some(event) = events.queue.pop_front() {
                return Ok(event);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(TIMEOUT);
            }
            guard = EVENTS
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
    }

    // ---- control --------------------------------------------------------------------------

    pub(crate) fn gpu_position(&self, uuid: &str) -> Result<u32, Code> {
        self.gpus
            .iter()
            .position(|gpu| gpu.uuid == uuid)
            .map(|position| position as u32)
            .ok_or(NOT_FOUND)
    }

    /// Queues an event on every set that registered its type for the GPU.
    pub(crate) fn inject(&mut self, event: Event) {
        for set in self.sets.values_mut() {
            if set
                .registered
                .get(&event.gpu)
                .is_some_and(|kinds| kinds & event.kind != 0)
            {
                set.queue.push_back(event);
            }
        }
        EVENTS.notify_all();
    }

    /// The GPU falls off the bus: every call on it returns `GPU_IS_LOST`, waiting event sets
    /// that registered it wake with that code, and its device node is closed.
    pub(crate) fn lose(&mut self, gpu: u32) {
        self.lost.insert(gpu);
        self.open_nodes.remove(&gpu);
        EVENTS.notify_all();
    }

    /// The GPU is bound to another driver (or back, `false`): NVML stops enumerating it and
    /// closes its node.
    pub(crate) fn set_detached(&mut self, gpu: u32, detached: bool) {
        if detached {
            self.detached.insert(gpu);
            self.open_nodes.remove(&gpu);
        } else {
            self.detached.remove(&gpu);
        }
    }

    /// An operator (or a reset) sets the GPU's MIG mode, outside NVML's checks: with MIG
    /// off, its GPU instances are gone for NVML.
    pub(crate) fn set_mig_mode_outside(&mut self, gpu: u32, enabled: bool) {
        let Some(inventory) = self
            .gpus
            .get(gpu as usize)
            .and_then(|info| self.backend.hardware().gpu(&info.uuid))
        else {
            return;
        };
        self.backend
            .mig()
            .set_mode(inventory, MigMode::settled(enabled));
    }

    /// `nvmlDeviceGetAddressingMode`: NVML's enum (1 HMM, 2 ATS, 0 none).
    pub(crate) fn addressing_mode(&self, gpu: u32) -> Result<u32, Code> {
        Ok(match self.gpu(gpu)?.addressing_mode.as_deref() {
            Some("HMM") => 1,
            Some("ATS") => 2,
            _ => 0,
        })
    }

    pub(crate) fn set_busy(&mut self, gpu: u32, busy: bool) {
        if busy {
            self.busy.insert(gpu);
        } else {
            self.busy.remove(&gpu);
        }
    }

    pub(crate) fn refuse_events(&mut self, gpu: u32) {
        self.refuse_events.insert(gpu);
    }

    pub(crate) fn memory_not_supported(&mut self, gpu: u32) {
        self.memory_not_supported.insert(gpu);
    }

    pub(crate) fn set_raw_brand(&mut self, gpu: u32, raw: u32) {
        self.raw_brand.insert(gpu, raw);
    }

    pub(crate) fn set_recovery_action(&mut self, gpu: u32, action: u32) {
        self.recovery.insert(gpu, action);
    }

    /// NVML's recovery action of a GPU (field 230).
    pub(crate) fn recovery_action(&self, gpu: u32) -> Result<u32, Code> {
        self.gpu(gpu)?;
        Ok(self.recovery.get(&gpu).copied().unwrap_or(0))
    }

    pub(crate) fn refuse_placements(&mut self, gpu: u32, profile_id: u32) {
        self.refused_placements.insert((gpu, profile_id));
    }

    // ---- persistence mode -----------------------------------------------------------------

    /// `nvmlDeviceGetPersistenceMode`: the driver's own (legacy) setting.
    pub(crate) fn persistence_mode(&self, gpu: u32) -> Result<bool, Code> {
        self.gpu(gpu)?;
        Ok(self.persistence.contains(&gpu))
    }

    /// `nvmlDeviceSetPersistenceMode`; `NO_PERMISSION` where a test refused it.
    pub(crate) fn set_persistence_mode(&mut self, gpu: u32, enabled: bool) -> Result<(), Code> {
        self.gpu(gpu)?;
        if self.refused_persistence.contains(&gpu) {
            return Err(NO_PERMISSION);
        }
        self.set_persistence_outside(gpu, enabled);
        Ok(())
    }

    /// Persistence mode set outside NVML (`nvidia-smi -pm` of an operator, a boot script).
    pub(crate) fn set_persistence_outside(&mut self, gpu: u32, enabled: bool) {
        if enabled {
            self.persistence.insert(gpu);
        } else {
            self.persistence.remove(&gpu);
        }
    }

    pub(crate) fn refuse_persistence(&mut self, gpu: u32) {
        self.refused_persistence.insert(gpu);
    }
}

/// A GPU's device node the library holds, and its entry in the root's `/proc`.
struct OpenNode {
    _file: File,
    /// `<root>/proc/<pid>/fd/<fd>`, removed when the node is closed.
    link: Option<PathBuf>,
}

impl Drop for OpenNode {
    fn drop(&mut self) {
        if let Some(link) = &self.link {
            // Gone already is fine: the test may have removed the tree.
            let _ = std::fs::remove_file(link);
        }
    }
}

/// Shows `file` (the node of GPU `minor`) as held by this process in `<root>/proc`, as the
/// kernel's `/proc/<pid>/fd` does; the link's path, or `None` when the tree cannot be
/// written (the hold is then invisible, as in a container that hides `/proc`).
fn show_in_proc(root: &Path, file: &File, minor: u32) -> Option<PathBuf> {
    let process = root.join("proc").join(std::process::id().to_string());
    let fds = process.join("fd");
    std::fs::create_dir_all(&fds).ok()?;
    let comm = process.join("comm");
    if !comm.exists() {
        let name =
            std::fs::read_to_string("/proc/self/comm").unwrap_or_else(|_| "nvml-mock\n".to_owned());
        std::fs::write(&comm, name).ok()?;
    }
    let link = fds.join(file.as_raw_fd().to_string());
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(format!("/dev/nvidia{minor}"), &link).ok()?;
    Some(link)
}

pub(crate) use crate::handle::Handle;

/// The NVML code of a refusal by the mock MIG model (the double checks NVML's documented
/// refusals itself before it calls the model, so what is left is unexpected).
fn mig_code(error: MigError) -> Code {
    match error {
        MigError::PlacementTaken { .. } => INSUFFICIENT_RESOURCES,
        _ => UNKNOWN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_indexes_follow_the_nvml_header() {
        let backend = MockBackend::from_profile("dgx-a100").unwrap();
        let gpu = &backend.hardware().gpus[0];
        let index = |name: &str| {
            let profile = gpu
                .mig_profiles
                .iter()
                .find(|profile| profile.name == name)
                .unwrap();
            (profile.id, nvml_profile_index(profile))
        };
        // nvidia-mig.md: enum index → profile ID on A100-80GB.
        assert_eq!(index("1g.10gb"), (19, Some(0)));
        assert_eq!(index("1g.10gb+me"), (20, Some(7)));
        assert_eq!(index("1g.20gb"), (15, Some(9)));
        assert_eq!(index("2g.20gb"), (14, Some(1)));
        assert_eq!(index("3g.40gb"), (9, Some(2)));
        assert_eq!(index("4g.40gb"), (5, Some(3)));
        assert_eq!(index("7g.80gb"), (0, Some(4)));
    }
}
