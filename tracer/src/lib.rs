//! gostw's library: Go binary analysis, the tracing core, the engine and its
//! sinks, and the targets the `gostw` binary traces.
//!
//! Data flows one way: `kernel` (probes, ring buffer) -> `engine` (read,
//! decode, correlate) -> `sink` (report, metrics, OTLP). `targets` says
//! which processes are traced; `image` symbolizes for everyone.

// The command line's modules name the library `tracer::`, as the binary does.
extern crate self as tracer;

/// `eprintln!` that cannot fail: when standard error is gone (a closed
/// pipe, `2>&1 | head`), what gostw would say there is said nowhere rather
/// than ending it with a panic.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod agent;
pub mod binary;
pub mod bpf_stats;
pub mod check;
pub mod cli;
pub mod clock;
pub mod engine;
pub mod formats;
pub mod image;
pub mod inspect;
pub mod kernel;
pub mod memory;
pub mod model;
pub mod privilege;
pub mod procfs;
pub mod reference;
pub mod sink;
pub mod stackgrowth;
pub mod targets;
pub mod units;

#[cfg(test)]
mod layering_tests;
