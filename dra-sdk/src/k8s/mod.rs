//! Kubernetes value syntax the SDK, its test kit and drivers share: [quantities](QuantityValue),
//! [name rules](NameRule) and [semantic versions](Semver). One parser each, so a driver, the
//! SDK's validation and the allocator cannot disagree on what `1.5Gi` or `gpu.example.com`
//! means.

pub(crate) mod names;
pub(crate) mod quantity;
mod semver;

pub use names::NameRule;
pub use quantity::{QuantityError, QuantityValue};
pub use semver::{Semver, SemverError};
