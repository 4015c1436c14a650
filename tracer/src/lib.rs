//! gostw's library: Go binary analysis, the tracing core, the engine and its
//! sinks, and the targets the `gostw` binary traces.
//!
//! Data flows one way: `kernel` (probes, ring buffer) -> `engine` (read,
//! decode, correlate) -> `sink` (report, metrics). `target` says which
//! processes are traced; `image` symbolizes for everyone.

pub mod agent;
pub mod binary;
pub mod bpf_stats;
pub mod check;
pub mod engine;
pub mod formats;
pub mod image;
pub mod inspect;
pub mod kernel;
pub mod memory;
pub mod privilege;
pub mod sink;
pub mod stackgrowth;
pub mod targets;
pub mod units;
