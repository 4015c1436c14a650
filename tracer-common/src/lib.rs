//! Types shared by gostw's kernel programs (`tracer-ebpf`) and its user-space
//! side (`tracer`). Everything here is `#[repr(C)]` with explicit padding so
//! both sides agree on the layout byte for byte; sizes are checked at compile
//! time.
#![no_std]

pub mod compat;
pub mod counters;
pub mod event;
pub mod explain;
pub mod fault;
pub mod pause;
pub mod process;
pub mod stack;

/// Names of the maps the kernel programs define, so user space looks them up
/// by the same spelling.
pub mod map_names {
    pub const TRACED: &str = "TRACED";
    pub const EVENTS: &str = "EVENTS";
    pub const PAUSE_EVENTS: &str = "PAUSE_EVENTS";
    pub const FAULT_COUNTS: &str = "FAULT_COUNTS";
    pub const COUNTERS: &str = "COUNTERS";
    pub const PROBE_HITS: &str = "PROBE_HITS";
    pub const PAUSE_WINDOWS: &str = "PAUSE_WINDOWS";
    pub const STACK_SITES: &str = "STACK_SITES";
    pub const STACK_CONFIG: &str = "STACK_CONFIG";
    pub const PAUSE_DETAILS: &str = "PAUSE_DETAILS";
    pub const PAUSE_THREADS: &str = "PAUSE_THREADS";
    pub const PAUSE_STACKS: &str = "PAUSE_STACKS";
}

/// Names of the programs of the pause and stack-growth families (the fault
/// backends' are in `fault::programs`), as the kernel object spells them.
pub mod program_names {
    /// `runtime.stopTheWorldWithSema` entry.
    pub const STW_STOP: &str = "stw_stop";
    /// Each RET of `runtime.startTheWorldWithSema`.
    pub const STW_START_RET: &str = "stw_start_ret";
    /// Each RET of `runtime.stopTheWorldWithSema` (Go 1.23+: the stopping
    /// phase; inside the pause, so only when asked for).
    pub const STW_STOPPED: &str = "stw_stopped";
    /// `runtime.copystack` entry (exact stack growth).
    pub const STACK_COPY: &str = "stack_copy";
    /// The CPU-clock sampler (sampled stack growth).
    pub const STACK_SAMPLE: &str = "stack_sample";
}

/// Compile-time size check for a type that crosses the kernel/user boundary.
#[macro_export]
macro_rules! assert_size {
    ($t:ty, $n:expr) => {
        const _: () = assert!(core::mem::size_of::<$t>() == $n);
    };
}
