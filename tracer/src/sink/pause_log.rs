//! The agent's pause log: one JSON line per slow-pause record, on stdout
//! (journald, `kubectl logs`) or in a file that is rotated at a size cap
//! (`PATH` -> `PATH.1`, one old file kept), so the records outlive the
//! agent. Under a storm of slow pauses at most `per_second` lines are
//! written each second; the rest are counted, never silent. The lines are
//! written by a queue's thread (`queued`): a stalled reader or a full disk
//! costs lines, counted, never the event loop's time.

use std::{
    fs::{File, OpenOptions},
    io::{self, Write as _},
    path::PathBuf,
    time::Instant,
};

use serde::Serialize;

use super::queued::{
    Bounds, Destination, LineQueue, OutputCounters, OutputWatch, RawStdout, Reason, Unwritten,
};

/// What may wait for the log's writer: a stalled reader costs at most this
/// much memory, and a burst this long is written late rather than lost.
pub const BOUNDS: Bounds = Bounds {
    lines: 1024,
    bytes: 256 << 10,
};

/// The pause log file, rotated at `max_bytes`, written by the queue's
/// thread. A failed write (a full disk) is cut back to the last whole
/// line and the next line is tried afresh: the log comes back by itself
/// once there is room.
pub struct RotatedFile {
    path: PathBuf,
    max_bytes: u64,
    file: Option<File>,
    /// Bytes in the file: where the last whole line ends.
    written: u64,
    /// A failed write left a part of a line that could not be cut off yet.
    cut_pending: bool,
}

impl RotatedFile {
    /// Append to `path` (created if missing).
    pub fn open(path: PathBuf, max_bytes: u64) -> anyhow::Result<RotatedFile> {
        let file = open(&path)?;
        let written = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(RotatedFile {
            path,
            max_bytes,
            file: Some(file),
            written,
            cut_pending: false,
        })
    }

    fn rotate(&mut self) -> io::Result<()> {
        let mut old = self.path.clone().into_os_string();
        old.push(".1");
        std::fs::rename(&self.path, &old)?;
        self.file = None;
        self.written = 0;
        Ok(())
    }

    /// Cut the file back to its last whole line.
    fn cut(&mut self, file: &File) -> io::Result<()> {
        file.set_len(self.written)?;
        self.cut_pending = false;
        Ok(())
    }
}

impl Destination for RotatedFile {
    fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        if self.written > 0 && self.written + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        let file = match self.file.take() {
            Some(f) => f,
            None => open(&self.path).map_err(io::Error::other)?,
        };
        let result = (|| {
            if self.cut_pending {
                self.cut(&file)?;
            }
            // The file is opened to append: after a cut, writes go on from
            // its new end.
            if let Err(e) = (&file).write_all(line) {
                self.cut_pending = true;
                let _ = self.cut(&file);
                return Err(e);
            }
            self.written += line.len() as u64;
            Ok(())
        })();
        self.file = Some(file);
        result
    }
}

/// The log: its rate limit on the event loop, its writes on a thread.
pub struct PauseLog {
    queue: LineQueue,
    per_second: u32,
    second: Option<Instant>,
    this_second: u32,
}

impl PauseLog {
    /// Lines to standard output.
    pub fn stdout(per_second: u32, counters: OutputCounters) -> anyhow::Result<PauseLog> {
        PauseLog::with(RawStdout, per_second, counters)
    }

    /// Append to `path` (created if missing), rotated at `max_bytes`.
    pub fn file(
        path: PathBuf,
        max_bytes: u64,
        per_second: u32,
        counters: OutputCounters,
    ) -> anyhow::Result<PauseLog> {
        PauseLog::with(RotatedFile::open(path, max_bytes)?, per_second, counters)
    }

    fn with(
        dest: impl Destination,
        per_second: u32,
        counters: OutputCounters,
    ) -> anyhow::Result<PauseLog> {
        let queue = LineQueue::start("pause_log", BOUNDS, dest, counters)
            .map_err(|e| anyhow::anyhow!("starting the pause log's writer: {e}"))?;
        Ok(PauseLog {
            queue,
            per_second,
            second: None,
            this_second: 0,
        })
    }

    /// Hand `record` to the writer as one line; false if it was left out
    /// (the rate limit, or a full queue: counted by the queue).
    pub fn write(&mut self, record: &impl Serialize) -> bool {
        self.write_at(record, Instant::now())
    }

    fn write_at(&mut self, record: &impl Serialize, now: Instant) -> bool {
        match self.second {
            Some(s) if now.duration_since(s).as_secs() < 1 => {}
            _ => {
                self.second = Some(now);
                self.this_second = 0;
            }
        }
        if self.this_second >= self.per_second {
            self.queue.lost(Reason::RateLimit, 1);
            return false;
        }
        self.this_second += 1;
        let mut line = match serde_json::to_vec(record) {
            Ok(l) => l,
            Err(e) => {
                log::warn!("pause log: {e}");
                return false;
            }
        };
        line.push(b'\n');
        self.queue.try_line(line)
    }

    /// The writer's state, for health and metrics.
    pub fn watch(&self) -> OutputWatch {
        self.queue.watch()
    }

    /// Write what is queued until `deadline`.
    pub fn finish(self, deadline: Instant) -> Unwritten {
        self.queue.finish(deadline)
    }
}

fn open(path: &PathBuf) -> anyhow::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| anyhow::anyhow!("cannot open the pause log {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[test]
    fn the_file_rotates_at_its_cap_and_keeps_one_old_file() {
        let dir = std::env::temp_dir().join(format!("gostw-pause-log-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pauses.jsonl");
        // Each line is {"n":N}\n: 8 bytes; a cap of 20 holds two.
        let counters = OutputCounters::default();
        let mut log = PauseLog::file(path.clone(), 20, 1000, counters.clone()).unwrap();
        for n in 0..5 {
            assert!(log.write(&serde_json::json!({ "n": n })));
        }
        assert_eq!(log.finish(soon()).lines, 0);
        assert_eq!(counters.written.get(), 5);
        let now = std::fs::read_to_string(&path).unwrap();
        let old = std::fs::read_to_string(dir.join("pauses.jsonl.1")).unwrap();
        assert_eq!(now, "{\"n\":4}\n");
        assert_eq!(old, "{\"n\":2}\n{\"n\":3}\n");
        // Reopened, it appends and counts what is there.
        let mut log = PauseLog::file(path.clone(), 20, 1000, OutputCounters::default()).unwrap();
        assert!(log.write(&serde_json::json!({ "n": 5 })));
        assert_eq!(log.finish(soon()).lines, 0);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"n\":4}\n{\"n\":5}\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_storm_is_cut_to_the_rate_and_the_next_second_writes_again() {
        let dir = std::env::temp_dir().join(format!("gostw-pause-rate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.jsonl");
        let counters = OutputCounters::default();
        let mut log = PauseLog::file(path.clone(), 1 << 20, 3, counters.clone()).unwrap();
        let t0 = Instant::now();
        let written = (0..10)
            .filter(|&n| log.write_at(&n, t0 + Duration::from_millis(n * 10)))
            .count();
        assert_eq!(written, 3);
        assert!(log.write_at(&99, t0 + Duration::from_millis(1200)));
        assert_eq!(log.watch().losses().rate_limit, 7);
        assert_eq!(log.finish(soon()).lines, 0);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "0\n1\n2\n99\n");
        assert_eq!(counters.dropped_for(Reason::RateLimit).get(), 7);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A device that is always full: each line is an error, counted, and
    /// the log goes on trying.
    #[test]
    fn a_full_device_counts_each_line_as_a_write_error() {
        let counters = OutputCounters::default();
        let mut log = PauseLog::file("/dev/full".into(), 1 << 20, 1000, counters.clone()).unwrap();
        for n in 0..3 {
            assert!(log.write(&n));
        }
        assert_eq!(log.finish(soon()).lines, 0);
        assert_eq!(
            (
                counters.written.get(),
                counters.dropped_for(Reason::WriteError).get()
            ),
            (0, 3)
        );
    }
}
