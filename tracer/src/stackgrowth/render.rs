//! The stack-growth report for people. What the data cannot say is said in
//! words: in sampled mode the size a stack grew to is an estimate (from the
//! site's frame size), and the size before growth is unknown for samples
//! taken after copystack switched the goroutine to its new stack.

use std::{collections::BTreeMap, fmt::Write as _};

use super::{
    Mode,
    aggregate::{StackGrowthSummary, UNKNOWN_SIZE},
};
use crate::units::fmt_stack_size;

impl StackGrowthSummary {
    /// The report for people.
    pub fn render_text(&self) -> String {
        let mut o = String::new();
        let unit = match self.mode {
            Mode::Exact => "growths",
            Mode::Sampled => "samples",
        };
        match self.mode {
            Mode::Exact => {
                let _ = writeln!(
                    o,
                    "stack growth (exact: copystack probe attached {:.1} s of {:.1} s, {:.0}%; rates are per attached second)",
                    self.attached_secs,
                    self.elapsed_secs,
                    self.attached_fraction * 100.0
                );
                let _ = writeln!(
                    o,
                    "  {} growths ({:.0}/s), {} copied ({}/s), {} new stacks; {} shrinks, {} same-size moves",
                    self.growths,
                    self.growths_per_sec.unwrap_or(0.0),
                    fmt_stack_size(self.copied_bytes),
                    fmt_stack_size(self.copied_bytes_per_sec.unwrap_or(0.0) as u64),
                    fmt_stack_size(self.new_stack_bytes),
                    self.shrinks,
                    self.moves
                );
            }
            Mode::Sampled => {
                let _ = writeln!(
                    o,
                    "stack growth (sampled at {} Hz per CPU for {:.1} s)",
                    self.sample_hz, self.elapsed_secs
                );
                let _ = writeln!(
                    o,
                    "  {} of {} CPU samples of the process were copying a goroutine stack: {:.2}% of its CPU time",
                    self.copy_samples,
                    self.cpu_samples,
                    self.cpu_share.unwrap_or(0.0) * 100.0
                );
            }
        }
        if !self.top_sites.is_empty() {
            let _ = writeln!(
                o,
                "  top call sites (function that needed more stack <- its caller), by {unit}:"
            );
        }
        let estimated = if self.new_sizes_estimated { "~" } else { "" };
        for s in &self.top_sites {
            let _ = writeln!(
                o,
                "  {:>6.1}% {:>9}  {} <- {}   {}",
                s.share * 100.0,
                s.count,
                s.site,
                s.caller,
                sizes(&s.old_sizes, &s.new_sizes, estimated)
            );
            if !s.example_stack.is_empty() {
                let stack: Vec<String> =
                    s.example_stack.iter().map(|f| f.function.clone()).collect();
                let _ = writeln!(o, "           stack: {}", stack.join(" <- "));
            }
        }
        if !self.old_sizes.is_empty() {
            let known: Vec<String> = self
                .old_sizes
                .iter()
                .filter(|(sz, _)| **sz != UNKNOWN_SIZE)
                .map(|(sz, n)| format!("{}: {n}", fmt_stack_size(*sz)))
                .collect();
            let mut line = format!("  size before growth: {}", known.join(", "));
            if self.old_size_unknown > 0 {
                let _ = write!(
                    line,
                    "{}unknown for {} {unit}",
                    if known.is_empty() { "" } else { "; " },
                    self.old_size_unknown
                );
            }
            let _ = writeln!(o, "{line}");
        }
        if self.new_sizes_estimated && !self.new_sizes.is_empty() {
            let _ = writeln!(
                o,
                "  sizes: \"~\" sizes grown to are estimates from each site's frame size and live stack;"
            );
            if self.old_size_unknown > 0 {
                let _ = writeln!(
                    o,
                    "  a size before growth is unknown when the sample came after copystack had moved the goroutine to its new stack (the old stack is gone)"
                );
            }
        }
        let _ = writeln!(o, "  recommendation: {}", self.recommendation.advice);
        o
    }
}

/// `from 2 KBx30 to 32 KBx30`; sampled: `to ~16 KBx79 from 8 KBx2, unknown x77`.
fn sizes(old: &BTreeMap<u64, u64>, new: &BTreeMap<u64, u64>, estimated: &str) -> String {
    let list = |m: &BTreeMap<u64, u64>, prefix: &str| {
        m.iter()
            .filter(|(sz, _)| **sz != UNKNOWN_SIZE)
            .map(|(sz, n)| format!("{prefix}{}x{n}", fmt_stack_size(*sz)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let unknown = old.get(&UNKNOWN_SIZE).copied().unwrap_or(0);
    if estimated.is_empty() && unknown == 0 {
        return format!("from {} to {}", list(old, ""), list(new, ""));
    }
    let before = match (list(old, ""), unknown) {
        (k, 0) => k,
        (k, n) if k.is_empty() => format!("unknown x{n}"),
        (k, n) => format!("{k}, unknown x{n}"),
    };
    format!("to {} from {before}", list(new, estimated))
}
