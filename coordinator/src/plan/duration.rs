//! Durations as plans write them: `"60s"`, `"1m30s"`, `"250ms"`, `"1.5h"`.
//!
//! A unit is always required: a bare `60` could be seconds (fio's `runtime`) or milliseconds
//! (fio's `thinktime` is microseconds), and a plan that silently runs 1,000 times too long is
//! worse than one that is refused. Written here rather than with `humantime` because the
//! grammar is this small and the messages can say what to write instead.

use std::time::Duration;

const UNITS: [(&str, u128); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
    ("d", 86_400_000_000_000),
];

/// Parses one or more `<number><unit>` parts (`"1h30m"`, `"2.5s"`); `"0"` alone is zero.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err("empty duration: write e.g. \"30s\"".to_string());
    }
    let mut rest = s;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(num_len);
        if num.is_empty() {
            return Err(format!(
                "invalid duration '{text}': write e.g. \"30s\", \"1m30s\", \"250ms\""
            ));
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let Some(&(_, scale)) = UNITS.iter().find(|(u, _)| *u == unit.trim()) else {
            return Err(if unit.is_empty() {
                format!("duration '{text}' has no unit: write e.g. \"{num}s\" or \"{num}ms\"")
            } else {
                format!(
                    "unknown unit '{unit}' in duration '{text}' (units: ns, us, ms, s, m, h, d)"
                )
            });
        };
        let nanos = if let Some((whole, frac)) = num.split_once('.') {
            if frac.contains('.') || (whole.is_empty() && frac.is_empty()) {
                return Err(format!("invalid number '{num}' in duration '{text}'"));
            }
            let value: f64 = num
                .parse()
                .map_err(|_| format!("invalid number '{num}' in duration '{text}'"))?;
            (value * scale as f64).round() as u128
        } else {
            let value: u128 = num
                .parse()
                .map_err(|_| format!("invalid number '{num}' in duration '{text}'"))?;
            value.saturating_mul(scale)
        };
        total = total.saturating_add(nanos);
        rest = next;
    }
    let nanos = u64::try_from(total).map_err(|_| format!("duration '{text}' is too long"))?;
    Ok(Duration::from_nanos(nanos))
}

/// Checks that a run, phase or fault duration is a whole number of milliseconds: the agents
/// run (and the protocol carries) milliseconds, so a finer one would silently run as another
/// ("1ns" became runtime=0ms, which every agent refused at prepare, far from the plan line).
pub fn check_whole_millis(d: Duration) -> Result<(), String> {
    if d.subsec_nanos() % 1_000_000 == 0 {
        return Ok(());
    }
    let up = (d.as_millis() + 1).max(1);
    Err(format!(
        "{} is not a whole number of milliseconds (the agents run milliseconds); write e.g. \"{up}ms\"",
        format_duration(d)
    ))
}

/// The shortest exact spelling `parse_duration` reads back (`"1m30s"`, `"250ms"`, `"0s"`).
pub fn format_duration(d: Duration) -> String {
    let mut nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    // Below a second, one unit reads better than "1s250ms"-style sums.
    if nanos < 1_000_000_000 {
        for (unit, scale) in [("ms", 1_000_000u128), ("us", 1_000), ("ns", 1)] {
            if nanos.checked_rem(scale) == Some(0) {
                return format!("{}{unit}", nanos / scale);
            }
        }
    }
    let mut out = String::new();
    for (unit, scale) in [
        ("h", 3_600_000_000_000u128),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
        ("ns", 1),
    ] {
        if nanos >= scale {
            out.push_str(&format!("{}{unit}", nanos / scale));
            nanos %= scale;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_compound_durations() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("10us"), Ok(Duration::from_micros(10)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration(" 5s "), Ok(Duration::from_secs(5)));
    }

    #[test]
    fn refuses_missing_or_unknown_units() {
        assert!(parse_duration("60").unwrap_err().contains("no unit"));
        assert!(
            parse_duration("60x")
                .unwrap_err()
                .contains("unknown unit 'x'")
        );
        assert!(parse_duration("").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("1.2.3s").is_err());
    }

    #[test]
    fn formats_back_to_what_parses() {
        for text in ["1m30s", "250ms", "5s", "1h", "0s", "1s500ms", "7us"] {
            let d = parse_duration(text).unwrap();
            assert_eq!(format_duration(d), text);
            assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
    }
}
