//! Kubernetes resource quantities (`10Gi`, `500m`, `1e3`), held exactly.
//!
//! A quantity is stored as a count of nano-units in an `i128`, which covers every value the API
//! server accepts (it rounds anything finer than `1n` up and caps at about `9.2e18`) with room for
//! the sums the allocator builds. Arithmetic is checked: an overflow is an error, never a wrap.

use std::cmp::Ordering;
use std::fmt;

/// Nano-units per unit.
const NANOS: i128 = 1_000_000_000;

/// An exact resource quantity.
///
/// Like Kubernetes' `resource.Quantity` it remembers whether it was written with a binary suffix,
/// which only decides how it is displayed: equality and order are by value.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Quantity {
    nanos: i128,
    binary: bool,
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

/// Why a string is not a quantity.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {input:?}: {reason}")]
pub(crate) struct QuantityError {
    input: String,
    reason: &'static str,
}

impl QuantityError {
    fn new(input: &str, reason: &'static str) -> Self {
        Self {
            input: input.to_owned(),
            reason,
        }
    }
}

impl Quantity {
    /// Zero.
    pub(crate) const ZERO: Quantity = Quantity {
        nanos: 0,
        binary: false,
    };

    /// The quantity of a whole number.
    pub(crate) fn from_int(value: i64) -> Self {
        Self {
            nanos: i128::from(value) * NANOS,
            binary: false,
        }
    }

    /// Parses the Kubernetes quantity syntax: a signed decimal number followed by a binary suffix
    /// (`Ki` … `Ei`), a decimal suffix (`n`, `u`, `m`, `k`, `M`, `G`, `T`, `P`, `E`) or a decimal
    /// exponent (`e3`, `E-2`). Precision below `1n` is rounded up, as the API server does.
    pub(crate) fn parse(input: &str) -> Result<Self, QuantityError> {
        let (nanos, binary) = crate::slices::quantity::parse_nanos(input.trim())
            .map_err(|reason| QuantityError::new(input, reason))?;
        Ok(Self { nanos, binary })
    }

    /// `-1`, `0` or `1`.
    pub(crate) fn sign(self) -> i64 {
        match self.nanos.cmp(&0) {
            Ordering::Less => -1,
            Ordering::Equal => 0,
            Ordering::Greater => 1,
        }
    }

    /// The value as an `i64`, if it is a whole number in range.
    pub(crate) fn as_integer(self) -> Option<i64> {
        if self.nanos % NANOS != 0 {
            return None;
        }
        i64::try_from(self.nanos / NANOS).ok()
    }

    /// The value as a float, possibly losing precision.
    pub(crate) fn as_approximate_float(self) -> f64 {
        // i128 → f64 rounds to the nearest representable value, which is what "approximate" means.
        self.nanos as f64 / NANOS as f64
    }

    /// `self + other` in `self`'s format, `None` on overflow.
    pub(crate) fn checked_add(self, other: Quantity) -> Option<Quantity> {
        self.nanos
            .checked_add(other.nanos)
            .map(|nanos| Quantity { nanos, ..self })
    }

    /// `self - other` in `self`'s format, `None` on overflow.
    pub(crate) fn checked_sub(self, other: Quantity) -> Option<Quantity> {
        self.nanos
            .checked_sub(other.nanos)
            .map(|nanos| Quantity { nanos, ..self })
    }

    /// The smallest `min + k * step` (k ≥ 0) that is at least `self`, in `step`'s format; `min`
    /// when `self` is below it. `None` on overflow or a non-positive step.
    pub(crate) fn round_up_to_step(self, min: Quantity, step: Quantity) -> Option<Quantity> {
        if self <= min {
            return Some(min);
        }
        if step.nanos <= 0 {
            return None;
        }
        let above = self.nanos - min.nanos;
        let steps = above / step.nanos + i128::from(above % step.nanos != 0);
        let nanos = steps.checked_mul(step.nanos)?.checked_add(min.nanos)?;
        Some(Quantity {
            nanos,
            binary: step.binary,
        })
    }

    /// Whether `self` is `min + k * step` for a whole `k ≥ 0`.
    pub(crate) fn is_on_step(self, min: Quantity, step: Quantity) -> bool {
        step.nanos > 0 && self >= min && (self.nanos - min.nanos) % step.nanos == 0
    }
}

impl fmt::Display for Quantity {
    /// The canonical form, as Kubernetes writes it: for a quantity written with a binary suffix
    /// the largest binary suffix that divides the value exactly, if any; otherwise the largest
    /// exact decimal suffix (`k` … `E`, or `m`, `u`, `n` for fractions). `1536Mi`, `4G`,
    /// `250m`, `0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = self.nanos;
        if nanos == 0 {
            return f.write_str("0");
        }
        if self.binary && nanos % NANOS == 0 {
            let units = nanos / NANOS;
            const BINARY: [(&str, u32); 6] = [
                ("Ei", 60),
                ("Pi", 50),
                ("Ti", 40),
                ("Gi", 30),
                ("Mi", 20),
                ("Ki", 10),
            ];
            for (suffix, shift) in BINARY {
                let divisor = 1i128 << shift;
                if units % divisor == 0 {
                    return write!(f, "{}{suffix}", units / divisor);
                }
            }
        }
        const DECIMAL: [(&str, i128); 10] = [
            ("E", 1_000_000_000_000_000_000_000_000_000),
            ("P", 1_000_000_000_000_000_000_000_000),
            ("T", 1_000_000_000_000_000_000_000),
            ("G", 1_000_000_000_000_000_000),
            ("M", 1_000_000_000_000_000),
            ("k", 1_000_000_000_000),
            ("", 1_000_000_000),
            ("m", 1_000_000),
            ("u", 1_000),
            ("n", 1),
        ];
        for (suffix, divisor) in DECIMAL {
            if nanos % divisor == 0 {
                return write!(f, "{}{suffix}", nanos / divisor);
            }
        }
        // Every value is a multiple of 1n, so the loop always returns.
        write!(f, "{nanos}n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    #[test]
    fn parses_suffixes_and_exponents() {
        assert_eq!(q("1Ki"), Quantity::from_int(1024));
        assert_eq!(q("1Gi"), Quantity::from_int(1 << 30));
        assert_eq!(q("2k"), Quantity::from_int(2000));
        assert_eq!(q("1.5"), q("1500m"));
        assert_eq!(q("1e3"), q("1k"));
        assert_eq!(q("1E-3"), q("1m"));
        assert_eq!(q("-2M"), Quantity::from_int(-2_000_000));
        assert_eq!(q(".5"), q("500m"));
        assert_eq!(q("0.5Gi"), q("512Mi"));
        assert_eq!(q("+7"), Quantity::from_int(7));
        assert_eq!(q("0001"), Quantity::from_int(1));
        assert_eq!(
            q("8Ei"),
            Quantity::from_int(0)
                .checked_add(q("4Ei"))
                .unwrap()
                .checked_add(q("4Ei"))
                .unwrap()
        );
    }

    #[test]
    fn rounds_sub_nano_precision_up() {
        assert_eq!(q("1.1n"), q("2n"));
        assert_eq!(q("1e-12"), q("1n"));
    }

    #[test]
    fn rejects_malformed_input() {
        for bad in ["", "Gi", "1.2.3", "1Q", "1e", "1ee3", "abc", "--1", "1 Gi"] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?} parsed");
        }
        assert!(Quantity::parse("1e40").is_err());
    }

    #[test]
    fn integer_and_float_views() {
        assert_eq!(q("10Gi").as_integer(), Some(10 << 30));
        assert_eq!(q("1500m").as_integer(), None);
        assert_eq!(q("1500m").as_approximate_float(), 1.5);
        assert_eq!(q("-3").sign(), -1);
        assert_eq!(q("0m").sign(), 0);
        assert_eq!(q("1E").as_integer(), Some(1_000_000_000_000_000_000));
        assert_eq!(q("16E").as_integer(), None, "beyond i64");
    }

    #[test]
    fn steps() {
        let (min, step) = (q("1Gi"), q("1Gi"));
        assert_eq!(q("1500Mi").round_up_to_step(min, step), Some(q("2Gi")));
        assert_eq!(q("100Mi").round_up_to_step(min, step), Some(q("1Gi")));
        assert_eq!(q("3Gi").round_up_to_step(min, step), Some(q("3Gi")));
        assert!(q("3Gi").is_on_step(min, step));
        assert!(!q("1500Mi").is_on_step(min, step));
    }

    #[test]
    fn displays_canonically() {
        for (input, shown) in [
            ("1024", "1024"),
            ("1024Ki", "1Mi"),
            ("4G", "4G"),
            ("1.5Ki", "1536"),
            ("1.5Gi", "1536Mi"),
            ("1500M", "1500M"),
            ("0.25", "250m"),
            ("0", "0"),
            ("7", "7"),
            ("-2Ki", "-2Ki"),
            ("1n", "1n"),
        ] {
            assert_eq!(q(input).to_string(), shown, "{input}");
        }
    }
}
