//! The records every stage shares, at the bottom of the library: a pause,
//! a fault, what the engine observed, what was lost, why a process could
//! not be traced, the process as sinks name it. The kernel side and the
//! targets produce them; the engine assembles them; every sink and front
//! end reads them. Below it are only the readers whose results it carries
//! (binary and image analysis, memory exposure, stack growth) and the
//! clocks (`crate::clock`); `layering_tests` holds every module of the
//! crate to its layer.
//!
//! - `pause`: a stop-the-world pause's record and Go's reasons;
//! - `laggard`, `breakdown`: what in a pause kept the world waiting, and its
//!   duration in named parts;
//! - `kernel_wait`: where in the kernel the threads that mattered slept;
//! - `fault`: a major fault, its sites and its totals by pause phase;
//! - `code`: the frames at stack-growth return addresses, symbolized once;
//! - `observed`: the one stream the engine emits, and the process it names;
//! - `labels`: a process's bounded series labels;
//! - `backend`: the fault backend a trace uses and why;
//! - `losses`: events that reached user space and produced nothing;
//! - `throttling`: CPU-cgroup throttling while a process was traced;

pub mod backend;
pub mod breakdown;
pub mod code;
pub mod fault;
pub mod kernel_wait;
pub mod labels;
pub mod laggard;
pub mod losses;
pub mod observed;
pub mod pause;
pub mod throttling;
