//! What a killed agent may leave behind, checked rather than assumed: the
//! BPF programs, links and maps it held (ids from its /proc/PID/fdinfo
//! while it lived, then looked up with bpftool until the kernel has freed
//! them), perf events still naming one of its programs (`bpftool perf
//! show`), and uprobe breakpoints still written into a traced program's
//! text (its executable mapping read through /proc/PID/mem against the
//! file).

use std::{
    collections::BTreeSet,
    fs,
    os::unix::fs::FileExt as _,
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::cmd::output;

/// BPF objects, by kernel id.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct BpfObjects {
    pub progs: BTreeSet<u64>,
    pub links: BTreeSet<u64>,
    pub maps: BTreeSet<u64>,
}

impl BpfObjects {
    fn is_empty(&self) -> bool {
        self.progs.is_empty() && self.links.is_empty() && self.maps.is_empty()
    }

    fn describe(&self) -> String {
        format!(
            "{} programs {:?}, {} links {:?}, {} maps {:?}",
            self.progs.len(),
            self.progs,
            self.links.len(),
            self.links,
            self.maps.len(),
            self.maps
        )
    }
}

/// The programs, links and maps `pid` holds file descriptors of.
pub fn held_by(pid: u32) -> anyhow::Result<BpfObjects> {
    let mut held = BpfObjects::default();
    let dir = PathBuf::from(format!("/proc/{pid}/fdinfo"));
    for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        // An fd closed meanwhile is simply gone.
        let Ok(info) = fs::read_to_string(entry?.path()) else {
            continue;
        };
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
        };
        if let Some(id) = field("link_id:") {
            held.links.insert(id);
        } else if let Some(id) = field("prog_id:") {
            held.progs.insert(id);
        } else if let Some(id) = field("map_id:") {
            held.maps.insert(id);
        }
    }
    Ok(held)
}

/// The ids `bpftool --json <kind> show` lists.
fn bpftool_ids(kind: &str) -> anyhow::Result<BTreeSet<u64>> {
    let json = output(Command::new("bpftool").args(["--json", kind, "show"]))
        .context("bpftool (apt-get install bpftool)")?;
    let v: serde_json::Value = serde_json::from_str(&json)?;
    Ok(v.as_array()
        .context("bpftool printed no list")?
        .iter()
        .filter_map(|o| o["id"].as_u64())
        .collect())
}

/// Of `held`, what the kernel still has, and the perf events (`bpftool perf
/// show`: every fd of every process with a program attached) naming one of
/// its programs.
fn still_there(held: &BpfObjects) -> anyhow::Result<(BpfObjects, usize)> {
    let left = |kind: &str, ids: &BTreeSet<u64>| -> anyhow::Result<BTreeSet<u64>> {
        Ok(bpftool_ids(kind)?.intersection(ids).copied().collect())
    };
    let objects = BpfObjects {
        progs: left("prog", &held.progs)?,
        links: left("link", &held.links)?,
        maps: left("map", &held.maps)?,
    };
    let perf = output(Command::new("bpftool").args(["--json", "perf", "show"]))?;
    let perf: serde_json::Value = serde_json::from_str(&perf)?;
    let perf_events = perf
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|e| {
                    e["prog_id"]
                        .as_u64()
                        .is_some_and(|p| held.progs.contains(&p))
                })
                .count()
        })
        .unwrap_or(0);
    Ok((objects, perf_events))
}

/// Wait until nothing of `held` is left (the kernel frees a program once
/// its last reference goes, partly after an RCU grace period); fail after
/// `timeout` naming what is left. Returns how long it took.
pub fn wait_freed(held: &BpfObjects, timeout: Duration) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        let (left, perf_events) = still_there(held)?;
        if left.is_empty() && perf_events == 0 {
            return Ok(started.elapsed());
        }
        if started.elapsed() > timeout {
            bail!(
                "{:?} after the agent was killed, still there: {}; perf events naming its programs: {perf_events}",
                timeout,
                left.describe()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Bytes of `pid`'s executable text mapping that differ from the file: a
/// uprobe is an int3 the kernel writes into the traced program's copy of
/// the page, so this is > 0 while probes are attached and 0 once they are
/// all gone.
pub fn patched_text_bytes(pid: u32) -> anyhow::Result<usize> {
    let exe = fs::read_link(format!("/proc/{pid}/exe"))?;
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let file = fs::File::open(&exe)?;
    let mem = fs::File::open(format!("/proc/{pid}/mem"))?;
    let mut differing = 0;
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || !f[1].starts_with("r-x") || exe.as_os_str() != f[5] {
            continue;
        }
        let (start, end) = f[0].split_once('-').context("malformed maps line")?;
        let start = u64::from_str_radix(start, 16)?;
        let end = u64::from_str_radix(end, 16)?;
        let offset = u64::from_str_radix(f[2], 16)?;
        let len = (end - start).min(file.metadata()?.len().saturating_sub(offset)) as usize;
        let mut want = vec![0; len];
        let mut have = vec![0; len];
        file.read_exact_at(&mut want, offset)?;
        mem.read_exact_at(&mut have, start)
            .with_context(|| format!("reading pid {pid}'s text at {start:#x}"))?;
        differing += want.iter().zip(&have).filter(|(a, b)| a != b).count();
    }
    Ok(differing)
}
