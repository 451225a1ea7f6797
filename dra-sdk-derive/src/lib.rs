//! Derive macros for `dra-sdk`. Use them through the re-exports in `dra_sdk`
//! (`dra_sdk::slices::DeviceAttributes`, `dra_sdk::config::OpaqueConfig`); this crate holds only the entry
//! points, the logic works on `proc_macro2` and is unit-tested in its modules.

use proc_macro::TokenStream;

mod device_attributes;
mod names;
mod opaque_config;

/// Publishes a struct's fields as the attributes and capacities of a device.
///
/// Implements `dra_sdk::slices::DeviceAttributes`, so a value becomes part of a
/// `dra_sdk::slices::Device` with `Device::with_attributes`.
///
/// ```
/// # extern crate sdk as dra_sdk;
/// use dra_sdk::slices::{AttributeValue, Device, DeviceAttributes};
/// use dra_sdk::attributes::{Bytes, Version};
///
/// #[derive(DeviceAttributes)]
/// struct Gpu {
///     /// `index` in the driver's domain.
///     index: i64,
///     /// `driverVersion`: field names become lowerCamelCase.
///     driver_version: Version,
///     /// A standard attribute, qualified with its domain; omitted when `None`.
///     #[dra(name = "resource.kubernetes.io/pcieRoot")]
///     pcie_root: Option<String>,
///     /// A capacity, published as `80Gi`.
///     #[dra(capacity)]
///     memory: Bytes,
///     /// Not published.
///     #[dra(skip)]
///     minor: u32,
/// }
///
/// # fn main() {
/// let gpu = Gpu {
///     index: 0,
///     driver_version: Version::new(580, 126, 20),
///     pcie_root: Some("pci0000:64".into()),
///     memory: Bytes(80 << 30),
///     minor: 3,
/// };
/// let device = Device::new("gpu-0").with_attributes(&gpu);
/// assert_eq!(device.attributes["driverVersion"], AttributeValue::Version("580.126.20".into()));
/// assert_eq!(
///     device.attributes["resource.kubernetes.io/pcieRoot"],
///     AttributeValue::String("pci0000:64".into()),
/// );
/// assert_eq!(device.capacity["memory"].value.0, "80Gi");
/// assert_eq!(device.attributes.len() + device.capacity.len(), 4);
/// # }
/// ```
///
/// # Field options: `#[dra(...)]`
///
/// - *(none)*: an attribute named after the field in lowerCamelCase, in the driver's domain.
///   The type must implement `dra_sdk::attributes::ToAttributeValue`: integers up to `i64`,
///   `bool`, strings, `Version` (and `semver::Version` with dra-sdk's `semver` feature),
///   `Option<T>` (omitted when `None`) and `Vec<T>` (list attributes, omitted when empty).
/// - `name = "..."`: the attribute or capacity name, either a C identifier or qualified
///   with a domain (`resource.kubernetes.io/pciBusID`).
/// - `capacity`: a capacity instead of an attribute. The type must implement
///   `dra_sdk::attributes::ToCapacity`: `Quantity`, `Bytes`, unsigned integers, `Option<T>`.
/// - `flatten`: the field is itself `DeviceAttributes` (shared by several device types);
///   its entries are added as they are.
/// - `skip`: not published.
///
/// # Container options
///
/// - `crate = "path"`: where to find dra-sdk, when the dependency is renamed or re-exported.
///   Generated code otherwise names it `::dra_sdk`.
///
/// # Compile-time checks
///
/// Names are checked against the Kubernetes rules (C identifier of at most 32 characters,
/// optional DNS-subdomain domain of at most 63) by the SDK's `k8s::NameRule`, evaluated at
/// compile time and reported on the name; duplicate names and more than 32 attributes plus
/// capacities are rejected, and unsupported field types are reported on the field.
/// Entries of flattened fields are checked when the ResourceSlice is validated.
#[proc_macro_derive(DeviceAttributes, attributes(dra))]
pub fn derive_device_attributes(input: TokenStream) -> TokenStream {
    match syn::parse(input) {
        Ok(input) => device_attributes::derive(&input).into(),
        Err(error) => error.to_compile_error().into(),
    }
}

/// Declares a serde type as an opaque config kind of the driver.
///
/// Implements `dra_sdk::config::OpaqueConfig`; register the type with
/// `ConfigRegistry::register` to accept it in claim and class parameters. The registry
/// selects it by `apiVersion` and `kind`, decodes the other fields strictly (unknown fields
/// are errors that name their JSON path), then calls the `ConfigHooks`.
///
/// ```
/// # extern crate sdk as dra_sdk;
/// use dra_sdk::config::{ConfigHooks, ConfigRegistry, ConfigValidationError, OpaqueConfig};
/// use serde::Deserialize;
///
/// #[derive(Debug, Deserialize, OpaqueConfig)]
/// #[serde(rename_all = "camelCase")]
/// #[dra(api_version = "gpu.example.com/v1", kind = "GpuConfig")]
/// struct GpuConfig {
///     sharing: Option<Sharing>,
/// }
///
/// #[derive(Debug, Deserialize)]
/// #[serde(rename_all = "camelCase")]
/// struct Sharing {
///     strategy: Strategy,
///     #[serde(default)]
///     time_slicing_config: Option<TimeSlicingConfig>,
/// }
///
/// #[derive(Debug, Deserialize, PartialEq)]
/// enum Strategy { TimeSlicing, Mps }
///
/// #[derive(Debug, Deserialize)]
/// struct TimeSlicingConfig { interval: Interval }
///
/// #[derive(Debug, Deserialize)]
/// enum Interval { Default, Short, Medium, Long }
///
/// impl ConfigHooks for GpuConfig {
///     fn normalize(&mut self) {
///         if let Some(sharing) = &mut self.sharing {
///             if sharing.strategy == Strategy::TimeSlicing && sharing.time_slicing_config.is_none() {
///                 sharing.time_slicing_config = Some(TimeSlicingConfig { interval: Interval::Default });
///             }
///         }
///     }
///
///     fn validate(&self) -> Result<(), ConfigValidationError> {
///         match &self.sharing {
///             Some(sharing) if sharing.strategy == Strategy::Mps && sharing.time_slicing_config.is_some() => {
///                 Err(ConfigValidationError::for_field(
///                     "sharing.timeSlicingConfig",
///                     "only applies to the TimeSlicing strategy",
///                 ))
///             }
///             _ => Ok(()),
///         }
///     }
/// }
///
/// # fn main() {
/// let registry = ConfigRegistry::<GpuConfig>::new().register::<GpuConfig>();
/// let error = registry
///     .decode(&serde_json::json!({
///         "apiVersion": "gpu.example.com/v1",
///         "kind": "GpuConfig",
///         "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Fast"}},
///     }))
///     .unwrap_err();
/// assert_eq!(
///     error.to_string(),
///     "invalid GpuConfig (gpu.example.com/v1): sharing.timeSlicingConfig.interval: \
///      unknown variant, expected one of `Default`, `Short`, `Medium`, `Long`",
/// );
/// # }
/// ```
///
/// # Options: `#[dra(...)]` on the type
///
/// - `api_version = "group/version"` (required): the group a lowercase DNS subdomain, the
///   version a DNS label starting with a letter (`v1`, `v1beta1`).
/// - `kind = "Kind"` (required): an UpperCamelCase identifier.
/// - `hooks = false`: the type needs no `normalize`/`validate`; the derive writes the empty
///   `impl ConfigHooks`. Without it the type must implement `ConfigHooks` itself, so that a
///   forgotten validation is a compile error.
/// - `crate = "path"`: where to find dra-sdk when the dependency is renamed or re-exported.
///
/// The registry consumes `apiVersion` and `kind`, so a field or enum tag that would read
/// either is a compile error.
///
/// # Versions
///
/// Several versions of one kind are several types with the same `kind` and different
/// `api_version`s, each registered, with `From` conversions into the newest; see
/// `dra_sdk::config::ConfigRegistry`.
#[proc_macro_derive(OpaqueConfig, attributes(dra))]
pub fn derive_opaque_config(input: TokenStream) -> TokenStream {
    match syn::parse(input) {
        Ok(input) => opaque_config::derive(&input).into(),
        Err(error) => error.to_compile_error().into(),
    }
}
