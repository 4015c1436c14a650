//! A pause's duration split into named parts that add up to it. The pause
//! is `[start, end)` as Go counts it, stopping until Go's
//! `finishedStopping`, stopped after:
//!
//! - stopping: the world waits for its last thread to stop (the critical
//!   laggard: the one that left the CPU last). From the start until it
//!   stopped, its own time says why: `stopping_on_cpu_ns` (running code
//!   that reached no safe point), `stopping_fault_ns` (blocked in a major
//!   fault), `stopping_runnable_ns` (preempted or throttled, waiting for a
//!   CPU), `stopping_blocked_ns` (asleep otherwise), with its time inside
//!   faults counted as faults the same way as below. From then until the end
//!   of stopping, the stopping thread's reaction: its wait for a CPU after
//!   being woken (`off_cpu_runnable_ns`) and its running (`on_cpu_ns`).
//!   With no laggard seen, the stopping thread's own time: runnable and
//!   running as above, its sleep (waiting on threads gostw did not see) is
//!   `unexplained_ns`.
//! - stopped: the stopping thread alone: `faults_ns` (inside its major
//!   faults, begin to end: exact, from the fault events),
//!   `off_cpu_blocked_ns` (blocked outside them), `off_cpu_runnable_ns`
//!   (waiting for a CPU: preempted, CFS-throttled, woken but not running;
//!   runnable time that fits inside the faults is taken as theirs),
//!   `on_cpu_ns` (running: no off-CPU interval covers it; the scheduler
//!   programs see every switch of that thread while they are attached).
//!
//! Time in the kernel whose kernel stack says it waited for (or spun on)
//! the address space's lock, was in reclaim, in gostw's own probe, or
//! (running, sampled) in the page-fault path (`model::kernel_wait`) is
//! named `mmap_lock_ns`, `reclaim_ns`, `probe_ns` or `minor_faults_ns`
//! instead, taken out of the running part it was in (`stopping_on_cpu_ns`,
//! `on_cpu_ns`) or taken out of the blocked part it was in (the
//! laggard's `stopping_blocked_ns`, the stopping thread's
//! `off_cpu_blocked_ns` or `unexplained_ns`).
//!
//! Other threads' faults of the stopped and restarting phases are not
//! parts: the stopping thread did not wait for them.

use serde::Serialize;

/// The parts' names: the JSON field names without `_ns`.
pub const PARTS: [&str; 13] = [
    "stopping_on_cpu",
    "stopping_fault",
    "stopping_runnable",
    "stopping_blocked",
    "faults",
    "off_cpu_runnable",
    "off_cpu_blocked",
    "mmap_lock",
    "reclaim",
    "probe",
    "minor_faults",
    "on_cpu",
    "unexplained",
];

/// The parts of one pause (ns); they add up to `duration_ns`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Breakdown {
    pub stopping_on_cpu_ns: u64,
    pub stopping_fault_ns: u64,
    pub stopping_runnable_ns: u64,
    pub stopping_blocked_ns: u64,
    pub faults_ns: u64,
    pub off_cpu_runnable_ns: u64,
    pub off_cpu_blocked_ns: u64,
    /// Asleep waiting for the address space's lock, in either phase.
    pub mmap_lock_ns: u64,
    /// Asleep in reclaim, compaction or the `memory.high` throttle.
    pub reclaim_ns: u64,
    /// gostw's own probe asleep in the kernel (`WaitKind::Uprobe`): the
    /// cost of tracing inside the pause.
    pub probe_ns: u64,
    /// Running in the kernel's page-fault path (sampled): zeroing or
    /// copying pages of minor faults, huge pages, NUMA migration.
    pub minor_faults_ns: u64,
    pub on_cpu_ns: u64,
    pub unexplained_ns: u64,
}

impl Breakdown {
    /// The named parts with their JSON names (without the `_ns`), largest
    /// first, zero parts left out.
    pub fn largest(&self) -> Vec<(&'static str, u64)> {
        let mut v: Vec<(&'static str, u64)> =
            self.parts().into_iter().filter(|(_, ns)| *ns > 0).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        v
    }

    /// Every part with its name (`PARTS`), in that order.
    pub fn parts(&self) -> [(&'static str, u64); PARTS.len()] {
        let ns = [
            self.stopping_on_cpu_ns,
            self.stopping_fault_ns,
            self.stopping_runnable_ns,
            self.stopping_blocked_ns,
            self.faults_ns,
            self.off_cpu_runnable_ns,
            self.off_cpu_blocked_ns,
            self.mmap_lock_ns,
            self.reclaim_ns,
            self.probe_ns,
            self.minor_faults_ns,
            self.on_cpu_ns,
            self.unexplained_ns,
        ];
        std::array::from_fn(|i| (PARTS[i], ns[i]))
    }

    /// Sum of the parts (equal to the pause's duration).
    pub fn total_ns(&self) -> u64 {
        self.largest().iter().map(|(_, ns)| ns).sum()
    }

    /// Add `o` part by part (a summary's totals).
    pub fn add(&mut self, o: &Breakdown) {
        self.stopping_on_cpu_ns += o.stopping_on_cpu_ns;
        self.stopping_fault_ns += o.stopping_fault_ns;
        self.stopping_runnable_ns += o.stopping_runnable_ns;
        self.stopping_blocked_ns += o.stopping_blocked_ns;
        self.faults_ns += o.faults_ns;
        self.off_cpu_runnable_ns += o.off_cpu_runnable_ns;
        self.off_cpu_blocked_ns += o.off_cpu_blocked_ns;
        self.mmap_lock_ns += o.mmap_lock_ns;
        self.reclaim_ns += o.reclaim_ns;
        self.probe_ns += o.probe_ns;
        self.minor_faults_ns += o.minor_faults_ns;
        self.on_cpu_ns += o.on_cpu_ns;
        self.unexplained_ns += o.unexplained_ns;
    }

    /// Time spent waiting for a CPU, the laggard's and the stopping thread's.
    pub fn runnable_ns(&self) -> u64 {
        self.stopping_runnable_ns + self.off_cpu_runnable_ns
    }
}
