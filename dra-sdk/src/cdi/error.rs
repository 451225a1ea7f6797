//! The error type of the `cdi` module.

use std::path::PathBuf;
use std::{fmt, io};

use super::version::Version;

/// Everything that can go wrong while building, parsing, validating, writing or removing CDI specs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CdiError {
    /// A vendor, class or device name, a kind or a qualified device name breaks the CDI naming
    /// rules.
    #[error("invalid CDI {what} {value:?}: {reason}")]
    InvalidName {
        /// Which kind of name it is.
        what: NameKind,
        /// The offending input.
        value: String,
        /// The rule it breaks.
        reason: String,
    },

    /// A field of a spec breaks a validation rule.
    #[error("invalid CDI spec: {}{field}: {reason}", scope(.device))]
    InvalidSpec {
        /// The name of the device whose fields are wrong, as written in the spec (without the
        /// kind); `None` for the spec level (kind, spec annotations, spec-level edits, device list).
        device: Option<String>,
        /// The path of the field, in the spec's JSON names (`containerEdits.deviceNodes[0].path`).
        field: String,
        /// The rule it breaks.
        reason: String,
    },

    /// The spec declares a `cdiVersion` lower than the features it uses need.
    #[error(
        "CDI spec declares cdiVersion {declared}, but at least {required} is required: {reason}"
    )]
    VersionTooLow {
        /// The declared version.
        declared: Version,
        /// The minimum version the spec's contents need.
        required: Version,
        /// The feature that raises the requirement.
        reason: String,
    },

    /// The spec text could not be parsed (syntax error, wrong type, unknown field, duplicate key,
    /// unknown `cdiVersion`, ...).
    #[error("cannot parse CDI spec as {format}: {message}")]
    Parse {
        /// The format it was parsed as.
        format: SpecFormat,
        /// What the parser said, including the location of the problem.
        message: String,
    },

    /// The document is empty or `null`.
    #[error("no CDI spec data: the document is empty or null")]
    Empty,

    /// Reading or validating one spec file failed; `source` says why.
    #[error("CDI spec file {}: {source}", .path.display())]
    InFile {
        /// The spec file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: Box<CdiError>,
    },

    /// A claim UID cannot be used in a spec file name or a device name.
    #[error("invalid claim UID {uid:?} for a CDI spec: {reason}")]
    InvalidClaimUid {
        /// The offending UID.
        uid: String,
        /// The rule it breaks.
        reason: &'static str,
    },

    /// Serializing a spec failed.
    #[error("cannot serialize CDI spec: {0}")]
    Serialize(#[source] serde_json::Error),

    /// A file-system operation failed.
    #[error("{op} {}: {source}", .path.display())]
    Io {
        /// What was being done (`"write CDI spec"`, `"remove CDI spec"`, ...).
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

fn scope(device: &Option<String>) -> String {
    match device {
        Some(name) => format!("device {name:?}: "),
        None => String::new(),
    }
}

impl CdiError {
    pub(crate) fn spec(field: impl Into<String>, reason: impl Into<String>) -> Self {
        CdiError::InvalidSpec {
            device: None,
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        CdiError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

/// Which kind of CDI name an [`CdiError::InvalidName`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NameKind {
    /// The vendor part of a kind (`nvidia.com`).
    Vendor,
    /// The class part of a kind (`gpu`).
    Class,
    /// A device name (`gpu0`).
    Device,
    /// A whole kind (`vendor/class`).
    Kind,
    /// A whole qualified device name (`vendor/class=name`).
    QualifiedName,
}

impl fmt::Display for NameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NameKind::Vendor => "vendor name",
            NameKind::Class => "class name",
            NameKind::Device => "device name",
            NameKind::Kind => "kind",
            NameKind::QualifiedName => "qualified device name",
        })
    }
}

/// The text format of a spec document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpecFormat {
    /// JSON (`.json` files).
    Json,
    /// YAML (`.yaml` files); a superset of JSON.
    Yaml,
}

impl fmt::Display for SpecFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SpecFormat::Json => "JSON",
            SpecFormat::Yaml => "YAML",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_cross_threads_and_boxes() {
        fn assert_error<E: std::error::Error + Send + Sync + 'static>() {}
        assert_error::<CdiError>();
    }

    #[test]
    fn spec_errors_name_the_scope() {
        let device = CdiError::InvalidSpec {
            device: Some("gpu-0".to_owned()),
            field: "containerEdits.env[0]".to_owned(),
            reason: "bad".to_owned(),
        };
        assert_eq!(
            device.to_string(),
            r#"invalid CDI spec: device "gpu-0": containerEdits.env[0]: bad"#
        );
        assert_eq!(
            CdiError::spec("devices", "empty").to_string(),
            "invalid CDI spec: devices: empty"
        );
    }
}
