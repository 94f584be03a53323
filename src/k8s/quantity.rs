//! A Kubernetes `resource.Quantity` string ("10M", "1Gi", "500k", "1.5e6",
//! "250m") read as its value rounded up to a whole number, as Go's
//! `Quantity.Value()` does (apimachinery `pkg/api/resource/quantity.go`): an
//! optional sign, digits with an optional fraction (`.5` and `5.` are numbers,
//! `.` is not), then one suffix: none, a decimal SI one (`n u m k M G T P E`),
//! a binary SI one (`Ki Mi Gi Ti Pi Ei`) or a decimal exponent (`e3`, `E-2`).
//! No spaces. Pure.
//!
//! One limit of this reading: at most [`MAX_DIGITS`] significant digits (the
//! apimachinery takes any number); beyond that the value is refused as
//! [`QuantityError::TooManyDigits`], so the exact arithmetic fits a `u128`.

/// The most significant digits read (leading zeros of the number and trailing
/// zeros of its fraction do not count).
pub const MAX_DIGITS: usize = 20;

/// Why a string is no quantity this reading takes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, thiserror::Error)]
pub enum QuantityError {
    #[error("is not a quantity (a number with an optional suffix such as k, M, Gi or e3)")]
    NotAQuantity,
    #[error("has more than {MAX_DIGITS} significant digits")]
    TooManyDigits,
}

/// A quantity's value rounded up to a whole number; `Huge` when it does not
/// fit a `u128` (far beyond any bound podnet checks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    Negative,
    Whole(u128),
    Huge,
}

/// The value of `s` rounded up (`"1500m"` is 2, `"0.1"` is 1), as `Value()`.
pub fn value(s: &str) -> Result<Value, QuantityError> {
    let (negative, rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let int_end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let (int, after) = rest.split_at(int_end);
    let (frac, suffix) = match after.strip_prefix('.') {
        Some(f) => f.split_at(f.find(|c: char| !c.is_ascii_digit()).unwrap_or(f.len())),
        None => ("", after),
    };
    if int.is_empty() && frac.is_empty() {
        return Err(QuantityError::NotAQuantity);
    }
    let (exp10, exp2) = suffix_scale(suffix)?;
    let frac = frac.trim_end_matches('0');
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > MAX_DIGITS {
        return Err(QuantityError::TooManyDigits);
    }
    // At most 20 digits: below 2^67, so m × 2^60 fits.
    let m: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| QuantityError::NotAQuantity)?
    };
    if m == 0 {
        return Ok(Value::Whole(0));
    }
    if negative {
        return Ok(Value::Negative);
    }
    let scaled = m << exp2;
    let exp = exp10 - frac.len() as i64;
    Ok(scale(scaled, exp))
}

/// `n × 10^exp`, rounded up.
fn scale(n: u128, exp: i64) -> Value {
    if exp >= 0 {
        let Ok(e) = u32::try_from(exp) else {
            return Value::Huge;
        };
        return match 10u128.checked_pow(e).and_then(|p| n.checked_mul(p)) {
            Some(v) => Value::Whole(v),
            None => Value::Huge,
        };
    }
    // n < 2^127 < 10^39: dividing by 10^39 or more leaves a fraction below 1.
    let div = u32::try_from(-exp).ok().and_then(|e| 10u128.checked_pow(e));
    match div {
        Some(d) => Value::Whole(n.div_ceil(d)),
        None => Value::Whole(1),
    }
}

/// The powers of ten and of two a suffix multiplies by.
fn suffix_scale(suffix: &str) -> Result<(i64, u32), QuantityError> {
    Ok(match suffix {
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
        _ => (decimal_exponent(suffix)?, 0),
    })
}

/// `e<signed number>` or `E<signed number>` (a whole number).
fn decimal_exponent(suffix: &str) -> Result<i64, QuantityError> {
    let exp = suffix
        .strip_prefix('e')
        .or_else(|| suffix.strip_prefix('E'))
        .ok_or(QuantityError::NotAQuantity)?;
    let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(QuantityError::NotAQuantity);
    }
    // Anything beyond ±10^6 is as good as infinite (or nothing) here.
    let clamped = if digits.len() > 7 { "1000000" } else { digits };
    let n: i64 = clamped.parse().map_err(|_| QuantityError::NotAQuantity)?;
    Ok(if exp.starts_with('-') { -n } else { n })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(s: &str) -> u128 {
        match value(s) {
            Ok(Value::Whole(v)) => v,
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn every_suffix() {
        let cases: &[(&str, u128)] = &[
            ("10", 10),
            ("10k", 10_000),
            ("10M", 10_000_000),
            ("10G", 10_000_000_000),
            ("10T", 10_000_000_000_000),
            ("1P", 1_000_000_000_000_000),
            ("1E", 1_000_000_000_000_000_000),
            ("1Ki", 1024),
            ("1Mi", 1 << 20),
            ("1Gi", 1 << 30),
            ("1Ti", 1 << 40),
            ("1Pi", 1 << 50),
            ("1Ei", 1 << 60),
            ("1500m", 2),
            ("1000m", 1),
            ("1u", 1),
            ("1n", 1),
            ("1e3", 1000),
            ("1E3", 1000),
            ("1e+3", 1000),
            ("15e-1", 2),
            ("1e0", 1),
        ];
        for (s, v) in cases {
            assert_eq!(whole(s), *v, "{s}");
        }
    }

    #[test]
    fn fractions_and_signs() {
        assert_eq!(whole("1.5k"), 1500);
        assert_eq!(whole("0.5"), 1);
        assert_eq!(whole(".5"), 1);
        assert_eq!(whole("5."), 5);
        assert_eq!(whole("999.5"), 1000);
        assert_eq!(whole("1000000000000000.1"), 1_000_000_000_000_001);
        assert_eq!(whole("0.9k"), 900);
        assert_eq!(whole("1.5Ki"), 1536);
        assert_eq!(whole("+10M"), 10_000_000);
        assert_eq!(whole("0010M"), 10_000_000);
        assert_eq!(whole("1.000000000000000000000000000k"), 1000);
        assert_eq!(whole("0"), 0);
        assert_eq!(whole("-0"), 0);
        assert_eq!(whole("0.0M"), 0);
        assert_eq!(value("-1"), Ok(Value::Negative));
        assert_eq!(value("-10M"), Ok(Value::Negative));
        assert_eq!(value("-.5"), Ok(Value::Negative));
    }

    #[test]
    fn extremes() {
        assert_eq!(value("1e100"), Ok(Value::Huge));
        assert_eq!(value("1e99999999999"), Ok(Value::Huge));
        assert_eq!(whole("1e-100"), 1);
        assert_eq!(whole("1e-99999999999"), 1);
        assert_eq!(
            whole("99999999999999999999Ei"),
            99_999_999_999_999_999_999u128 << 60
        );
        assert_eq!(whole("0.00000000000000000001Ei"), 1);
        assert_eq!(
            value("123456789012345678901"),
            Err(QuantityError::TooManyDigits)
        );
        assert_eq!(whole("12345678901234567890"), 12_345_678_901_234_567_890);
    }

    #[test]
    fn not_quantities() {
        for s in [
            "", ".", "-", "+", "k", "10K", "10kb", "10 M", " 10M", "10M ", "10mi", "1e", "1E+",
            "1e1.5", "1ee3", "1Kie3", "ten", "1,000", "--1", "+-1", "1..2", "1.2.3", "0x10",
            "10Mbps", "1e3k", "∞",
        ] {
            assert_eq!(value(s), Err(QuantityError::NotAQuantity), "{s:?}");
        }
    }
}
