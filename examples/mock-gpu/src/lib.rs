//! A DRA driver for mock GPUs, built on dra-sdk: the example a vendor starts from.
//!
//! It publishes `--num-devices` GPUs with deterministic attributes, accepts a
//! [`GpuConfig`](config::GpuConfig) opaque config, and "prepares" a GPU by handing the container
//! environment variables that describe it, so a pod can prove what it got by printing its env.

pub mod config;
#[cfg(feature = "demo")]
pub mod demo;
#[cfg(feature = "demo")]
pub mod testing;

use dra_sdk::DeviceAttributes;
use dra_sdk::cdi::ContainerEdits;
use dra_sdk::checkpoint::ClaimRecord;
use dra_sdk::config::ConfigRegistry;
use dra_sdk::driver::{
    AllocatedDevice, Claim, ClaimRef, Driver, DriverError, PreparedClaim, PreparedDevice,
};
use dra_sdk::slices::{Device, DriverResources, Quantity};
use sha2::{Digest, Sha256};

use crate::config::{GpuConfig, SharingStrategy};

/// Default driver name.
pub const DEFAULT_DRIVER_NAME: &str = "gpu.example.com";

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
}

impl MockGpu {
    /// The `index`-th GPU of `node_name`; the UUID is the same on every start.
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
}

/// The mock GPU driver.
#[derive(Clone, Debug)]
pub struct MockGpuDriver {
    driver_name: String,
    node_name: String,
    gpus: Vec<MockGpu>,
}

impl MockGpuDriver {
    /// A driver with `num_devices` GPUs on `node_name`.
    pub fn new(
        driver_name: impl Into<String>,
        node_name: impl Into<String>,
        num_devices: u32,
    ) -> Self {
        let node_name = node_name.into();
        let gpus = (0..num_devices)
            .map(|i| MockGpu::new(&node_name, i))
            .collect();
        Self {
            driver_name: driver_name.into(),
            node_name,
            gpus,
        }
    }

    /// The GPUs this driver has.
    pub fn gpus(&self) -> &[MockGpu] {
        &self.gpus
    }

    /// What the plugin publishes: one pool named after the node.
    pub fn resources(&self) -> DriverResources {
        DriverResources::single_pool(
            self.node_name.clone(),
            self.gpus.iter().map(MockGpu::device).collect(),
        )
    }

    fn device_edits(
        &self,
        claim: &ClaimRef,
        device: &AllocatedDevice<GpuConfig>,
    ) -> Result<ContainerEdits, DriverError> {
        let gpu = self
            .gpus
            .iter()
            .find(|gpu| gpu.name() == device.device)
            .ok_or_else(|| DriverError::Device {
                device: device.id(),
                reason: "no such GPU on this node".into(),
            })?;
        let prefix = format!("GPU_DEVICE_{}", gpu.index);
        let mut edits = ContainerEdits::new()
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
        ConfigRegistry::new().register::<GpuConfig>()
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
        Ok(PreparedClaim::new(devices).with_common_edits(common))
    }

    async fn unprepare(&self, _claim: &ClaimRef, _record: &ClaimRecord) -> Result<(), DriverError> {
        // Mock GPUs hold no node state: the SDK removes the CDI spec.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_deterministic_per_node_and_index() {
        assert_eq!(MockGpu::new("a", 0).uuid, MockGpu::new("a", 0).uuid);
        assert_ne!(MockGpu::new("a", 0).uuid, MockGpu::new("a", 1).uuid);
        assert_ne!(MockGpu::new("a", 0).uuid, MockGpu::new("b", 0).uuid);
    }

    #[test]
    fn devices_carry_the_documented_attributes() {
        let device = MockGpu::new("node", 3).device();
        assert_eq!(device.name, "gpu-3");
        for key in ["index", "uuid", "model", "driverVersion"] {
            assert!(device.attributes.contains_key(key), "{key}");
        }
        assert_eq!(device.capacity["memory"].value.0, "80Gi");
    }
}
