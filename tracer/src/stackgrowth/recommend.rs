//! The starting stack size that would have avoided most observed growths,
//! and when growth is too small to act on. Pure arithmetic.

use crate::units::fmt_stack_size;

/// Go's smallest (and default) goroutine stack.
pub const GO_MIN_STACK: u64 = 2048;

/// Go's `stackGuard` on linux/amd64 (1.19-1.27): newstack grows until the
/// new frame plus this much fits.
pub const GO_STACK_GUARD: u64 = 928;

/// Share of growths the recommended starting stack must avoid.
pub const COVERAGE: f64 = 0.99;

/// Exact mode: below both rates growth costs well under 1% of a CPU (a
/// small copy takes a few microseconds).
pub const NEGLIGIBLE_GROWTHS_PER_SEC: f64 = 1000.0;
pub const NEGLIGIBLE_COPIED_BYTES_PER_SEC: f64 = 16.0 * 1024.0 * 1024.0;
/// Sampled mode: below this share of the process's CPU time.
pub const NEGLIGIBLE_CPU_SHARE: f64 = 0.01;

/// Sampled mode: the fewest stack-copy samples a share is claimed from.
pub const MIN_SAMPLES_FOR_SHARE: u64 = 20;

/// What the counts a recommendation is computed from are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Basis {
    /// Exact mode: every growth counted, sizes observed.
    Growths,
    /// Sampled mode: CPU samples that caught a stack copy. They weigh each
    /// growth by the time its copy took (a share of them is a share of that
    /// time, not of growths), the sizes grown to are estimated from each
    /// site's frame, `old_size_unknown` of them came after the switch to the
    /// new stack, and `frame_unknown` of them had no frame size to go on.
    Samples {
        old_size_unknown: u64,
        frame_unknown: u64,
    },
}

/// The size newstack grows a stack of `old` bytes to, of which `used` bytes
/// are live, for a function whose frame needs `max_frame` bytes (Go doubles
/// until the frame plus the guard fits; unknown frame: one doubling).
pub fn grown_size(old: u64, used: u64, max_frame: Option<u64>) -> u64 {
    let mut new = old.max(1) * 2;
    if let Some(frame) = max_frame {
        let needed = frame + GO_STACK_GUARD;
        while new.saturating_sub(used) < needed && new < 1 << 30 {
            new *= 2;
        }
    }
    new
}

/// What gostw advises about the starting stack size.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Recommendation {
    /// Growth is too small to act on: nothing should change.
    pub negligible: bool,
    /// The smallest power-of-two starting stack that would have avoided
    /// `COVERAGE` of the observed growths (None when nothing grew).
    pub starting_stack_bytes: Option<u64>,
    /// Share of `avoided_of` it would have avoided (0 when not
    /// `avoided_fraction_supported`).
    pub avoided_fraction: f64,
    /// What the share is of: "growths" (exact mode) or "sampled stack-copy
    /// time" (sampled mode: samples weigh each growth by its copy time).
    pub avoided_of: String,
    /// Whether the data supports a share: sampled mode needs
    /// `MIN_SAMPLES_FOR_SHARE` samples, most with a known frame size.
    pub avoided_fraction_supported: bool,
    /// The starting size goroutines had (smallest pre-growth size seen; at
    /// least Go's 2 KB minimum).
    pub current_starting_stack_bytes: u64,
    /// Whether a size before growth was seen at all (sampled mode may see
    /// none: then the current starting size is unknown).
    pub current_starting_stack_known: bool,
    /// Goroutines the memory estimate is for, and where that count came from.
    pub goroutines: Option<u64>,
    pub goroutines_source: Option<String>,
    /// `starting_stack_bytes * goroutines`.
    pub memory_bytes: Option<u64>,
    /// Memory above what those goroutines start with today.
    pub extra_memory_bytes: Option<u64>,
    /// One sentence for people.
    pub advice: String,
}

/// Recommend a starting stack from `(size grown to, count)` pairs of
/// growths (exact mode).
pub fn recommend(
    grown_to: &[(u64, u64)],
    current_start: u64,
    goroutines: Option<(u64, &str)>,
    negligible: bool,
) -> Recommendation {
    recommend_from(
        Basis::Growths,
        grown_to,
        current_start,
        goroutines,
        negligible,
    )
}

/// Recommend a starting stack from `(size grown to, count)` pairs counted
/// on `basis`; `current_start` is the smallest size seen before growth (0:
/// none seen).
pub fn recommend_from(
    basis: Basis,
    grown_to: &[(u64, u64)],
    current_start: u64,
    goroutines: Option<(u64, &str)>,
    negligible: bool,
) -> Recommendation {
    let total: u64 = grown_to.iter().map(|&(_, n)| n).sum();
    let current = current_start.max(GO_MIN_STACK).next_power_of_two();
    let sampled = matches!(basis, Basis::Samples { .. });
    let mut rec = Recommendation {
        negligible,
        starting_stack_bytes: None,
        avoided_fraction: 0.0,
        avoided_of: if sampled {
            "sampled stack-copy time"
        } else {
            "growths"
        }
        .into(),
        avoided_fraction_supported: false,
        current_starting_stack_bytes: current,
        current_starting_stack_known: current_start != 0 || !sampled,
        goroutines: goroutines.map(|(n, _)| n),
        goroutines_source: goroutines.map(|(_, s)| s.to_owned()),
        memory_bytes: None,
        extra_memory_bytes: None,
        advice: String::new(),
    };
    if total == 0 {
        rec.negligible = true;
        rec.advice = "no goroutine stack growth observed: nothing should change".into();
        return rec;
    }
    // What the data cannot support a share from, in words.
    let unsupported = match basis {
        Basis::Growths => None,
        Basis::Samples { .. } if total < MIN_SAMPLES_FOR_SHARE => Some(format!(
            "only {total} samples caught a stack copy: too few to say what share a bigger \
             starting stack would avoid"
        )),
        Basis::Samples { frame_unknown, .. } if frame_unknown * 2 > total => Some(format!(
            "the frame size of the sites is unknown for {frame_unknown} of {total} samples, so \
             the size their stacks grew to is unknown"
        )),
        Basis::Samples { .. } => None,
    };
    let mut sizes: Vec<(u64, u64)> = grown_to
        .iter()
        .map(|&(s, n)| (s.max(GO_MIN_STACK).next_power_of_two(), n))
        .collect();
    sizes.sort_unstable();
    let mut covered = 0u64;
    let mut pick = current;
    for &(size, n) in &sizes {
        if covered as f64 >= COVERAGE * total as f64 {
            break;
        }
        covered += n;
        pick = pick.max(size);
    }
    let avoided: u64 = sizes
        .iter()
        .filter(|(s, _)| *s <= pick)
        .map(|(_, n)| n)
        .sum();
    if let Some(why) = unsupported {
        rec.advice = if negligible {
            format!("growth is negligible: nothing should change ({why})")
        } else {
            format!(
                "{why}; the top call sites above are where stacks grow. Run longer, or with \
                 --mode exact for counts"
            )
        };
        return rec;
    }
    rec.starting_stack_bytes = Some(pick);
    rec.avoided_fraction = avoided as f64 / total as f64;
    rec.avoided_fraction_supported = true;
    if let Some((n, _)) = goroutines {
        rec.memory_bytes = Some(pick.saturating_mul(n));
        rec.extra_memory_bytes = rec
            .current_starting_stack_known
            .then(|| pick.saturating_sub(current).saturating_mul(n));
    }
    let cost = match (rec.memory_bytes, &rec.goroutines_source) {
        (Some(m), Some(src)) => format!(
            "; for {} goroutines ({src}) that is {} of stacks{}",
            rec.goroutines.unwrap_or(0),
            fmt_stack_size(m),
            rec.extra_memory_bytes
                .map(|x| format!(", {} more than now", fmt_stack_size(x)))
                .unwrap_or_default()
        ),
        _ => "; the goroutine count is unknown (runtime.allglen was not found or not \
              readable), so the memory it costs is not estimated: --goroutines N gives a count"
            .into(),
    };
    let share = match basis {
        Basis::Growths => format!("{:.1}% of growths", rec.avoided_fraction * 100.0),
        Basis::Samples {
            old_size_unknown, ..
        } => format!(
            "the growths behind {:.1}% of the {total} stack-copy samples (sizes grown to \
             estimated from the sites' frames{})",
            rec.avoided_fraction * 100.0,
            if old_size_unknown > 0 {
                format!("; size before growth unknown for {old_size_unknown}")
            } else {
                String::new()
            }
        ),
    };
    let now = if rec.current_starting_stack_known {
        format!(" (now {})", fmt_stack_size(current))
    } else {
        String::new()
    };
    rec.advice = if negligible {
        format!(
            "growth is negligible: nothing should change (a {} starting stack would avoid {share}{cost})",
            fmt_stack_size(pick),
        )
    } else {
        format!(
            "a {} starting stack{now} would have avoided {share}{cost}. Go has no \
             setting for it: keep such goroutines alive in a pool (they keep grown stacks), or \
             move the large frame of the top site off the stack",
            fmt_stack_size(pick),
        )
    };
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_19k_frame_grows_a_fresh_stack_to_32k_in_one_step() {
        // deep19k: 19456-byte buffer + a little, called with ~200 bytes used.
        assert_eq!(grown_size(2048, 200, Some(19456 + 40)), 32768);
        assert_eq!(grown_size(4096, 200, Some(19456 + 40)), 32768);
        // An unknown frame: one doubling.
        assert_eq!(grown_size(2048, 200, None), 4096);
        // A small frame: one doubling.
        assert_eq!(grown_size(8192, 7000, Some(100)), 16384);
    }

    #[test]
    fn recommends_the_99th_percentile_power_of_two() {
        let r = recommend(
            &[(32768, 990), (65536, 10)],
            2048,
            Some((100, "test")),
            false,
        );
        assert_eq!(r.starting_stack_bytes, Some(32768));
        assert!((r.avoided_fraction - 0.99).abs() < 1e-9);
        assert_eq!(r.memory_bytes, Some(3_276_800));
        assert_eq!(r.extra_memory_bytes, Some((32768 - 2048) * 100));
        assert!(r.advice.contains("32 KB"), "{}", r.advice);
        // 2% above 32K: 64K is needed to reach 99%.
        let r = recommend(&[(32768, 98), (65536, 2)], 2048, None, false);
        assert_eq!(r.starting_stack_bytes, Some(65536));
        assert_eq!(r.memory_bytes, None);
    }

    #[test]
    fn sizes_round_up_and_never_below_the_current_start() {
        let r = recommend(&[(3000, 5)], 4096, None, false);
        assert_eq!(r.starting_stack_bytes, Some(4096));
        assert_eq!(r.current_starting_stack_bytes, 4096);
    }

    #[test]
    fn nothing_grew_or_negligible_means_no_change() {
        let r = recommend(&[], 2048, None, false);
        assert!(r.negligible);
        assert_eq!(r.starting_stack_bytes, None);
        assert!(r.advice.contains("nothing should change"));
        let r = recommend(&[(4096, 3)], 2048, None, true);
        assert!(r.negligible && r.advice.contains("nothing should change"));
    }

    #[test]
    fn sampled_shares_are_of_copy_time_and_need_enough_samples() {
        let sampled = Basis::Samples {
            old_size_unknown: 77,
            frame_unknown: 0,
        };
        let r = recommend_from(sampled, &[(16384, 79)], 8192, Some((30, "t")), false);
        assert_eq!(r.starting_stack_bytes, Some(16384));
        assert!(r.avoided_fraction_supported);
        assert_eq!(r.avoided_of, "sampled stack-copy time");
        assert!(
            r.advice.contains("100.0% of the 79 stack-copy samples"),
            "{}",
            r.advice
        );
        assert!(r.advice.contains("unknown for 77"), "{}", r.advice);
        assert!(!r.advice.contains("of growths"), "{}", r.advice);
        // Too few samples: no share, no size.
        let r = recommend_from(sampled, &[(16384, 9)], 8192, None, false);
        assert_eq!(r.starting_stack_bytes, None);
        assert!(!r.avoided_fraction_supported && r.avoided_fraction == 0.0);
        assert!(r.advice.contains("only 9 samples"), "{}", r.advice);
        // Sizes guessed for most samples: no share either.
        let guessed = Basis::Samples {
            old_size_unknown: 0,
            frame_unknown: 60,
        };
        let r = recommend_from(guessed, &[(4096, 100)], 2048, None, false);
        assert_eq!(r.starting_stack_bytes, None);
        assert!(r.advice.contains("frame size"), "{}", r.advice);
        // No size before growth seen: no "now", no extra memory.
        let r = recommend_from(sampled, &[(16384, 79)], 0, Some((30, "t")), false);
        assert!(!r.current_starting_stack_known && !r.advice.contains("(now"));
        assert_eq!(
            (r.memory_bytes, r.extra_memory_bytes),
            (Some(16384 * 30), None)
        );
    }

    #[test]
    fn an_unknown_goroutine_count_is_said_plainly() {
        let r = recommend(&[(32768, 10)], 2048, None, false);
        assert_eq!(r.memory_bytes, None);
        assert!(
            r.advice.contains("goroutine count is unknown"),
            "{}",
            r.advice
        );
    }
}
