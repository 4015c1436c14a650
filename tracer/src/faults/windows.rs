//! Pause windows for fault correlation until the pauses pipeline's records
//! are wired in: tracefs uprobe events (not eBPF) on
//! `runtime.stopTheWorldWithSema` entry and the RETs of
//! `runtime.startTheWorldWithSema`, in a private tracefs instance with the
//! CLOCK_MONOTONIC trace clock (the clock of `bpf_ktime_get_ns`), read back at
//! the end. Timestamps have microsecond resolution.

use std::{
    collections::HashMap,
    fs::{self, OpenOptions},
    io::Write as _,
    path::PathBuf,
};

use anyhow::Context as _;

use super::{backend::ensure_tracefs, correlate::PauseWindow};
use crate::binary::{GoBinary, START_THE_WORLD, STOP_THE_WORLD};

/// Uprobe events of one Go binary, recorded in their own tracefs instance.
pub struct UprobePauseWindows {
    tracefs: PathBuf,
    group: String,
    events: Vec<String>,
    instance: PathBuf,
}

impl UprobePauseWindows {
    /// Add the uprobe events for `binary` and start recording.
    pub fn attach(binary: &GoBinary) -> anyhow::Result<Self> {
        let tracefs = ensure_tracefs()?.to_owned();
        // Unique per gostw process and binary.
        let group = format!("gostwf{}_{}", std::process::id(), unique());
        let mut me = UprobePauseWindows {
            instance: tracefs.join("instances").join(&group),
            tracefs,
            group,
            events: Vec::new(),
        };
        let stop = binary.function(STOP_THE_WORLD)?;
        let start = binary.function(START_THE_WORLD)?;
        let path = binary.path.display().to_string();
        me.add_event("stop", &path, stop.file_offset)?;
        for (i, off) in start.ret_file_offsets.iter().enumerate() {
            me.add_event(&format!("start_ret{i}"), &path, *off)?;
        }
        fs::create_dir(&me.instance)
            .with_context(|| format!("creating tracefs instance {}", me.instance.display()))?;
        fs::write(me.instance.join("trace_clock"), "mono").context("setting trace_clock mono")?;
        fs::write(me.instance.join("buffer_size_kb"), "4096").ok();
        fs::write(
            me.instance.join("events").join(&me.group).join("enable"),
            "1",
        )
        .context("enabling the pause uprobe events")?;
        Ok(me)
    }

    fn add_event(&mut self, name: &str, path: &str, offset: u64) -> anyhow::Result<()> {
        let mut f = OpenOptions::new()
            .append(true)
            .open(self.tracefs.join("uprobe_events"))
            .context("opening uprobe_events")?;
        // One write(2) per definition: tracefs parses each write on its own.
        f.write_all(format!("p:{}/{name} {path}:{offset:#x}\n", self.group).as_bytes())
            .with_context(|| format!("adding uprobe event {name} at {path}:{offset:#x}"))?;
        self.events.push(name.to_owned());
        Ok(())
    }

    /// Pause windows recorded so far, attributed to process `tgid`.
    pub fn windows(&self, tgid: u32) -> anyhow::Result<Vec<PauseWindow>> {
        let text = fs::read_to_string(self.instance.join("trace")).context("reading the trace")?;
        Ok(parse_windows(&text, tgid))
    }
}

impl Drop for UprobePauseWindows {
    fn drop(&mut self) {
        let _ = fs::write(
            self.instance
                .join("events")
                .join(&self.group)
                .join("enable"),
            "0",
        );
        let _ = fs::remove_dir(&self.instance);
        if let Ok(mut f) = OpenOptions::new()
            .append(true)
            .open(self.tracefs.join("uprobe_events"))
        {
            for e in &self.events {
                let _ = f.write_all(format!("-:{}/{e}\n", self.group).as_bytes());
            }
        }
    }
}

fn unique() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Pair each thread's `stop` with its next `start_ret*` (Go stops and starts
/// the world on the same thread: nothing else runs in between).
fn parse_windows(trace: &str, tgid: u32) -> Vec<PauseWindow> {
    let mut open: HashMap<u32, u64> = HashMap::new();
    let mut out = Vec::new();
    for line in trace.lines().filter(|l| !l.starts_with('#')) {
        let toks: Vec<&str> = line.split_whitespace().collect();
        let Some(cpu_at) = toks
            .iter()
            .position(|t| t.starts_with('[') && t.ends_with(']'))
        else {
            continue;
        };
        let Some(tid) = cpu_at
            .checked_sub(1)
            .and_then(|i| toks[i].rsplit_once('-'))
            .and_then(|(_, p)| p.parse::<u32>().ok())
        else {
            continue;
        };
        let Some((ts_at, ts)) = toks.iter().enumerate().skip(cpu_at).find_map(|(i, t)| {
            let v = t.strip_suffix(':')?;
            let (s, us) = v.split_once('.')?;
            Some((
                i,
                s.parse::<u64>().ok()? * 1_000_000_000 + us.parse::<u64>().ok()? * 1_000,
            ))
        }) else {
            continue;
        };
        let Some(event) = toks.get(ts_at + 1).and_then(|t| t.strip_suffix(':')) else {
            continue;
        };
        if event == "stop" {
            open.insert(tid, ts);
        } else if event.starts_with("start_ret")
            && let Some(start) = open.remove(&tid)
        {
            out.push(PauseWindow {
                tgid,
                stopper_tid: tid,
                start_ns: start,
                end_ns: ts,
            });
        }
    }
    out.sort_by_key(|w| w.start_ns);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_stop_and_start_per_thread() {
        let trace = "\
# tracer: nop
#
     my-prog-1234    [001] d....  100.000010: stop: (0x46a3e0)
           x-1235    [000] d....  100.000020: stop: (0x46a3e0)
     my-prog-1234    [001] d....  100.002010: start_ret0: (0x46a8f1)
           x-1235    [000] d....  100.000070: start_ret1: (0x46a8f1)
           x-1236    [000] d....  100.000080: start_ret0: (0x46a8f1)
";
        let w = parse_windows(trace, 7);
        assert_eq!(
            w,
            vec![
                PauseWindow {
                    tgid: 7,
                    stopper_tid: 1234,
                    start_ns: 100_000_010_000,
                    end_ns: 100_002_010_000
                },
                PauseWindow {
                    tgid: 7,
                    stopper_tid: 1235,
                    start_ns: 100_000_020_000,
                    end_ns: 100_000_070_000
                },
            ]
        );
    }
}
