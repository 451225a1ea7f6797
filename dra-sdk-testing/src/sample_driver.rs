//! A small GPU driver the SDK's own tests, benches and `dractl`'s tests share: the driver
//! name, its opaque config, its GPUs, and what a correct GPU driver prepares. Also a worked
//! example of a [`Driver`] implementation a test can start in a [`TestCluster`](crate::cluster::TestCluster).

use std::path::{Path, PathBuf};

use crate::cluster::NODE_NAME;
use dra_sdk::cdi::ContainerEdits;
use dra_sdk::claim::{Claim, DriverError, RecordedClaim};
use dra_sdk::config::{ConfigHooks, ConfigRegistry, OpaqueConfig};
use dra_sdk::context::DriverContext;
use dra_sdk::driver::{Driver, PreparedClaim, PreparedDevice};
use dra_sdk::health::DeviceState;
use dra_sdk::slices::{Device, DriverResources};
use serde::Deserialize;

/// The sample driver's name.
pub const DRIVER: &str = "gpu.example.com";

/// The sample driver's opaque config (`gpu.example.com/v1`, `GpuConfig`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuConfig {
    /// A sharing strategy, echoed into the container as `SHARING`.
    #[serde(default)]
    pub sharing: Option<String>,
}

impl ConfigHooks for GpuConfig {}

impl OpaqueConfig for GpuConfig {
    const API_VERSION: &'static str = "gpu.example.com/v1";
    const KIND: &'static str = "GpuConfig";
}

/// `n` GPUs, `gpu-0` on, each with an `index` attribute, in one pool of [`NODE_NAME`].
pub fn gpus(n: usize) -> DriverResources {
    gpus_on(NODE_NAME, n)
}

/// `n` GPUs like [`gpus`], in one pool of `node`.
pub fn gpus_on(node: &str, n: usize) -> DriverResources {
    let devices = (0..n)
        .map(|i| Device::new(format!("gpu-{i}")).attribute("index", i as i64))
        .collect();
    DriverResources::single_pool(node, devices)
}

/// A correct driver with the [`GpuConfig`]: prepares what [`prepare_gpus`] says; optional
/// health.
#[derive(Clone, Default)]
pub struct GpuDriver {
    /// The device states it reports when it starts; `None`: it does not report health. A
    /// test changes them later through the plugin's context.
    pub health: Option<Vec<DeviceState>>,
}

#[async_trait::async_trait]
impl Driver for GpuDriver {
    type Config = GpuConfig;

    fn config_registry(&self) -> ConfigRegistry<GpuConfig> {
        ConfigRegistry::new().register::<GpuConfig>()
    }

    async fn prepare(&self, claim: &Claim<GpuConfig>) -> Result<PreparedClaim, DriverError> {
        Ok(prepare_gpus(claim))
    }

    async fn unprepare(&self, _: &RecordedClaim) -> Result<(), DriverError> {
        Ok(())
    }

    fn reports_health(&self) -> bool {
        self.health.is_some()
    }

    async fn start(&self, ctx: &DriverContext) -> Result<(), DriverError> {
        ctx.set_device_states(self.health.iter().flatten().cloned());
        Ok(())
    }
}

/// What a correct GPU driver prepares: per device `GPU_<device>=1` and `SHARING=<the
/// config's sharing, or none>`; for the whole claim `DRIVER=<driver>`.
pub fn prepare_gpus(claim: &Claim<GpuConfig>) -> PreparedClaim {
    let devices = claim
        .devices
        .iter()
        .map(|device| {
            let sharing = device
                .config()
                .and_then(|config| config.sharing.clone())
                .unwrap_or_else(|| "none".into());
            let edits = ContainerEdits::new()
                .env(format!("GPU_{}", device.device.name.replace('-', "_")), "1")
                .env("SHARING", sharing);
            PreparedDevice::new(device, edits)
        })
        .collect();
    PreparedClaim::new(devices).with_common_edits(ContainerEdits::new().env("DRIVER", DRIVER))
}

/// Writes a CDI spec of another vendor's kind for the claim into `cdi_root`, which nothing
/// removes: the leak a broken driver leaves and the conformance suite must report.
pub fn leak_spec(cdi_root: &Path, claim_uid: &str) -> Result<(), DriverError> {
    let spec = serde_json::json!({
        "cdiVersion": "0.5.0",
        "kind": "leaky.example.com/gpu",
        "devices": [{ "name": claim_uid, "containerEdits": { "env": ["LEAK=1"] } }],
    });
    let path = cdi_root.join(format!("leaky.example.com-gpu_{claim_uid}.json"));
    std::fs::write(path, spec.to_string()).map_err(DriverError::other)
}

/// A correct driver with no config: `GPU=<device>` per device; optionally reports health
/// or leaks a CDI spec per claim (see [`leak_spec`]).
#[derive(Clone, Default)]
pub struct EnvDriver {
    /// The device states it reports when it starts; `None`: it does not report health. A
    /// test changes them later through the plugin's context.
    pub health: Option<Vec<DeviceState>>,
    /// Writes a spec file per claim that it never removes.
    pub leak_into: Option<PathBuf>,
}

#[async_trait::async_trait]
impl Driver for EnvDriver {
    type Config = ();

    async fn prepare(&self, claim: &Claim<()>) -> Result<PreparedClaim, DriverError> {
        if let Some(root) = &self.leak_into {
            leak_spec(root, &claim.claim.uid)?;
        }
        let devices = claim
            .devices
            .iter()
            .map(|d| PreparedDevice::new(d, ContainerEdits::new().env("GPU", &d.device.name)))
            .collect();
        Ok(PreparedClaim::new(devices))
    }

    async fn unprepare(&self, _: &RecordedClaim) -> Result<(), DriverError> {
        Ok(())
    }

    fn reports_health(&self) -> bool {
        self.health.is_some()
    }

    async fn start(&self, ctx: &DriverContext) -> Result<(), DriverError> {
        ctx.set_device_states(self.health.iter().flatten().cloned());
        Ok(())
    }
}
