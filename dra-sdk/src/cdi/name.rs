//! CDI names: vendor, class and device names, kinds (`vendor/class`) and qualified device names
//! (`vendor/class=name`).
//!
//! The character rules are the ones the reference library (`pkg/parser`) enforces; the longer
//! limits SPEC.md mentions (DNS subdomain vendors, 63-character classes) are enforced by no
//! runtime and are not enforced here either.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::{CdiError, NameKind};

/// A CDI kind, `vendor/class`: the `kind` of a spec and the first half of every qualified device
/// name.
///
/// ```
/// use dra_sdk::cdi::Kind;
///
/// let kind: Kind = "k8s.gpu.example.com/gpu".parse()?;
/// assert_eq!(kind.vendor(), "k8s.gpu.example.com");
/// assert_eq!(kind.class(), "gpu");
/// assert_eq!(kind, Kind::new("k8s.gpu.example.com", "gpu")?);
/// # Ok::<(), dra_sdk::cdi::CdiError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Kind {
    vendor: String,
    class: String,
}

impl Kind {
    /// A kind from its two parts, each checked against the CDI rules.
    pub fn new(vendor: impl Into<String>, class: impl Into<String>) -> Result<Kind, CdiError> {
        let (vendor, class) = (vendor.into(), class.into());
        validate_vendor_name(&vendor)?;
        validate_class_name(&class)?;
        Ok(Kind { vendor, class })
    }

    /// The vendor part (`nvidia.com`).
    pub fn vendor(&self) -> &str {
        &self.vendor
    }

    /// The class part (`gpu`).
    pub fn class(&self) -> &str {
        &self.class
    }

    /// The qualified name of the device `name` of this kind.
    pub fn device(&self, name: impl Into<String>) -> Result<QualifiedName, CdiError> {
        QualifiedName::new(self.clone(), name)
    }
}

impl FromStr for Kind {
    type Err = CdiError;

    /// Splits at the first `/`, as the reference's `ParseQualifier` does.
    fn from_str(s: &str) -> Result<Kind, CdiError> {
        let Some((vendor, class)) = s.split_once('/') else {
            return Err(invalid(NameKind::Kind, s, "expected vendor/class"));
        };
        if vendor.is_empty() || class.is_empty() {
            return Err(invalid(
                NameKind::Kind,
                s,
                "expected vendor/class with both parts non-empty",
            ));
        }
        Kind::new(vendor, class)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.vendor, self.class)
    }
}

impl Serialize for Kind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Kind, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A fully qualified CDI device name, `vendor/class=name`: what a DRA driver returns to the
/// kubelet as a CDI device ID, and what the runtime resolves against the spec files.
///
/// ```
/// use dra_sdk::advanced::cdi::QualifiedName;
///
/// let name: QualifiedName = "nvidia.com/gpu=0".parse()?;
/// assert_eq!((name.vendor(), name.class(), name.name()), ("nvidia.com", "gpu", "0"));
/// assert_eq!(name.to_string(), "nvidia.com/gpu=0");
/// assert!("/dev/nvidia0".parse::<QualifiedName>().is_err());
/// # Ok::<(), dra_sdk::cdi::CdiError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QualifiedName {
    kind: Kind,
    name: String,
}

impl QualifiedName {
    /// The qualified name of device `name` of `kind`; the device name is checked.
    pub fn new(kind: Kind, name: impl Into<String>) -> Result<QualifiedName, CdiError> {
        let name = name.into();
        validate_device_name(&name)?;
        Ok(QualifiedName { kind, name })
    }

    /// For names already checked (the device names of a validated spec).
    pub(crate) fn new_unchecked(kind: Kind, name: String) -> QualifiedName {
        QualifiedName { kind, name }
    }

    /// The kind (`vendor/class`).
    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    /// The vendor part.
    pub fn vendor(&self) -> &str {
        self.kind.vendor()
    }

    /// The class part.
    pub fn class(&self) -> &str {
        self.kind.class()
    }

    /// The device name, unique within its kind.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Splits into kind and device name.
    pub fn into_parts(self) -> (Kind, String) {
        (self.kind, self.name)
    }
}

impl FromStr for QualifiedName {
    type Err = CdiError;

    /// Splits at the first `=` and the left side at its first `/`, as the reference's
    /// `ParseQualifiedName` does. Empty input and input starting with `/` (a device path, which
    /// runtimes accept in the same places) are rejected.
    fn from_str(s: &str) -> Result<QualifiedName, CdiError> {
        if s.is_empty() {
            return Err(invalid(NameKind::QualifiedName, s, "must not be empty"));
        }
        if s.starts_with('/') {
            return Err(invalid(
                NameKind::QualifiedName,
                s,
                "starts with '/': a device path, not a CDI name",
            ));
        }
        let Some((kind, name)) = s.split_once('=') else {
            return Err(invalid(
                NameKind::QualifiedName,
                s,
                "expected vendor/class=name",
            ));
        };
        let Some((vendor, class)) = kind.split_once('/') else {
            return Err(invalid(
                NameKind::QualifiedName,
                s,
                "expected vendor/class=name (no '/' before '=')",
            ));
        };
        if vendor.is_empty() || class.is_empty() || name.is_empty() {
            return Err(invalid(
                NameKind::QualifiedName,
                s,
                "expected vendor/class=name with all three parts non-empty",
            ));
        }
        QualifiedName::new(Kind::new(vendor, class)?, name)
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.kind, self.name)
    }
}

impl Serialize for QualifiedName {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for QualifiedName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<QualifiedName, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Checks a vendor name: an ASCII letter first, a letter or digit last, letters, digits, `_`,
/// `-` and `.` in between. No length limit (none in the reference).
pub fn validate_vendor_name(vendor: &str) -> Result<(), CdiError> {
    check_name(vendor, NameKind::Vendor, "._-")
}

/// Checks a class name: the vendor rules. Dots need cdiVersion 0.6.0, which
/// [`Spec::minimum_version`](super::Spec::minimum_version) accounts for.
pub fn validate_class_name(class: &str) -> Result<(), CdiError> {
    check_name(class, NameKind::Class, "._-")
}

/// Checks a device name: an ASCII letter or digit first and last, letters, digits, `_`, `-`,
/// `.` and `:` in between. A leading digit needs cdiVersion 0.5.0, which
/// [`Spec::minimum_version`](super::Spec::minimum_version) accounts for.
pub fn validate_device_name(name: &str) -> Result<(), CdiError> {
    check_name(name, NameKind::Device, "._-:")
}

fn check_name(value: &str, what: NameKind, middle_extra: &str) -> Result<(), CdiError> {
    let mut chars = value.chars();
    let Some(first) = chars.next() else {
        return Err(invalid(what, value, "must not be empty"));
    };
    let first_ok = match what {
        NameKind::Device => first.is_ascii_alphanumeric(),
        _ => first.is_ascii_alphabetic(),
    };
    if !first_ok {
        let reason = match what {
            NameKind::Device => format!("must start with an ASCII letter or digit, not {first:?}"),
            _ => format!("must start with an ASCII letter, not {first:?}"),
        };
        return Err(invalid(what, value, reason));
    }
    let Some(last) = chars.next_back() else {
        return Ok(());
    };
    if let Some(bad) = chars.find(|c| !c.is_ascii_alphanumeric() && !middle_extra.contains(*c)) {
        let allowed = middle_extra
            .chars()
            .map(|c| format!("'{c}'"))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(invalid(
            what,
            value,
            format!(
                "invalid character {bad:?}: only ASCII letters, digits and {allowed} are allowed"
            ),
        ));
    }
    if !last.is_ascii_alphanumeric() {
        return Err(invalid(
            what,
            value,
            format!("must end with an ASCII letter or digit, not {last:?}"),
        ));
    }
    Ok(())
}

fn invalid(what: NameKind, value: &str, reason: impl Into<String>) -> CdiError {
    CdiError::InvalidName {
        what,
        value: value.to_owned(),
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vendor_and_class_rules() {
        for good in ["a", "nvidia.com", "k8s.gpu.example.com", "A_b-c.d9", "x1"] {
            assert!(validate_vendor_name(good).is_ok(), "{good}");
            assert!(validate_class_name(good).is_ok(), "{good}");
        }
        for bad in [
            "", "1abc", "-a", "a-", "a.", "a/b", "a=b", "a b", "é", "aé1", "a:b",
        ] {
            assert!(validate_vendor_name(bad).is_err(), "{bad}");
            assert!(validate_class_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn device_name_rules() {
        for good in ["0", "gpu-0", "MIG-3b2c", "a:b", "a.b_c", "9"] {
            assert!(validate_device_name(good).is_ok(), "{good}");
        }
        for bad in ["", "-a", "a-", "a=b", "a/b", "a b", "é", ":a", "a:"] {
            assert!(validate_device_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn kind_parse_and_display() {
        let kind: Kind = "vendor.com/class".parse().unwrap();
        assert_eq!(kind.to_string(), "vendor.com/class");
        assert!("vendor.com/foo/bar".parse::<Kind>().is_err());
        assert!("vendor.com".parse::<Kind>().is_err());
        assert!("/class".parse::<Kind>().is_err());
        assert!("vendor/".parse::<Kind>().is_err());
    }

    #[test]
    fn qualified_name_parse_and_display() {
        let name: QualifiedName = "vendor.com/class=dev:0".parse().unwrap();
        assert_eq!(name.kind().to_string(), "vendor.com/class");
        assert_eq!(name.name(), "dev:0");
        assert_eq!(name.to_string(), "vendor.com/class=dev:0");
        // Split at the first '=': the name then holds a '=' and is rejected.
        assert!("vendor.com/class=a=b".parse::<QualifiedName>().is_err());
        for bad in [
            "",
            "/dev/x",
            "vendor.com/class",
            "vendor.com=x",
            "v/c=",
            "/c=x",
        ] {
            let err = bad.parse::<QualifiedName>().unwrap_err();
            assert!(err.to_string().contains("invalid CDI"), "{bad}: {err}");
        }
    }

    #[test]
    fn errors_name_the_value_and_rule() {
        let err = validate_device_name("gpu-").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"invalid CDI device name "gpu-": must end with an ASCII letter or digit, not '-'"#
        );
    }
}
