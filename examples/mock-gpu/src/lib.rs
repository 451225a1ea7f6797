//! A DRA driver for mock GPUs, built on dra-sdk: the example a vendor starts from.
//!
//! It publishes `--num-devices` GPUs with deterministic attributes, accepts a
//! [`GpuConfig`] opaque config, and "prepares" a GPU by handing the container
//! environment variables that describe it, so a pod can prove what it got by printing its env.
//!
//! Two optional modes show the newer DRA features ([`PublishOptions`]):
//! - **partitionable devices** (`--gpu-partitions N`, `DRAPartitionableDevices`): each GPU gets
//!   a shared counter set `gpu-<i>-counters` holding its memory and compute, and `N` partition
//!   devices `gpu-<i>-partition-<j>` that each consume `1/N` of it, next to the whole GPU
//!   `gpu-<i>` that consumes all of it: the scheduler never hands out a GPU and one of its
//!   partitions at the same time;
//! - **consumable capacity** (`--gpu-allow-multiple-allocations`, `DRAConsumableCapacity`): the
//!   whole GPUs set `allowMultipleAllocations`, with a request policy on `memory` and `compute`
//!   whose default is all of it, so claims that ask for no capacity still get a GPU to
//!   themselves while claims that ask for a share (`capacity.requests`) can share one GPU.
//!
//! Every GPU publishes `index`, `uuid`, `model` and `driverVersion`, the capacities `memory`
//! and `compute`, and a mock **NVLink topology** the scheduler can use: GPUs `2k` and `2k+1`
//! form an NVLink-bridged pair, and both carry `nvlinkGroup` (string: the UUID of GPU `2k`, the
//! same on both GPUs of the pair and different for every other pair, across the cluster too) and
//! `nvlinkActiveLinks` (int: [`NVLINK_ACTIVE_LINKS`], 12). A GPU without a peer (the last one
//! of an odd count) has neither attribute. A claim for two GPUs with
//! `constraints: [{matchAttribute: gpu.example.com/nvlinkGroup}]` gets the two GPUs of one pair,
//! as a claim with `gpu.nvidia.com/nvlinkGroup` does with the NVIDIA driver, whose attributes
//! these model. Partitions carry their GPU's.
//!
//! At run time it uses the SDK's [`DriverContext`]: GPUs can be hot-plugged
//! ([`MockGpuDriver::add_gpu`]) or changed ([`MockGpuDriver::update_gpu`]), and a GPU marked
//! unhealthy ([`MockGpuDriver::set_gpu_health`]) is reported on the kubelet's health stream and
//! tainted in the ResourceSlice with one call.
//!
//! Two SDK features are opt-in ([`MockGpuDriver::with_device_status`],
//! [`MockGpuDriver::with_device_metadata`]; `--device-status` and `--device-metadata` on the
//! command line): the status of each prepared GPU in the claim's `status.devices` (KEP-4817)
//! and a metadata file describing the GPUs mounted into the containers (KEP-5304).

pub mod classes;
pub mod config;
#[cfg(feature = "demo")]
pub mod demo;
#[cfg(feature = "demo")]
pub mod testing;

use std::sync::{Arc, Mutex, PoisonError};

use dra_sdk::cdi::ContainerEdits;
use dra_sdk::claim::{AllocatedDevice, Claim, ClaimRef, DriverError, RecordedClaim};
use dra_sdk::config::ConfigRegistry;
use dra_sdk::context::{ContextError, DriverContext};
use dra_sdk::device_status::DeviceStatus;
use dra_sdk::driver::{Driver, PreparedClaim, PreparedDevice};
use dra_sdk::health::DeviceState;
use dra_sdk::slices::DeviceAttributes;
use dra_sdk::slices::{
    CapacityRequestPolicy, CounterSet, Device, DeviceTaint, DriverResources, Pool, Quantity,
    TaintEffect,
};
use sha2::{Digest, Sha256};

use crate::config::{GpuConfig, SharingStrategy};

/// Default driver name.
pub const DEFAULT_DRIVER_NAME: &str = "gpu.example.com";

/// The opaque configs the driver accepts: what prepare decodes claims' configs with, and what
/// the `mock-gpu-webhook` binary checks them with at admission.
pub fn config_registry() -> ConfigRegistry<GpuConfig> {
    ConfigRegistry::new().register::<GpuConfig>()
}

/// Memory of one mock GPU, in MiB (`80Gi`): partitions get an equal share of it.
const GPU_MEMORY_MIB: u64 = 80 * 1024;
/// Compute units of one mock GPU: partitions get an equal share of them.
const GPU_COMPUTE: u64 = 100;
/// The most partitions a GPU can be cut into: each must get at least one compute unit.
pub const MAX_PARTITIONS: u32 = 100;
/// The `nvlinkActiveLinks` of each GPU of an NVLink-bridged pair: three bridges of four links,
/// as on a pair of PCIe data-center GPUs.
pub const NVLINK_ACTIVE_LINKS: i64 = 12;

/// How the GPUs are published, beyond their number: the optional partitionable and
/// consumable-capacity modes (both off by default, as upstream).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PublishOptions {
    /// Partitions per GPU; `0` publishes whole GPUs only, without shared counters.
    pub partitions: u32,
    /// Whole GPUs set `allowMultipleAllocations` and a request policy on their capacities.
    pub allow_multiple_allocations: bool,
}

/// Options the driver cannot publish.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum OptionsError {
    /// `partitions` is above [`MAX_PARTITIONS`].
    #[error(
        "gpu partitions: {0} is more than {MAX_PARTITIONS} (each partition needs at least one of the {GPU_COMPUTE} compute units)"
    )]
    TooManyPartitions(u32),
}

impl PublishOptions {
    /// Checks the options before the driver publishes with them.
    pub fn validate(&self) -> Result<(), OptionsError> {
        if self.partitions > MAX_PARTITIONS {
            return Err(OptionsError::TooManyPartitions(self.partitions));
        }
        Ok(())
    }
}

/// Which mock GPU (and which of its partitions) a published device name stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct DeviceName {
    index: i64,
    partition: Option<u32>,
}

impl DeviceName {
    /// Parses `gpu-<i>` and `gpu-<i>-partition-<j>`.
    fn parse(name: &str) -> Option<Self> {
        let rest = name.strip_prefix("gpu-")?;
        let (index, partition) = match rest.split_once("-partition-") {
            Some((index, partition)) => (index, Some(partition.parse().ok()?)),
            None => (rest, None),
        };
        Some(Self {
            index: index.parse().ok()?,
            partition,
        })
    }
}

/// The published description of one mock GPU.
#[derive(Clone, Debug, DeviceAttributes)]
pub struct MockGpu {
    /// Position of the GPU on the node.
    pub index: i64,
    /// Stable identifier, derived from the node name and index.
    pub uuid: String,
    /// Product name.
    pub model: String,
    /// Version of the (mock) kernel driver.
    pub driver_version: dra_sdk::attributes::Version,
    /// Memory.
    #[dra(capacity)]
    pub memory: Quantity,
    /// Compute units.
    #[dra(capacity)]
    pub compute: Quantity,
    /// `nvlinkGroup`: the same value on both GPUs of an NVLink-bridged pair (the UUID of its
    /// even-indexed GPU); `None`, and not published, on a GPU without a peer.
    pub nvlink_group: Option<String>,
    /// `nvlinkActiveLinks`: the NVLinks up, [`NVLINK_ACTIVE_LINKS`] in a pair; `None`, and not
    /// published, on a GPU without NVLink.
    pub nvlink_active_links: Option<i64>,
}

impl MockGpu {
    /// The `index`-th GPU of `node_name`; the UUID is the same on every start. It has no NVLink
    /// peer until [`MockGpu::bridge`] pairs it (the driver pairs GPUs `2k` and `2k+1`).
    pub fn new(node_name: &str, index: u32) -> Self {
        let digest = Sha256::digest(format!("{node_name}/{index}").as_bytes());
        let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
        let uuid = format!(
            "gpu-{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        );
        Self {
            index: i64::from(index),
            uuid,
            model: "LATEST-GPU-MODEL".into(),
            driver_version: dra_sdk::attributes::Version::new(1, 0, 0),
            memory: Quantity("80Gi".into()),
            compute: Quantity("100".into()),
            nvlink_group: None,
            nvlink_active_links: None,
        }
    }

    /// Connects this GPU and `peer` with an NVLink bridge: both get the same `nvlinkGroup`,
    /// this GPU's UUID, and [`NVLINK_ACTIVE_LINKS`] active links.
    pub fn bridge(&mut self, peer: &mut MockGpu) {
        let group = self.uuid.clone();
        for gpu in [self, peer] {
            gpu.nvlink_group = Some(group.clone());
            gpu.nvlink_active_links = Some(NVLINK_ACTIVE_LINKS);
        }
    }

    /// The device name in the ResourceSlice.
    pub fn name(&self) -> String {
        format!("gpu-{}", self.index)
    }

    /// The device as published.
    pub fn device(&self) -> Device {
        Device::new(self.name()).with_attributes(self)
    }

    /// The name of the shared counter set of this GPU (partitionable mode).
    pub fn counter_set_name(&self) -> String {
        format!("gpu-{}-counters", self.index)
    }

    /// The name of partition `partition` of this GPU (partitionable mode).
    pub fn partition_name(&self, partition: u32) -> String {
        format!("gpu-{}-partition-{partition}", self.index)
    }

    /// The memory and compute of one of `partitions` equal partitions: what each consumes of
    /// the GPU's counter set. Memory in MiB so that it divides evenly more often; a remainder
    /// stays unused, as on real hardware whose partitions do not add up to the whole.
    fn partition_size(partitions: u32) -> (Quantity, Quantity) {
        let n = u64::from(partitions.max(1));
        (
            Quantity(format!("{}Mi", GPU_MEMORY_MIB / n)),
            Quantity((GPU_COMPUTE / n).to_string()),
        )
    }

    /// The devices and counter set this GPU publishes with `options`.
    fn publish(&self, options: PublishOptions) -> (Vec<Device>, Option<CounterSet>) {
        let mut whole = self.device();
        if options.allow_multiple_allocations {
            // The default is all of it: a claim that asks for no capacity keeps the GPU to
            // itself, as without this mode; shares are asked for with `capacity.requests`.
            whole = whole.allow_multiple_allocations(true);
            for (name, step) in [("memory", "1Gi"), ("compute", "1")] {
                if let Some(capacity) = whole.capacity.get_mut(name) {
                    let total = capacity.value.0.clone();
                    capacity.request_policy = Some(
                        CapacityRequestPolicy::with_default(total.clone()).valid_range(
                            step,
                            Some(&total),
                            Some(step),
                        ),
                    );
                }
            }
        }
        if options.partitions == 0 {
            return (vec![whole], None);
        }
        let counters = CounterSet::new(
            self.counter_set_name(),
            [
                ("memory", self.memory.0.clone()),
                ("compute", self.compute.0.clone()),
            ],
        );
        let mut devices = vec![whole.consumes(
            self.counter_set_name(),
            [
                ("memory", self.memory.0.clone()),
                ("compute", self.compute.0.clone()),
            ],
        )];
        let (memory, compute) = Self::partition_size(options.partitions);
        for partition in 0..options.partitions {
            let described = MockGpu {
                memory: memory.clone(),
                compute: compute.clone(),
                ..self.clone()
            };
            devices.push(
                Device::new(self.partition_name(partition))
                    .with_attributes(&described)
                    .attribute("partition", partition)
                    .consumes(
                        self.counter_set_name(),
                        [("memory", memory.0.clone()), ("compute", compute.0.clone())],
                    ),
            );
        }
        (devices, Some(counters))
    }

    /// The names of the devices this GPU publishes with `options`.
    fn device_names(&self, options: PublishOptions) -> Vec<String> {
        std::iter::once(self.name())
            .chain((0..options.partitions).map(|p| self.partition_name(p)))
            .collect()
    }
}

/// Appends the next GPU of `node_name` (index: how many there are) to `gpus` and returns it. A
/// GPU with an odd index `2k+1` is bridged by NVLink to GPU `2k` ([`MockGpu::bridge`]); one
/// with an even index has no peer until the next GPU comes.
fn push_gpu(gpus: &mut Vec<MockGpu>, node_name: &str) -> MockGpu {
    let index = u32::try_from(gpus.len()).unwrap_or(u32::MAX);
    let mut gpu = MockGpu::new(node_name, index);
    if gpu.index % 2 == 1
        && let Some(peer) = gpus.iter_mut().find(|g| g.index == gpu.index - 1)
    {
        peer.bridge(&mut gpu);
    }
    gpus.push(gpu.clone());
    gpu
}

/// Why a run-time change to the mock GPUs failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The plugin has not started the driver yet: there is no context to publish through.
    #[error("the plugin has not started this driver yet")]
    NotStarted,
    /// No GPU with this index.
    #[error("no GPU with index {0} on this node")]
    NoSuchGpu(u32),
    /// The SDK refused the change.
    #[error(transparent)]
    Context(#[from] ContextError),
}

/// Health of a mock GPU, as set with [`MockGpuDriver::set_gpu_health`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuHealth {
    /// Working.
    Healthy,
    /// Failed, with the reason shown in the pod's status.
    Unhealthy(String),
}

/// The mock GPU driver.
///
/// Clones share the GPUs and the runtime context: keep one to change the GPUs of the plugin
/// that runs another.
#[derive(Clone, Debug)]
pub struct MockGpuDriver {
    driver_name: String,
    node_name: String,
    options: PublishOptions,
    gpus: Arc<Mutex<Vec<MockGpu>>>,
    /// The context of the plugin that started this driver last.
    context: Arc<Mutex<Option<DriverContext>>>,
    /// Report each prepared GPU's status in its claim.
    device_status: bool,
    /// Have the plugin write device metadata files.
    device_metadata: bool,
}

impl MockGpuDriver {
    /// A driver with `num_devices` GPUs on `node_name`, GPUs `2k` and `2k+1` bridged by NVLink
    /// ([`MockGpu::bridge`]); with an odd `num_devices` the last one has no peer.
    pub fn new(
        driver_name: impl Into<String>,
        node_name: impl Into<String>,
        num_devices: u32,
    ) -> Self {
        let node_name = node_name.into();
        let mut gpus = Vec::new();
        for _ in 0..num_devices {
            push_gpu(&mut gpus, &node_name);
        }
        Self {
            driver_name: driver_name.into(),
            node_name,
            options: PublishOptions::default(),
            gpus: Arc::new(Mutex::new(gpus)),
            context: Arc::new(Mutex::new(None)),
            device_status: false,
            device_metadata: false,
        }
    }

    /// Reports, at prepare, a `Ready` condition and the GPU's UUID in the claim's
    /// `status.devices` (KEP-4817); the plugin removes it at unprepare. Needs the RBAC the
    /// chart grants with `deviceStatus: true`.
    pub fn with_device_status(mut self, enabled: bool) -> Self {
        self.device_status = enabled;
        self
    }

    /// Has the plugin write a device metadata file per request and mount it into the
    /// containers (KEP-5304, alpha in Kubernetes 1.36).
    pub fn with_device_metadata(mut self, enabled: bool) -> Self {
        self.device_metadata = enabled;
        self
    }

    /// The same driver publishing with `options` (partitions, consumable capacity); call
    /// before the plugin starts.
    pub fn with_options(mut self, options: PublishOptions) -> Result<Self, OptionsError> {
        options.validate()?;
        self.options = options;
        Ok(self)
    }

    /// How this driver publishes its GPUs.
    pub fn options(&self) -> PublishOptions {
        self.options
    }

    /// The GPUs this driver has now.
    pub fn gpus(&self) -> Vec<MockGpu> {
        self.lock_gpus().clone()
    }

    fn lock_gpus(&self) -> std::sync::MutexGuard<'_, Vec<MockGpu>> {
        // The list is replaced or pushed to in one step: never half-updated.
        self.gpus.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn context(&self) -> Result<DriverContext, RuntimeError> {
        self.context
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or(RuntimeError::NotStarted)
    }

    /// What the plugin publishes: one pool named after the node, with a shared counter set
    /// per GPU in partitionable mode.
    pub fn resources(&self) -> DriverResources {
        let mut pool = Pool::new([]);
        for gpu in self.lock_gpus().iter() {
            let (devices, counters) = gpu.publish(self.options);
            for device in devices {
                pool = pool.device(device);
            }
            if let Some(counters) = counters {
                pool = pool.counter_set(counters);
            }
        }
        DriverResources::new().with_pool(self.node_name.clone(), pool)
    }

    /// A state for every published device (whole GPUs, and partitions in partitionable mode),
    /// made by `health` from the device name.
    fn device_states(&self, health: impl Fn(String) -> DeviceState) -> Vec<DeviceState> {
        self.lock_gpus()
            .iter()
            .flat_map(|gpu| gpu.device_names(self.options))
            .map(health)
            .collect()
    }

    /// Hot-plugs one more GPU (the next index) and publishes it; it is healthy. A GPU with an
    /// odd index is bridged by NVLink to the one before it, which gets its `nvlinkGroup` and
    /// `nvlinkActiveLinks` now; one with an even index has no peer yet.
    pub fn add_gpu(&self) -> Result<MockGpu, RuntimeError> {
        let context = self.context()?;
        let gpu = {
            let mut gpus = self.lock_gpus();
            push_gpu(&mut gpus, &self.node_name)
        };
        context.publish(self.resources())?;
        // One device at a time: `set_device_states` would replace the other GPUs' states.
        for name in gpu.device_names(self.options) {
            context.set_device_state(DeviceState::healthy(&self.node_name, name));
        }
        tracing::info!(device = %gpu.name(), "GPU hot-plugged");
        Ok(gpu)
    }

    /// Changes the description of GPU `index` (a new driver version, less memory after a
    /// repartition) and publishes it.
    pub fn update_gpu(
        &self,
        index: u32,
        change: impl FnOnce(&mut MockGpu),
    ) -> Result<MockGpu, RuntimeError> {
        let context = self.context()?;
        let gpu = {
            let mut gpus = self.lock_gpus();
            let gpu = gpus
                .iter_mut()
                .find(|gpu| gpu.index == i64::from(index))
                .ok_or(RuntimeError::NoSuchGpu(index))?;
            change(gpu);
            gpu.clone()
        };
        context.publish(self.resources())?;
        Ok(gpu)
    }

    /// Sets the health of GPU `index` (and of its partitions). An unhealthy GPU is reported
    /// to the kubelet (and so in the status of pods using it) and tainted
    /// `<driver>/unhealthy=true:NoSchedule` in the ResourceSlice, so no new claim gets it; a
    /// healthy one loses the taint.
    pub fn set_gpu_health(&self, index: u32, health: GpuHealth) -> Result<(), RuntimeError> {
        let context = self.context()?;
        let names = self
            .lock_gpus()
            .iter()
            .find(|gpu| gpu.index == i64::from(index))
            .map(|gpu| gpu.device_names(self.options))
            .ok_or(RuntimeError::NoSuchGpu(index))?;
        for name in names {
            context.set_device_state(match &health {
                GpuHealth::Healthy => DeviceState::healthy(&self.node_name, name),
                GpuHealth::Unhealthy(reason) => {
                    DeviceState::unhealthy(&self.node_name, name, reason.clone())
                        .with_taint(self.unhealthy_taint())
                }
            });
        }
        Ok(())
    }

    /// The taint of an unhealthy GPU.
    pub fn unhealthy_taint(&self) -> DeviceTaint {
        DeviceTaint::new(
            format!("{}/unhealthy", self.driver_name),
            TaintEffect::NoSchedule,
        )
        .value("true")
    }

    fn device_edits(
        &self,
        claim: &ClaimRef,
        device: &AllocatedDevice<GpuConfig>,
    ) -> Result<ContainerEdits, DriverError> {
        let no_such_device = || DriverError::Device {
            device: device.id(),
            reason: "no such GPU on this node".into(),
        };
        let name = DeviceName::parse(&device.device.name)
            .filter(|name| name.partition.is_none_or(|p| p < self.options.partitions))
            .ok_or_else(no_such_device)?;
        let gpu = self
            .lock_gpus()
            .iter()
            .find(|gpu| gpu.index == name.index)
            .cloned()
            .ok_or_else(no_such_device)?;
        let mut prefix = format!("GPU_DEVICE_{}", gpu.index);
        let mut edits = ContainerEdits::new();
        if let Some(partition) = name.partition {
            // A partition: the parent's UUID, and its share of the GPU.
            prefix = format!("{prefix}_PARTITION_{partition}");
            let (memory, compute) = MockGpu::partition_size(self.options.partitions);
            edits = edits
                .env(format!("{prefix}_MEMORY"), &memory.0)
                .env(format!("{prefix}_COMPUTE"), &compute.0);
        }
        let mut edits = edits
            .env(&prefix, &gpu.uuid)
            .env(format!("{prefix}_RESOURCE_CLAIM"), &claim.uid)
            .env("DRA_ADMIN_ACCESS", device.admin_access.to_string());
        let default = GpuConfig::default_normalized();
        let config = device.config().unwrap_or(&default);
        if let Some(sharing) = &config.sharing {
            edits = match sharing.strategy {
                SharingStrategy::TimeSlicing => {
                    let interval = sharing
                        .time_slicing_config
                        .as_ref()
                        .map(|c| format!("{:?}", c.interval))
                        .unwrap_or_else(|| "Default".into());
                    edits
                        .env(format!("{prefix}_SHARING_STRATEGY"), "TimeSlicing")
                        .env(format!("{prefix}_TIMESLICE_INTERVAL"), interval)
                }
                SharingStrategy::SpacePartitioning => {
                    let count = sharing
                        .space_partitioning_config
                        .as_ref()
                        .map_or(1, |c| c.partition_count);
                    edits
                        .env(format!("{prefix}_SHARING_STRATEGY"), "SpacePartitioning")
                        .env(format!("{prefix}_PARTITION_COUNT"), count.to_string())
                }
            };
        }
        for (name, quantity) in &device.consumed_capacity {
            edits = edits.env(format!("{prefix}_{}", name.to_uppercase()), &quantity.0);
        }
        Ok(edits)
    }
}

impl GpuConfig {
    /// The config a device gets when the claim has none: time-slicing, default interval.
    pub fn default_normalized() -> Self {
        let mut config = GpuConfig::default();
        dra_sdk::config::ConfigHooks::normalize(&mut config);
        config
    }
}

#[async_trait::async_trait]
impl Driver for MockGpuDriver {
    type Config = GpuConfig;

    fn config_registry(&self) -> ConfigRegistry<GpuConfig> {
        config_registry()
    }

    async fn start(&self, ctx: &DriverContext) -> Result<(), DriverError> {
        // Mock GPUs start healthy; a real driver would ask the hardware here.
        ctx.set_device_states(
            self.device_states(|name| DeviceState::healthy(&self.node_name, name)),
        );
        *self.context.lock().unwrap_or_else(PoisonError::into_inner) = Some(ctx.clone());
        Ok(())
    }

    fn reports_health(&self) -> bool {
        true
    }

    fn reports_device_status(&self) -> bool {
        self.device_status
    }

    fn device_metadata(&self) -> bool {
        self.device_metadata
    }

    async fn prepare(&self, claim: &Claim<GpuConfig>) -> Result<PreparedClaim, DriverError> {
        let devices = claim
            .devices
            .iter()
            .map(|device| {
                Ok(PreparedDevice::new(
                    device,
                    self.device_edits(&claim.claim, device)?,
                ))
            })
            .collect::<Result<Vec<_>, DriverError>>()?;
        let common = ContainerEdits::new()
            .env("KUBERNETES_NODE_NAME", &self.node_name)
            .env("DRA_RESOURCE_DRIVER_NAME", &self.driver_name);
        let mut prepared = PreparedClaim::new(devices).with_common_edits(common);
        if self.device_status {
            for device in &claim.devices {
                let uuid = self
                    .lock_gpus()
                    .iter()
                    .find(|gpu| gpu.name() == device.device.name)
                    .map(|gpu| gpu.uuid.clone());
                let status = DeviceStatus::new(&device.device.pool, &device.device.name)
                    .ready("Prepared", "mock GPU ready for the pod")
                    .data(serde_json::json!({ "uuid": uuid }));
                prepared = prepared.with_device_status(status);
            }
        }
        Ok(prepared)
    }

    async fn unprepare(&self, _claim: &RecordedClaim) -> Result<(), DriverError> {
        // Mock GPUs hold no node state: the SDK removes the CDI spec.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dra_sdk::slices::AttributeValue;

    #[test]
    fn uuids_are_deterministic_per_node_and_index() {
        assert_eq!(MockGpu::new("a", 0).uuid, MockGpu::new("a", 0).uuid);
        assert_ne!(MockGpu::new("a", 0).uuid, MockGpu::new("a", 1).uuid);
        assert_ne!(MockGpu::new("a", 0).uuid, MockGpu::new("b", 0).uuid);
    }

    #[test]
    fn devices_carry_the_documented_attributes() {
        let gpus = MockGpuDriver::new(DEFAULT_DRIVER_NAME, "node", 4).gpus();
        let device = gpus[3].device();
        assert_eq!(device.name, "gpu-3");
        for key in [
            "index",
            "uuid",
            "model",
            "driverVersion",
            "nvlinkGroup",
            "nvlinkActiveLinks",
        ] {
            assert!(device.attributes.contains_key(key), "{key}");
        }
        assert_eq!(device.attributes.len(), 6, "{:?}", device.attributes);
        assert_eq!(device.capacity["memory"].value.0, "80Gi");
        assert_eq!(
            device.attributes["nvlinkGroup"],
            AttributeValue::String(gpus[2].uuid.clone())
        );
        assert_eq!(
            device.attributes["nvlinkActiveLinks"],
            AttributeValue::Int(NVLINK_ACTIVE_LINKS)
        );
    }

    /// `gpu-<i>` → its `nvlinkGroup`, for the whole GPUs of `resources`.
    fn nvlink_groups(resources: &DriverResources) -> Vec<(String, Option<AttributeValue>)> {
        resources
            .pools
            .values()
            .flat_map(|pool| &pool.devices)
            .map(|d| (d.name.clone(), d.attributes.get("nvlinkGroup").cloned()))
            .collect()
    }

    #[test]
    fn gpus_2k_and_2k_plus_1_share_an_nvlink_group_and_a_lone_gpu_has_none() {
        let driver = MockGpuDriver::new(DEFAULT_DRIVER_NAME, "node", 5);
        let gpus = driver.gpus();
        let group = |i: usize| gpus[i].nvlink_group.clone();
        assert_eq!(group(0), Some(gpus[0].uuid.clone()));
        assert_eq!(group(0), group(1));
        assert_eq!(group(2), Some(gpus[2].uuid.clone()));
        assert_eq!(group(2), group(3));
        assert_ne!(group(1), group(2));
        // The fifth GPU has no peer: neither attribute is published.
        let lone = gpus[4].device();
        assert!(!lone.attributes.contains_key("nvlinkGroup"), "{lone:?}");
        assert!(
            !lone.attributes.contains_key("nvlinkActiveLinks"),
            "{lone:?}"
        );
        // The same on every start, and another node's pairs have other groups.
        let resources = driver.resources();
        assert_eq!(
            nvlink_groups(&resources),
            nvlink_groups(&MockGpuDriver::new(DEFAULT_DRIVER_NAME, "node", 5).resources())
        );
        let other = MockGpuDriver::new(DEFAULT_DRIVER_NAME, "other", 5).gpus();
        assert_ne!(other[0].nvlink_group, group(0));
        // Within the limits the API server sets per device.
        resources
            .validate(&dra_sdk::advanced::slices::SliceLimits::strictest())
            .unwrap();
    }

    #[test]
    fn a_hot_plugged_gpu_with_an_odd_index_is_bridged_to_the_one_before() {
        let mut gpus = MockGpuDriver::new(DEFAULT_DRIVER_NAME, "node", 3).gpus();
        assert_eq!(gpus[2].nvlink_group, None);
        let added = push_gpu(&mut gpus, "node");
        assert_eq!(added.index, 3);
        assert_eq!(added.nvlink_group, Some(gpus[2].uuid.clone()));
        assert_eq!(gpus[2].nvlink_group, added.nvlink_group);
        assert_eq!(gpus[2].nvlink_active_links, Some(NVLINK_ACTIVE_LINKS));
        let added = push_gpu(&mut gpus, "node");
        assert_eq!((added.index, added.nvlink_group), (4, None));
    }

    #[test]
    fn device_names_parse_whole_gpus_and_partitions_only() {
        let parse = DeviceName::parse;
        assert_eq!(
            parse("gpu-3"),
            Some(DeviceName {
                index: 3,
                partition: None
            })
        );
        assert_eq!(
            parse("gpu-3-partition-1"),
            Some(DeviceName {
                index: 3,
                partition: Some(1)
            })
        );
        for bad in [
            "gpu-",
            "gpu-x",
            "cpu-1",
            "gpu-1-partition-",
            "gpu-1-partition-x",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn partitions_share_the_gpus_counter_set_and_never_exceed_it() {
        let options = PublishOptions {
            partitions: 3,
            allow_multiple_allocations: false,
        };
        let (devices, counters) = MockGpu::new("node", 1).publish(options);
        let counters = counters.unwrap();
        assert_eq!(counters.name, "gpu-1-counters");
        let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "gpu-1",
                "gpu-1-partition-0",
                "gpu-1-partition-1",
                "gpu-1-partition-2"
            ]
        );
        // The whole GPU consumes the whole set; three partitions stay within it.
        assert_eq!(devices[0].consumes_counters[0].counters, counters.counters);
        // Partitions carry their GPU's NVLink group.
        let mut gpus = MockGpuDriver::new(DEFAULT_DRIVER_NAME, "node", 2).gpus();
        let (paired, _) = gpus.remove(1).publish(options);
        assert!(
            paired
                .iter()
                .all(|d| d.attributes["nvlinkGroup"] == paired[0].attributes["nvlinkGroup"]),
            "{paired:?}"
        );
        let partition = &devices[1].consumes_counters[0].counters;
        assert_eq!(partition["memory"].0, "27306Mi");
        assert_eq!(partition["compute"].0, "33");
        assert!(!devices[1].allow_multiple_allocations);
        assert!(
            PublishOptions {
                partitions: MAX_PARTITIONS + 1,
                ..options
            }
            .validate()
            .is_err()
        );
    }
}
