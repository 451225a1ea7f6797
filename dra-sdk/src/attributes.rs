//! Typed device attribute and capacity values, and the traits `#[derive(DeviceAttributes)]`
//! builds on.
//!
//! A field of a `#[derive(DeviceAttributes)]` struct becomes an attribute when its type
//! implements [`ToAttributeValue`], or a capacity (`#[dra(capacity)]`) when it implements
//! [`ToCapacity`]. The SDK implements them for the types that map to the DRA kinds:
//!
//! | Rust type | Published as |
//! |---|---|
//! | `i8`, `i16`, `i32`, `i64`, `u8`, `u16`, `u32` | `int` |
//! | `bool` | `bool` |
//! | `String`, `&str`, `Box<str>`, `Cow<str>` | `string` |
//! | [`Version`] (and `semver::Version` with the `semver` feature) | `version` |
//! | `Vec<T>`, `[T]`, `[T; N]` of the above | `ints`, `bools`, `strings`, `versions` (omitted when empty) |
//! | `Option<T>` | `T`, omitted when `None` |
//! | [`AttributeValue`] | itself |
//! | [`PciBusId`], [`PcieRoot`] / [`NumaNode`] (the standard `resource.kubernetes.io/` attributes) | `string` / `int` |
//! | capacity: [`Quantity`], [`Bytes`], `u8`…`u64`, `usize`, [`DeviceCapacity`], `Option<T>` | `capacity.value` |
//!
//! `u64`, `usize` and floats are deliberately not attributes: DRA integers are signed 64-bit and
//! there is no float kind, so the conversion is the driver's decision, made visibly.
//!
//! The standard attributes `resource.kubernetes.io/pciBusID`, `pcieRoot` and `numaNode` have
//! typed values, name constants and a sysfs reader ([`PciAttributes::from_sysfs`]); see
//! [`PciAttributes`].
//!
//! Implement the traits for your own types (an enum published as a string, for example) to use
//! them as fields.
//!
//! ```
//! use dra_sdk::attributes::{ToAttributeValue, Version};
//! use dra_sdk::slices::AttributeValue;
//!
//! enum DeviceType { Gpu, Mig }
//!
//! impl ToAttributeValue for DeviceType {
//!     fn to_attribute_value(&self) -> Option<AttributeValue> {
//!         let name = match self { DeviceType::Gpu => "gpu", DeviceType::Mig => "mig" };
//!         Some(AttributeValue::String(name.to_owned()))
//!     }
//! }
//!
//! assert_eq!(
//!     Version::coerce("535.104.05")?.to_attribute_value(),
//!     Some(AttributeValue::Version("535.104.5".to_owned())),
//! );
//! # Ok::<(), dra_sdk::attributes::VersionError>(())
//! ```

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use crate::slices::{AttributeValue, DeviceCapacity, Quantity};

mod standard;

pub use standard::{
    NumaNode, NumaNodeForm, PciAttributes, PciBusId, PcieRoot, StandardAttributeError,
};

/// Longest string or version attribute value the API server accepts.
const MAX_VALUE_LENGTH: usize = 64;

/// Why a string is not a [`Version`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VersionError {
    /// The text is not a semantic version (semver 2.0.0).
    #[error("{version:?} is not a semantic version (semver 2.0.0): {reason}")]
    Malformed {
        /// The rejected text.
        version: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The version is longer than a version attribute may be.
    #[error(
        "version {version:?} is {length} characters long; version attributes are limited to 64"
    )]
    TooLong {
        /// The rejected text.
        version: String,
        /// Its length in characters.
        length: usize,
    },
}

/// A semantic version (semver 2.0.0) of at most 64 characters: a valid `version` attribute.
///
/// [`Version::parse`] is strict, as the API server is. [`Version::coerce`] accepts what
/// vendor tools print (`8.0`, `535.104.05`, `v12.4`) and normalizes it.
///
/// ```
/// use dra_sdk::attributes::Version;
///
/// assert_eq!(Version::parse("1.2.3-rc.1+build.5")?.as_str(), "1.2.3-rc.1+build.5");
/// assert!(Version::parse("1.2").is_err());
/// assert_eq!(Version::coerce("8.0")?.as_str(), "8.0.0");
/// assert_eq!(Version::new(580, 126, 20).to_string(), "580.126.20");
/// # Ok::<(), dra_sdk::attributes::VersionError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Version(String);

impl Version {
    /// `major.minor.patch`. Always valid: three `u64` and two dots fit in 64 characters.
    pub fn new(major: u64, minor: u64, patch: u64) -> Self {
        Self(format!("{major}.{minor}.{patch}"))
    }

    /// Parses a semantic version exactly as the API server validates it.
    pub fn parse(text: &str) -> Result<Self, VersionError> {
        let malformed = |reason| VersionError::Malformed {
            version: text.to_owned(),
            reason,
        };
        let length = text.chars().count();
        if length > MAX_VALUE_LENGTH {
            return Err(VersionError::TooLong {
                version: text.to_owned(),
                length,
            });
        }
        crate::k8s::Semver::parse(text).map_err(|error| malformed(error.reason()))?;
        Ok(Self(text.to_owned()))
    }

    /// Accepts the loose versions vendor tools print and normalizes them: an optional leading
    /// `v`, one to three numeric components with leading zeros allowed (missing ones become
    /// `0`), then an optional semver pre-release and build suffix.
    ///
    /// `"8.0"` becomes `8.0.0`, `"535.104.05"` becomes `535.104.5`, `"v12"` becomes `12.0.0`.
    pub fn coerce(text: &str) -> Result<Self, VersionError> {
        let malformed = |reason| VersionError::Malformed {
            version: text.to_owned(),
            reason,
        };
        let trimmed = text.trim();
        let trimmed = trimmed.strip_prefix(['v', 'V']).unwrap_or(trimmed);
        let core_end = trimmed.find(['-', '+']).unwrap_or(trimmed.len());
        let (core, suffix) = trimmed.split_at(core_end);
        let mut parts = [0u64; 3];
        for (index, component) in core.split('.').enumerate() {
            let slot = parts
                .get_mut(index)
                .ok_or_else(|| malformed("more than three numeric components"))?;
            if component.is_empty() || !component.bytes().all(|b| b.is_ascii_digit()) {
                return Err(malformed("expected one to three numeric components"));
            }
            *slot = component
                .parse()
                .map_err(|_| malformed("numeric component does not fit in 64 bits"))?;
        }
        let [major, minor, patch] = parts;
        Self::parse(&format!("{major}.{minor}.{patch}{suffix}")).map_err(|error| match error {
            // Report the caller's text, not our normalized intermediate.
            VersionError::Malformed { reason, .. } => malformed(reason),
            VersionError::TooLong { length, .. } => VersionError::TooLong {
                version: text.to_owned(),
                length,
            },
        })
    }

    /// The version text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The version text, owned.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Version {
    type Err = VersionError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

impl TryFrom<&str> for Version {
    type Error = VersionError;

    fn try_from(text: &str) -> Result<Self, Self::Error> {
        Self::parse(text)
    }
}

impl TryFrom<String> for Version {
    type Error = VersionError;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        Self::parse(&text)
    }
}

impl From<Version> for String {
    fn from(version: Version) -> Self {
        version.0
    }
}

impl AsRef<str> for Version {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl serde::Serialize for Version {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Version {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <Cow<'de, str>>::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Fails only for versions longer than 64 characters (long pre-release or build metadata).
#[cfg(feature = "semver")]
impl TryFrom<&semver::Version> for Version {
    type Error = VersionError;

    fn try_from(version: &semver::Version) -> Result<Self, Self::Error> {
        Self::parse(&version.to_string())
    }
}

/// A number of bytes, published as a capacity in the binary-SI form Kubernetes prints
/// (`80Gi`, `512Mi`, or plain bytes when no binary unit divides it).
///
/// ```
/// use dra_sdk::attributes::{Bytes, ToCapacity};
///
/// let capacity = Bytes(80 * 1024 * 1024 * 1024).to_capacity().unwrap();
/// assert_eq!(capacity.value.0, "80Gi");
/// assert_eq!(Bytes(1500).to_string(), "1500");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["Ei", "Pi", "Ti", "Gi", "Mi", "Ki"];
        let Bytes(bytes) = *self;
        if bytes != 0 {
            for (index, unit) in UNITS.iter().enumerate() {
                let scale = 1u64 << (10 * (UNITS.len() - index));
                if bytes % scale == 0 {
                    return write!(f, "{}{unit}", bytes / scale);
                }
            }
        }
        write!(f, "{bytes}")
    }
}

/// A type whose values are device attributes.
///
/// Implemented for the types listed in the [module documentation](self); implement it for
/// your own types to use them as `#[derive(DeviceAttributes)]` fields.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be published as a device attribute",
    label = "unsupported attribute type",
    note = "attribute fields may be integers that fit in i64, bool, String or &str, dra_sdk::attributes::Version (semver::Version with the `semver` feature), Option<T> or Vec<T> of those, or implement dra_sdk::attributes::ToAttributeValue",
    note = "capacities need #[dra(capacity)], nested attribute structs #[dra(flatten)], other fields #[dra(skip)]"
)]
pub trait ToAttributeValue {
    /// The attribute value, or `None` to omit the attribute.
    fn to_attribute_value(&self) -> Option<AttributeValue>;
}

/// A type whose values can be elements of a list attribute (`ints`, `bools`, `strings`,
/// `versions`; Kubernetes 1.36+ with `DRAListTypeAttributes`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be an element of a list attribute",
    label = "unsupported list element type",
    note = "list attributes hold integers that fit in i64, bool, strings or versions"
)]
pub trait AttributeListItem {
    /// The list attribute holding `items`, in order. Called with at least one item.
    fn list_value<'a>(items: impl Iterator<Item = &'a Self>) -> AttributeValue
    where
        Self: 'a;
}

/// A type whose values are device capacities (`#[dra(capacity)]` fields).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be published as a device capacity",
    label = "unsupported capacity type",
    note = "capacity fields may be dra_sdk::slices::Quantity, dra_sdk::attributes::Bytes, unsigned integers, dra_sdk::slices::DeviceCapacity, or Option<T> of those, or implement dra_sdk::attributes::ToCapacity"
)]
pub trait ToCapacity {
    /// The capacity, or `None` to omit it.
    fn to_capacity(&self) -> Option<DeviceCapacity>;
}

macro_rules! int_attributes {
    ($($int:ty),*) => {$(
        impl ToAttributeValue for $int {
            fn to_attribute_value(&self) -> Option<AttributeValue> {
                Some(AttributeValue::Int(i64::from(*self)))
            }
        }

        impl AttributeListItem for $int {
            fn list_value<'a>(items: impl Iterator<Item = &'a Self>) -> AttributeValue {
                AttributeValue::Ints(items.map(|item| i64::from(*item)).collect())
            }
        }
    )*};
}

int_attributes!(i8, i16, i32, i64, u8, u16, u32);

impl ToAttributeValue for bool {
    fn to_attribute_value(&self) -> Option<AttributeValue> {
        Some(AttributeValue::Bool(*self))
    }
}

impl AttributeListItem for bool {
    fn list_value<'a>(items: impl Iterator<Item = &'a Self>) -> AttributeValue {
        AttributeValue::Bools(items.copied().collect())
    }
}

macro_rules! string_attributes {
    ($($string:ty),*) => {$(
        impl ToAttributeValue for $string {
            fn to_attribute_value(&self) -> Option<AttributeValue> {
                Some(AttributeValue::String(str::to_owned(self)))
            }
        }

        impl AttributeListItem for $string {
            fn list_value<'a>(items: impl Iterator<Item = &'a Self>) -> AttributeValue
            where
                Self: 'a,
            {
                AttributeValue::Strings(items.map(|item| str::to_owned(item)).collect())
            }
        }
    )*};
}

string_attributes!(str, String, Box<str>, Cow<'_, str>);

impl ToAttributeValue for Version {
    fn to_attribute_value(&self) -> Option<AttributeValue> {
        Some(AttributeValue::Version(self.0.clone()))
    }
}

impl AttributeListItem for Version {
    fn list_value<'a>(items: impl Iterator<Item = &'a Self>) -> AttributeValue {
        AttributeValue::Versions(items.map(|item| item.0.clone()).collect())
    }
}

#[cfg(feature = "semver")]
impl ToAttributeValue for semver::Version {
    fn to_attribute_value(&self) -> Option<AttributeValue> {
        Some(AttributeValue::Version(self.to_string()))
    }
}

#[cfg(feature = "semver")]
impl AttributeListItem for semver::Version {
    fn list_value<'a>(items: impl Iterator<Item = &'a Self>) -> AttributeValue {
        AttributeValue::Versions(items.map(ToString::to_string).collect())
    }
}

impl ToAttributeValue for AttributeValue {
    fn to_attribute_value(&self) -> Option<AttributeValue> {
        Some(self.clone())
    }
}

impl<T: ToAttributeValue + ?Sized> ToAttributeValue for &T {
    fn to_attribute_value(&self) -> Option<AttributeValue> {
        (**self).to_attribute_value()
    }
}

impl<T: AttributeListItem + ?Sized> AttributeListItem for &T {
    fn list_value<'a>(items: impl Iterator<Item = &'a Self>) -> AttributeValue
    where
        Self: 'a,
    {
        T::list_value(items.map(|item| &**item))
    }
}

impl<T: ToAttributeValue> ToAttributeValue for Option<T> {
    fn to_attribute_value(&self) -> Option<AttributeValue> {
        self.as_ref().and_then(T::to_attribute_value)
    }
}

/// Lists must not be empty on the wire, so an empty list means "no such attribute".
impl<T: AttributeListItem> ToAttributeValue for [T] {
    fn to_attribute_value(&self) -> Option<AttributeValue> {
        (!self.is_empty()).then(|| T::list_value(self.iter()))
    }
}

impl<T: AttributeListItem> ToAttributeValue for Vec<T> {
    fn to_attribute_value(&self) -> Option<AttributeValue> {
        self.as_slice().to_attribute_value()
    }
}

impl<T: AttributeListItem, const N: usize> ToAttributeValue for [T; N] {
    fn to_attribute_value(&self) -> Option<AttributeValue> {
        self.as_slice().to_attribute_value()
    }
}

impl ToCapacity for Quantity {
    fn to_capacity(&self) -> Option<DeviceCapacity> {
        Some(DeviceCapacity::new(self.0.clone()))
    }
}

impl ToCapacity for DeviceCapacity {
    fn to_capacity(&self) -> Option<DeviceCapacity> {
        Some(self.clone())
    }
}

impl ToCapacity for Bytes {
    fn to_capacity(&self) -> Option<DeviceCapacity> {
        Some(DeviceCapacity::new(self.to_string()))
    }
}

macro_rules! int_capacities {
    ($($int:ty),*) => {$(
        impl ToCapacity for $int {
            fn to_capacity(&self) -> Option<DeviceCapacity> {
                Some(DeviceCapacity::new(self.to_string()))
            }
        }
    )*};
}

int_capacities!(u8, u16, u32, u64, usize);

impl<T: ToCapacity + ?Sized> ToCapacity for &T {
    fn to_capacity(&self) -> Option<DeviceCapacity> {
        (**self).to_capacity()
    }
}

impl<T: ToCapacity> ToCapacity for Option<T> {
    fn to_capacity(&self) -> Option<DeviceCapacity> {
        self.as_ref().and_then(T::to_capacity)
    }
}

/// What `#[derive(DeviceAttributes)]` expands to. Not a stable API.
#[doc(hidden)]
pub mod __private {
    use super::{ToAttributeValue, ToCapacity};
    use crate::slices::Device;

    /// Sets attribute `name` unless the value is omitted.
    pub fn set_attribute<T: ToAttributeValue + ?Sized>(
        device: &mut Device,
        name: &'static str,
        value: &T,
    ) {
        if let Some(value) = value.to_attribute_value() {
            device.attributes.insert(name.to_owned(), value);
        }
    }

    /// Sets capacity `name` unless the value is omitted.
    pub fn set_capacity<T: ToCapacity + ?Sized>(
        device: &mut Device,
        name: &'static str,
        value: &T,
    ) {
        if let Some(capacity) = value.to_capacity() {
            device.capacity.insert(name.to_owned(), capacity);
        }
    }
}

/// Runs the examples in `docs/derive.md` as doctests, so the guide cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../docs/derive.md")]
struct DeriveGuide;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slices::Device;

    #[test]
    fn parse_accepts_semver() {
        for text in [
            "0.0.0",
            "1.2.3",
            "10.20.30",
            "1.0.0-alpha",
            "1.0.0-alpha.1",
            "1.0.0-0.3.7",
            "1.0.0-x.7.z.92",
            "1.0.0+20130313144700",
            "1.0.0-beta+exp.sha.5114f85",
            "1.0.0+21AF26D3----117B344092BD",
            "18446744073709551615.0.0",
        ] {
            assert_eq!(Version::parse(text).unwrap().as_str(), text);
        }
    }

    #[test]
    fn parse_rejects_non_semver() {
        for text in [
            "",
            "1",
            "1.2",
            "1.2.3.4",
            "01.2.3",
            "1.02.3",
            "1.2.03",
            "v1.2.3",
            "1.2.3-",
            "1.2.3-01",
            "1.2.3-a..b",
            "1.2.3+",
            "1.2.3+a_b",
            "1.2.-3",
            "a.b.c",
            "18446744073709551616.0.0",
            " 1.2.3",
        ] {
            assert!(Version::parse(text).is_err(), "{text:?} accepted");
        }
    }

    #[test]
    fn parse_enforces_length_limit() {
        let long = format!("1.0.0+{}", "a".repeat(58));
        assert_eq!(long.len(), 64);
        assert!(Version::parse(&long).is_ok());
        let too_long = format!("{long}b");
        assert_eq!(
            Version::parse(&too_long),
            Err(VersionError::TooLong {
                version: too_long.clone(),
                length: 65
            })
        );
    }

    #[test]
    fn coerce_normalizes_vendor_versions() {
        for (text, expected) in [
            ("8.0", "8.0.0"),
            ("9", "9.0.0"),
            ("v12.4", "12.4.0"),
            ("535.104.05", "535.104.5"),
            ("580.126.20", "580.126.20"),
            ("1.2.3-rc.1+b", "1.2.3-rc.1+b"),
            (" 1.2 ", "1.2.0"),
        ] {
            assert_eq!(Version::coerce(text).unwrap().as_str(), expected, "{text}");
        }
        for text in [
            "",
            "v",
            "1.2.3.4",
            "1..2",
            "x.1",
            "1.2-",
            "99999999999999999999",
        ] {
            assert!(Version::coerce(text).is_err(), "{text:?} accepted");
        }
    }

    #[test]
    fn version_errors_name_the_input() {
        let error = Version::parse("1.2").unwrap_err();
        assert_eq!(
            error.to_string(),
            "\"1.2\" is not a semantic version (semver 2.0.0): expected MAJOR.MINOR.PATCH"
        );
    }

    #[test]
    fn version_serde_validates() {
        let version: Version = serde_json::from_str("\"1.2.3\"").unwrap();
        assert_eq!(serde_json::to_string(&version).unwrap(), "\"1.2.3\"");
        assert!(serde_json::from_str::<Version>("\"1.2\"").is_err());
    }

    #[test]
    fn bytes_print_binary_si() {
        assert_eq!(Bytes(0).to_string(), "0");
        assert_eq!(Bytes(1023).to_string(), "1023");
        assert_eq!(Bytes(1024).to_string(), "1Ki");
        assert_eq!(Bytes(1536 * 1024).to_string(), "1536Ki");
        assert_eq!(Bytes(80 << 30).to_string(), "80Gi");
        assert_eq!(Bytes(1 << 60).to_string(), "1Ei");
        assert_eq!(Bytes(u64::MAX).to_string(), u64::MAX.to_string());
    }

    #[test]
    fn scalar_attributes() {
        assert_eq!(7u32.to_attribute_value(), Some(AttributeValue::Int(7)));
        assert_eq!((-3i8).to_attribute_value(), Some(AttributeValue::Int(-3)));
        assert_eq!(true.to_attribute_value(), Some(AttributeValue::Bool(true)));
        assert_eq!(
            "a".to_attribute_value(),
            Some(AttributeValue::String("a".into()))
        );
        assert_eq!(
            Cow::Borrowed("b").to_attribute_value(),
            Some(AttributeValue::String("b".into()))
        );
        assert_eq!(None::<i64>.to_attribute_value(), None);
        assert_eq!(
            Some(5i64).to_attribute_value(),
            Some(AttributeValue::Int(5))
        );
    }

    #[test]
    fn list_attributes_and_empty_lists() {
        assert_eq!(
            vec![1i64, 2].to_attribute_value(),
            Some(AttributeValue::Ints(vec![1, 2]))
        );
        assert_eq!(
            vec!["a", "b"].to_attribute_value(),
            Some(AttributeValue::Strings(vec!["a".into(), "b".into()]))
        );
        assert_eq!(
            [Version::new(1, 0, 0)].to_attribute_value(),
            Some(AttributeValue::Versions(vec!["1.0.0".into()]))
        );
        assert_eq!(
            [true, false][..].to_attribute_value(),
            Some(AttributeValue::Bools(vec![true, false]))
        );
        assert_eq!(Vec::<String>::new().to_attribute_value(), None);
    }

    #[test]
    fn capacities() {
        assert_eq!(
            16u64.to_capacity(),
            Some(DeviceCapacity::new("16".to_owned()))
        );
        assert_eq!(
            Quantity("80Gi".into()).to_capacity(),
            Some(DeviceCapacity::new("80Gi".to_owned()))
        );
        assert_eq!(None::<Bytes>.to_capacity(), None);
    }

    #[test]
    fn private_setters_skip_omitted_values() {
        let mut device = Device::new("gpu-0");
        __private::set_attribute(&mut device, "index", &0i64);
        __private::set_attribute(&mut device, "uuid", &None::<String>);
        __private::set_capacity(&mut device, "memory", &Bytes(1 << 30));
        __private::set_capacity(&mut device, "shares", &None::<u32>);
        assert_eq!(device.attributes.len(), 1);
        assert_eq!(device.attributes["index"], AttributeValue::Int(0));
        assert_eq!(device.capacity.len(), 1);
        assert_eq!(device.capacity["memory"].value.0, "1Gi");
    }
}
