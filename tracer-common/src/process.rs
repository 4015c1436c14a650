//! What the kernel programs know about each traced process, and the per-probe
//! hit counters keyed by process.

use crate::assert_size;

/// Which probe a `PROBE_HITS` entry counts.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// `runtime.stopTheWorldWithSema` entry.
    StopTheWorld = 0,
    /// A RET of `runtime.startTheWorldWithSema`. Not counted (the probe
    /// keeps to one map lookup): every hit of a traced process is a pause
    /// event or a `pause_unmatched` count.
    StartTheWorldRet = 1,
    /// `runtime.copystack` entry (exact stack-growth mode), any copy.
    Copystack = 3,
    /// A CPU-clock sample of a traced process (sampled stack-growth mode).
    CpuSample = 4,
    /// A CPU-clock sample that caught the process copying a goroutine stack.
    StackCopySample = 5,
}

impl Probe {
    /// Every probe (what forgetting a process must clear).
    pub const ALL: [Probe; 5] = [
        Probe::StopTheWorld,
        Probe::StartTheWorldRet,
        Probe::Copystack,
        Probe::CpuSample,
        Probe::StackCopySample,
    ];
}

/// Key of the `PROBE_HITS` map: one counter per (process, probe).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProbeHitKey {
    pub tgid: u32,
    pub probe: u32,
}
assert_size!(ProbeHitKey, 8);

/// Value of the `TRACED` map, keyed by tgid: presence means "trace this
/// process"; the fields tell the probes how to read this process's Go
/// runtime structures (they differ between Go versions).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TracedProcess {
    /// Go version as major*100 + minor (1.22 -> 122).
    pub go_version: u32,
    /// Bit flags, see `TracedProcess::FLAG_*`.
    pub flags: u32,
    /// Offsets (bytes) of the runtime fields the probes read.
    pub offsets: GoOffsets,
    /// What the pause explanation reads of the runtime beyond `offsets`.
    pub explain: ExplainRuntime,
    /// CPU-clock samples that landed in the process (its `Probe::CpuSample`
    /// hits), added by the sampler in the entry it has just read: no second
    /// map lookup per sample. User space inserts 0.
    pub cpu_samples: u64,
}
assert_size!(TracedProcess, 16 + GoOffsets::SIZE + ExplainRuntime::SIZE);

/// Where the runtime keeps its Ms, for the `stopTheWorldWithSema` entry
/// probe to list the threads running goroutines (the possible laggards).
/// Optional: zero / `GoOffsets::UNKNOWN` where the binary does not say.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExplainRuntime {
    /// Link-time address of `runtime.allm` (0: unknown, e.g. stripped).
    pub allm: u64,
    /// Link-time address of `runtime.stopTheWorldWithSema`: the probe's
    /// own address minus this is the load bias (page-aligned).
    pub stop_the_world: u64,
    /// `m.alllink`, `m.p`.
    pub m_alllink: u16,
    pub m_p: u16,
    pub _pad: [u16; 2],
}
assert_size!(ExplainRuntime, ExplainRuntime::SIZE);

impl ExplainRuntime {
    /// Size in bytes.
    pub const SIZE: usize = 24;
}

impl Default for ExplainRuntime {
    fn default() -> Self {
        ExplainRuntime {
            allm: 0,
            stop_the_world: 0,
            m_alllink: GoOffsets::UNKNOWN,
            m_p: GoOffsets::UNKNOWN,
            _pad: [0; 2],
        }
    }
}

impl TracedProcess {
    /// Version-dependent flag: the pause reason is `m.preemptoff` (Go 1.19/1.20),
    /// not the `reason` argument.
    pub const FLAG_REASON_FROM_PREEMPTOFF: u32 = 1 << 0;
    /// The stopping-phase probe (`stw_stopped`) is attached to the
    /// process's executable: its pauses move to the stopped phase when the
    /// last P stops. Set by user space, never read by the kernel.
    pub const FLAG_STOPPED_PROBE: u32 = 1 << 1;
}

/// Byte offsets inside `runtime.g` and `runtime.m` (see GO_RUNTIME.md). A value
/// of `u16::MAX` means "unknown for this binary".
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoOffsets {
    pub g_stack_lo: u16,
    pub g_stack_hi: u16,
    pub g_stackguard0: u16,
    pub g_m: u16,
    pub g_sched_sp: u16,
    pub g_sched_pc: u16,
    pub g_sched_bp: u16,
    pub g_goid: u16,
    pub m_morebuf_pc: u16,
    pub m_procid: u16,
    pub m_curg: u16,
    pub m_preemptoff: u16,
    /// Offset from RSP, at startTheWorldWithSema's RET, of the saved
    /// `w.startedStopping` (Go 1.22+), as a negative distance in bytes.
    pub start_rsp_started_stopping: u16,
    /// `g.atomicstatus` (stack-growth samples check for `_Gcopystack`).
    pub g_atomicstatus: u16,
    /// `m.g0`.
    pub m_g0: u16,
    /// Offset from RSP, at `startTheWorldWithSema`'s calls of
    /// `timeHistogram.record` (Go 1.22+, where the end probe sits then), of
    /// the same saved `w.startedStopping`, as a positive distance; UNKNOWN:
    /// the end probe sits on the RETs. Found in the code by user space, not
    /// in the version tables.
    pub start_call_rsp_started_stopping: u16,
}
assert_size!(GoOffsets, GoOffsets::SIZE);

impl GoOffsets {
    /// Size of the struct in bytes.
    pub const SIZE: usize = 32;
    /// The value of an offset that is not known.
    pub const UNKNOWN: u16 = u16::MAX;
}

impl Default for GoOffsets {
    fn default() -> Self {
        GoOffsets {
            g_stack_lo: Self::UNKNOWN,
            g_stack_hi: Self::UNKNOWN,
            g_stackguard0: Self::UNKNOWN,
            g_m: Self::UNKNOWN,
            g_sched_sp: Self::UNKNOWN,
            g_sched_pc: Self::UNKNOWN,
            g_sched_bp: Self::UNKNOWN,
            g_goid: Self::UNKNOWN,
            m_morebuf_pc: Self::UNKNOWN,
            m_procid: Self::UNKNOWN,
            m_curg: Self::UNKNOWN,
            m_preemptoff: Self::UNKNOWN,
            start_rsp_started_stopping: Self::UNKNOWN,
            g_atomicstatus: Self::UNKNOWN,
            m_g0: Self::UNKNOWN,
            start_call_rsp_started_stopping: Self::UNKNOWN,
        }
    }
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: all four are #[repr(C)] plain integers with no implicit padding
    // (sizes asserted above), so any byte pattern is a valid value.
    unsafe impl aya::Pod for super::ProbeHitKey {}
    unsafe impl aya::Pod for super::TracedProcess {}
    unsafe impl aya::Pod for super::GoOffsets {}
    unsafe impl aya::Pod for super::ExplainRuntime {}
}

/// Processes traced at once, at most. The maps keyed by traced process
/// (`TRACED`, `PAUSE_WINDOWS`, `PAUSE_DETAILS`) are filled only by user
/// space, so they are not preallocated: their entries come from the slab
/// (the kernel's direct map, huge pages) rather than one vmalloc'd area of
/// 4 KiB pages, and their bucket arrays (16 bytes a bucket) stay within the
/// 32 KiB the kernel allocates the same way. A probe that fires once a pause
/// finds them cold: that cut `stw_stop` from 3.2-3.7 us to 2.4-2.7 us a hit
/// on the allocation-heavy bench (4 096 entries, not preallocated: 2.8-3.0).
pub const MAX_TRACED: u32 = 2048;
