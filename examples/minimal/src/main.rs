//! The smallest complete DRA driver: it publishes a few mock accelerators on its node and
//! prepares them by handing each container environment variables through CDI.
//! Walkthrough: docs/quickstart.md. Run: `minimal-kubelet-plugin --node-name <node>`.

use clap::Parser;
use dra_sdk::cdi::ContainerEdits;
use dra_sdk::claim::{Claim, DriverError, RecordedClaim};
use dra_sdk::cli::PluginArgs;
use dra_sdk::config::{ConfigHooks, ConfigRegistry, ConfigValidationError, OpaqueConfig};
use dra_sdk::driver::{Driver, PreparedClaim, PreparedDevice};
use dra_sdk::plugin::KubeletPlugin;
use dra_sdk::slices::{Device, DeviceAttributes, DriverResources, Quantity};

/// The name the driver registers with the kubelet and writes into its ResourceSlices.
const DRIVER_NAME: &str = "minimal.example.com";

/// One accelerator as the scheduler sees it: attributes and capacities for CEL selectors.
#[derive(DeviceAttributes)]
struct Accelerator {
    /// `device.attributes["minimal.example.com"].index`
    index: i64,
    /// `device.attributes["minimal.example.com"].model`
    model: String,
    /// `device.capacity["minimal.example.com"].memory`
    #[dra(capacity)]
    memory: Quantity,
}

/// What a claim may ask for in `opaque.parameters`; unknown fields are rejected.
#[derive(Debug, Default, serde::Deserialize, OpaqueConfig)]
#[serde(rename_all = "camelCase")]
#[dra(api_version = "minimal.example.com/v1", kind = "AcceleratorConfig")]
struct AcceleratorConfig {
    /// Power mode: `Performance` (the default) or `LowPower`.
    #[serde(default)]
    power_mode: Option<String>,
}

impl ConfigHooks for AcceleratorConfig {
    fn normalize(&mut self) {
        self.power_mode.get_or_insert_with(|| "Performance".into());
    }

    fn validate(&self) -> Result<(), ConfigValidationError> {
        match self.power_mode.as_deref() {
            Some("Performance" | "LowPower") | None => Ok(()),
            Some(_) => Err(ConfigValidationError::for_field(
                "powerMode",
                "must be Performance or LowPower",
            )),
        }
    }
}

/// The driver: no node state, so unprepare has nothing to undo (the SDK removes CDI specs).
struct MinimalDriver;

#[dra_sdk::async_trait]
impl Driver for MinimalDriver {
    type Config = AcceleratorConfig;

    fn config_registry(&self) -> ConfigRegistry<AcceleratorConfig> {
        ConfigRegistry::new().register::<AcceleratorConfig>()
    }

    async fn prepare(
        &self,
        claim: &Claim<AcceleratorConfig>,
    ) -> Result<PreparedClaim, DriverError> {
        let devices = claim.devices.iter().map(|device| {
            // The config with the highest precedence (claim over class), if one applies.
            let mode = device.config().and_then(|c| c.power_mode.as_deref());
            let prefix = format!(
                "ACCELERATOR_{}",
                device.device.name.replace('-', "_").to_uppercase()
            );
            let edits = ContainerEdits::new().env(&prefix, &device.device.name).env(
                format!("{prefix}_POWER_MODE"),
                mode.unwrap_or("Performance"),
            );
            PreparedDevice::new(device, edits)
        });
        Ok(PreparedClaim::new(devices.collect()))
    }

    async fn unprepare(&self, _claim: &RecordedClaim) -> Result<(), DriverError> {
        Ok(())
    }
}

/// The SDK's flags (`--node-name`, `--kubeconfig`, `--cdi-root`, ...) plus one of ours.
#[derive(Parser)]
#[command(name = "minimal-kubelet-plugin", version, about)]
struct Cli {
    #[command(flatten)]
    plugin: PluginArgs,
    /// Number of accelerators to publish.
    #[arg(long, env = "NUM_DEVICES", default_value_t = 2)]
    num_devices: u32,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    // The SDK's logging: `--log-format text|json`, colour only on a terminal, `RUST_LOG`.
    cli.plugin.init_logging();
    let node = cli.plugin.node_name.clone();
    let devices = (0..cli.num_devices)
        .map(|index| {
            let accelerator = Accelerator {
                index: index.into(),
                model: "MINIMAL-1".into(),
                memory: Quantity("16Gi".into()),
            };
            Device::new(format!("acc-{index}")).with_attributes(&accelerator)
        })
        .collect();
    let client = cli.plugin.kube_client().await?;
    KubeletPlugin::builder(MinimalDriver, DRIVER_NAME, &node, client)
        .args(&cli.plugin)?
        .resources(DriverResources::single_pool(node.clone(), devices))
        .start()
        .await?
        .run_until_signal()
        .await?;
    Ok(())
}
