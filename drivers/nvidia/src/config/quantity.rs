//! Just enough of Kubernetes `resource.Quantity` to turn a memory limit into bytes.

use std::fmt;

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
        parse_bytes(&self.0)
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `<sign><digits>[.<digits>]<suffix>` with the suffixes of the Kubernetes quantity grammar:
/// binary SI (`Ki` … `Ei`), decimal SI (`n`, `u`, `m`, `k`, `M` … `E`) and decimal exponents
/// (`e3`, `E-2`).
fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let text = text.strip_prefix('+').unwrap_or(text);
    if text.starts_with('-') {
        return None;
    }
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    // The value is digits / 10^fraction_len, scaled by the suffix: exact rational arithmetic
    // on u128, so "1.5Mi" is exactly 1572864 and not a float approximation.
    let digits: u128 = format!("{whole}{fraction}").parse().ok()?;
    let mut numerator = digits;
    let mut denominator: u128 = 10u128.checked_pow(u32::try_from(fraction.len()).ok()?)?;
    let (multiplier, exponent) = suffix_scale(suffix)?;
    numerator = numerator.checked_mul(multiplier)?;
    if exponent >= 0 {
        numerator = numerator.checked_mul(10u128.checked_pow(exponent.unsigned_abs())?)?;
    } else {
        denominator = denominator.checked_mul(10u128.checked_pow(exponent.unsigned_abs())?)?;
    }
    u64::try_from(numerator / denominator).ok()
}

/// (binary multiplier, decimal exponent) of a suffix.
fn suffix_scale(suffix: &str) -> Option<(u128, i32)> {
    let binary = |power: u32| Some((1u128 << power, 0));
    match suffix {
        "" => Some((1, 0)),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        "n" => Some((1, -9)),
        "u" => Some((1, -6)),
        "m" => Some((1, -3)),
        "k" => Some((1, 3)),
        "M" => Some((1, 6)),
        "G" => Some((1, 9)),
        "T" => Some((1, 12)),
        "P" => Some((1, 15)),
        "E" => Some((1, 18)),
        _ => {
            let exponent = suffix.strip_prefix(['e', 'E'])?;
            let value: i32 = exponent.parse().ok()?;
            (-30..=30).contains(&value).then_some((1, value))
        }
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
            ("99999999999Ei", None),
        ];
        for (text, bytes) in cases {
            assert_eq!(Quantity(text.into()).bytes(), bytes, "{text}");
        }
    }
}
