//! Where and how live records are written: JSON lines or text, each record
//! in one write. On standard output they go through a queue (`queued`):
//! a reader that does not keep up costs lines, counted and said at the
//! end, never the trace.

use std::{io::Write, time::Duration};

use serde::Serialize;

use super::text::pause_line;
use crate::{
    model::pause::{PauseRecord, SlowThreshold},
    sink::queued::{LineQueue, Losses, OutputWatch, Unwritten},
};

/// How long the end of the trace waits for a reader that writes nothing
/// more before it gives up on the lines still queued.
pub const END_STALL: Duration = Duration::from_secs(2);

/// Where and how live records are written.
pub struct Output {
    pub(super) out: Box<dyn Write>,
    /// Live lines and the last words go through this queue instead of
    /// `out`, until it is finished.
    queue: Option<LineQueue>,
    /// The queue's state, kept after it is finished.
    queued: Option<(OutputWatch, Unwritten)>,
    pub(super) json: bool,
    slow: SlowThreshold,
    /// The pipe or socket `out` writes to, watched for its reader going away.
    pub watch: Option<std::os::fd::RawFd>,
}

impl Output {
    /// Write to `out`, as JSON lines or text; only `slow` pauses are
    /// written as they happen.
    pub fn new(out: Box<dyn Write>, json: bool, slow: SlowThreshold) -> Output {
        Output {
            out,
            queue: None,
            queued: None,
            json,
            slow,
            watch: None,
        }
    }

    /// Write through `queue` (standard output, whose reader may be slow).
    pub fn queued(queue: LineQueue, json: bool, slow: SlowThreshold) -> Output {
        let watch = queue.watch();
        Output {
            queue: Some(queue),
            queued: Some((watch, Unwritten::default())),
            ..Output::new(Box::new(std::io::sink()), json, slow)
        }
    }

    /// Write to `out` from now on, directly (the queue's reader is gone).
    pub(super) fn direct(&mut self, out: Box<dyn Write>) {
        self.queue = None;
        self.out = out;
        self.watch = None;
    }

    /// Lines the queue could not write so far, and what the end left.
    pub fn losses(&self) -> Option<(Losses, Unwritten)> {
        self.queued.as_ref().map(|(w, u)| (w.losses(), *u))
    }

    /// The first error the queue's writes met, since the last call.
    pub(super) fn take_error(&mut self) -> Option<std::io::Error> {
        self.queue.as_ref().and_then(LineQueue::take_error)
    }

    pub(super) fn pause(&mut self, p: &PauseRecord) -> std::io::Result<()> {
        if !self.slow.is_slow(p.duration_ns) {
            return Ok(());
        }
        if self.json {
            #[derive(Serialize)]
            struct Tagged<'a> {
                #[serde(rename = "type")]
                kind: &'static str,
                #[serde(flatten)]
                record: &'a PauseRecord,
            }
            self.json_line(&Tagged {
                kind: "pause",
                record: p,
            })
        } else {
            let mut line = pause_line(p).into_bytes();
            line.push(b'\n');
            self.write_line(&line)
        }
    }

    pub(super) fn json_line(&mut self, v: &impl Serialize) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(v)?;
        line.push(b'\n');
        self.write_line(&line)
    }

    /// One record, newline included, in one write: `run` shares its stdout
    /// with the traced program, whose output must not land inside a line
    /// (stdout's line buffer of 1 KiB would write a longer line in pieces;
    /// a pipe keeps a write of up to 4 KiB whole).
    pub(super) fn write_line(&mut self, line: &[u8]) -> std::io::Result<()> {
        if let Some(q) = &self.queue {
            // A full queue is counted there; the trace goes on.
            q.try_line(line.to_vec());
            return Ok(());
        }
        self.out.write_all(line)?;
        self.out.flush()
    }

    /// The last words (the summary), after every line: a queue is
    /// finished with them, waiting while its reader reads.
    pub(super) fn write_last(&mut self, text: &[u8]) -> std::io::Result<()> {
        let Some(q) = self.queue.take() else {
            self.out.write_all(text)?;
            return self.out.flush();
        };
        let error = q.take_error();
        let unwritten = q.finish_after(text.to_vec(), END_STALL);
        if let Some((_, u)) = &mut self.queued {
            *u = unwritten;
        }
        match error.or_else(|| self.queued.as_ref()?.0.take_error()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
