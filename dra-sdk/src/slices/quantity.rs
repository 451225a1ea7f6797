//! Kubernetes quantity syntax: validation and a canonical form for comparisons.
//!
//! The API server re-serializes quantities canonically (`1000m` comes back as `1`,
//! `1024Mi` as `1Gi`), so the publisher compares quantities by value, not by spelling.
//!
//! The crate's one quantity parser: the test kit's allocator builds on [`parse_nanos`].

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
/// outside `i128`). The test kit's allocator builds its exact `Quantity` on this.
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
