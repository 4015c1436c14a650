//! The interface between the tracing pipeline and the agent: what was
//! observed, and in which process. The pipeline knows pids; the agent maps
//! each pid to the labels of its executable (see `Agent::observer`).

/// One stop-the-world pause that ended.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PauseObservation {
    /// Stable snake_case `stwReason` identifier (a fixed table, so a bounded
    /// label), e.g. "gc_mark_termination".
    pub reason: &'static str,
    /// The pause as Go counts it where the version allows it, else the probe
    /// window.
    pub duration_ns: u64,
    /// Major page faults that began inside the pause (any thread).
    pub major_faults: u32,
}

/// Whose read a faulting thread waited on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitedOn {
    /// This thread issued the read itself.
    Own,
    /// Another thread's read, or a page lock it held.
    Other,
}

/// What backed the faulted page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backing {
    Swap,
    File,
}

/// One major page fault that ended.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaultObservation {
    /// The fault began inside a stop-the-world pause of its process.
    pub in_pause: bool,
    pub backing: Backing,
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

/// CPU samples of a traced process, counted in the kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuSamples {
    /// All samples that landed in the process.
    pub all: u64,
    /// Those that caught it copying a goroutine stack.
    pub stack_growth: u64,
}

/// The sink the pipeline feeds. `pid` is the traced process (tgid).
pub trait Observer {
    fn pause(&mut self, pid: u32, pause: &PauseObservation);
    fn fault(&mut self, pid: u32, fault: &FaultObservation);
    fn stack_growth(&mut self, pid: u32, growth: &StackGrowthObservation);
    /// `n` more `stopTheWorldWithSema` entries counted in the kernel (the
    /// probe-hit map; independent of event delivery).
    fn stop_the_world_entries(&mut self, pid: u32, n: u64);
}
