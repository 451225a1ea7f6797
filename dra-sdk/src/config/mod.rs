//! Opaque device configuration: a registry of the driver's config types and strict decoding.
//!
//! Users attach driver-specific configuration to a claim (or an admin to a DeviceClass) as
//! `opaque.parameters`: a JSON object with `apiVersion` and `kind`, like a Kubernetes object.
//! A driver describes each accepted kind as a serde type with `#[derive(OpaqueConfig)]`,
//! registers the types in a [`ConfigRegistry`], and decodes parameters into its own config
//! type `C` on the prepare path:
//!
//! 1. `apiVersion` and `kind` select the registered type (an error lists what is accepted);
//! 2. the rest of the object is decoded **strictly**: unknown fields are rejected whatever
//!    serde attributes the type uses, and errors carry the JSON path of the bad field
//!    (`sharing.timeSlicingConfig.interval: unknown variant, expected ...`), and an unknown
//!    field comes with the closest declared one (`did you mean ...`);
//! 3. [`ConfigHooks::normalize`] fills in defaults, [`ConfigHooks::validate`] checks the result;
//! 4. the value is converted into `C` with `Into`. Older versions of a kind convert into the
//!    newest one this way, the way Kubernetes APIs evolve.
//!
//! Every failure is a [`ConfigError`] whose message is written for the user who wrote the
//! claim: it ends up in the claim's events. It never quotes a string value of the parameters,
//! since a config field may hold a secret (a token, a password): it says what was expected
//! and the type found (`expected a boolean, found a string`). Unknown field *names* are
//! quoted, shortened; so are `apiVersion` and `kind`. A driver's
//! [`validate`](ConfigHooks::validate) should not quote values either.
//!
//! ```
//! use dra_sdk::config::{ConfigHooks, ConfigRegistry, ConfigValidationError, OpaqueConfig};
//! use serde::Deserialize;
//!
//! #[derive(Debug, Deserialize, OpaqueConfig)]
//! #[serde(rename_all = "camelCase")]
//! #[dra(api_version = "gpu.example.com/v1", kind = "GpuConfig")]
//! struct GpuConfig {
//!     #[serde(default)]
//!     time_slice: Option<String>,
//! }
//!
//! impl ConfigHooks for GpuConfig {
//!     fn normalize(&mut self) {
//!         self.time_slice.get_or_insert_with(|| "Default".to_owned());
//!     }
//!
//!     fn validate(&self) -> Result<(), ConfigValidationError> {
//!         match self.time_slice.as_deref() {
//!             Some("Default" | "Short" | "Long") | None => Ok(()),
//!             // Not quoting the value: a field may hold a secret.
//!             Some(_) => Err(ConfigValidationError::for_field(
//!                 "timeSlice",
//!                 "must be Default, Short or Long",
//!             )),
//!         }
//!     }
//! }
//!
//! let registry = ConfigRegistry::<GpuConfig>::new().register::<GpuConfig>();
//!
//! let config = registry.decode(&serde_json::json!({
//!     "apiVersion": "gpu.example.com/v1",
//!     "kind": "GpuConfig",
//! }))?;
//! assert_eq!(config.time_slice.as_deref(), Some("Default"));
//!
//! let error = registry
//!     .decode(&serde_json::json!({
//!         "apiVersion": "gpu.example.com/v1",
//!         "kind": "GpuConfig",
//!         "timeSlices": "Long",
//!     }))
//!     .unwrap_err();
//! assert_eq!(
//!     error.to_string(),
//!     "invalid GpuConfig (gpu.example.com/v1): unknown field `timeSlices` \
//!      (did you mean `timeSlice`?)",
//! );
//! # Ok::<(), dra_sdk::config::ConfigError>(())
//! ```

mod error;
mod registry;
mod strict;

pub use dra_sdk_derive::OpaqueConfig;
pub use error::{ConfigError, ConfigValidationError, DuplicateConfigKind, UnknownField};
pub use registry::{ConfigKind, ConfigRegistry};

/// A kind of opaque configuration the driver accepts: a serde type plus its `apiVersion` and
/// `kind`.
///
/// Implement it with `#[derive(OpaqueConfig)]`:
/// `#[dra(api_version = "gpu.example.com/v1", kind = "GpuConfig")]` checks both at compile
/// time. The registry consumes `apiVersion` and `kind`, so the type itself does not declare
/// them, and decodes the remaining fields strictly.
///
/// The top level must deserialize from a JSON object: a struct, or an internally tagged,
/// adjacently tagged or untagged enum.
///
/// ```
/// use dra_sdk::config::{ConfigRegistry, OpaqueConfig};
///
/// #[derive(Debug, serde::Deserialize, OpaqueConfig)]
/// #[serde(rename_all = "camelCase")]
/// #[dra(api_version = "gpu.example.com/v1", kind = "GpuConfig", hooks = false)]
/// struct GpuConfig {
///     time_slice: Option<String>,
/// }
///
/// let registry: ConfigRegistry<GpuConfig> = ConfigRegistry::new().register::<GpuConfig>();
/// assert_eq!(GpuConfig::KIND, "GpuConfig");
/// # let _ = registry;
/// ```
pub trait OpaqueConfig: serde::de::DeserializeOwned + ConfigHooks + Send + Sync + 'static {
    /// `group/version`, for example `gpu.example.com/v1`.
    const API_VERSION: &'static str;
    /// The kind, for example `GpuConfig`.
    const KIND: &'static str;
}

/// Defaulting and validation of a decoded config, called by [`ConfigRegistry::decode`]:
/// first [`normalize`](Self::normalize), then [`validate`](Self::validate).
///
/// Both methods default to doing nothing. A type without hooks says so with
/// `#[derive(OpaqueConfig)]` and `#[dra(..., hooks = false)]`, which writes the empty impl;
/// otherwise the driver writes `impl ConfigHooks for T`, so forgetting validation is a
/// compile error rather than a silent default.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not implement `ConfigHooks`",
    label = "opaque configs need normalize/validate hooks",
    note = "write `impl dra_sdk::config::ConfigHooks for {Self} {{ .. }}`, or `#[dra(hooks = false)]` if it needs none"
)]
pub trait ConfigHooks {
    /// Fills in defaults. Runs on every decoded value before [`validate`](Self::validate).
    fn normalize(&mut self) {}

    /// Checks the normalized value. The error's message reaches the user, so name the field
    /// and the accepted values, but do not quote a string the user wrote: it may be a secret,
    /// and the message lands in events and logs.
    fn validate(&self) -> Result<(), ConfigValidationError> {
        Ok(())
    }
}
