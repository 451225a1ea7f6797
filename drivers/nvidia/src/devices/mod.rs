//! Discovery: from what the [`GpuBackend`] and the [`Host`] report to the devices the plugin
//! publishes, with upstream's names, attributes and capacities (`drivers.md` A.1, A.2).
//!
//! | Device | Name | When |
//! |---|---|---|
//! | full GPU (`type=gpu`) | `gpu-<minor>` | MIG mode off (a GPU in MIG mode runs no work as a whole) |
//! | static MIG (`type=mig`) | `gpu-<parentMinor>-mig-<profile>-<giProfileID>-<placementStart>` | for each MIG device that exists |
//! | VFIO (`type=vfio`) | `gpu-vfio-<n>` | with [`DiscoveryOptions::passthrough`] (gate `PassthroughSupport`), for GPUs without MIG devices |
//!
//! Names are stable across reboots: the device minor (not the NVML index, which changes when
//! a GPU falls off the bus), the MIG profile ID and placement (not the driver-assigned GPU
//! instance ID), and for VFIO the position of the GPU's PCI function among all NVIDIA GPU
//! functions in bus-ID order (a GPU bound to vfio-pci has no minor). `<profile>` is the
//! profile name lowercased, without dots, other characters outside `[a-z0-9-]` as `-`
//! (`1g.10gb+me` → `1g10gb-me`).
//!
//! **Attributes** (driver domain `gpu.nvidia.com` unless qualified), as upstream HEAD
//! publishes them:
//!
//! * GPU: `type`, `uuid`, `productName`, `brand`, `architecture`, `cudaComputeCapability`
//!   (version), `driverVersion` (version), `cudaDriverVersion` (version),
//!   `resource.kubernetes.io/pciBusID`, `resource.kubernetes.io/pcieRoot` and
//!   `resource.kubernetes.io/numaNode` when known (a one-element int list with
//!   [`DiscoveryOptions::list_type_attributes`], gate `DRAListTypeAttributes`),
//!   `addressingMode` when reported, `nvlinkGroup` and `nvlinkActiveLinks` when the GPU has
//!   NVLink ([`topology`]); capacity
//!   `memory` (bytes). Upstream removed `index`, `minor` and `pcieBusID` (issue #563), and so
//!   does this driver.
//! * MIG: `type`, `uuid` (`MIG-…`), `parentUUID`, `profile` (`1g.10gb`), the parent's
//!   `productName`, `brand`, `architecture`, versions, PCI, NUMA, addressing and `nvlinkGroup`
//!   attributes;
//!   capacities `multiprocessors`, `copyEngines`, `decoders`, `encoders`, `jpegEngines`,
//!   `ofaEngines`, `memory` (the profile's memory, MiB × 2^20) and `memorySlice<i>` = 1 for
//!   each memory slice of its placement. The engine capacities are usable from the claim's
//!   container: its CDI spec mounts every library of the driver's version, the video ones
//!   (`libnvcuvid`, `libnvidia-encode`, `libnvidia-opticalflow`) included
//!   ([`crate::cdi`], `docs/cdi.md`).
//! * VFIO: `type`, `uuid` (the GPU's, when known), `deviceID` (`0x20b2`), `vendorID`
//!   (`0x10de`), `productName`, `iommuFDEnabled` (`/dev/iommu` exists),
//!   `resource.kubernetes.io/{pciBusID,pcieRoot,numaNode}`; capacity `addressableMemory`.
//!
//! # A GPU and its VFIO twin
//!
//! The same GPU is published twice when passthrough is on: `gpu-<minor>` for containers and
//! `gpu-vfio-<n>` for VMs. They must never be allocated at the same time. This driver uses
//! **shared counters**: a counter set `gpu-vfio-<n>-counter-set` with one counter `device` = 1,
//! consumed (1) by both twins. The scheduler then refuses the second twin in the same
//! allocation step that would have handed it out, with no window. Upstream instead removes the
//! sibling from the ResourceSlice at prepare and republishes; between an allocation and that
//! republish the scheduler can hand out both (several claims scheduled in one cycle, or a
//! slow plugin), and a plugin restart forgets it. Taints would have the same window and
//! need a republish per prepare. Counters need `DRAPartitionableDevices` (default on from
//! Kubernetes 1.36; on 1.34–1.35 it must be enabled); where the API server drops them, the
//! SDK reports the dropped fields and the prepare-time check (a device already prepared, or
//! its twin, is refused) is what remains.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use dra_sdk::attributes::{Bytes, ToAttributeValue, Version};
use dra_sdk::slices::{
    AttributeValue, CounterSet, Device, DeviceAttributes, DeviceCapacity, DriverResources, Pool,
};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClass, DeviceClassSpec, DeviceSelector,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::backend::{
    BackendError, GpuBackend, GpuInfo, GpuInventory, Inventory, MigDeviceInfo, MigMode,
    MigProfileInfo,
};
use crate::host::{Host, HostError, facts};
use crate::sharing::ConsumableShares;

pub mod counters;
pub mod partitions;
pub mod topology;
pub use partitions::{MigPartition, PartitionableGpu, partition_pool_name};

/// The driver name: the attribute domain, and the `spec.driver` of its ResourceSlices.
pub const DRIVER_NAME: &str = "gpu.nvidia.com";
/// DeviceClass of full GPUs.
pub const GPU_DEVICE_CLASS: &str = "gpu.nvidia.com";
/// DeviceClass of MIG devices.
pub const MIG_DEVICE_CLASS: &str = "mig.nvidia.com";
/// DeviceClass of VFIO devices.
pub const VFIO_DEVICE_CLASS: &str = "vfio.gpu.nvidia.com";
/// The extended resource name the GPU DeviceClass maps (KEP-5004), as upstream's chart sets.
pub const GPU_EXTENDED_RESOURCE_NAME: &str = "nvidia.com/gpu";
/// The counter every VFIO twin pair shares (see the module docs).
pub const TWIN_COUNTER: &str = "device";

/// PCI class codes of GPUs: VGA controller and 3D controller.
const GPU_PCI_CLASSES: [&str; 2] = ["0x0300", "0x0302"];
const NVIDIA_VENDOR: &str = "0x10de";

/// The `type` attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceType {
    /// A full GPU.
    Gpu,
    /// A MIG device.
    Mig,
    /// A GPU for passthrough to a VM.
    Vfio,
}

impl DeviceType {
    /// `gpu`, `mig` or `vfio`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gpu => "gpu",
            Self::Mig => "mig",
            Self::Vfio => "vfio",
        }
    }
}

impl ToAttributeValue for DeviceType {
    fn to_attribute_value(&self) -> Option<AttributeValue> {
        Some(AttributeValue::String(self.as_str().to_owned()))
    }
}

/// What discovery is asked to publish.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct DiscoveryOptions {
    /// Publish VFIO devices (feature gate `PassthroughSupport`).
    pub passthrough: bool,
    /// Publish `resource.kubernetes.io/numaNode` as a one-element int list (feature gate
    /// `DRAListTypeAttributes`, KEP-6072; Kubernetes 1.36+).
    pub list_type_attributes: bool,
    /// Publish GPUs and MIG devices for several claims (gate `ConsumableShares`, see
    /// [`crate::sharing::consumable`]).
    pub consumable_shares: ConsumableShares,
    /// Publish MIG-capable GPUs as partitionable devices (feature gate `DynamicMIG`, see
    /// [`partitions`]).
    pub dynamic_mig: bool,
}

impl DiscoveryOptions {
    /// Full GPUs and static MIG devices only.
    pub fn new() -> Self {
        Self::default()
    }

    /// With or without VFIO devices.
    pub fn passthrough(mut self, enabled: bool) -> Self {
        self.passthrough = enabled;
        self
    }

    /// With list-typed attributes or without.
    pub fn list_type_attributes(mut self, enabled: bool) -> Self {
        self.list_type_attributes = enabled;
        self
    }

    /// How GPUs and MIG devices are shared between claims.
    pub fn consumable_shares(mut self, mode: ConsumableShares) -> Self {
        self.consumable_shares = mode;
        self
    }

    /// With MIG-capable GPUs partitionable (dynamic MIG) or not.
    pub fn dynamic_mig(mut self, enabled: bool) -> Self {
        self.dynamic_mig = enabled;
        self
    }
}

/// Why discovery failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiscoveryError {
    /// The backend failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// Reading host facts failed.
    #[error(transparent)]
    Host(#[from] HostError),
    /// A version the hardware reports is not one a version attribute can hold.
    #[error("{attribute} {value:?} of {device} cannot be published as a version: {reason}")]
    Version {
        /// The attribute.
        attribute: &'static str,
        /// The device (GPU UUID or "the driver").
        device: String,
        /// The value.
        value: String,
        /// Why.
        reason: String,
    },
    /// Passthrough is on but the host has no IOMMU groups.
    #[error(
        "PassthroughSupport is enabled but /sys/kernel/iommu_groups is empty or missing: enable \
         the IOMMU (intel_iommu=on or amd_iommu=on) or turn the gate off"
    )]
    IommuDisabled,
    /// Two GPUs would publish the same name (two GPUs report the same minor).
    #[error("two devices would be named {name}: {first} and {second}")]
    DuplicateName {
        /// The name.
        name: String,
        /// One device (UUID or bus ID).
        first: String,
        /// The other.
        second: String,
    },
}

/// Attributes every GPU-backed device copies from its GPU.
#[derive(Clone, Debug, DeviceAttributes)]
struct GpuCommon {
    product_name: String,
    brand: String,
    architecture: String,
    cuda_compute_capability: Version,
    driver_version: Version,
    cuda_driver_version: Version,
    #[dra(name = "resource.kubernetes.io/pciBusID")]
    pci_bus_id: String,
    #[dra(name = "resource.kubernetes.io/pcieRoot")]
    pcie_root: Option<String>,
    #[dra(name = "resource.kubernetes.io/numaNode")]
    numa_node: Option<AttributeValue>,
    addressing_mode: Option<String>,
    /// The GPU's NVLink peer group ([`topology`]); MIG devices inherit their parent's.
    nvlink_group: Option<String>,
}

#[derive(Clone, Debug, DeviceAttributes)]
struct GpuAttributes {
    r#type: DeviceType,
    uuid: String,
    #[dra(flatten)]
    common: GpuCommon,
    /// NVLinks up ([`topology`]); absent on GPUs without NVLink.
    nvlink_active_links: Option<u32>,
    #[dra(capacity)]
    memory: Bytes,
}

#[derive(Clone, Debug, DeviceAttributes)]
struct MigAttributes {
    r#type: DeviceType,
    /// `None` for a dynamic MIG partition: its instance exists only once prepared.
    uuid: Option<String>,
    #[dra(name = "parentUUID")]
    parent_uuid: String,
    profile: String,
    #[dra(flatten)]
    common: GpuCommon,
    #[dra(capacity)]
    multiprocessors: u32,
    #[dra(capacity)]
    copy_engines: u32,
    #[dra(capacity)]
    decoders: u32,
    #[dra(capacity)]
    encoders: u32,
    #[dra(capacity)]
    jpeg_engines: u32,
    #[dra(capacity)]
    ofa_engines: u32,
    #[dra(capacity)]
    memory: Bytes,
}

impl MigAttributes {
    /// A MIG device's attributes: its UUID (when it exists), its parent's, its profile's
    /// name and capacities (`memory`: the profile's MiB × 2^20).
    fn new(
        uuid: Option<String>,
        parent: &GpuInfo,
        profile: &MigProfileInfo,
        common: &GpuCommon,
    ) -> Self {
        let engines = &profile.engines;
        Self {
            r#type: DeviceType::Mig,
            uuid,
            parent_uuid: parent.uuid.clone(),
            profile: profile.name.clone(),
            common: common.clone(),
            multiprocessors: engines.multiprocessors,
            copy_engines: engines.copy_engines,
            decoders: engines.decoders,
            encoders: engines.encoders,
            jpeg_engines: engines.jpeg_engines,
            ofa_engines: engines.ofa_engines,
            memory: Bytes(profile.memory_bytes()),
        }
    }
}

#[derive(Clone, Debug, DeviceAttributes)]
struct VfioAttributes {
    r#type: DeviceType,
    uuid: Option<String>,
    #[dra(name = "deviceID")]
    device_id: String,
    #[dra(name = "vendorID")]
    vendor_id: String,
    product_name: Option<String>,
    #[dra(name = "iommuFDEnabled")]
    iommu_fd_enabled: bool,
    #[dra(name = "resource.kubernetes.io/pciBusID")]
    pci_bus_id: String,
    #[dra(name = "resource.kubernetes.io/pcieRoot")]
    pcie_root: Option<String>,
    #[dra(name = "resource.kubernetes.io/numaNode")]
    numa_node: Option<AttributeValue>,
    #[dra(capacity)]
    addressable_memory: Option<Bytes>,
}

/// A full GPU as published.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct GpuDevice {
    /// `gpu-<minor>`.
    pub name: String,
    /// The GPU, with `pcie_root` and `numa_node` completed from the host.
    pub info: GpuInfo,
    /// Its MIG mode (`None`: MIG unsupported).
    pub mig_mode: Option<MigMode>,
    /// Its VFIO twin's counter set, when passthrough is on.
    pub twin_counter_set: Option<String>,
    /// The GPU is partitionable (dynamic MIG): the full GPU consumes all of its counter set.
    pub partitionable: Option<PartitionableGpu>,
    attributes: GpuAttributes,
}

/// A static MIG device as published.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct MigDevice {
    /// `gpu-<parentMinor>-mig-<profile>-<giProfileID>-<placementStart>`.
    pub name: String,
    /// The parent GPU.
    pub parent: GpuInfo,
    /// The MIG device.
    pub mig: MigDeviceInfo,
    /// Its GPU-instance profile.
    pub profile: MigProfileInfo,
    attributes: MigAttributes,
}

/// A VFIO device as published.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct VfioDevice {
    /// `gpu-vfio-<index>`.
    pub name: String,
    /// Position among the node's NVIDIA GPU PCI functions in bus-ID order.
    pub index: u32,
    /// PCI bus ID (`0000:07:00.0`).
    pub pci_bus_id: String,
    /// The GPU as the backend reports it; `None` when it is bound to a VFIO driver already
    /// (NVML does not see it then).
    pub gpu: Option<GpuInfo>,
    /// The driver it is bound to now (`nvidia`, `vfio-pci`), if any.
    pub bound_driver: Option<String>,
    /// IOMMU group.
    pub iommu_group: Option<u32>,
    /// The counter set it shares with its twin `gpu-<minor>`.
    pub twin_counter_set: String,
    attributes: VfioAttributes,
}

/// One published device, by kind.
#[derive(Clone, Copy, Debug)]
pub enum NodeDevice<'a> {
    /// A full GPU.
    Gpu(&'a GpuDevice),
    /// A MIG device.
    Mig(&'a MigDevice),
    /// A VFIO device.
    Vfio(&'a VfioDevice),
    /// A MIG partition of a partitionable GPU (dynamic MIG), created at prepare.
    Partition(&'a MigPartition),
}

impl NodeDevice<'_> {
    /// The published name.
    pub fn name(&self) -> &str {
        match self {
            Self::Gpu(gpu) => &gpu.name,
            Self::Mig(mig) => &mig.name,
            Self::Vfio(vfio) => &vfio.name,
            Self::Partition(partition) => &partition.name,
        }
    }

    /// The `type` attribute.
    pub fn device_type(&self) -> DeviceType {
        match self {
            Self::Gpu(_) => DeviceType::Gpu,
            Self::Mig(_) | Self::Partition(_) => DeviceType::Mig,
            Self::Vfio(_) => DeviceType::Vfio,
        }
    }
}

/// What a node publishes: its GPUs, MIG devices and VFIO devices, with the facts prepare
/// needs about each.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Discovery {
    /// Full GPUs, by minor.
    pub gpus: Vec<GpuDevice>,
    /// Static MIG devices, by parent minor and placement.
    pub migs: Vec<MigDevice>,
    /// VFIO devices, by index.
    pub vfio: Vec<VfioDevice>,
    /// Partitionable GPUs (dynamic MIG), by minor.
    pub partitionable: Vec<PartitionableGpu>,
    /// The MIG partitions of the partitionable GPUs, by GPU, profile and placement.
    pub partitions: Vec<MigPartition>,
    /// The hardware as the backend reported it.
    pub inventory: Inventory,
    /// How GPUs and MIG devices are published for sharing.
    pub consumable_shares: ConsumableShares,
}

impl Discovery {
    /// Reads the hardware through `backend` and the host facts through `host`.
    #[tracing::instrument(skip_all, fields(backend = %backend.name(), passthrough = options.passthrough))]
    pub fn discover(
        backend: &dyn GpuBackend,
        host: &dyn Host,
        options: &DiscoveryOptions,
    ) -> Result<Self, DiscoveryError> {
        let inventory = backend.inventory()?;
        let discovery = Self::from_inventory(inventory, host, options)?;
        tracing::info!(
            gpus = discovery.gpus.len(),
            migs = discovery.migs.len(),
            vfio = discovery.vfio.len(),
            "discovered devices"
        );
        Ok(discovery)
    }

    /// The devices of an inventory read earlier.
    pub fn from_inventory(
        inventory: Inventory,
        host: &dyn Host,
        options: &DiscoveryOptions,
    ) -> Result<Self, DiscoveryError> {
        let driver_version = version("driverVersion", "the driver", &inventory.driver_version)?;
        let cuda_driver_version = version(
            "cudaDriverVersion",
            "the driver",
            &inventory.cuda_driver_version.to_string(),
        )?;
        let mut completed = Vec::with_capacity(inventory.gpus.len());
        for gpu in &inventory.gpus {
            completed.push(complete_from_host(gpu, host)?);
        }
        let twins = if options.passthrough {
            let split: BTreeSet<&str> = inventory
                .gpus
                .iter()
                .filter(|gpu| !gpu.mig_devices.is_empty())
                .map(|gpu| gpu.info.pci.bus_id.as_str())
                .collect();
            vfio_candidates(&completed, &split, host)?
        } else {
            Vec::new()
        };
        let twin_of = |bus_id: &str| {
            twins
                .iter()
                .find(|twin| twin.bus_id == bus_id)
                .map(|twin| twin_counter_set(twin.index))
        };

        let nvlinks = topology::NvLinkTopology::of(&inventory);
        for component in nvlinks.not_fully_connected() {
            tracing::warn!(
                gpus = ?component,
                "these GPUs are connected by NVLink but not every pair directly: no nvlinkGroup is published for them"
            );
        }

        let mut gpus = Vec::new();
        let mut migs = Vec::new();
        let mut partitionable = Vec::new();
        let mut partition_devices = Vec::new();
        for (gpu, info) in inventory.gpus.iter().zip(&completed) {
            let common = GpuCommon {
                product_name: info.product_name.clone(),
                brand: info.brand.clone(),
                architecture: info.architecture.clone(),
                cuda_compute_capability: version(
                    "cudaComputeCapability",
                    &info.uuid,
                    &info.cuda_compute_capability.to_string(),
                )?,
                driver_version: driver_version.clone(),
                cuda_driver_version: cuda_driver_version.clone(),
                pci_bus_id: info.pci.bus_id.clone(),
                pcie_root: info.pcie_root.clone(),
                numa_node: numa_attribute(info.numa_node, options),
                addressing_mode: info.addressing_mode.clone(),
                nvlink_group: nvlinks.group(&info.uuid).map(str::to_owned),
            };
            let nvlink_active_links = nvlinks.active_links(&info.uuid);
            let mig_on = gpu.mig_mode.is_some_and(|mode| mode.current);
            if options.dynamic_mig && partitions::is_partitionable(gpu) {
                // Instances that exist now belong to prepared claims or are orphans the
                // driver destroys at start: the partitions stand for all of them.
                let (parent, mut devices) = partitions::partition(gpu, info, &common);
                partition_devices.append(&mut devices);
                if !mig_on {
                    gpus.push(GpuDevice {
                        name: format!("gpu-{}", info.minor),
                        info: info.clone(),
                        mig_mode: gpu.mig_mode,
                        twin_counter_set: None,
                        partitionable: Some(parent.clone()),
                        attributes: GpuAttributes {
                            r#type: DeviceType::Gpu,
                            uuid: info.uuid.clone(),
                            common: common.clone(),
                            nvlink_active_links,
                            memory: Bytes(info.memory_bytes),
                        },
                    });
                }
                partitionable.push(parent);
                continue;
            }
            if !mig_on {
                gpus.push(GpuDevice {
                    name: format!("gpu-{}", info.minor),
                    info: info.clone(),
                    mig_mode: gpu.mig_mode,
                    twin_counter_set: twin_of(&info.pci.bus_id),
                    partitionable: None,
                    attributes: GpuAttributes {
                        r#type: DeviceType::Gpu,
                        uuid: info.uuid.clone(),
                        common: common.clone(),
                        nvlink_active_links,
                        memory: Bytes(info.memory_bytes),
                    },
                });
            } else if gpu.mig_devices.is_empty() {
                // Static MIG: instances are made by the operator (mig-parted, nvidia-smi),
                // and new ones show up after a plugin restart.
                tracing::warn!(gpu = %info.uuid, "MIG mode is on but the GPU has no MIG devices: publishing nothing for it");
            }
            for mig in &gpu.mig_devices {
                let Some(profile) = gpu.mig_profile(mig.profile_id) else {
                    return Err(BackendError::Query {
                        what: format!("MIG profile {} of MIG device {}", mig.profile_id, mig.uuid),
                        gpu: Some(info.uuid.clone()),
                        reason: "the GPU does not list this profile".into(),
                    }
                    .into());
                };
                migs.push(MigDevice {
                    name: mig_device_name(info.minor, profile, mig.placement.start),
                    parent: info.clone(),
                    mig: mig.clone(),
                    profile: profile.clone(),
                    attributes: MigAttributes::new(Some(mig.uuid.clone()), info, profile, &common),
                });
            }
        }

        let iommu_fd = options.passthrough && host.exists(Path::new("/dev/iommu"))?;
        let vfio = twins
            .into_iter()
            .map(|twin| {
                let gpu = completed
                    .iter()
                    .find(|gpu| gpu.pci.bus_id == twin.bus_id)
                    .cloned();
                let attributes = VfioAttributes {
                    r#type: DeviceType::Vfio,
                    uuid: gpu.as_ref().map(|gpu| gpu.uuid.clone()),
                    device_id: format!("{:#06x}", twin.device_id),
                    vendor_id: NVIDIA_VENDOR.to_owned(),
                    product_name: gpu.as_ref().map(|gpu| gpu.product_name.clone()),
                    iommu_fd_enabled: iommu_fd,
                    pci_bus_id: twin.bus_id.clone(),
                    pcie_root: twin.pcie_root.clone(),
                    numa_node: numa_attribute(twin.numa_node, options),
                    addressable_memory: gpu.as_ref().map(|gpu| Bytes(gpu.memory_bytes)),
                };
                VfioDevice {
                    name: format!("gpu-vfio-{}", twin.index),
                    index: twin.index,
                    pci_bus_id: twin.bus_id,
                    gpu,
                    bound_driver: twin.driver,
                    iommu_group: twin.iommu_group,
                    twin_counter_set: twin_counter_set(twin.index),
                    attributes,
                }
            })
            .collect();

        let discovery = Self {
            gpus,
            migs,
            vfio,
            partitionable,
            partitions: partition_devices,
            inventory,
            consumable_shares: options.consumable_shares,
        };
        discovery.check_names()?;
        Ok(discovery)
    }

    fn check_names(&self) -> Result<(), DiscoveryError> {
        let mut seen: BTreeMap<String, String> = BTreeMap::new();
        for device in self.iter() {
            let id = match device {
                NodeDevice::Gpu(gpu) => gpu.info.uuid.clone(),
                NodeDevice::Mig(mig) => mig.mig.uuid.clone(),
                NodeDevice::Vfio(vfio) => vfio.pci_bus_id.clone(),
                NodeDevice::Partition(partition) => {
                    format!("{} at {}", partition.profile.name, partition.placement)
                }
            };
            if let Some(first) = seen.insert(device.name().to_owned(), id.clone()) {
                return Err(DiscoveryError::DuplicateName {
                    name: device.name().to_owned(),
                    first,
                    second: id,
                });
            }
        }
        Ok(())
    }

    /// Every published device.
    pub fn iter(&self) -> impl Iterator<Item = NodeDevice<'_>> {
        self.gpus
            .iter()
            .map(NodeDevice::Gpu)
            .chain(self.migs.iter().map(NodeDevice::Mig))
            .chain(self.vfio.iter().map(NodeDevice::Vfio))
            .chain(self.partitions.iter().map(NodeDevice::Partition))
    }

    /// The device published under `name`.
    pub fn device(&self, name: &str) -> Option<NodeDevice<'_>> {
        self.iter().find(|device| device.name() == name)
    }

    /// The devices of the node's own pool, sorted by name (the scheduler tries devices in
    /// order, and a stable order keeps slices from being rewritten). Partitionable GPUs
    /// (dynamic MIG) are in pools of their own: [`partition_pools`](Self::partition_pools).
    pub fn devices(&self) -> Vec<Device> {
        let mut devices: Vec<Device> = self
            .gpus
            .iter()
            .filter(|gpu| gpu.partitionable.is_none())
            .map(|gpu| {
                let device = Device::new(&gpu.name).with_attributes(&gpu.attributes);
                let device = self
                    .consumable_shares
                    .publish(device, gpu.info.memory_bytes);
                match &gpu.twin_counter_set {
                    Some(set) => device.consumes(set, [(TWIN_COUNTER, "1")]),
                    None => device,
                }
            })
            .chain(self.migs.iter().map(|mig| {
                let device = mig.mig.placement.slices().fold(
                    Device::new(&mig.name).with_attributes(&mig.attributes),
                    |device, slice| {
                        device.capacity(format!("memorySlice{slice}"), DeviceCapacity::new("1"))
                    },
                );
                self.consumable_shares
                    .publish(device, mig.profile.memory_bytes())
            }))
            .chain(self.vfio.iter().map(|vfio| {
                Device::new(&vfio.name)
                    .with_attributes(&vfio.attributes)
                    .consumes(&vfio.twin_counter_set, [(TWIN_COUNTER, "1")])
            }))
            .collect();
        devices.sort_by(|a, b| natural_key(&a.name).cmp(&natural_key(&b.name)));
        devices
    }

    /// The shared counter sets (one per VFIO twin pair).
    pub fn counter_sets(&self) -> Vec<CounterSet> {
        self.vfio
            .iter()
            .map(|vfio| CounterSet::new(&vfio.twin_counter_set, [(TWIN_COUNTER, "1")]))
            .collect()
    }

    /// The pool of each partitionable GPU (dynamic MIG), `(name, pool)`: its counter set,
    /// the full GPU (when MIG mode is off) consuming all of it, and its partitions, sorted by
    /// name.
    pub fn partition_pools(&self, node_name: &str) -> Vec<(String, Pool)> {
        self.partitionable
            .iter()
            .map(|parent| {
                let full = self
                    .gpus
                    .iter()
                    .filter(|gpu| gpu.info.uuid == parent.info.uuid)
                    .map(|gpu| {
                        let device = Device::new(&gpu.name)
                            .with_attributes(&gpu.attributes)
                            .consumes(&parent.counter_set, parent.counters.clone());
                        self.consumable_shares
                            .publish(device, gpu.info.memory_bytes)
                    });
                // With consumable shares, a partition (and the full GPU) is allocated to
                // several claims; the scheduler charges its counters once, for the first
                // (KEP-5075 with KEP-4815), so sharing claims never block each other.
                let mut devices: Vec<Device> = full
                    .chain(
                        self.partitions
                            .iter()
                            .filter(|partition| partition.parent.uuid == parent.info.uuid)
                            .map(|partition| {
                                self.consumable_shares
                                    .publish(partition.device(), partition.profile.memory_bytes())
                            }),
                    )
                    .collect();
                devices.sort_by(|a, b| natural_key(&a.name).cmp(&natural_key(&b.name)));
                (
                    partition_pool_name(node_name, parent.info.minor),
                    Pool::new(devices).counter_set(parent.counter_set()),
                )
            })
            .collect()
    }

    /// The pool a published device is in: the node's, or its GPU's under dynamic MIG.
    pub fn pool_of(&self, node_name: &str, device: &str) -> String {
        let minor = match self.device(device) {
            Some(NodeDevice::Partition(partition)) => Some(partition.parent.minor),
            Some(NodeDevice::Gpu(gpu)) if gpu.partitionable.is_some() => Some(gpu.info.minor),
            _ => None,
        };
        match minor {
            Some(minor) => partition_pool_name(node_name, minor),
            None => node_name.to_owned(),
        }
    }

    /// What the plugin publishes: the pool named after the node, and with dynamic MIG one
    /// pool per partitionable GPU.
    pub fn resources(&self, node_name: &str) -> DriverResources {
        let pool = self
            .counter_sets()
            .into_iter()
            .fold(Pool::new(self.devices()), Pool::counter_set);
        self.partition_pools(node_name).into_iter().fold(
            DriverResources::new().with_pool(node_name, pool),
            |resources, (name, pool)| resources.with_pool(name, pool),
        )
    }
}

/// `gpu-<parentMinor>-mig-<profile>-<giProfileID>-<placementStart>`, upstream's name of a
/// MIG device.
///
/// ```
/// # use dra_driver_nvidia::devices::mig_profile_name_part;
/// assert_eq!(mig_profile_name_part("1g.10gb+me"), "1g10gb-me");
/// ```
pub fn mig_device_name(
    parent_minor: u32,
    profile: &MigProfileInfo,
    placement_start: u32,
) -> String {
    format!(
        "gpu-{parent_minor}-mig-{}-{}-{placement_start}",
        mig_profile_name_part(&profile.name),
        profile.id
    )
}

/// The part of a MIG device name derived from the profile name: lowercased, dots removed,
/// other characters outside `[a-z0-9-]` as `-`.
pub fn mig_profile_name_part(profile: &str) -> String {
    profile
        .chars()
        .filter(|c| *c != '.')
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-') => c,
            _ => '-',
        })
        .collect()
}

/// The counter set a VFIO device shares with its GPU twin.
pub fn twin_counter_set(vfio_index: u32) -> String {
    format!("gpu-vfio-{vfio_index}-counter-set")
}

/// Sort key that orders `gpu-2` before `gpu-10`.
fn natural_key(name: &str) -> Vec<either::Chunk<'_>> {
    either::chunks(name)
}

mod either {
    /// A run of digits (compared as a number) or of other characters.
    #[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
    pub(super) enum Chunk<'a> {
        Number(u64),
        Text(&'a str),
    }

    pub(super) fn chunks(name: &str) -> Vec<Chunk<'_>> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = name.as_bytes();
        while start < bytes.len() {
            let digit = bytes[start].is_ascii_digit();
            let end = bytes[start..]
                .iter()
                .position(|b| b.is_ascii_digit() != digit)
                .map_or(bytes.len(), |offset| start + offset);
            let part = &name[start..end];
            out.push(match part.parse() {
                Ok(number) if digit => Chunk::Number(number),
                _ => Chunk::Text(part),
            });
            start = end;
        }
        out
    }
}

/// `resource.kubernetes.io/numaNode`: an int, or a one-element int list with
/// `DRAListTypeAttributes`.
fn numa_attribute(node: Option<u32>, options: &DiscoveryOptions) -> Option<AttributeValue> {
    let node = i64::from(node?);
    Some(if options.list_type_attributes {
        AttributeValue::Ints(vec![node])
    } else {
        AttributeValue::Int(node)
    })
}

fn version(attribute: &'static str, device: &str, value: &str) -> Result<Version, DiscoveryError> {
    Version::coerce(value).map_err(|error| DiscoveryError::Version {
        attribute,
        device: device.to_owned(),
        value: value.to_owned(),
        reason: error.to_string(),
    })
}

/// The GPU with `pcie_root` filled from sysfs where the backend left it out (NVML does not
/// report the root complex) and `numa_node` taken from sysfs where sysfs has one.
fn complete_from_host(gpu: &GpuInventory, host: &dyn Host) -> Result<GpuInfo, DiscoveryError> {
    let mut info = gpu.info.clone();
    if info.pcie_root.is_none() {
        info.pcie_root = facts::pcie_root(host, &info.pci.bus_id)?;
    }
    // The PCI device's NUMA node from sysfs wins: on GH200 and GB200, NVML's NUMA ID is the
    // node of the GPU's own memory, not the node the GPU is attached to.
    if let Some(node) = facts::numa_node(host, &info.pci.bus_id)? {
        info.numa_node = Some(node);
    }
    Ok(info)
}

/// A GPU PCI function that gets a VFIO device.
struct VfioCandidate {
    index: u32,
    bus_id: String,
    device_id: u16,
    driver: Option<String>,
    iommu_group: Option<u32>,
    pcie_root: Option<String>,
    numa_node: Option<u32>,
}

/// The NVIDIA GPU functions of the node in bus-ID order (from sysfs, plus the backend's
/// GPUs in case sysfs is not visible), and of those the ones offered for passthrough: not
/// split into MIG devices.
fn vfio_candidates(
    gpus: &[GpuInfo],
    split: &BTreeSet<&str>,
    host: &dyn Host,
) -> Result<Vec<VfioCandidate>, DiscoveryError> {
    let groups = match host.read_dir(Path::new("/sys/kernel/iommu_groups")) {
        Ok(groups) => groups,
        Err(error) if error.is_not_found() => Vec::new(),
        Err(error) => return Err(error.into()),
    };
    if groups.is_empty() {
        return Err(DiscoveryError::IommuDisabled);
    }
    let mut functions: BTreeMap<String, Option<u16>> = gpus
        .iter()
        .map(|gpu| (gpu.pci.bus_id.clone(), Some(gpu.pci.device_id)))
        .collect();
    let pci_devices = match host.read_dir(Path::new("/sys/bus/pci/devices")) {
        Ok(names) => names,
        Err(error) if error.is_not_found() => Vec::new(),
        Err(error) => return Err(error.into()),
    };
    for bus_id in pci_devices {
        let dir = facts::pci_device_dir(&bus_id);
        let read = |file: &str| -> Result<Option<String>, HostError> {
            match host.read_to_string(&dir.join(file)) {
                Ok(text) => Ok(Some(text.trim().to_owned())),
                Err(error) if error.is_not_found() => Ok(None),
                Err(error) => Err(error),
            }
        };
        if read("vendor")?.as_deref() != Some(NVIDIA_VENDOR) {
            continue;
        }
        let is_gpu = read("class")?.is_some_and(|class| {
            GPU_PCI_CLASSES
                .iter()
                .any(|prefix| class.starts_with(prefix))
        });
        if !is_gpu {
            continue;
        }
        let device_id = read("device")?
            .and_then(|id| u16::from_str_radix(id.trim_start_matches("0x"), 16).ok());
        let entry = functions.entry(bus_id).or_insert(None);
        if entry.is_none() {
            *entry = device_id;
        }
    }
    let mut candidates = Vec::new();
    for (index, (bus_id, device_id)) in functions.into_iter().enumerate() {
        let index = u32::try_from(index).unwrap_or(u32::MAX);
        // The index counts every GPU function, so names stay put when MIG devices come
        // and go; GPUs split into MIG devices are not offered (as upstream).
        if split.contains(bus_id.as_str()) {
            continue;
        }
        let gpu = gpus.iter().find(|gpu| gpu.pci.bus_id == bus_id);
        candidates.push(VfioCandidate {
            index,
            device_id: device_id.unwrap_or(0),
            driver: facts::pci_driver(host, &bus_id)?,
            iommu_group: facts::iommu_group(host, &bus_id)?,
            pcie_root: match gpu.and_then(|gpu| gpu.pcie_root.clone()) {
                Some(root) => Some(root),
                None => facts::pcie_root(host, &bus_id)?,
            },
            numa_node: match gpu.and_then(|gpu| gpu.numa_node) {
                Some(node) => Some(node),
                None => facts::numa_node(host, &bus_id)?,
            },
            bus_id,
        });
    }
    Ok(candidates)
}

/// The DeviceClasses of the driver, as upstream's chart installs them: `gpu.nvidia.com`
/// (with `extendedResourceName: nvidia.com/gpu`), `mig.nvidia.com` and
/// `vfio.gpu.nvidia.com`, each selecting its device `type` by CEL.
///
/// ```
/// let classes = dra_driver_nvidia::devices::device_classes();
/// assert_eq!(classes.len(), 3);
/// assert_eq!(classes[1].metadata.name.as_deref(), Some("mig.nvidia.com"));
/// ```
pub fn device_classes() -> Vec<DeviceClass> {
    let class = |name: &str, device_type: DeviceType, extended: Option<&str>| DeviceClass {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: device_class_cel(device_type),
                }),
            }]),
            extended_resource_name: extended.map(str::to_owned),
            ..DeviceClassSpec::default()
        }),
    };
    vec![
        class(
            GPU_DEVICE_CLASS,
            DeviceType::Gpu,
            Some(GPU_EXTENDED_RESOURCE_NAME),
        ),
        class(MIG_DEVICE_CLASS, DeviceType::Mig, None),
        class(VFIO_DEVICE_CLASS, DeviceType::Vfio, None),
    ]
}

/// `device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == '<type>'`.
pub fn device_class_cel(device_type: DeviceType) -> String {
    format!(
        "device.driver == '{DRIVER_NAME}' && device.attributes['{DRIVER_NAME}'].type == '{}'",
        device_type.as_str()
    )
}

#[cfg(test)]
mod tests;
