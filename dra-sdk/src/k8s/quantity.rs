//! Kubernetes quantity syntax (`10Gi`, `500m`, `1e3`): the workspace's one parser.
//!
//! The API server re-serializes quantities canonically (`1000m` comes back as `1`,
//! `1024Mi` as `1Gi`), so the publisher compares quantities by value, not by spelling; the
//! allocator, the fake API server and drivers do arithmetic on [`QuantityValue`].
//!
//! A value is held as a count of nano-units in an `i128`, which covers every value the API
//! server accepts (it rounds anything finer than `1n` up and caps at about `9.2e18`) with room
//! for the sums the allocator builds. Arithmetic is checked: an overflow is an error, never a
//! wrap.

use std::cmp::Ordering;
use std::fmt;

use super::ParseError;

/// A syntactically valid quantity, split into its parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Parsed<'a> {
    negative: bool,
    integer: &'a str,
    fraction: &'a str,
    /// Power of ten from a decimal SI suffix or exponent.
    exp10: i32,
    /// Power of two from a binary SI suffix.
    exp2: u32,
}

/// Splits `input` into sign, digits and suffix, or says why it is not a quantity.
fn parse(input: &str) -> Result<Parsed<'_>, &'static str> {
    if input.is_empty() {
        return Err("empty");
    }
    let (negative, rest) = match input.as_bytes().first() {
        Some(b'+') => (false, &input[1..]),
        Some(b'-') => (true, &input[1..]),
        _ => (false, input),
    };
    let number_len = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_len);
    let (integer, fraction) = match number.split_once('.') {
        Some((integer, fraction)) => (integer, fraction),
        None => (number, ""),
    };
    if integer.is_empty() && fraction.is_empty() {
        return Err("no digits");
    }
    if fraction.contains('.') {
        return Err("more than one decimal point");
    }
    let (exp10, exp2) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        _ => {
            let exponent = suffix.strip_prefix(['e', 'E']).ok_or("unknown suffix")?;
            let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err("malformed exponent");
            }
            (
                exponent.parse::<i32>().map_err(|_| "malformed exponent")?,
                0,
            )
        }
    };
    Ok(Parsed {
        negative,
        integer,
        fraction,
        exp10,
        exp2,
    })
}

/// Whether `input` is a valid Kubernetes quantity.
pub(crate) fn is_valid(input: &str) -> bool {
    parse(input).is_ok()
}

/// The value in nano-units, rounded up like the API server does, or `None` when invalid or
/// outside the range of `i128`.
pub(crate) fn nanos(input: &str) -> Option<i128> {
    parse_nanos(input).ok().map(|(nanos, _)| nanos)
}

/// The value in nano-units (rounded up like the API server does) and whether it was written
/// with a binary suffix, or why it is not a quantity (including "out of range" for values
/// outside `i128`).
pub(crate) fn parse_nanos(input: &str) -> Result<(i128, bool), &'static str> {
    let parsed = parse(input)?;
    let out_of_range = "out of range";
    let mut mantissa: i128 = 0;
    for digit in parsed.integer.bytes().chain(parsed.fraction.bytes()) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(i128::from(digit - b'0')))
            .ok_or(out_of_range)?;
    }
    mantissa = 1i128
        .checked_shl(parsed.exp2)
        .and_then(|factor| mantissa.checked_mul(factor))
        .ok_or(out_of_range)?;
    let scale = i32::try_from(parsed.fraction.len())
        .ok()
        .and_then(|fraction_len| parsed.exp10.checked_sub(fraction_len))
        .and_then(|scale| scale.checked_add(9))
        .ok_or(out_of_range)?;
    let magnitude = if scale >= 0 {
        10i128
            .checked_pow(scale.unsigned_abs())
            .and_then(|factor| mantissa.checked_mul(factor))
            .ok_or(out_of_range)?
    } else {
        let divisor = 10i128.checked_pow(scale.unsigned_abs());
        match divisor {
            // Rounds away from zero, as the API server does for sub-nano precision (a
            // request never shrinks).
            Some(divisor) => mantissa / divisor + i128::from(mantissa % divisor != 0),
            // Smaller than any representable step: the smallest non-zero quantity.
            None => i128::from(mantissa != 0),
        }
    };
    let nanos = if parsed.negative {
        -magnitude
    } else {
        magnitude
    };
    Ok((nanos, parsed.exp2 > 0))
}

/// A spelling-independent form for equality checks: the nano value where it is
/// representable, the input otherwise.
pub(crate) fn canonical(input: &str) -> String {
    match nanos(input) {
        Some(value) => format!("{value}n"),
        None => input.to_owned(),
    }
}

/// Nano-units per unit.
const NANOS: i128 = 1_000_000_000;

/// The exact value of a Kubernetes quantity, for arithmetic and comparisons
/// ([`Quantity`](crate::slices::Quantity) is the API's string form).
///
/// ```
/// use dra_sdk::k8s::QuantityValue;
///
/// let memory = QuantityValue::parse("1.5Gi")?;
/// assert_eq!(memory, QuantityValue::parse("1536Mi")?);
/// assert_eq!(memory.to_string(), "1536Mi");
/// assert_eq!(QuantityValue::parse("500m")?.as_integer(), None);
/// # Ok::<(), dra_sdk::k8s::ParseError>(())
/// ```
///
/// Like Kubernetes' `resource.Quantity` it remembers whether it was written with a binary suffix,
/// which only decides how it is displayed: equality and order are by value.
#[derive(Clone, Copy, Debug, Default)]
pub struct QuantityValue {
    nanos: i128,
    binary: bool,
}

impl PartialEq for QuantityValue {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for QuantityValue {}

impl PartialOrd for QuantityValue {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for QuantityValue {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

impl QuantityValue {
    /// Zero.
    pub const ZERO: QuantityValue = QuantityValue {
        nanos: 0,
        binary: false,
    };

    /// The quantity of a whole number.
    pub fn from_int(value: i64) -> Self {
        Self {
            nanos: i128::from(value) * NANOS,
            binary: false,
        }
    }

    /// Parses the Kubernetes quantity syntax: a signed decimal number followed by a binary suffix
    /// (`Ki` … `Ei`), a decimal suffix (`n`, `u`, `m`, `k`, `M`, `G`, `T`, `P`, `E`) or a decimal
    /// exponent (`e3`, `E-2`). Precision below `1n` is rounded up, as the API server does.
    pub fn parse(input: &str) -> Result<Self, ParseError> {
        let (nanos, binary) = parse_nanos(input.trim())
            .map_err(|reason| ParseError::new("quantity", input, reason))?;
        Ok(Self { nanos, binary })
    }

    /// `-1`, `0` or `1`.
    pub fn sign(self) -> i64 {
        match self.nanos.cmp(&0) {
            Ordering::Less => -1,
            Ordering::Equal => 0,
            Ordering::Greater => 1,
        }
    }

    /// The value as an `i64`, if it is a whole number in range.
    pub fn as_integer(self) -> Option<i64> {
        if self.nanos % NANOS != 0 {
            return None;
        }
        i64::try_from(self.nanos / NANOS).ok()
    }

    /// The largest whole number not above the value (rounded toward negative infinity).
    ///
    /// ```
    /// use dra_sdk::k8s::QuantityValue;
    ///
    /// assert_eq!(QuantityValue::parse("1.5Mi")?.floor(), 1_572_864);
    /// assert_eq!(QuantityValue::parse("1500m")?.floor(), 1);
    /// assert_eq!(QuantityValue::parse("-500m")?.floor(), -1);
    /// assert_eq!(QuantityValue::parse("10Ei")?.floor(), 10 << 60);
    /// # Ok::<(), dra_sdk::k8s::ParseError>(())
    /// ```
    pub fn floor(self) -> i128 {
        self.nanos.div_euclid(NANOS)
    }

    /// The value as a float, possibly losing precision.
    pub fn as_approximate_float(self) -> f64 {
        // i128 → f64 rounds to the nearest representable value, which is what "approximate" means.
        self.nanos as f64 / NANOS as f64
    }

    /// `self + other` in `self`'s format, `None` on overflow.
    pub fn checked_add(self, other: QuantityValue) -> Option<QuantityValue> {
        self.nanos
            .checked_add(other.nanos)
            .map(|nanos| QuantityValue { nanos, ..self })
    }

    /// `self - other` in `self`'s format, `None` on overflow.
    pub fn checked_sub(self, other: QuantityValue) -> Option<QuantityValue> {
        self.nanos
            .checked_sub(other.nanos)
            .map(|nanos| QuantityValue { nanos, ..self })
    }

    /// The smallest `min + k * step` (k ≥ 0) that is at least `self`, in `step`'s format; `min`
    /// when `self` is below it. `None` on overflow or a non-positive step.
    pub fn round_up_to_step(
        self,
        min: QuantityValue,
        step: QuantityValue,
    ) -> Option<QuantityValue> {
        if self <= min {
            return Some(min);
        }
        if step.nanos <= 0 {
            return None;
        }
        let above = self.nanos - min.nanos;
        let steps = above / step.nanos + i128::from(above % step.nanos != 0);
        let nanos = steps.checked_mul(step.nanos)?.checked_add(min.nanos)?;
        Some(QuantityValue {
            nanos,
            binary: step.binary,
        })
    }

    /// Whether `self` is `min + k * step` for a whole `k ≥ 0`.
    pub fn is_on_step(self, min: QuantityValue, step: QuantityValue) -> bool {
        step.nanos > 0 && self >= min && (self.nanos - min.nanos) % step.nanos == 0
    }
}

impl fmt::Display for QuantityValue {
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

    fn q(s: &str) -> QuantityValue {
        QuantityValue::parse(s).unwrap()
    }

    #[test]
    fn accepts_kubernetes_spellings() {
        for valid in [
            "1", "0", "+1", "-1", "1.5", ".5", "5.", "100m", "1Ki", "80Gi", "1e3", "1E3", "1e-3",
            "1E", "2P", "3n", "7u",
        ] {
            assert!(is_valid(valid), "{valid} should be valid");
        }
        for invalid in [
            "", ".", "1.2.3", "1Gb", "1ki", "Gi", "1e", "1e+", "abc", "1 Gi", "--1",
        ] {
            assert!(!is_valid(invalid), "{invalid} should be invalid");
        }
    }

    #[test]
    fn compares_by_value() {
        assert_eq!(canonical("1000m"), canonical("1"));
        assert_eq!(canonical("1024Mi"), canonical("1Gi"));
        assert_eq!(canonical("1k"), canonical("1e3"));
        assert_eq!(canonical("0.5"), canonical("500m"));
        assert_ne!(canonical("1Gi"), canonical("1G"));
        assert_eq!(nanos("1.5Gi"), Some(1_610_612_736 * 1_000_000_000));
    }

    #[test]
    fn rounds_sub_nano_values_up() {
        assert_eq!(nanos("1e-12"), Some(1));
        assert_eq!(nanos("1.5n"), Some(2));
        assert_eq!(nanos("-1.5n"), Some(-2));
        assert_eq!(nanos("0e-99"), Some(0));
    }

    #[test]
    fn huge_values_fall_back_to_spelling() {
        assert_eq!(nanos("1e40"), None);
        assert_eq!(canonical("1e40"), "1e40");
        assert!(is_valid("1e40"));
    }

    #[test]
    fn parses_suffixes_and_exponents() {
        assert_eq!(q("1Ki"), QuantityValue::from_int(1024));
        assert_eq!(q("1Gi"), QuantityValue::from_int(1 << 30));
        assert_eq!(q("2k"), QuantityValue::from_int(2000));
        assert_eq!(q("1.5"), q("1500m"));
        assert_eq!(q("1e3"), q("1k"));
        assert_eq!(q("1E-3"), q("1m"));
        assert_eq!(q("-2M"), QuantityValue::from_int(-2_000_000));
        assert_eq!(q(".5"), q("500m"));
        assert_eq!(q("0.5Gi"), q("512Mi"));
        assert_eq!(q("+7"), QuantityValue::from_int(7));
        assert_eq!(q("0001"), QuantityValue::from_int(1));
        assert_eq!(
            q("8Ei"),
            QuantityValue::from_int(0)
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
            assert!(QuantityValue::parse(bad).is_err(), "{bad:?} parsed");
        }
        assert!(QuantityValue::parse("1e40").is_err());
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
