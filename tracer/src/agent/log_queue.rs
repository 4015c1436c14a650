//! The agent's own log lines (warnings, and with `RUST_LOG=info` a line
//! per process traced) and its few words of its own, through a queue once
//! the agent runs: its standard error is often the same pipe as its
//! standard output (a container's log), and a logger that waits on it
//! would stop the event loop as the pause log did. Before the queue is
//! started (and in every other command) lines go straight to standard
//! error.

use std::{
    io::{self, Write},
    sync::OnceLock,
    time::Instant,
};

use crate::sink::queued::{Bounds, LineQueue, OutputCounters, OutputWatch, RawStderr, Unwritten};

/// What may wait for standard error.
const BOUNDS: Bounds = Bounds {
    lines: 256,
    bytes: 64 << 10,
};

static AGENT: OnceLock<LineQueue> = OnceLock::new();

/// The logger's writer (`env_logger`'s pipe target): one record per
/// write.
pub struct LogWriter(&'static OnceLock<LineQueue>);

impl LogWriter {
    /// The writer of the agent's queue, once `start`ed.
    pub fn agent() -> LogWriter {
        LogWriter(&AGENT)
    }
}

impl Write for LogWriter {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self.0.get() {
            // A full queue is counted there.
            Some(q) => {
                q.try_line(b.to_vec());
            }
            None => io::stderr().write_all(b)?,
        }
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Send the agent's log through a queue from now on, counted in
/// `counters`; its state for health.
pub fn start(counters: OutputCounters) -> io::Result<OutputWatch> {
    start_in(&AGENT, counters)
}

fn start_in(cell: &OnceLock<LineQueue>, counters: OutputCounters) -> io::Result<OutputWatch> {
    if let Some(q) = cell.get() {
        return Ok(q.watch());
    }
    let q = LineQueue::start("log", BOUNDS, RawStderr, counters)?;
    Ok(cell.get_or_init(|| q).watch())
}

/// One line of the agent's own (`say!` without the wait).
pub fn say(line: &str) {
    let mut l = Vec::with_capacity(line.len() + 1);
    l.extend_from_slice(line.as_bytes());
    l.push(b'\n');
    let _ = LogWriter::agent().write(&l);
}

/// Write what is queued until `deadline` (nothing if never started).
pub fn finish(deadline: Instant) -> Unwritten {
    AGENT
        .get()
        .map(|q| q.close_within(deadline))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn log_lines_go_through_the_queue_once_started() {
        let cell: &'static OnceLock<LineQueue> = Box::leak(Box::new(OnceLock::new()));
        let counters = OutputCounters::default();
        let watch = start_in(cell, counters.clone()).unwrap();
        let mut w = LogWriter(cell);
        // Bounded by the queue, never by standard error's reader.
        for _ in 0..3 {
            w.write_all(b"\n").unwrap();
        }
        let u = cell
            .get()
            .unwrap()
            .close_within(Instant::now() + Duration::from_secs(5));
        assert_eq!(u.lines, 0);
        assert_eq!(watch.losses().written, 3);
        assert_eq!(watch.name(), "log");
        // Closed: later lines are counted, not written.
        w.write_all(b"late\n").unwrap();
        assert_eq!(
            counters
                .dropped_for(crate::sink::queued::Reason::QueueFull)
                .get(),
            1
        );
    }
}
