//! The SDK is a dependency named `sdk` here, so `::dra_sdk` does not exist: the derives must
//! follow `#[dra(crate = "...")]` everywhere. An ordinary test rather than a trybuild `pass`
//! case: with only `compile_fail` cases trybuild type-checks (`cargo check`) instead of building
//! the SDK's whole dependency tree a second time (docs/testing.md).

use sdk::config::{ConfigHooks, ConfigRegistry, ConfigValidationError};
use sdk::slices::{AttributeValue, Device};

#[derive(sdk::slices::DeviceAttributes)]
#[dra(crate = "sdk")]
struct Gpu {
    index: i64,
    #[dra(capacity)]
    memory: sdk::attributes::Bytes,
    #[dra(flatten)]
    common: Common,
}

#[derive(sdk::slices::DeviceAttributes)]
#[dra(crate = "::sdk")]
struct Common {
    #[dra(name = "resource.kubernetes.io/pcieRoot")]
    pcie_root: Option<String>,
}

#[derive(serde::Deserialize, sdk::config::OpaqueConfig)]
#[dra(api_version = "gpu.example.com/v1", kind = "GpuConfig", crate = "sdk")]
struct GpuConfig {
    interval: u8,
}

impl ConfigHooks for GpuConfig {
    fn validate(&self) -> Result<(), ConfigValidationError> {
        if self.interval > 3 {
            return Err(ConfigValidationError::for_field(
                "interval",
                "must be 0 to 3",
            ));
        }
        Ok(())
    }
}

#[derive(serde::Deserialize, sdk::config::OpaqueConfig)]
#[dra(
    api_version = "gpu.example.com/v1",
    kind = "Empty",
    hooks = false,
    crate = "sdk"
)]
struct Empty {}

#[test]
fn generated_code_follows_the_crate_option() {
    let gpu = Gpu {
        index: 3,
        memory: sdk::attributes::Bytes(1 << 30),
        common: Common {
            pcie_root: Some("pci0000:00".into()),
        },
    };
    let device = Device::new("gpu-3").with_attributes(&gpu);
    assert_eq!(device.attributes["index"], AttributeValue::Int(3));
    assert_eq!(device.capacity["memory"].value.0, "1Gi");
    assert!(
        device
            .attributes
            .contains_key("resource.kubernetes.io/pcieRoot")
    );

    #[derive(Debug)]
    enum Config {
        Gpu(u8),
        Empty,
    }
    impl From<GpuConfig> for Config {
        fn from(config: GpuConfig) -> Self {
            Config::Gpu(config.interval)
        }
    }
    impl From<Empty> for Config {
        fn from(_: Empty) -> Self {
            Config::Empty
        }
    }
    let registry = ConfigRegistry::<Config>::new()
        .register::<GpuConfig>()
        .register::<Empty>();
    let config = registry
        .decode(&serde_json::json!({"apiVersion": "gpu.example.com/v1", "kind": "GpuConfig", "interval": 2}))
        .unwrap();
    assert!(matches!(config, Config::Gpu(2)));
    let error = registry
        .decode(&serde_json::json!({"apiVersion": "gpu.example.com/v1", "kind": "GpuConfig", "interval": 9}))
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid GpuConfig (gpu.example.com/v1): interval: must be 0 to 3"
    );
    assert!(matches!(
        registry.decode(&serde_json::json!({"apiVersion": "gpu.example.com/v1", "kind": "Empty"})),
        Ok(Config::Empty)
    ));
}
