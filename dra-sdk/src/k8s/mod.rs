//! Kubernetes value syntax the SDK, its test kit and drivers share: [quantities](QuantityValue),
//! [name rules](NameRule) and [semantic versions](Semver). One parser each, so a driver, the
//! SDK's validation and the allocator cannot disagree on what `1.5Gi` or `gpu.example.com`
//! means.

pub(crate) mod names;
pub(crate) mod quantity;
mod semver;

pub use names::NameRule;
pub use quantity::QuantityValue;
pub use semver::Semver;

/// A string that is not a valid quantity or semantic version: the input and what is wrong.
///
/// ```
/// use dra_sdk::k8s::QuantityValue;
///
/// let error = QuantityValue::parse("10GB").unwrap_err();
/// assert_eq!(error.to_string(), r#"invalid quantity "10GB": unknown suffix"#);
/// assert_eq!(error.reason(), "unknown suffix");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {input:?}: {reason}")]
pub struct ParseError {
    what: &'static str,
    input: String,
    reason: &'static str,
}

impl ParseError {
    fn new(what: &'static str, input: &str, reason: &'static str) -> Self {
        Self {
            what,
            input: input.to_owned(),
            reason,
        }
    }

    /// What is wrong, without the input, for messages with their own wording.
    pub fn reason(&self) -> &'static str {
        self.reason
    }

    /// The input as given.
    pub fn input(&self) -> &str {
        &self.input
    }
}
