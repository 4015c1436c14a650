//! The front ends' ends of the one stream: every output gostw makes is a
//! `Sink` of `model::observed::Observed`.
//!
//! - `report`: live lines and the summary, as text or JSON (attach, run,
//!   faults, stacks).
//! - `metrics`: the agent's Prometheus metrics.
//! - `profile`: pprof profiles of faults and stack growth (`--pprof`, the
//!   agent's `/debug/pprof/*`).
//! - `timeline`: the trace-event timeline (`--timeline`).
//! - `slow_pauses`: the agent's record of every slow pause
//!   (`/debug/pauses`), and `pause_log` the JSON lines it writes of them.

pub mod file;
pub mod metrics;
pub mod otlp;
pub mod pause_log;
pub mod profile;
pub mod report;
pub mod slow_pauses;
pub mod timeline;

/// Defined beside the stream it consumes, so the engine, below the sinks,
/// can feed one.
pub use crate::model::observed::Sink;

#[cfg(test)]
mod recorded_tests;

#[cfg(test)]
pub mod tests_support {
    use std::{
        io::{self, Write},
        sync::{Arc, Mutex},
    };

    /// A `Write` whose bytes a test reads afterwards (a sink's output).
    #[derive(Clone, Default)]
    pub struct Captured(pub Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        pub fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }
}
