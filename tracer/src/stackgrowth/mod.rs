//! Goroutine stack growth: which call sites grow stacks, how often, to which
//! sizes, what it costs, and the starting stack that would avoid most of it.
//!
//! (The kernel side, attaching and reading its counts, is `kernel::stacks`.)
//! - `aggregate`: pure aggregation into a `StackGrowthSummary` (serde);
//!   `render`: its text for people.
//! - `recommend`: the starting-stack recommendation.
//! - `symbolize`: what aggregation needs of code (frames and frame sizes of
//!   return addresses, as the engine read them: `model::code`).
//! - `goroutines`: the peak goroutine count of a live process, read only
//!   where `resident` (its pagemap) says the pages are in memory.

pub mod aggregate;
pub mod goroutines;
pub mod recommend;
mod render;
pub mod symbolize;

/// Rows of the kernel's site map, as tests write them.
#[cfg(test)]
pub mod tests_support {
    use tracer_common::stack::{StackChange, StackSiteCounts, StackSiteKey, StackSource};

    /// An exact-mode growth row: `count` growths of `tgid`'s stacks from
    /// `sizes.0` to `sizes.1` bytes at `site_pc` (returning to
    /// `caller_pc`), `copied` live bytes copied.
    pub fn exact_row(
        tgid: u32,
        (site_pc, caller_pc): (u64, u64),
        (old_size, new_size): (u32, u32),
        count: u64,
        copied: u64,
    ) -> (StackSiteKey, StackSiteCounts) {
        let key = StackSiteKey {
            tgid,
            source: StackSource::Exact as u8,
            change: StackChange::Grow as u8,
            _pad: 0,
            old_size,
            new_size,
            site_pc,
            caller_pc,
        };
        let counts = StackSiteCounts {
            count,
            copied_bytes: copied,
        };
        (key, counts)
    }
}

pub use aggregate::{SiteSummary, StackGrowthAggregator, StackGrowthSummary};
pub use recommend::Recommendation;
pub use symbolize::Symbolizer;

/// How stack growth is observed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// CPU-clock samples that catch a thread copying a goroutine stack:
    /// near-zero cost, shares of CPU time rather than counts. The default.
    #[default]
    Sampled,
    /// A uprobe on every `runtime.copystack`: exact counts and sizes, but
    /// each hit costs microseconds, so it is attached only part of the time.
    Exact,
}
