//! What one metric update is made of: the parts of a pause, a fault or a
//! stack-growth sample that the Prometheus series record.

use crate::model::fault::FaultKind;

/// One stop-the-world pause that ended.
#[derive(Clone, Debug, PartialEq)]
pub struct PauseObservation {
    /// Stable snake_case `stwReason` identifier (a fixed table, so a bounded
    /// label), e.g. "gc_mark_termination".
    pub reason: &'static str,
    /// The pause as Go counts it where the version allows it, else the probe
    /// window.
    pub duration_ns: u64,
    /// Major page faults that began inside the pause (any thread).
    pub major_faults: u32,
    /// The id of its slow-pause record, if it has one: the exemplar of its
    /// duration bucket.
    pub record_id: Option<String>,
}

/// Whose read a faulting thread waited on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitedOn {
    /// This thread issued the read itself.
    Own,
    /// Another thread's read, or a page lock it held.
    Other,
}

/// The `waited_on` label value.
pub fn waited_label(w: WaitedOn) -> &'static str {
    match w {
        WaitedOn::Own => "own",
        WaitedOn::Other => "other",
    }
}

/// One major page fault that ended.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaultObservation {
    /// The fault began inside a stop-the-world pause of its process.
    pub in_pause: bool,
    pub backing: FaultKind,
    /// Time blocked inside the fault.
    pub wait_ns: u64,
    pub waited_on: WaitedOn,
}

/// One CPU sample that caught a thread copying a goroutine stack (the
/// sampled stack-growth mode: each stands for one sample period of CPU time,
/// not for one growth).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StackGrowthObservation {
    /// The goroutine's stack size when sampled: the size before the growth
    /// until `copystack` switches the goroutine to its new stack, the new
    /// size in the short rest of the copy.
    pub old_size: u64,
    /// Live bytes of the stack being copied (what `copystack` moves).
    pub live_bytes: u64,
}
