//! The agent's pause log: one JSON line per slow-pause record, on stdout
//! (journald, `kubectl logs`) or in a file that is rotated at a size cap
//! (`PATH` -> `PATH.1`, one old file kept), so the records outlive the
//! agent. Under a storm of slow pauses at most `per_second` lines are
//! written each second; the rest are counted by the caller, never silent.

use std::{
    fs::{File, OpenOptions},
    io::Write as _,
    path::PathBuf,
    time::Instant,
};

use serde::Serialize;

/// Where the lines go.
pub enum LogTarget {
    Stdout,
    File {
        path: PathBuf,
        max_bytes: u64,
        file: File,
        written: u64,
    },
}

pub struct PauseLog {
    target: LogTarget,
    /// A write failed (e.g. stdout's reader went away): the log is off,
    /// said once, and what is not written is counted.
    failed: bool,
    per_second: u32,
    second: Option<Instant>,
    this_second: u32,
}

impl PauseLog {
    pub fn stdout(per_second: u32) -> PauseLog {
        PauseLog::with(LogTarget::Stdout, per_second)
    }

    /// Append to `path` (created if missing), rotated at `max_bytes`.
    pub fn file(path: PathBuf, max_bytes: u64, per_second: u32) -> anyhow::Result<PauseLog> {
        let file = open(&path)?;
        let written = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(PauseLog::with(
            LogTarget::File {
                path,
                max_bytes,
                file,
                written,
            },
            per_second,
        ))
    }

    fn with(target: LogTarget, per_second: u32) -> PauseLog {
        PauseLog {
            target,
            failed: false,
            per_second,
            second: None,
            this_second: 0,
        }
    }

    /// Write `record` as one line; false if it was not written (the rate
    /// limit, or a write error, which is logged once and ends the log).
    pub fn write(&mut self, record: &impl Serialize) -> bool {
        self.write_at(record, Instant::now())
    }

    fn write_at(&mut self, record: &impl Serialize, now: Instant) -> bool {
        if self.failed {
            return false;
        }
        match self.second {
            Some(s) if now.duration_since(s).as_secs() < 1 => {}
            _ => {
                self.second = Some(now);
                self.this_second = 0;
            }
        }
        if self.this_second >= self.per_second {
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
        match self.append(&line) {
            Ok(()) => true,
            Err(e) => {
                log::warn!("the pause log is off: {e:#}; records stay in /debug/pauses");
                self.failed = true;
                false
            }
        }
    }

    fn append(&mut self, line: &[u8]) -> anyhow::Result<()> {
        match &mut self.target {
            LogTarget::Stdout => {
                // One write per line: a pipe keeps it whole.
                let mut out = std::io::stdout().lock();
                out.write_all(line)?;
                out.flush()?;
            }
            LogTarget::File {
                path,
                max_bytes,
                file,
                written,
            } => {
                if *written > 0 && *written + line.len() as u64 > *max_bytes {
                    let mut old = path.clone().into_os_string();
                    old.push(".1");
                    std::fs::rename(&*path, &old)?;
                    *file = open(path)?;
                    *written = 0;
                }
                file.write_all(line)?;
                *written += line.len() as u64;
            }
        }
        Ok(())
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

    #[test]
    fn the_file_rotates_at_its_cap_and_keeps_one_old_file() {
        let dir = std::env::temp_dir().join(format!("gostw-pause-log-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pauses.jsonl");
        // Each line is {"n":N}\n: 8 bytes; a cap of 20 holds two.
        let mut log = PauseLog::file(path.clone(), 20, 1000).unwrap();
        for n in 0..5 {
            assert!(log.write(&serde_json::json!({ "n": n })));
        }
        let now = std::fs::read_to_string(&path).unwrap();
        let old = std::fs::read_to_string(dir.join("pauses.jsonl.1")).unwrap();
        assert_eq!(now, "{\"n\":4}\n");
        assert_eq!(old, "{\"n\":2}\n{\"n\":3}\n");
        // Reopened, it appends and counts what is there.
        let mut log = PauseLog::file(path.clone(), 20, 1000).unwrap();
        assert!(log.write(&serde_json::json!({ "n": 5 })));
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
        let mut log = PauseLog::file(path.clone(), 1 << 20, 3).unwrap();
        let t0 = Instant::now();
        let written = (0..10)
            .filter(|&n| log.write_at(&n, t0 + Duration::from_millis(n * 10)))
            .count();
        assert_eq!(written, 3);
        assert!(log.write_at(&99, t0 + Duration::from_millis(1200)));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "0\n1\n2\n99\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
