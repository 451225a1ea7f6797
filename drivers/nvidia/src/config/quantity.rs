//! A memory limit as written in a config, turned into bytes by the SDK's one quantity parser
//! ([`QuantityValue`]).

use std::fmt;

use dra_sdk::k8s::QuantityValue;
use serde::{Deserialize, Serialize};

/// A Kubernetes quantity as the user wrote it (`10Gi`, `512M`, `1e9`), kept verbatim so that
/// a config written back (to a checkpoint, an error) reads like the input.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Quantity(pub String);

impl Quantity {
    /// The quantity in whole bytes, rounded down; `None` when it is not a valid quantity,
    /// is negative, or does not fit in 64 bits.
    ///
    /// ```
    /// use dra_driver_nvidia::config::Quantity;
    /// assert_eq!(Quantity("10Gi".into()).bytes(), Some(10 << 30));
    /// assert_eq!(Quantity("1.5Mi".into()).bytes(), Some(1_572_864));
    /// assert_eq!(Quantity("2e3".into()).bytes(), Some(2000));
    /// assert_eq!(Quantity("100M".into()).bytes(), Some(100_000_000));
    /// assert_eq!(Quantity("ten".into()).bytes(), None);
    /// ```
    pub fn bytes(&self) -> Option<u64> {
        // A negative value rounds down to a negative number, which no u64 holds.
        u64::try_from(QuantityValue::parse(&self.0).ok()?.floor()).ok()
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_quantity_grammar() {
        let cases = [
            ("0", Some(0)),
            ("1", Some(1)),
            ("1Ki", Some(1024)),
            ("1Mi", Some(1 << 20)),
            ("10Gi", Some(10 << 30)),
            ("0.5Gi", Some(1 << 29)),
            ("1k", Some(1000)),
            ("1500m", Some(1)),
            ("1e6", Some(1_000_000)),
            ("1E-3", Some(0)),
            ("+2M", Some(2_000_000)),
            ("-1Mi", None),
            ("", None),
            (".", None),
            ("1Xi", None),
            ("1..2", None),
            ("10Ei", Some(10 << 60)),
            ("99999999999Ei", None),
        ];
        for (text, bytes) in cases {
            assert_eq!(Quantity(text.into()).bytes(), bytes, "{text}");
        }
    }
}
