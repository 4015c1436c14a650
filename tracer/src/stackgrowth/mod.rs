//! Goroutine stack growth: which call sites grow stacks, how often, to which
//! sizes, what it costs, and the starting stack that would avoid most of it.
//!
//! (The kernel side, attaching and reading its counts, is `kernel::stacks`.)
//! - `aggregate`: pure aggregation into a `StackGrowthSummary` (serde);
//!   `render`: its text for people.
//! - `recommend`: the starting-stack recommendation.
//! - `symbolize`: what aggregation needs of code (the process image's frames
//!   and frame sizes, from `image::frames`).
//! - `goroutines`: the peak goroutine count of a live process, read only
//!   where `resident` (its pagemap) says the pages are in memory.

pub mod aggregate;
pub mod goroutines;
pub mod recommend;
mod render;
pub mod symbolize;

pub use aggregate::{SiteSummary, StackGrowthAggregator, StackGrowthSummary};
pub use recommend::Recommendation;
pub use symbolize::{NoSymbols, Symbolizer};

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
