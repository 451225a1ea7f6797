//! The derives' generated code resolves the SDK and std through absolute paths, so local
//! items with the same names do not capture it, and `#[dra(crate = "...")]` redirects it.
#![allow(dead_code, non_camel_case_types, non_upper_case_globals)]

mod shadowing {
    // Everything the generated code could accidentally pick up from the caller's scope.
    mod dra_sdk {}
    mod core {}
    mod std {}
    struct Option;
    struct Some;
    struct None;
    struct String;
    struct Result;
    struct Ok;
    struct Err;
    struct Device;
    struct Send;
    struct Sync;
    trait DeviceAttributes {}
    trait ToAttributeValue {}
    trait ToCapacity {}
    trait OpaqueConfig {}
    trait ConfigHooks {}
    trait Deserialize {}
    // Function parameters can never shadow constants (E0530), whatever the hygiene, so the
    // generated parameter has a reserved-looking name (`__dra_device`), as serde's do.
    const device: u8 = 0;
    fn set_attribute() {}
    fn set_capacity() {}

    #[derive(::dra_sdk::slices::DeviceAttributes)]
    pub(super) struct Gpu {
        pub(super) index: i64,
        pub(super) uuid: ::std::string::String,
        #[dra(capacity)]
        pub(super) memory: ::dra_sdk::attributes::Bytes,
        pub(super) __dra_device: bool,
    }

    #[derive(::serde::Deserialize, ::dra_sdk::config::OpaqueConfig)]
    #[dra(api_version = "gpu.example.com/v1", kind = "GpuConfig", hooks = false)]
    pub(super) struct GpuConfig {
        pub(super) interval: ::std::option::Option<u8>,
    }
}

/// A crate that re-exports the SDK, as a vendor's internal platform crate might.
mod platform {
    pub(crate) use dra_sdk as sdk;
}

#[derive(dra_sdk::slices::DeviceAttributes)]
#[dra(crate = "crate::platform::sdk")]
struct ThroughReexport {
    index: i64,
}

#[derive(serde::Deserialize, dra_sdk::config::OpaqueConfig)]
#[dra(
    api_version = "gpu.example.com/v1",
    kind = "Reexported",
    hooks = false,
    crate = "crate::platform::sdk"
)]
struct ReexportedConfig {}

#[test]
fn generated_code_is_hygienic() {
    use dra_sdk::config::ConfigRegistry;
    use dra_sdk::slices::{AttributeValue, Device};

    let gpu = shadowing::Gpu {
        index: 1,
        uuid: "GPU-1".into(),
        memory: dra_sdk::attributes::Bytes(1 << 20),
        __dra_device: true,
    };
    let device = Device::new("gpu-1").with_attributes(&gpu);
    assert_eq!(device.attributes["index"], AttributeValue::Int(1));
    assert_eq!(device.attributes["__draDevice"], AttributeValue::Bool(true));
    assert_eq!(device.capacity["memory"].value.0, "1Mi");

    let registry = ConfigRegistry::<shadowing::GpuConfig>::new().register::<shadowing::GpuConfig>();
    let config = registry
        .decode(&serde_json::json!({"apiVersion": "gpu.example.com/v1", "kind": "GpuConfig", "interval": 2}))
        .unwrap();
    assert_eq!(config.interval, Some(2));

    let device = Device::new("x").with_attributes(&ThroughReexport { index: 2 });
    assert_eq!(device.attributes["index"], AttributeValue::Int(2));
    let registry = ConfigRegistry::<ReexportedConfig>::new().register::<ReexportedConfig>();
    assert!(
        registry
            .decode(&serde_json::json!({"apiVersion": "gpu.example.com/v1", "kind": "Reexported"}))
            .is_ok()
    );
}
