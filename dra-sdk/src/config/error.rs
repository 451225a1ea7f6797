//! Errors of opaque-config decoding, written for the user who wrote the claim.

use std::fmt;

use super::ConfigKind;

/// Longest piece of user input (a kind, a field path, a serde message) echoed in an error.
/// The messages end up in Kubernetes events, which hold about 1 KiB.
const MAX_ECHO: usize = 128;
/// How many unknown fields one error lists.
const MAX_LISTED_FIELDS: usize = 5;

/// Why opaque config parameters were rejected.
///
/// The `Display` text tells the user what to change; it names the config kind and the JSON
/// path of the offending field where there is one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The parameters are not a JSON object.
    #[error(
        "opaque config parameters must be a JSON object with apiVersion and kind, found {found}"
    )]
    NotAnObject {
        /// The JSON type found instead, for example `an array`.
        found: &'static str,
    },
    /// `apiVersion` or `kind` is missing.
    #[error("opaque config parameters have no `{field}`; this driver accepts {}", KindList(.accepted))]
    MissingField {
        /// `apiVersion` or `kind`.
        field: &'static str,
        /// The kinds the registry accepts.
        accepted: Vec<ConfigKind>,
    },
    /// `apiVersion` or `kind` is not a string.
    #[error("opaque config `{field}` must be a string, found {found}")]
    FieldNotString {
        /// `apiVersion` or `kind`.
        field: &'static str,
        /// The JSON type found instead.
        found: &'static str,
    },
    /// No registered config type has this `apiVersion` and `kind`.
    #[error(
        "unsupported opaque config kind {kind:?} in apiVersion {api_version:?}; this driver accepts {}",
        KindList(.accepted)
    )]
    UnknownKind {
        /// The `apiVersion` given (shortened if very long).
        api_version: String,
        /// The `kind` given (shortened if very long).
        kind: String,
        /// The kinds the registry accepts.
        accepted: Vec<ConfigKind>,
    },
    /// The fields do not decode into the config type: a wrong type, an unknown enum variant,
    /// a missing required field.
    #[error("invalid {config}: {}{message}", FieldPrefix(.field.as_deref()))]
    Decode {
        /// The config kind being decoded.
        config: ConfigKind,
        /// JSON path of the offending value (`sharing.timeSlicingConfig.interval`,
        /// `devices[2].uuid`), `None` for the top level.
        field: Option<String>,
        /// What is wrong, from the deserializer. It never quotes a string value of the input
        /// (a config field may hold a secret): it names what was expected and the type found.
        message: String,
    },
    /// The parameters have fields the config type does not know, typically a typo.
    #[error("invalid {config}: {}", UnknownFieldList(.fields))]
    UnknownFields {
        /// The config kind being decoded.
        config: ConfigKind,
        /// The unknown fields, in the order decoding met them.
        fields: Vec<UnknownField>,
    },
    /// The decoded config failed [`ConfigHooks::validate`](super::ConfigHooks::validate).
    // `reason` is part of the message rather than `source()`: the message alone must be
    // complete, since it is all a user sees in the claim's events.
    #[error("invalid {config}: {reason}")]
    Invalid {
        /// The config kind being validated.
        config: ConfigKind,
        /// The validation failure.
        reason: ConfigValidationError,
    },
}

impl ConfigError {
    /// The config kind the parameters were decoded as, when they got that far.
    pub fn config(&self) -> Option<ConfigKind> {
        match self {
            Self::Decode { config, .. }
            | Self::UnknownFields { config, .. }
            | Self::Invalid { config, .. } => Some(*config),
            Self::NotAnObject { .. }
            | Self::MissingField { .. }
            | Self::FieldNotString { .. }
            | Self::UnknownKind { .. } => None,
        }
    }
}

/// A config value that decoded but is not acceptable, returned by
/// [`ConfigHooks::validate`](super::ConfigHooks::validate).
///
/// ```
/// use dra_sdk::config::ConfigValidationError;
///
/// let error = ConfigValidationError::for_field(
///     "sharing.mpsConfig.defaultActiveThreadPercentage",
///     "must be between 0 and 100, got 150",
/// );
/// assert_eq!(
///     error.to_string(),
///     "sharing.mpsConfig.defaultActiveThreadPercentage: must be between 0 and 100, got 150",
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", FieldPrefix(.field.as_deref()))]
pub struct ConfigValidationError {
    field: Option<String>,
    message: String,
}

impl ConfigValidationError {
    /// A failure of the config as a whole, or of a combination of fields.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            field: None,
            message: message.into(),
        }
    }

    /// A failure of one field, named by its JSON path (`sharing.strategy`, `devices[0]`).
    /// A path longer than 128 characters (it may hold a user's map key) is shortened.
    pub fn for_field(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: Some(echo(&field.into())),
            message: message.into(),
        }
    }

    /// The JSON path of the offending field, if the failure is about one field.
    pub fn field(&self) -> Option<&str> {
        self.field.as_deref()
    }

    /// What is wrong.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// A field of the parameters that the config type does not declare.
///
/// Displays as `` `sharing.timeSlicingConfg` (did you mean `timeSlicingConfig`?) ``.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownField {
    /// JSON path of the field (`sharing.timeSlicingConfg`, `devices[1].extra`).
    pub path: String,
    /// The declared field of the same struct whose name is closest, when it is close enough
    /// to suggest a typo.
    pub did_you_mean: Option<&'static str>,
}

impl fmt::Display for UnknownField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`", self.path)?;
        if let Some(field) = self.did_you_mean {
            write!(f, " (did you mean `{field}`?)")?;
        }
        Ok(())
    }
}

/// [`ConfigRegistry::try_register`](super::ConfigRegistry::try_register) was given a second
/// type for an `apiVersion` and `kind` that already has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("opaque config {kind} is registered twice")]
pub struct DuplicateConfigKind {
    /// The contested `apiVersion` and `kind`.
    pub kind: ConfigKind,
}

/// Shortens user input echoed in a message, on a character boundary.
pub(super) fn echo(text: &str) -> String {
    match text.char_indices().nth(MAX_ECHO) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_owned(),
    }
}

struct FieldPrefix<'a>(Option<&'a str>);

impl fmt::Display for FieldPrefix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(field) => write!(f, "{field}: "),
            None => Ok(()),
        }
    }
}

struct KindList<'a>(&'a [ConfigKind]);

impl fmt::Display for KindList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("no opaque configs");
        }
        for (index, kind) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{kind}")?;
        }
        Ok(())
    }
}

struct UnknownFieldList<'a>(&'a [UnknownField]);

impl fmt::Display for UnknownFieldList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fields = self.0;
        f.write_str(if fields.len() == 1 {
            "unknown field "
        } else {
            "unknown fields "
        })?;
        for (index, field) in fields.iter().take(MAX_LISTED_FIELDS).enumerate() {
            if index > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{field}")?;
        }
        if fields.len() > MAX_LISTED_FIELDS {
            write!(f, " and {} more", fields.len() - MAX_LISTED_FIELDS)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU: ConfigKind = ConfigKind {
        api_version: "gpu.example.com/v1",
        kind: "GpuConfig",
    };

    #[test]
    fn messages() {
        let cases = [
            (
                ConfigError::NotAnObject { found: "an array" },
                "opaque config parameters must be a JSON object with apiVersion and kind, found an array",
            ),
            (
                ConfigError::MissingField {
                    field: "kind",
                    accepted: vec![GPU],
                },
                "opaque config parameters have no `kind`; this driver accepts GpuConfig (gpu.example.com/v1)",
            ),
            (
                ConfigError::UnknownKind {
                    api_version: "x/v1".into(),
                    kind: "Y".into(),
                    accepted: vec![],
                },
                "unsupported opaque config kind \"Y\" in apiVersion \"x/v1\"; this driver accepts no opaque configs",
            ),
            (
                ConfigError::Decode {
                    config: GPU,
                    field: None,
                    message: "missing field `sharing`".into(),
                },
                "invalid GpuConfig (gpu.example.com/v1): missing field `sharing`",
            ),
            (
                ConfigError::UnknownFields {
                    config: GPU,
                    fields: (0..7)
                        .map(|i| UnknownField {
                            path: format!("f{i}"),
                            did_you_mean: (i == 0).then_some("g"),
                        })
                        .collect(),
                },
                "invalid GpuConfig (gpu.example.com/v1): unknown fields `f0` (did you mean `g`?), `f1`, `f2`, `f3`, `f4` and 2 more",
            ),
            (
                ConfigError::Invalid {
                    config: GPU,
                    reason: ConfigValidationError::new("needs at least one device"),
                },
                "invalid GpuConfig (gpu.example.com/v1): needs at least one device",
            ),
        ];
        for (error, message) in cases {
            assert_eq!(error.to_string(), message);
        }
    }

    #[test]
    fn echo_shortens_on_char_boundaries() {
        assert_eq!(echo("short"), "short");
        let long = "é".repeat(200);
        let echoed = echo(&long);
        assert_eq!(echoed.chars().count(), MAX_ECHO + 3);
        assert!(echoed.ends_with("..."));
    }
}
