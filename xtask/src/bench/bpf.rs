//! The kernel's own accounting of BPF programs, for benchmarks: run-time
//! statistics enabled for as long as a `Stats` lives (the `BPF_ENABLE_STATS`
//! fd), and the run count / run time of every program a process holds open,
//! read from `/proc/PID/fdinfo` (no tool started in the middle of a timed
//! run).

use std::{
    collections::HashMap,
    fs,
    os::fd::{FromRawFd as _, OwnedFd},
};

use anyhow::bail;

const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_ENABLE_STATS: libc::c_long = 32;
const BPF_STATS_RUN_TIME: u32 = 0;
/// `BPF_PROG_TYPE_KPROBE`: kprobes and uprobes.
pub const PROG_TYPE_KPROBE: u32 = 2;

/// `bpf(cmd, attr, size)` with a zero-padded attribute block.
fn bpf(cmd: libc::c_long, attr: &mut [u64; 16]) -> std::io::Result<i32> {
    // SAFETY: attr is a valid, writable buffer of the size passed; the
    // kernel reads (and for some commands writes) at most that much.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(attr) as u32,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r as i32)
    }
}

/// BPF run-time statistics, on while this lives.
pub struct Stats(#[allow(dead_code, reason = "held for its lifetime")] OwnedFd);

impl Stats {
    pub fn enable() -> anyhow::Result<Stats> {
        let mut attr = [0u64; 16];
        attr[0] = u64::from(BPF_STATS_RUN_TIME);
        match bpf(BPF_ENABLE_STATS, &mut attr) {
            // SAFETY: a new fd the kernel just returned to us.
            Ok(fd) => Ok(Stats(unsafe { OwnedFd::from_raw_fd(fd) })),
            Err(e) => bail!("BPF_ENABLE_STATS failed (needs root, Linux 5.8+): {e}"),
        }
    }
}

/// One program's counters at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProgStat {
    pub name: String,
    pub prog_type: u32,
    pub runs: u64,
    pub run_ns: u64,
}

/// gostw's programs whose names the kernel cuts at 15 bytes.
const LONG_NAMES: &[&str] = &[
    "fault_kp_filemap_entry",
    "fault_kp_filemap_ret",
    "fault_kp_lock_entry",
    "fault_kp_lock_ret",
    "fault_kp_swap_entry",
    "fault_kp_swap_read",
    "fault_kp_swap_ret",
    "fault_perf_major",
    "fault_tp_bio_queue",
    "fault_tp_filemap",
];

/// The full name of a gostw program from the kernel's cut one.
fn full_name(kernel: String) -> String {
    match LONG_NAMES
        .iter()
        .find(|n| n.starts_with(&kernel) && kernel.len() == 15)
    {
        Some(n) => (*n).to_owned(),
        None => kernel,
    }
}

/// The kernel's name of program `id` (at most 15 bytes).
fn prog_name(id: u32) -> Option<String> {
    let mut attr = [0u64; 16];
    attr[0] = u64::from(id);
    // SAFETY: a new fd the kernel just returned to us.
    let fd = unsafe { OwnedFd::from_raw_fd(bpf(BPF_PROG_GET_FD_BY_ID, &mut attr).ok()?) };
    use std::os::fd::AsRawFd as _;
    // struct bpf_prog_info up to `name` (offset 64, 16 bytes), which has
    // been there since Linux 4.15.
    let mut info = [0u8; 80];
    let mut attr = [0u64; 16];
    attr[0] = fd.as_raw_fd() as u64 | ((info.len() as u64) << 32);
    attr[1] = info.as_mut_ptr() as u64;
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).ok()?;
    let name = &info[64..80];
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Some(String::from_utf8_lossy(&name[..end]).into_owned())
}

/// The fields of a program fd's fdinfo text this module reads.
fn parse_fdinfo(text: &str) -> Option<(u32, u32, u64, u64)> {
    let get = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse::<u64>().ok())
    };
    Some((
        get("prog_id:")? as u32,
        get("prog_type:")? as u32,
        get("run_time_ns:")?,
        get("run_cnt:")?,
    ))
}

/// Programs by id, with their names cached across calls (ids are unique
/// per boot).
#[derive(Default)]
pub struct Reader {
    names: HashMap<u32, String>,
}

impl Reader {
    /// Every BPF program process `pid` holds open, by program id.
    pub fn programs_of(&mut self, pid: u32) -> HashMap<u32, ProgStat> {
        let mut out = HashMap::new();
        let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            return out;
        };
        for fd in fds.filter_map(Result::ok) {
            let is_prog = fs::read_link(fd.path())
                .is_ok_and(|t| t.to_string_lossy() == "anon_inode:bpf-prog");
            if !is_prog {
                continue;
            }
            let info = format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy());
            let Some((id, prog_type, run_ns, runs)) = fs::read_to_string(info)
                .ok()
                .as_deref()
                .and_then(parse_fdinfo)
            else {
                continue;
            };
            let name = self
                .names
                .entry(id)
                .or_insert_with(|| prog_name(id).map_or_else(|| format!("id {id}"), full_name))
                .clone();
            out.insert(
                id,
                ProgStat {
                    name,
                    prog_type,
                    runs,
                    run_ns,
                },
            );
        }
        out
    }
}

/// What ran between two readings, summed by program name (one program
/// attached to several CPUs or offsets is one entry per load, same name).
pub fn window(before: &HashMap<u32, ProgStat>, after: &HashMap<u32, ProgStat>) -> Vec<ProgStat> {
    let mut by_name: HashMap<&str, ProgStat> = HashMap::new();
    for (id, a) in after {
        let b = before.get(id);
        let e = by_name.entry(&a.name).or_insert_with(|| ProgStat {
            name: a.name.clone(),
            prog_type: a.prog_type,
            ..ProgStat::default()
        });
        e.runs += a.runs - b.map_or(0, |b| b.runs.min(a.runs));
        e.run_ns += a.run_ns - b.map_or(0, |b| b.run_ns.min(a.run_ns));
    }
    let mut v: Vec<ProgStat> = by_name.into_values().collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

/// CPU time of every thread of process `pid` so far, in seconds
/// (`/proc/PID/task/*/schedstat`: nanoseconds, where `/proc/PID/stat` counts
/// 10 ms ticks).
pub fn process_cpu_s(pid: u32) -> Option<f64> {
    let tasks = fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let ns: u64 = tasks
        .filter_map(Result::ok)
        .filter_map(|t| {
            let s = fs::read_to_string(t.path().join("schedstat")).ok()?;
            s.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum();
    Some(ns as f64 / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fdinfo_and_subtracts_by_name() {
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nprog_type:\t5\n\
                    prog_jited:\t1\nprog_tag:\t2ec3f7e56feff1e8\nmemlock:\t4096\nprog_id:\t115\n\
                    run_time_ns:\t141541231\nrun_cnt:\t365142\nrecursion_misses:\t0\n";
        assert_eq!(parse_fdinfo(text), Some((115, 5, 141541231, 365142)));
        assert_eq!(parse_fdinfo("pos:\t0\n"), None);
        assert_eq!(full_name("fault_tp_bio_qu".into()), "fault_tp_bio_queue");
        assert_eq!(full_name("fault_tp_user".into()), "fault_tp_user");
        let stat = |name: &str, runs, run_ns| ProgStat {
            name: name.into(),
            prog_type: 5,
            runs,
            run_ns,
        };
        let before = HashMap::from([(1, stat("a", 10, 100)), (2, stat("a", 5, 50))]);
        let after = HashMap::from([
            (1, stat("a", 20, 300)),
            (2, stat("a", 6, 60)),
            (3, stat("b", 4, 40)),
        ]);
        assert_eq!(
            window(&before, &after),
            vec![stat("a", 11, 210), stat("b", 4, 40)]
        );
    }
}
