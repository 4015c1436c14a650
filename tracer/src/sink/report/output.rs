//! Where and how live records are written: JSON lines or text, each record
//! in one write.

use std::io::Write;

use serde::Serialize;

use super::text::pause_line;
use crate::model::pause::PauseRecord;

/// Where and how live records are written.
pub struct Output {
    pub(super) out: Box<dyn Write>,
    pub(super) json: bool,
    threshold_ns: u64,
    /// The pipe or socket `out` writes to, watched for its reader going away.
    pub watch: Option<std::os::fd::RawFd>,
}

impl Output {
    /// Write to `out`, as JSON lines or text; only pauses of at least
    /// `threshold_ns` are written as they happen.
    pub fn new(out: Box<dyn Write>, json: bool, threshold_ns: u64) -> Output {
        Output {
            out,
            json,
            threshold_ns,
            watch: None,
        }
    }

    pub(super) fn pause(&mut self, p: &PauseRecord) -> std::io::Result<()> {
        if p.duration_ns < self.threshold_ns {
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
        self.out.write_all(line)?;
        self.out.flush()
    }
}
