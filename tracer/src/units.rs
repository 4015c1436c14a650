//! Durations as people write and read them: "250us", "1.5ms", "10s", "2m".

use std::time::Duration;

/// Parse a duration: a number (decimals allowed) and a unit of ns, us, ms,
/// s, m or h; a bare "0" is zero.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{s:?} has no unit (use ns, us, ms, s, m or h, e.g. 10s)"))?;
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a number followed by a unit"))?;
    let ns_per = match unit {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" => 60e9,
        "h" => 3600e9,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {s:?} (use ns, us, ms, s, m or h)"
            ));
        }
    };
    Ok(Duration::from_nanos((value * ns_per).round() as u64))
}

/// A length of time that must pass: `parse_duration`, more than zero
/// (`--duration`, the exact-mode windows).
pub fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!(
            "{s:?} is no time at all: give more than zero (e.g. 10s)"
        ));
    }
    Ok(d)
}

/// The shortest period of a repeated reading (`--exposure-every`,
/// `memory --interval`): each one reads /proc files or process memory.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// How often something repeats: `parse_duration`, 0 for never, otherwise
/// at least `MIN_INTERVAL`.
pub fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if !d.is_zero() && d < MIN_INTERVAL {
        return Err(format!(
            "{s:?} is too short: give 0 (off) or at least {}ms",
            MIN_INTERVAL.as_millis()
        ));
    }
    Ok(d)
}

/// A period of the agent's own work (`--poll-interval`,
/// `--otlp-interval`): `parse_duration`, from 10 ms to 1 hour.
pub fn parse_period(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if !(Duration::from_millis(10)..=Duration::from_secs(3600)).contains(&d) {
        return Err(format!("{s} is outside 10ms..1h"));
    }
    Ok(d)
}

/// Bytes in binary units, one decimal: `1536` -> "1.5 KiB" (memory reports).
pub fn fmt_bytes(n: u64) -> String {
    let (v, u) = scaled(n, ["B", "KiB", "MiB", "GiB", "TiB"]);
    if u == "B" {
        format!("{n} B")
    } else {
        format!("{v:.1} {u}")
    }
}

/// A stack or copy size the way Go's docs write them (binary, "KB"), whole
/// where exact: `2048` -> "2 KB", `1536` -> "1.5 KB".
pub fn fmt_stack_size(n: u64) -> String {
    let (v, u) = scaled(n, ["B", "KB", "MB", "GB", "TB"]);
    if v.fract() == 0.0 || u == "B" {
        format!("{v:.0} {u}")
    } else {
        format!("{v:.1} {u}")
    }
}

/// ns -> "12.3 ms".
pub fn fmt_ms(ns: u64) -> String {
    format!("{:.1} ms", ns as f64 / 1e6)
}

/// ns -> "60 us" under a millisecond, else "12.3 ms".
pub fn fmt_short_duration(ns: u64) -> String {
    if ns < 1_000_000 {
        format!("{} us", ns / 1000)
    } else {
        fmt_ms(ns)
    }
}

/// 0.123 -> "12.3%".
pub fn fmt_pct(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

/// `n` divided by 1024 until below it, with the unit it reached.
fn scaled(n: u64, units: [&'static str; 5]) -> (f64, &'static str) {
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < units.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    (v, units[u])
}

/// Nanoseconds as a short human figure with a unit: "850 ns", "12.3 us",
/// "1.25 ms", "2.00 s".
pub fn fmt_ns(ns: u64) -> String {
    let f = ns as f64;
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} us", f / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2} ms", f / 1e6)
    } else {
        format!("{:.2} s", f / 1e9)
    }
}

/// Unix nanoseconds as local wall-clock time of day, "14:03:07.123456".
pub fn fmt_time_of_day(unix_ns: u64) -> String {
    let secs = (unix_ns / 1_000_000_000) as libc::time_t;
    let micros = (unix_ns % 1_000_000_000) / 1_000;
    // SAFETY: zeroed tm is a valid out-parameter; localtime_r is thread-safe.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers.
    if unsafe { libc::localtime_r(&secs, &mut tm) }.is_null() {
        return format!("{secs}.{micros:06}");
    }
    format!(
        "{:02}:{:02}:{:02}.{micros:06}",
        tm.tm_hour, tm.tm_min, tm.tm_sec
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods() {
        assert_eq!(parse_period("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_period("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_period("2m"), Ok(Duration::from_secs(120)));
        for bad in ["1", "s", "2h", "0", "5ms", "2d", "-1s"] {
            assert!(parse_period(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn byte_and_duration_formats() {
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(1536), "1.5 KiB");
        assert_eq!(fmt_bytes(64 << 20), "64.0 MiB");
        assert_eq!(fmt_stack_size(2048), "2 KB");
        assert_eq!(fmt_stack_size(1536), "1.5 KB");
        assert_eq!(fmt_stack_size(100), "100 B");
        assert_eq!(fmt_stack_size(32 << 20), "32 MB");
        assert_eq!(fmt_ms(1_250_000), "1.2 ms");
        assert_eq!(fmt_short_duration(60_460), "60 us");
        assert_eq!(fmt_short_duration(2_500_000), "2.5 ms");
        assert_eq!(fmt_pct(0.125), "12.5%");
    }

    #[test]
    fn parses_common_forms() {
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5ms"), Ok(Duration::from_micros(1500)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("ms").is_err());
    }

    #[test]
    fn positive_durations_refuse_zero() {
        assert_eq!(parse_positive_duration("1ns"), Ok(Duration::from_nanos(1)));
        assert_eq!(parse_positive_duration("2m"), Ok(Duration::from_secs(120)));
        for bad in ["0", "0s", "0.0ms", "0.0000001ns", "10", "x"] {
            assert!(parse_positive_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn intervals_are_off_or_at_least_the_minimum() {
        assert_eq!(parse_interval("0"), Ok(Duration::ZERO));
        assert_eq!(parse_interval("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_interval("100ms"), Ok(MIN_INTERVAL));
        assert_eq!(parse_interval("2s"), Ok(Duration::from_secs(2)));
        for bad in ["1ns", "99ms", "0.05s", "10"] {
            let e = parse_interval(bad).unwrap_err();
            assert!(e.contains("100ms") || e.contains("unit"), "{bad}: {e}");
        }
    }

    #[test]
    fn formats_with_a_unit() {
        assert_eq!(fmt_ns(850), "850 ns");
        assert_eq!(fmt_ns(12_345), "12.3 us");
        assert_eq!(fmt_ns(1_250_000), "1.25 ms");
        assert_eq!(fmt_ns(2_000_000_000), "2.00 s");
    }
}
