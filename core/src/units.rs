//! fio's number syntax: sizes (`4k`, `1g`, `0x1000`), percentages (`10%`) and times (`30s`,
//! `500ms`, `10m`).
//!
//! The rules are fio's (checked against fio 3.33 with `--debug=parse`), so a job file means the
//! same thing here as under fio:
//! - Size suffixes are case-insensitive. With fio's default `kb_base=1024`, `k`/`kb` mean 1024
//!   and the IEC spellings `kib`/`mib`/... mean powers of **1000** (fio's "compatibility mode":
//!   `1KiB` is 1000 bytes). With `kb_base=1000` the two swap. `b` alone means bytes.
//! - Time suffixes are case-insensitive: `us`/`usec`, `ms`/`msec`, `s`, `m` (minutes, not
//!   milli), `h`, `d`. A bare number is in the option's default unit (seconds for `runtime`,
//!   microseconds for `thinktime`).
//!
//! Where fio silently reads something the user cannot have meant, we refuse it instead, with a
//! message that says what fio would have done: `1.5k` (fio: 1 byte), `10min` and `10sec` (fio: 10
//! microseconds), `12.5%` (fio: 12 bytes), an unknown suffix like `4q` (fio: 4 bytes), and `4ki`,
//! which fio's HOWTO and fio's parser disagree about.

use std::time::Duration;

use crate::job::Extent;

/// fio's `kb_base`: which spelling of a unit prefix means a power of 1024.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KbBase {
    /// `kb_base=1024`, fio's default: `k`/`kb` = 1024, `kib` = 1000 (sic, fio's compatibility
    /// mode for old job files).
    #[default]
    K1024,
    /// `kb_base=1000`: `k`/`kb` = 1000, `kib` = 1024, as the SI and IEC standards say.
    K1000,
}

impl KbBase {
    /// The multiplier of one prefix step for the SI-style spelling (`k`, `kb`).
    fn si(self) -> u64 {
        match self {
            KbBase::K1024 => 1024,
            KbBase::K1000 => 1000,
        }
    }

    /// The multiplier of one prefix step for the IEC-style spelling (`kib`): the other base.
    fn iec(self) -> u64 {
        match self {
            KbBase::K1024 => 1000,
            KbBase::K1000 => 1024,
        }
    }
}

/// The unit a bare number is in, which differs per option in fio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeUnit {
    /// `runtime`, `ramp_time`, `startdelay`.
    Seconds,
    /// `thinktime`.
    Microseconds,
}

/// Why a value is not a number of the expected kind. The messages are written to follow
/// "option=value: " in a job-file error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("not a size (expected e.g. 4k, 1m)")]
    NotASize,
    #[error("not a number (expected e.g. 32)")]
    NotANumber,
    #[error("not a time (expected e.g. 30, 30s, 500ms, 10m, 1h)")]
    NotATime,
    #[error("not a number (expected e.g. 1.5)")]
    NotAFloat,
    #[error("fractions are not supported here (fio would read '{0}' as {1}); use a smaller unit")]
    Fraction(String, String),
    #[error(
        "'{0}' is ambiguous (fio's parser reads it as {1}, fio's HOWTO as {2}); write {3} instead"
    )]
    AmbiguousSuffix(String, &'static str, &'static str, &'static str),
    #[error(
        "'{0}' is not a time unit (fio would read it as microseconds); use us, ms, s, m, h or d"
    )]
    BadTimeSuffix(String),
    #[error("too large: does not fit in 64 bits")]
    Overflow,
    #[error("a percentage is not allowed here")]
    PercentNotAllowed,
    #[error(
        "fractional percentages are not supported (fio 3.33 would read '{0}' as {1} bytes); use a whole percent"
    )]
    FractionalPercent(String, u64),
    #[error("a range is not supported by lockstep; give a single value")]
    Range,
    #[error("arithmetic expressions are not supported by lockstep; give the value")]
    Arithmetic,
}

/// The multipliers fio knows, as (prefix letter, power).
const PREFIXES: [(char, u32); 5] = [('k', 1), ('m', 2), ('g', 3), ('t', 4), ('p', 5)];

/// A value that looks like a fio arithmetic expression (`(4k*2)`, `8*$mb_memory` after keyword
/// expansion). fio evaluates these; we say so instead of misreading them.
fn looks_arithmetic(s: &str) -> bool {
    s.starts_with('(') || s.contains(['*', '+', '/', '^', '('])
}

/// Splits `s` into its leading decimal digits and the rest.
fn split_digits(s: &str) -> (&str, &str) {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    s.split_at(end)
}

/// What fio 3.33 makes of a number with a fractional part: it stops at the '.', so the integer
/// part, times the multiplier of no suffix at all (the suffix it sees starts with '.').
fn fio_truncation(int_part: &str) -> String {
    match int_part.parse::<u64>() {
        Ok(1) => "1 byte".to_string(),
        Ok(n) => format!("{n} bytes"),
        Err(_) => "0".to_string(),
    }
}

/// The multiplier of a size suffix (already lower-cased), or why it is not one.
fn size_multiplier(suffix: &str, kb: KbBase) -> Result<u64, UnitError> {
    if suffix.is_empty() || suffix == "b" {
        return Ok(1);
    }
    let mut chars = suffix.chars();
    let letter = chars.next().ok_or(UnitError::NotASize)?;
    let rest = chars.as_str();
    let (_, power) = PREFIXES
        .iter()
        .find(|(p, _)| *p == letter)
        .ok_or(UnitError::NotASize)?;
    let step = match rest {
        "" | "b" => kb.si(),
        "ib" => kb.iec(),
        "i" => {
            let (parser, howto, instead) = match letter {
                'k' => ("k (1024)", "1000", "k or kib"),
                'm' => ("m (1024^2)", "1000^2", "m or mib"),
                'g' => ("g (1024^3)", "1000^3", "g or gib"),
                't' => ("t (1024^4)", "1000^4", "t or tib"),
                _ => ("p (1024^5)", "1000^5", "p or pib"),
            };
            return Err(UnitError::AmbiguousSuffix(
                suffix.to_string(),
                parser,
                howto,
                instead,
            ));
        }
        _ => return Err(UnitError::NotASize),
    };
    step.checked_pow(*power).ok_or(UnitError::Overflow)
}

/// Parses an unsigned integer with an optional size suffix: fio's `int` type. `not_a` is the
/// error for text that is not a number at all, so sizes and counts can say what was expected.
fn parse_scaled(text: &str, kb: KbBase, not_a: UnitError) -> Result<u64, UnitError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(not_a);
    }
    if looks_arithmetic(s) {
        return Err(UnitError::Arithmetic);
    }
    if s.ends_with('%') {
        return Err(UnitError::PercentNotAllowed);
    }
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        // fio reads hex digits and then looks for a suffix in the text after "0", which never
        // matches one: a suffix on a hex number means nothing. So hex is digits only.
        if hex.is_empty() || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(not_a);
        }
        return u64::from_str_radix(hex, 16).map_err(|_| UnitError::Overflow);
    }
    let (digits, suffix) = split_digits(s);
    if digits.is_empty() {
        return Err(not_a);
    }
    if let Some(frac) = suffix.strip_prefix('.') {
        if frac.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(UnitError::Fraction(s.to_string(), fio_truncation(digits)));
        }
        return Err(not_a);
    }
    let suffix = suffix.to_ascii_lowercase();
    let mult = match size_multiplier(&suffix, kb) {
        Ok(m) => m,
        Err(UnitError::NotASize) => return Err(not_a),
        Err(e) => return Err(e),
    };
    let n: u64 = digits.parse().map_err(|_| UnitError::Overflow)?;
    n.checked_mul(mult).ok_or(UnitError::Overflow)
}

/// A size in bytes: `4096`, `4k`, `4KB`, `1m`, `1g`, `0x1000`, `512b`.
pub fn parse_size(text: &str, kb: KbBase) -> Result<u64, UnitError> {
    let s = text.trim();
    if is_range(s) {
        return Err(UnitError::Range);
    }
    parse_scaled(s, kb, UnitError::NotASize)
}

/// A count (`iodepth`, `numjobs`, `rate_iops`, ...). fio parses these like sizes, so `1k` is
/// 1024 here too.
pub fn parse_count(text: &str, kb: KbBase) -> Result<u64, UnitError> {
    parse_scaled(text, kb, UnitError::NotANumber)
}

/// `a-b` or `a:b` with sizes on both sides: fio's `irange`, which lockstep does not support.
fn is_range(s: &str) -> bool {
    let Some(i) = s.find([':', '-']).filter(|&i| i > 0) else {
        return false;
    };
    let (a, b) = (&s[..i], &s[i + 1..]);
    a.starts_with(|c: char| c.is_ascii_digit()) && b.starts_with(|c: char| c.is_ascii_digit())
}

/// A size or a percentage (`size=`, `offset=`): `50%` is `Extent::Percent(50.0)`. Percentages
/// are whole numbers: fio 3.33 stops at a '.' and reads `12.5%` as 12 bytes.
pub fn parse_extent(text: &str, kb: KbBase) -> Result<Extent, UnitError> {
    let s = text.trim();
    let Some(number) = s.strip_suffix('%') else {
        return parse_size(s, kb).map(Extent::Bytes);
    };
    let number = number.trim_end();
    let (digits, rest) = split_digits(number);
    if digits.is_empty() {
        return Err(UnitError::NotASize);
    }
    if rest.starts_with('.') {
        let fio_reads = digits.parse().unwrap_or(0);
        return Err(UnitError::FractionalPercent(s.to_string(), fio_reads));
    }
    if !rest.is_empty() {
        return Err(UnitError::NotASize);
    }
    let p: u32 = digits.parse().map_err(|_| UnitError::Overflow)?;
    Ok(Extent::Percent(f64::from(p)))
}

/// A duration: a whole number with an optional unit (`30`, `30s`, `500ms`, `10m`, `2h`, `1d`,
/// `100us`). A bare number is in `default` units. Whitespace between number and unit is
/// allowed, as fio allows it.
pub fn parse_time(text: &str, default: TimeUnit) -> Result<Duration, UnitError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(UnitError::NotATime);
    }
    if looks_arithmetic(s) {
        return Err(UnitError::Arithmetic);
    }
    if is_range(s) {
        return Err(UnitError::Range);
    }
    let (digits, rest) = split_digits(s);
    if digits.is_empty() {
        return Err(UnitError::NotATime);
    }
    if let Some(frac) = rest.strip_prefix('.') {
        if frac.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(UnitError::Fraction(
                s.to_string(),
                format!("{digits} (truncated)"),
            ));
        }
        return Err(UnitError::NotATime);
    }
    let unit = rest.trim().to_ascii_lowercase();
    let micros_per: u64 = match unit.as_str() {
        "" => match default {
            TimeUnit::Seconds => 1_000_000,
            TimeUnit::Microseconds => 1,
        },
        "us" | "usec" => 1,
        "ms" | "msec" => 1_000,
        "s" => 1_000_000,
        "m" => 60_000_000,
        "h" => 3_600_000_000,
        "d" => 86_400_000_000,
        // fio compares the whole suffix: these fall through to a multiplier of 1 (microseconds),
        // so `runtime=10min` would run for 10us. Nobody means that.
        "sec" | "secs" | "min" | "mins" | "hr" | "hrs" | "hour" | "hours" | "day" | "days"
        | "ns" | "nsec" => return Err(UnitError::BadTimeSuffix(rest.trim().to_string())),
        _ => return Err(UnitError::NotATime),
    };
    let n: u64 = digits.parse().map_err(|_| UnitError::Overflow)?;
    let micros = n.checked_mul(micros_per).ok_or(UnitError::Overflow)?;
    Ok(Duration::from_micros(micros))
}

/// A finite floating-point number (`percentile_list`, distribution parameters).
pub fn parse_float(text: &str) -> Result<f64, UnitError> {
    let s = text.trim();
    // Rust's parser accepts "inf" and "NaN"; fio's strtod would too, but neither is a
    // meaningful percentile or distribution parameter.
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && !s.is_empty() => Ok(v),
        _ => Err(UnitError::NotAFloat),
    }
}

/// The shortest fio spelling of a byte count that reads back exactly (with `kb_base=1024`):
/// `4096` is `4k`, `1536` is `1536`... `1610612736` is `1536m`. For messages and reports.
pub fn format_size(bytes: u64) -> String {
    for (letter, power) in PREFIXES.iter().rev() {
        let mult = 1024u64.pow(*power);
        if bytes != 0 && bytes / mult * mult == bytes {
            return format!("{}{}", bytes / mult, letter);
        }
    }
    bytes.to_string()
}

/// The shortest fio spelling of a duration that reads back exactly, whatever the option's
/// default unit: `30s`, `500ms`, `10m`, `1h`, `150us`. Sub-microsecond parts are dropped (fio's
/// resolution is the microsecond).
pub fn format_time(d: Duration) -> String {
    let micros = d.as_micros();
    if micros == 0 {
        return "0s".to_string();
    }
    const UNITS: [(&str, u128); 6] = [
        ("d", 86_400_000_000),
        ("h", 3_600_000_000),
        ("m", 60_000_000),
        ("s", 1_000_000),
        ("ms", 1_000),
        ("us", 1),
    ];
    UNITS
        .iter()
        .find(|(_, per)| micros / per * per == micros)
        .map(|(unit, per)| format!("{}{}", micros / per, unit))
        .unwrap_or_else(|| format!("{micros}us"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const K: KbBase = KbBase::K1024;

    #[test]
    fn plain_bytes_and_b_suffix() {
        assert_eq!(parse_size("4096", K), Ok(4096));
        assert_eq!(parse_size("4096b", K), Ok(4096));
        assert_eq!(parse_size("4096B", K), Ok(4096));
        assert_eq!(parse_size(" 0 ", K), Ok(0));
    }

    #[test]
    fn si_spellings_are_powers_of_1024_by_default() {
        for (text, want) in [
            ("4k", 4096),
            ("4K", 4096),
            ("4kb", 4096),
            ("4KB", 4096),
            ("4kB", 4096),
            ("1m", 1 << 20),
            ("1MB", 1 << 20),
            ("1g", 1 << 30),
            ("1G", 1 << 30),
            ("1t", 1 << 40),
            ("1p", 1 << 50),
            ("128M", 128 << 20),
            ("500G", 500 << 30),
        ] {
            assert_eq!(parse_size(text, K), Ok(want), "{text}");
        }
    }

    #[test]
    fn iec_spellings_are_powers_of_1000_by_default_as_in_fio() {
        // fio 3.33 --debug=parse: size=1KiB -> 1000, 1MiB -> 1000000, 1GiB -> 1000000000.
        assert_eq!(parse_size("1KiB", K), Ok(1000));
        assert_eq!(parse_size("4kib", K), Ok(4000));
        assert_eq!(parse_size("1MiB", K), Ok(1_000_000));
        assert_eq!(parse_size("1GiB", K), Ok(1_000_000_000));
        assert_eq!(parse_size("1TiB", K), Ok(1_000_000_000_000));
    }

    #[test]
    fn kb_base_1000_swaps_the_spellings() {
        let d = KbBase::K1000;
        assert_eq!(parse_size("1k", d), Ok(1000));
        assert_eq!(parse_size("1kb", d), Ok(1000));
        assert_eq!(parse_size("1KiB", d), Ok(1024));
        assert_eq!(parse_size("1MiB", d), Ok(1 << 20));
        assert_eq!(parse_size("1m", d), Ok(1_000_000));
    }

    #[test]
    fn hex_is_digits_only() {
        assert_eq!(parse_size("0x1000", K), Ok(4096));
        assert_eq!(parse_size("0X1f", K), Ok(31));
        assert_eq!(parse_size("0x", K), Err(UnitError::NotASize));
        assert_eq!(parse_size("0x10k", K), Err(UnitError::NotASize));
    }

    #[test]
    fn garbage_is_not_a_size() {
        for text in ["", "k", "4q", "4kx", "four", "-4k", "4 k", "4e", "1eb"] {
            assert_eq!(parse_size(text, K), Err(UnitError::NotASize), "{text:?}");
        }
        // fio's strtoll would take a sign; we read it as the start of an expression.
        assert!(parse_size("+4", K).is_err());
        assert_eq!(
            UnitError::NotASize.to_string(),
            "not a size (expected e.g. 4k, 1m)"
        );
    }

    #[test]
    fn fractions_are_refused_with_what_fio_would_do() {
        let err = parse_size("1.5k", K).unwrap_err();
        assert!(matches!(err, UnitError::Fraction(..)));
        assert!(err.to_string().contains("1 byte"), "{err}");
    }

    #[test]
    fn ambiguous_ki_is_refused() {
        let err = parse_size("4ki", K).unwrap_err();
        assert!(matches!(err, UnitError::AmbiguousSuffix(..)), "{err}");
        assert!(err.to_string().contains("k or kib"));
    }

    #[test]
    fn overflow_is_an_error() {
        assert_eq!(parse_size("16384p", K), Err(UnitError::Overflow));
        assert_eq!(
            parse_size("99999999999999999999", K),
            Err(UnitError::Overflow)
        );
        assert_eq!(
            parse_size("0x1ffffffffffffffff", K),
            Err(UnitError::Overflow)
        );
        assert_eq!(parse_size("16383p", K), Ok(16383 << 50));
    }

    #[test]
    fn ranges_percentages_and_arithmetic_are_named() {
        assert_eq!(parse_size("1k-4k", K), Err(UnitError::Range));
        assert_eq!(parse_size("1k:4k", K), Err(UnitError::Range));
        assert_eq!(parse_size("10%", K), Err(UnitError::PercentNotAllowed));
        assert_eq!(parse_size("(4k*2)", K), Err(UnitError::Arithmetic));
        assert_eq!(parse_size("8*1024", K), Err(UnitError::Arithmetic));
    }

    #[test]
    fn counts_take_suffixes_like_fio() {
        assert_eq!(parse_count("32", K), Ok(32));
        assert_eq!(parse_count("1k", K), Ok(1024));
        assert_eq!(parse_count("0x10", K), Ok(16));
        assert_eq!(parse_count("many", K), Err(UnitError::NotANumber));
        assert_eq!(parse_count("4q", K), Err(UnitError::NotANumber));
    }

    #[test]
    fn extents() {
        assert_eq!(parse_extent("50%", K), Ok(Extent::Percent(50.0)));
        assert_eq!(parse_extent("100%", K), Ok(Extent::Percent(100.0)));
        assert_eq!(parse_extent("10 %", K), Ok(Extent::Percent(10.0)));
        assert_eq!(parse_extent("1g", K), Ok(Extent::Bytes(1 << 30)));
        assert!(matches!(
            parse_extent("12.5%", K),
            Err(UnitError::FractionalPercent(_, 12))
        ));
        assert_eq!(parse_extent("%", K), Err(UnitError::NotASize));
        assert_eq!(parse_extent("x%", K), Err(UnitError::NotASize));
    }

    #[test]
    fn times_with_seconds_default() {
        let s = TimeUnit::Seconds;
        assert_eq!(parse_time("30", s), Ok(Duration::from_secs(30)));
        assert_eq!(parse_time("30s", s), Ok(Duration::from_secs(30)));
        assert_eq!(parse_time("30S", s), Ok(Duration::from_secs(30)));
        assert_eq!(parse_time("10 s", s), Ok(Duration::from_secs(10)));
        assert_eq!(parse_time("500ms", s), Ok(Duration::from_millis(500)));
        assert_eq!(parse_time("500msec", s), Ok(Duration::from_millis(500)));
        assert_eq!(parse_time("10Ms", s), Ok(Duration::from_millis(10)));
        assert_eq!(parse_time("100us", s), Ok(Duration::from_micros(100)));
        assert_eq!(parse_time("100usec", s), Ok(Duration::from_micros(100)));
        // `m` is minutes for times, whatever the case.
        assert_eq!(parse_time("1m", s), Ok(Duration::from_secs(60)));
        assert_eq!(parse_time("1M", s), Ok(Duration::from_secs(60)));
        assert_eq!(parse_time("2h", s), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_time("1d", s), Ok(Duration::from_secs(86400)));
        assert_eq!(parse_time("0", s), Ok(Duration::ZERO));
    }

    #[test]
    fn times_with_microseconds_default() {
        let us = TimeUnit::Microseconds;
        assert_eq!(parse_time("10", us), Ok(Duration::from_micros(10)));
        assert_eq!(parse_time("10ms", us), Ok(Duration::from_millis(10)));
        assert_eq!(parse_time("1s", us), Ok(Duration::from_secs(1)));
    }

    #[test]
    fn time_suffixes_fio_misreads_are_refused() {
        for text in ["10min", "10sec", "1hr", "5ns"] {
            let err = parse_time(text, TimeUnit::Seconds).unwrap_err();
            assert!(matches!(err, UnitError::BadTimeSuffix(_)), "{text}: {err}");
        }
        for text in ["", "s", "10q", "0x10", "-5", "ten"] {
            assert_eq!(
                parse_time(text, TimeUnit::Seconds),
                Err(UnitError::NotATime),
                "{text:?}"
            );
        }
        assert!(matches!(
            parse_time("1.5", TimeUnit::Seconds),
            Err(UnitError::Fraction(..))
        ));
        assert_eq!(parse_time("1-5", TimeUnit::Seconds), Err(UnitError::Range));
        assert_eq!(
            parse_time("99999999999999999d", TimeUnit::Seconds),
            Err(UnitError::Overflow)
        );
    }

    #[test]
    fn floats() {
        assert_eq!(parse_float("99.9"), Ok(99.9));
        assert_eq!(parse_float(" 1.2 "), Ok(1.2));
        for text in ["", "nan", "inf", "x", "1.2.3"] {
            assert_eq!(parse_float(text), Err(UnitError::NotAFloat), "{text:?}");
        }
    }

    #[test]
    fn formatting() {
        assert_eq!(format_size(0), "0");
        assert_eq!(format_size(4096), "4k");
        assert_eq!(format_size(1536), "1536");
        assert_eq!(format_size(1 << 30), "1g");
        assert_eq!(format_size(3 << 29), "1536m");
        assert_eq!(format_time(Duration::from_secs(30)), "30s");
        assert_eq!(format_time(Duration::from_secs(120)), "2m");
        assert_eq!(format_time(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_time(Duration::ZERO), "0s");
    }

    proptest! {
        #[test]
        fn size_round_trips(bytes in any::<u64>()) {
            prop_assert_eq!(parse_size(&format_size(bytes), K), Ok(bytes));
        }

        #[test]
        fn size_round_trips_on_unit_multiples(n in 0u64..(1 << 20), power in 0u32..5) {
            let bytes = n << (10 * power);
            prop_assert_eq!(parse_size(&format_size(bytes), K), Ok(bytes));
        }

        #[test]
        fn time_round_trips(micros in 0u64..(1 << 50), seconds_default in any::<bool>()) {
            let d = Duration::from_micros(micros);
            let unit = if seconds_default { TimeUnit::Seconds } else { TimeUnit::Microseconds };
            prop_assert_eq!(parse_time(&format_time(d), unit), Ok(d));
        }

        #[test]
        fn suffixes_are_case_insensitive(n in 0u64..(1 << 20), idx in 0usize..5, upper in any::<bool>()) {
            let (letter, _) = PREFIXES[idx];
            let suffix = if upper { letter.to_ascii_uppercase() } else { letter };
            let text = format!("{n}{suffix}");
            prop_assert_eq!(parse_size(&text, K), parse_size(&text.to_ascii_lowercase(), K));
        }

        #[test]
        fn parse_never_panics(text in "\\PC{0,12}") {
            let _ = parse_size(&text, K);
            let _ = parse_extent(&text, K);
            let _ = parse_time(&text, TimeUnit::Seconds);
            let _ = parse_float(&text);
        }
    }
}
