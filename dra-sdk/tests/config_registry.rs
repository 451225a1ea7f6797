//! The opaque config registry end to end: kind selection, strict decoding, hooks,
//! conversions between versions, and messages a user can act on.

use dra_sdk::config::{
    ConfigError, ConfigHooks, ConfigKind, ConfigRegistry, ConfigValidationError,
    DuplicateConfigKind, OpaqueConfig, UnknownField,
};
use proptest::prelude::*;
use serde::Deserialize;
use serde_json::{Value, json};

/// Modelled on the NVIDIA driver's `GpuConfig` (`resource.nvidia.com/v1beta1`).
#[derive(Clone, Debug, Deserialize, PartialEq, OpaqueConfig)]
#[serde(rename_all = "camelCase")]
#[dra(api_version = "resource.nvidia.com/v1beta1", kind = "GpuConfig")]
struct GpuConfig {
    #[serde(default)]
    sharing: Option<GpuSharing>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct GpuSharing {
    strategy: SharingStrategy,
    #[serde(default)]
    time_slicing_config: Option<TimeSlicingConfig>,
    #[serde(default)]
    mps_config: Option<MpsConfig>,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
enum SharingStrategy {
    TimeSlicing,
    #[serde(rename = "MPS")]
    Mps,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
struct TimeSlicingConfig {
    interval: Interval,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
enum Interval {
    Default,
    Short,
    Medium,
    Long,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct MpsConfig {
    #[serde(default)]
    default_active_thread_percentage: Option<u32>,
}

impl ConfigHooks for GpuConfig {
    fn normalize(&mut self) {
        let Some(sharing) = &mut self.sharing else {
            return;
        };
        match sharing.strategy {
            SharingStrategy::TimeSlicing => {
                sharing
                    .time_slicing_config
                    .get_or_insert(TimeSlicingConfig {
                        interval: Interval::Default,
                    });
            }
            SharingStrategy::Mps => {
                sharing.mps_config.get_or_insert_with(MpsConfig::default);
            }
        }
    }

    fn validate(&self) -> Result<(), ConfigValidationError> {
        let Some(sharing) = &self.sharing else {
            return Ok(());
        };
        match sharing.strategy {
            SharingStrategy::TimeSlicing if sharing.mps_config.is_some() => Err(
                ConfigValidationError::for_field("sharing.mpsConfig", "only applies to MPS"),
            ),
            SharingStrategy::Mps if sharing.time_slicing_config.is_some() => {
                Err(ConfigValidationError::for_field(
                    "sharing.timeSlicingConfig",
                    "only applies to TimeSlicing",
                ))
            }
            _ => match sharing
                .mps_config
                .as_ref()
                .and_then(|mps| mps.default_active_thread_percentage)
            {
                Some(percentage) if percentage > 100 => Err(ConfigValidationError::for_field(
                    "sharing.mpsConfig.defaultActiveThreadPercentage",
                    format!("must be between 0 and 100, got {percentage}"),
                )),
                _ => Ok(()),
            },
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq, OpaqueConfig)]
#[serde(rename_all = "camelCase")]
#[dra(
    api_version = "resource.nvidia.com/v1beta1",
    kind = "VfioDeviceConfig",
    hooks = false
)]
struct VfioDeviceConfig {
    #[serde(default)]
    enable_api_device: bool,
}

/// The driver's own view: one enum over its kinds.
#[derive(Debug, PartialEq)]
enum DriverConfig {
    Gpu(GpuConfig),
    Vfio(VfioDeviceConfig),
}

impl From<GpuConfig> for DriverConfig {
    fn from(config: GpuConfig) -> Self {
        Self::Gpu(config)
    }
}

impl From<VfioDeviceConfig> for DriverConfig {
    fn from(config: VfioDeviceConfig) -> Self {
        Self::Vfio(config)
    }
}

fn registry() -> ConfigRegistry<DriverConfig> {
    ConfigRegistry::new()
        .register::<GpuConfig>()
        .register::<VfioDeviceConfig>()
}

fn gpu(body: Value) -> Value {
    let mut parameters = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"});
    if let (Some(object), Value::Object(body)) = (parameters.as_object_mut(), body) {
        object.extend(body);
    }
    parameters
}

fn message(parameters: Value) -> String {
    registry().decode(&parameters).unwrap_err().to_string()
}

#[test]
fn selects_the_kind_and_normalizes() {
    let config = registry()
        .decode(&gpu(json!({"sharing": {"strategy": "TimeSlicing"}})))
        .unwrap();
    assert_eq!(
        config,
        DriverConfig::Gpu(GpuConfig {
            sharing: Some(GpuSharing {
                strategy: SharingStrategy::TimeSlicing,
                time_slicing_config: Some(TimeSlicingConfig {
                    interval: Interval::Default
                }),
                mps_config: None,
            })
        })
    );
    let config = registry()
        .decode(&json!({
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "VfioDeviceConfig",
            "enableApiDevice": true,
        }))
        .unwrap();
    assert_eq!(
        config,
        DriverConfig::Vfio(VfioDeviceConfig {
            enable_api_device: true
        })
    );
}

#[test]
fn kinds_in_registration_order() {
    assert_eq!(
        registry().kinds().collect::<Vec<_>>(),
        [
            ConfigKind::of::<GpuConfig>(),
            ConfigKind::of::<VfioDeviceConfig>()
        ]
    );
    assert_eq!(
        ConfigKind::of::<GpuConfig>().to_string(),
        "GpuConfig (resource.nvidia.com/v1beta1)"
    );
    assert_eq!(
        format!(
            "{:?}",
            ConfigRegistry::<GpuConfig>::new().register::<GpuConfig>()
        ),
        "ConfigRegistry { kinds: [ConfigKind { api_version: \"resource.nvidia.com/v1beta1\", kind: \"GpuConfig\" }] }"
    );
}

#[test]
fn type_field_errors() {
    assert_eq!(
        message(json!(["GpuConfig"])),
        "opaque config parameters must be a JSON object with apiVersion and kind, found an array"
    );
    assert_eq!(
        message(json!({"kind": "GpuConfig"})),
        "opaque config parameters have no `apiVersion`; this driver accepts \
         GpuConfig (resource.nvidia.com/v1beta1), VfioDeviceConfig (resource.nvidia.com/v1beta1)"
    );
    assert_eq!(
        message(json!({"apiVersion": "resource.nvidia.com/v1beta1"})),
        "opaque config parameters have no `kind`; this driver accepts \
         GpuConfig (resource.nvidia.com/v1beta1), VfioDeviceConfig (resource.nvidia.com/v1beta1)"
    );
    assert_eq!(
        message(json!({"apiVersion": 1, "kind": "GpuConfig"})),
        "opaque config `apiVersion` must be a string, found a number"
    );
    assert_eq!(
        message(json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": null})),
        "opaque config `kind` must be a string, found null"
    );
}

#[test]
fn unknown_kind_lists_what_is_accepted() {
    let error = registry()
        .decode(&json!({"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"}))
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "unsupported opaque config kind \"GpuConfig\" in apiVersion \"resource.nvidia.com/v1\"; \
         this driver accepts GpuConfig (resource.nvidia.com/v1beta1), \
         VfioDeviceConfig (resource.nvidia.com/v1beta1)"
    );
    assert_eq!(error.config(), None);
    let empty = ConfigRegistry::<GpuConfig>::new();
    assert_eq!(
        empty.decode(&gpu(json!({}))).unwrap_err().to_string(),
        "unsupported opaque config kind \"GpuConfig\" in apiVersion \"resource.nvidia.com/v1beta1\"; \
         this driver accepts no opaque configs"
    );
}

#[test]
fn decode_errors_name_the_json_path() {
    let error = registry()
        .decode(&gpu(json!({
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Fast"}},
        })))
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid GpuConfig (resource.nvidia.com/v1beta1): sharing.timeSlicingConfig.interval: \
         unknown variant, expected one of `Default`, `Short`, `Medium`, `Long`"
    );
    assert_eq!(error.config(), Some(ConfigKind::of::<GpuConfig>()));
    assert_eq!(
        message(gpu(json!({"sharing": {}}))),
        "invalid GpuConfig (resource.nvidia.com/v1beta1): sharing: missing field `strategy`"
    );
    assert_eq!(
        message(gpu(
            json!({"sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": -4}}})
        )),
        "invalid GpuConfig (resource.nvidia.com/v1beta1): \
         sharing.mpsConfig.defaultActiveThreadPercentage: invalid value: expected u32, found integer `-4`"
    );
}

#[test]
fn unknown_fields_are_rejected_with_suggestions() {
    let error = registry()
        .decode(&gpu(json!({
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfg": {"interval": "Long"}},
            "extra": 1,
        })))
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid GpuConfig (resource.nvidia.com/v1beta1): unknown fields `extra`, \
         `sharing.timeSlicingConfg` (did you mean `timeSlicingConfig`?)"
    );
    let ConfigError::UnknownFields { fields, .. } = error else {
        panic!("unexpected error {error:?}");
    };
    assert_eq!(
        fields[1],
        UnknownField {
            path: "sharing.timeSlicingConfg".into(),
            did_you_mean: Some("timeSlicingConfig"),
        }
    );
}

#[test]
fn lenient_decoding_accepts_fields_of_newer_versions() {
    let parameters = gpu(json!({"sharing": {"strategy": "MPS", "fromTheFuture": true}}));
    assert!(registry().decode(&parameters).is_err());
    let DriverConfig::Gpu(config) = registry().decode_lenient(&parameters).unwrap() else {
        panic!("decoded as the wrong kind");
    };
    assert_eq!(
        config.sharing.unwrap().mps_config,
        Some(MpsConfig::default()),
        "normalize still runs"
    );
}

#[test]
fn validation_runs_after_normalize() {
    assert_eq!(
        message(gpu(json!({
            "sharing": {"strategy": "MPS", "timeSlicingConfig": {"interval": "Short"}},
        }))),
        "invalid GpuConfig (resource.nvidia.com/v1beta1): sharing.timeSlicingConfig: only applies to TimeSlicing"
    );
    let error = registry()
        .decode(&gpu(json!({
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}},
        })))
        .unwrap_err();
    let ConfigError::Invalid { config, reason } = &error else {
        panic!("unexpected error {error:?}");
    };
    assert_eq!(*config, ConfigKind::of::<GpuConfig>());
    assert_eq!(
        reason.field(),
        Some("sharing.mpsConfig.defaultActiveThreadPercentage")
    );
    assert_eq!(reason.message(), "must be between 0 and 100, got 150");
}

#[test]
fn duplicate_registration_is_an_error() {
    let result = ConfigRegistry::<DriverConfig>::new()
        .register::<GpuConfig>()
        .try_register::<GpuConfig>();
    let error = result.unwrap_err();
    assert_eq!(
        error,
        DuplicateConfigKind {
            kind: ConfigKind::of::<GpuConfig>()
        }
    );
    assert_eq!(
        error.to_string(),
        "opaque config GpuConfig (resource.nvidia.com/v1beta1) is registered twice"
    );
}

#[test]
#[should_panic(
    expected = "opaque config GpuConfig (resource.nvidia.com/v1beta1) is registered twice"
)]
fn duplicate_register_panics_at_startup() {
    let _ = ConfigRegistry::<DriverConfig>::new()
        .register::<GpuConfig>()
        .register::<GpuConfig>();
}

mod versions {
    //! Two versions of one kind, the older converted to the newer.

    use super::*;

    #[derive(Debug, Deserialize, OpaqueConfig)]
    #[serde(rename_all = "camelCase")]
    #[dra(api_version = "gpu.example.com/v1alpha1", kind = "GpuConfig")]
    pub(super) struct GpuConfigV1alpha1 {
        time_slice: Option<String>,
    }

    impl ConfigHooks for GpuConfigV1alpha1 {
        fn validate(&self) -> Result<(), ConfigValidationError> {
            match self.time_slice.as_deref() {
                None | Some("Default" | "Short" | "Medium" | "Long") => Ok(()),
                Some(other) => Err(ConfigValidationError::for_field(
                    "timeSlice",
                    format!("unknown interval {other:?}"),
                )),
            }
        }
    }

    #[derive(Debug, PartialEq, Deserialize, OpaqueConfig)]
    #[serde(rename_all = "camelCase")]
    #[dra(api_version = "gpu.example.com/v1", kind = "GpuConfig", hooks = false)]
    pub(super) struct GpuConfigV1 {
        pub(super) sharing: Option<Sharing>,
    }

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub(super) struct Sharing {
        pub(super) interval: Interval,
    }

    impl From<GpuConfigV1alpha1> for GpuConfigV1 {
        fn from(old: GpuConfigV1alpha1) -> Self {
            let interval = match old.time_slice.as_deref() {
                None => return Self { sharing: None },
                Some("Short") => Interval::Short,
                Some("Medium") => Interval::Medium,
                Some("Long") => Interval::Long,
                Some(_) => Interval::Default,
            };
            Self {
                sharing: Some(Sharing { interval }),
            }
        }
    }
}

#[test]
fn older_versions_convert_to_the_newest() {
    use versions::{GpuConfigV1, GpuConfigV1alpha1, Sharing};
    let registry = ConfigRegistry::<GpuConfigV1>::new()
        .register::<GpuConfigV1alpha1>()
        .register::<GpuConfigV1>();
    let old =
        json!({"apiVersion": "gpu.example.com/v1alpha1", "kind": "GpuConfig", "timeSlice": "Long"});
    let new = json!({"apiVersion": "gpu.example.com/v1", "kind": "GpuConfig", "sharing": {"interval": "Long"}});
    let expected = GpuConfigV1 {
        sharing: Some(Sharing {
            interval: Interval::Long,
        }),
    };
    assert_eq!(registry.decode(&old).unwrap(), expected);
    assert_eq!(registry.decode(&new).unwrap(), expected);
    // Each version validates with its own rules, and is strict about its own fields.
    let bad_old =
        json!({"apiVersion": "gpu.example.com/v1alpha1", "kind": "GpuConfig", "timeSlice": "Fast"});
    assert_eq!(
        registry.decode(&bad_old).unwrap_err().to_string(),
        "invalid GpuConfig (gpu.example.com/v1alpha1): timeSlice: unknown interval \"Fast\""
    );
    let mixed =
        json!({"apiVersion": "gpu.example.com/v1", "kind": "GpuConfig", "timeSlice": "Long"});
    assert_eq!(
        registry.decode(&mixed).unwrap_err().to_string(),
        "invalid GpuConfig (gpu.example.com/v1): unknown field `timeSlice`"
    );
}

#[test]
fn registry_is_shareable() {
    fn assert_send_sync_clone<T: Send + Sync + Clone + 'static>() {}
    assert_send_sync_clone::<ConfigRegistry<DriverConfig>>();
    let registry = std::sync::Arc::new(registry());
    let handle = {
        let registry = registry.clone();
        std::thread::spawn(move || registry.decode(&gpu(json!({}))).is_ok())
    };
    assert!(handle.join().unwrap());
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop_oneof![
            Just("GpuConfig".to_owned()),
            Just("resource.nvidia.com/v1beta1".to_owned()),
            Just("TimeSlicing".to_owned()),
            Just("MPS".to_owned()),
            Just("Long".to_owned()),
            ".{0,12}",
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        let key = prop_oneof![
            Just("apiVersion".to_owned()),
            Just("kind".to_owned()),
            Just("sharing".to_owned()),
            Just("strategy".to_owned()),
            Just("timeSlicingConfig".to_owned()),
            Just("interval".to_owned()),
            Just("mpsConfig".to_owned()),
            Just("defaultActiveThreadPercentage".to_owned()),
            "[a-zA-Z]{1,8}",
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key, inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

proptest! {
    /// Any input yields a value or an error, never a panic, and the error message is short
    /// enough for a Kubernetes event.
    #[test]
    fn never_panics(mut value in json_value(), typed in any::<bool>()) {
        if typed && let Some(object) = value.as_object_mut() {
            object.insert("apiVersion".into(), "resource.nvidia.com/v1beta1".into());
            object.insert("kind".into(), "GpuConfig".into());
        }
        let registry = registry();
        if let Err(error) = registry.decode(&value) {
            prop_assert!(error.to_string().len() < 1024, "{error}");
        }
        let _ = registry.decode_lenient(&value);
    }
}

/// A config with every shape a driver's config has: nested structs, an externally tagged
/// enum with struct variants, lists, maps, numbers with ranges, a field whose own
/// `Deserialize` writes a message quoting the value, and a secret.
#[derive(Debug, Deserialize, OpaqueConfig)]
#[serde(rename_all = "camelCase")]
#[dra(api_version = "app.example.com/v1", kind = "AppConfig")]
#[allow(dead_code)]
struct AppConfig {
    token: Option<String>,
    #[serde(default)]
    workers: Vec<Worker>,
    #[serde(default)]
    limits: std::collections::BTreeMap<String, u16>,
    sharing: Option<GpuSharing>,
    timeout: Option<Timeout>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct Worker {
    name: String,
    port: u16,
    role: Role,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
enum Role {
    Leader { priority: u8 },
    Follower,
}

/// Seconds, written `"30s"`; a bad value fails with a message quoting it, as many
/// hand-written `Deserialize` impls do.
#[derive(Debug)]
struct Timeout(#[allow(dead_code)] u32);

impl<'de> Deserialize<'de> for Timeout {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.strip_suffix('s')
            .and_then(|seconds| seconds.parse().ok())
            .map(Timeout)
            .ok_or_else(|| serde::de::Error::custom(format!("{text:?} is not like 30s")))
    }
}

impl ConfigHooks for AppConfig {
    fn validate(&self) -> Result<(), ConfigValidationError> {
        for (index, worker) in self.workers.iter().enumerate() {
            if worker.port == 0 {
                return Err(ConfigValidationError::for_field(
                    format!("workers[{index}].port"),
                    "must not be 0",
                ));
            }
        }
        Ok(())
    }
}

/// Every name the configs, their hooks and the error messages use: a string value of the
/// input that is part of these may appear in a message without having been echoed.
const VOCABULARY: &str = "GpuConfig VfioDeviceConfig AppConfig resource.nvidia.com/v1beta1 \
    app.example.com/v1 apiVersion kind sharing strategy timeSlicingConfig interval mpsConfig \
    defaultActiveThreadPercentage enableApiDevice TimeSlicing MPS Default Short Medium Long \
    token workers limits timeout name port role leader priority follower \
    invalid type value length expected found unknown field fields variant variants missing \
    duplicate string integer boolean floating point null array object struct there are no \
    only applies must not be between and 100 got opaque config parameters JSON with this \
    driver accepts unsupported did you mean a u8 u16 u32 map sequence option tuple size \
    fewer elements in is like 30s (value hidden) single key char character more";

fn app_registry() -> ConfigRegistry<AppConfig> {
    ConfigRegistry::new().register::<AppConfig>()
}

/// Strings as users write them, and as attackers do: words of the configs (valid values in
/// the wrong place), any text, secrets, long ones.
fn json_string() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "GpuConfig",
            "AppConfig",
            "resource.nvidia.com/v1beta1",
            "app.example.com/v1",
            "TimeSlicing",
            "MPS",
            "Long",
            "leader",
            "follower",
            "30s",
        ])
        .prop_map(str::to_owned),
        ".{0,16}",
        "hunter2-[A-Za-z0-9]{4,24}",
        "[a-z]{200,300}",
    ]
}

/// Any JSON value, its keys mostly the configs' field names so that decoding goes deep.
fn config_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        prop_oneof![
            Just(0u64),
            Just(1),
            Just(100),
            Just(101),
            Just(65_535),
            Just(65_536)
        ]
        .prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        json_string().prop_map(Value::from),
    ];
    leaf.prop_recursive(6, 96, 6, |inner| {
        let key = prop_oneof![
            prop::sample::select(vec![
                "apiVersion",
                "kind",
                "sharing",
                "strategy",
                "timeSlicingConfig",
                "interval",
                "mpsConfig",
                "defaultActiveThreadPercentage",
                "token",
                "workers",
                "limits",
                "timeout",
                "name",
                "port",
                "role",
                "leader",
                "priority",
                "follower",
            ])
            .prop_map(str::to_owned),
            ".{1,12}",
            "[a-z]{100,140}",
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key, inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// Every string value of `value` and every key, except the top level's `apiVersion` and
/// `kind` (selectors, quoted in the unknown-kind message).
fn strings_and_keys(value: &Value) -> (Vec<&str>, Vec<&str>) {
    let (mut strings, mut keys) = (Vec::new(), Vec::new());
    let mut pending = vec![(value, true)];
    while let Some((value, root)) = pending.pop() {
        match value {
            Value::String(text) => strings.push(text.as_str()),
            Value::Array(items) => pending.extend(items.iter().map(|item| (item, false))),
            Value::Object(object) => {
                for (key, item) in object {
                    keys.push(key.as_str());
                    if !(root && (key == "apiVersion" || key == "kind")) {
                        pending.push((item, false));
                    }
                }
            }
            _ => {}
        }
    }
    (strings, keys)
}

/// Whether the error points at what to fix: a field path, or a named field.
fn names_a_field(error: &ConfigError) -> bool {
    let message = error.to_string();
    match error {
        // The top level itself, `apiVersion` or `kind`: named in the message.
        ConfigError::NotAnObject { .. } => message.contains("apiVersion and kind"),
        ConfigError::MissingField { field, .. } | ConfigError::FieldNotString { field, .. } => {
            message.contains(&format!("`{field}`"))
        }
        ConfigError::UnknownKind { .. } => {
            message.contains("kind") && message.contains("apiVersion")
        }
        ConfigError::Decode { field, message, .. } => match field {
            Some(field) => error.to_string().contains(&format!("{field}: ")),
            // At the top level only a missing or unknown field can fail, and it is named.
            None => {
                message.starts_with("missing field `") || message.starts_with("unknown field `")
            }
        },
        ConfigError::UnknownFields { fields, .. } => {
            !fields.is_empty() && message.contains(&format!("`{}`", fields[0].path))
        }
        ConfigError::Invalid { reason, .. } => reason.field().is_some(),
        _ => false,
    }
}

/// Checks one decode's outcome: an error names a field, fits an event, and quotes no string
/// value of the input longer than three characters.
fn check_error(input: &Value, error: &ConfigError) -> Result<(), TestCaseError> {
    let message = error.to_string();
    prop_assert!(message.len() < 1024, "too long: {message}");
    prop_assert!(names_a_field(error), "names no field: {error:?}");
    let (strings, keys) = strings_and_keys(input);
    for text in strings {
        let echoable = text.chars().count() < 4
            || VOCABULARY.contains(text)
            || keys.iter().any(|key| key.contains(text));
        prop_assert!(
            echoable || !message.contains(text),
            "the message quotes the input value {text:?}: {message}"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]

    /// Any JSON for any of three config types (nested structs, enums with struct variants,
    /// lists, maps, numbers out of range, a hand-written `Deserialize`, validation hooks):
    /// never a panic, and every error names the field and quotes no string value.
    #[test]
    fn config_errors_name_the_field_and_never_echo_values(
        mut value in config_json(),
        kind in 0..4usize,
    ) {
        if let Some(object) = value.as_object_mut() {
            let (api_version, kind) = [
                ("resource.nvidia.com/v1beta1", "GpuConfig"),
                ("resource.nvidia.com/v1beta1", "VfioDeviceConfig"),
                ("app.example.com/v1", "AppConfig"),
                ("app.example.com/v1", "NoSuchKind"),
            ][kind];
            object.insert("apiVersion".into(), api_version.into());
            object.insert("kind".into(), kind.into());
        }
        for result in [
            registry().decode(&value).map(drop),
            registry().decode_lenient(&value).map(drop),
            app_registry().decode(&value).map(drop),
            app_registry().decode_lenient(&value).map(drop),
        ] {
            if let Err(error) = result {
                check_error(&value, &error)?;
            }
        }
    }

    /// Text as it may arrive (truncated, bytes flipped) before it is parsed: a syntax error
    /// is serde_json's and names the line and column; text that parses goes through the
    /// registry like any value.
    #[test]
    fn broken_json_text_never_panics(
        value in config_json(),
        cut in any::<prop::sample::Index>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
    ) {
        let mut text = serde_json::to_vec(&value).unwrap_or_default();
        if !text.is_empty() {
            text.truncate(cut.index(text.len() + 1).max(1));
            for (at, byte) in flips {
                let at = at.index(text.len());
                text[at] = byte;
            }
        }
        match serde_json::from_slice::<Value>(&text) {
            Err(error) => prop_assert!(error.line() >= 1 && error.to_string().contains("line")),
            Ok(parsed) => {
                if let Err(error) = app_registry().decode(&parsed) {
                    check_error(&parsed, &error)?;
                }
            }
        }
    }
}

/// A secret in every position of a config the driver would accept otherwise: no error
/// quotes it.
#[test]
fn secrets_never_appear_in_config_errors() {
    const SECRET: &str = "hunter2-token-0123456789";
    let placements = [
        json!({"token": 42, "timeout": SECRET}),
        json!({"workers": [{"name": "a", "port": SECRET, "role": "follower"}]}),
        json!({"workers": [{"name": "a", "port": 1, "role": SECRET}]}),
        json!({"workers": [{"name": "a", "port": 1, "role": {"leader": {"priority": SECRET}}}]}),
        json!({"limits": {"gpu": SECRET}}),
        json!({"sharing": {"strategy": SECRET}}),
        json!({"sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": SECRET}}}),
        json!({"sharing": SECRET}),
        json!({"workers": SECRET}),
    ];
    for mut parameters in placements {
        let object = parameters.as_object_mut().unwrap();
        object.insert("apiVersion".into(), "app.example.com/v1".into());
        object.insert("kind".into(), "AppConfig".into());
        let error = app_registry().decode(&parameters).unwrap_err();
        let message = error.to_string();
        assert!(!message.contains("hunter2"), "{message}");
        assert!(names_a_field(&error), "{message}");
    }
    let error = app_registry()
        .decode(
            &json!({"apiVersion": "app.example.com/v1", "kind": "AppConfig", "timeout": SECRET}),
        )
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid AppConfig (app.example.com/v1): timeout: \"(value hidden)\" is not like 30s"
    );
}
