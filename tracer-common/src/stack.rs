//! Goroutine stack growth: the event a growth sample sends to user space, and
//! the per-site counts the kernel aggregates in `STACK_SITES`.
//!
//! Two sources feed the same types: the exact mode (a uprobe on
//! `runtime.copystack`, which sees every copy with its new size) and the
//! sampled mode (a CPU-clock perf event whose samples land on a thread that
//! is copying a goroutine stack).

use crate::{assert_size, event::EventHeader};

/// Frames kept per sampled event: the function that needed more stack, its
/// caller, then a frame-pointer walk.
pub const STACK_FRAMES: usize = 16;

/// Go's `stackPreempt`: a preemption request, not a growth.
pub const STACK_PREEMPT: u64 = 0xffff_ffff_ffff_fade;
/// Go's `stackForceMove`: a copy to a stack of the same size.
pub const STACK_FORCE_MOVE: u64 = 0xffff_ffff_ffff_feed;
/// Go's `_Gcopystack` goroutine status: its stack is being moved.
pub const G_COPYSTACK: u32 = 8;

/// What a copy did to the stack size.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackChange {
    /// Bigger stack (`newstack` -> `copystack`).
    Grow = 1,
    /// Smaller stack (the GC's `shrinkstack`).
    Shrink = 2,
    /// Same size (`stackForceMove`, debug only).
    Move = 3,
    /// Unknown new size (sampled mode: the thread was caught copying).
    Copying = 4,
}

impl StackChange {
    /// Classify a copy from `old` to `new` bytes.
    pub const fn of(old: u64, new: u64) -> StackChange {
        if new > old {
            StackChange::Grow
        } else if new < old {
            StackChange::Shrink
        } else {
            StackChange::Move
        }
    }

    /// The change of a raw value, if known.
    pub const fn from_u8(v: u8) -> Option<StackChange> {
        match v {
            1 => Some(StackChange::Grow),
            2 => Some(StackChange::Shrink),
            3 => Some(StackChange::Move),
            4 => Some(StackChange::Copying),
            _ => None,
        }
    }
}

/// Which mode observed a growth.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackSource {
    /// The `runtime.copystack` uprobe.
    Exact = 1,
    /// A CPU-clock sample.
    Sampled = 2,
}

/// Key of `STACK_SITES`: one counter per (process, source, change, sizes,
/// call site, caller).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StackSiteKey {
    pub tgid: u32,
    /// A `StackSource`.
    pub source: u8,
    /// A `StackChange`.
    pub change: u8,
    pub _pad: u16,
    /// Stack size before the copy (bytes); Go stacks are at most 1 GB.
    pub old_size: u32,
    /// Stack size after the copy; 0 when unknown (sampled).
    pub new_size: u32,
    /// `curg.sched.pc`: a return address inside the function that needed
    /// more stack (0 for shrinks).
    pub site_pc: u64,
    /// The return address into its caller (0 for shrinks).
    pub caller_pc: u64,
}
assert_size!(StackSiteKey, 32);

/// Value of `STACK_SITES` (per CPU; user space sums).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackSiteCounts {
    /// Copies (exact) or samples (sampled).
    pub count: u64,
    /// Bytes of live stack copied (`old.hi - sched.sp`; exact only).
    pub copied_bytes: u64,
}
assert_size!(StackSiteCounts, 16);

/// Settings user space writes into `STACK_CONFIG[0]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackConfig {
    /// Exact mode: send one full event per this many copies per CPU (0 =
    /// none). Sampled mode sends every growth sample.
    pub exact_event_every: u32,
    pub _pad: u32,
}
assert_size!(StackConfig, 8);

impl Default for StackConfig {
    fn default() -> Self {
        StackConfig {
            exact_event_every: 64,
            _pad: 0,
        }
    }
}

/// A sampled stack copy with its goroutine stack (`EventKind::StackGrowth`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackGrowthEvent {
    pub header: EventHeader,
    /// A `StackSource`.
    pub source: u8,
    /// A `StackChange`.
    pub change: u8,
    pub _pad: u16,
    /// Frames filled in `frames`.
    pub nframes: u32,
    pub goid: u64,
    pub old_size: u64,
    /// 0 when unknown (sampled).
    pub new_size: u64,
    /// Bytes of live stack to copy.
    pub used: u64,
    /// `frames[0]` = the function that needed more stack, `frames[1]` = its
    /// caller, then callers found by walking frame pointers.
    pub frames: [u64; STACK_FRAMES],
}
assert_size!(StackGrowthEvent, 24 + 8 + 32 + 8 * STACK_FRAMES);

#[cfg(feature = "user")]
mod user {
    // SAFETY: #[repr(C)] plain integers with explicit padding (sizes asserted
    // above), so any byte pattern is a valid value.
    unsafe impl aya::Pod for super::StackSiteKey {}
    unsafe impl aya::Pod for super::StackSiteCounts {}
    unsafe impl aya::Pod for super::StackConfig {}
    unsafe impl aya::Pod for super::StackGrowthEvent {}
}
