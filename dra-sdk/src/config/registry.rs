//! The driver's set of accepted opaque config kinds.

use std::fmt;

use serde_json::{Map, Value};

use super::error::echo;
use super::{ConfigError, DuplicateConfigKind, OpaqueConfig, strict};

/// An `apiVersion` and `kind` pair: one registered opaque config type.
///
/// Displays as `GpuConfig (gpu.example.com/v1)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConfigKind {
    /// `group/version`, for example `gpu.example.com/v1`.
    pub api_version: &'static str,
    /// The kind, for example `GpuConfig`.
    pub kind: &'static str,
}

impl ConfigKind {
    /// The `apiVersion` and `kind` of `T`.
    pub fn of<T: OpaqueConfig>() -> Self {
        Self {
            api_version: T::API_VERSION,
            kind: T::KIND,
        }
    }
}

impl fmt::Display for ConfigKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.kind, self.api_version)
    }
}

/// Decodes one registered type and converts it into the driver's config type `C`.
type DecodeFn<C> = fn(&Value, ConfigKind, bool) -> Result<C, ConfigError>;

struct Entry<C> {
    kind: ConfigKind,
    decode: DecodeFn<C>,
}

/// The opaque config types a driver accepts, and the decoder of claim and class parameters
/// into the driver's config type `C`.
///
/// `C` is often an enum over the driver's kinds, or the newest version of its only kind;
/// each registered type converts into it with `Into`. Registering every served version of a
/// kind, each with a `From` conversion to the newest, lets a driver evolve its config API the
/// way Kubernetes APIs evolve:
///
/// ```
/// use dra_sdk::config::{ConfigRegistry, OpaqueConfig};
/// use serde::Deserialize;
///
/// /// v1 had a boolean.
/// #[derive(Deserialize, OpaqueConfig)]
/// #[dra(api_version = "gpu.example.com/v1", kind = "GpuConfig", hooks = false)]
/// struct GpuConfigV1 {
///     shared: bool,
/// }
///
/// /// v2 names the sharing strategy.
/// #[derive(Debug, PartialEq, Deserialize, OpaqueConfig)]
/// #[dra(api_version = "gpu.example.com/v2", kind = "GpuConfig", hooks = false)]
/// struct GpuConfig {
///     sharing: Option<String>,
/// }
///
/// impl From<GpuConfigV1> for GpuConfig {
///     fn from(v1: GpuConfigV1) -> Self {
///         GpuConfig { sharing: v1.shared.then(|| "TimeSlicing".to_owned()) }
///     }
/// }
///
/// let registry = ConfigRegistry::<GpuConfig>::new()
///     .register::<GpuConfigV1>()
///     .register::<GpuConfig>();
///
/// let old = serde_json::json!({"apiVersion": "gpu.example.com/v1", "kind": "GpuConfig", "shared": true});
/// assert_eq!(registry.decode(&old)?, GpuConfig { sharing: Some("TimeSlicing".into()) });
/// # Ok::<(), dra_sdk::config::ConfigError>(())
/// ```
///
/// Decoding is cheap: it borrows the parameters, and looks the kind up in a short list.
pub struct ConfigRegistry<C> {
    entries: Vec<Entry<C>>,
}

impl<C: Send + Sync + 'static> ConfigRegistry<C> {
    /// A registry that accepts nothing yet.
    pub fn new() -> Self {
        Self {
            entries: Vec::new(),
        }
    }

    /// Accepts `T` under its `apiVersion` and `kind`.
    ///
    /// # Panics
    ///
    /// If a type with the same `apiVersion` and `kind` is already registered. That is a bug in
    /// the driver's startup code, found by any test that builds the registry (like
    /// overlapping routes in an HTTP router); use [`try_register`](Self::try_register) to
    /// handle it as an error instead.
    #[track_caller]
    pub fn register<T: OpaqueConfig + Into<C>>(self) -> Self {
        match self.try_register::<T>() {
            Ok(registry) => registry,
            Err(error) => panic!("{error}"),
        }
    }

    /// Accepts `T` under its `apiVersion` and `kind`, or fails if that pair is taken.
    pub fn try_register<T: OpaqueConfig + Into<C>>(mut self) -> Result<Self, DuplicateConfigKind> {
        let kind = ConfigKind::of::<T>();
        if self.entries.iter().any(|entry| entry.kind == kind) {
            return Err(DuplicateConfigKind { kind });
        }
        self.entries.push(Entry {
            kind,
            decode: decode_as::<T, C>,
        });
        Ok(self)
    }

    /// Decodes opaque config parameters strictly: selects the type by `apiVersion` and
    /// `kind`, rejects unknown fields, runs [`normalize`](super::ConfigHooks::normalize) and
    /// [`validate`](super::ConfigHooks::validate), and converts the value into `C`.
    ///
    /// Use it for everything a user wrote: claim and class parameters, admission webhooks.
    pub fn decode(&self, parameters: &Value) -> Result<C, ConfigError> {
        self.decode_with(parameters, true)
    }

    /// Like [`decode`](Self::decode) but ignores unknown fields.
    ///
    /// For parameters this driver stored itself, such as configs kept in a checkpoint: after a
    /// downgrade they may hold fields of a newer version, which must not make cleanup fail.
    pub fn decode_lenient(&self, parameters: &Value) -> Result<C, ConfigError> {
        self.decode_with(parameters, false)
    }

    /// Decodes one opaque config, strictly, when it is addressed to `driver_name`; `None` when
    /// `opaque_driver` is another driver's. Prepare (each `status.allocation.devices.config`
    /// entry) and the admission webhook (each `spec.devices.config` entry) both go through
    /// here, so a config is accepted or refused alike, with the same [`ConfigError`] text.
    pub(crate) fn decode_for_driver(
        &self,
        driver_name: &str,
        opaque_driver: &str,
        parameters: &Value,
    ) -> Option<Result<C, ConfigError>> {
        (opaque_driver == driver_name).then(|| self.decode(parameters))
    }

    /// The registered kinds, in registration order.
    pub fn kinds(&self) -> impl ExactSizeIterator<Item = ConfigKind> + '_ {
        self.entries.iter().map(|entry| entry.kind)
    }

    fn decode_with(&self, parameters: &Value, strict: bool) -> Result<C, ConfigError> {
        let object = parameters.as_object().ok_or(ConfigError::NotAnObject {
            found: json_type(parameters),
        })?;
        let api_version = self.type_field(object, "apiVersion")?;
        let kind = self.type_field(object, "kind")?;
        let entry = self
            .entries
            .iter()
            .find(|entry| entry.kind.api_version == api_version && entry.kind.kind == kind)
            .ok_or_else(|| ConfigError::UnknownKind {
                api_version: echo(api_version),
                kind: echo(kind),
                accepted: self.kinds().collect(),
            })?;
        (entry.decode)(parameters, entry.kind, strict)
    }

    fn type_field<'a>(
        &self,
        object: &'a Map<String, Value>,
        field: &'static str,
    ) -> Result<&'a str, ConfigError> {
        match object.get(field) {
            None => Err(ConfigError::MissingField {
                field,
                accepted: self.kinds().collect(),
            }),
            Some(Value::String(value)) => Ok(value),
            Some(other) => Err(ConfigError::FieldNotString {
                field,
                found: json_type(other),
            }),
        }
    }
}

fn decode_as<T: OpaqueConfig + Into<C>, C>(
    parameters: &Value,
    kind: ConfigKind,
    strict: bool,
) -> Result<C, ConfigError> {
    let mut config: T = strict::decode(parameters, kind, strict)?;
    config.normalize();
    config.validate().map_err(|reason| ConfigError::Invalid {
        config: kind,
        reason,
    })?;
    Ok(config.into())
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl<C: Send + Sync + 'static> Default for ConfigRegistry<C> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C> Clone for ConfigRegistry<C> {
    fn clone(&self) -> Self {
        Self {
            entries: self
                .entries
                .iter()
                .map(|entry| Entry {
                    kind: entry.kind,
                    decode: entry.decode,
                })
                .collect(),
        }
    }
}

impl<C> fmt::Debug for ConfigRegistry<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfigRegistry")
            .field(
                "kinds",
                &self
                    .entries
                    .iter()
                    .map(|entry| entry.kind)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}
