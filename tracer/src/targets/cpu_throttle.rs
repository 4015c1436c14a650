//! CFS throttling of a traced process's CPU cgroup, read from its
//! `cpu.stat` when it is traced and when it is gone: supporting evidence for
//! pauses whose time went to waiting for a CPU (the per-pause figure is the
//! runnable-not-running time the scheduler programs measure). cgroup v1
//! (`cpu` controller: `nr_throttled`, `throttled_time` in ns) and v2
//! (`nr_throttled`, `throttled_usec`).

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
};

use crate::model::throttling::{CpuThrottling, ThrottleCounts};

/// Where the cgroup hierarchies are mounted.
const ROOT: &str = "/sys/fs/cgroup";

/// The `cpu.stat` file of the CPU cgroup named by `/proc/PID/cgroup`'s text
/// (v1 `cpu` controller line first, else the v2 line), under `root`.
pub fn stat_path(proc_cgroup: &str, root: &Path) -> Option<(String, PathBuf)> {
    let mut v2 = None;
    for line in proc_cgroup.lines() {
        let mut it = line.splitn(3, ':');
        let (_, controllers, path) = (it.next()?, it.next()?, it.next()?);
        if controllers.split(',').any(|c| c == "cpu") {
            for dir in ["cpu", "cpu,cpuacct", "cpuacct,cpu"] {
                let f = root
                    .join(dir)
                    .join(path.trim_start_matches('/'))
                    .join("cpu.stat");
                if f.is_file() {
                    return Some((path.to_owned(), f));
                }
            }
        } else if controllers.is_empty() {
            v2 = Some(path.to_owned());
        }
    }
    let path = v2?;
    let f = root.join(path.trim_start_matches('/')).join("cpu.stat");
    f.is_file().then_some((path, f))
}

/// Parse a `cpu.stat` (v1 or v2).
pub fn parse_stat(text: &str) -> ThrottleCounts {
    let mut c = ThrottleCounts::default();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(k), Some(v)) = (it.next(), it.next().and_then(|v| v.parse::<u64>().ok())) else {
            continue;
        };
        match k {
            "nr_throttled" => c.nr_throttled = v,
            "throttled_time" => c.throttled_ns = v,
            "throttled_usec" => c.throttled_ns = v * 1_000,
            _ => {}
        }
    }
    c
}

/// The traced processes' CPU cgroups and their counters when traced.
#[derive(Default)]
pub struct ThrottleWatch {
    started: HashMap<u32, (String, PathBuf, ThrottleCounts)>,
}

impl ThrottleWatch {
    /// Process `pid` is traced from now on.
    pub fn started(&mut self, pid: u32) {
        let Ok(text) = fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            return;
        };
        if let Some((cgroup, file)) = stat_path(&text, Path::new(ROOT))
            && let Ok(stat) = fs::read_to_string(&file)
        {
            self.started.insert(pid, (cgroup, file, parse_stat(&stat)));
        }
    }

    /// Process `pid` is no longer traced: what its cgroup was throttled
    /// since (absent if the group has no quota or cannot be read).
    pub fn ended(&mut self, pid: u32) -> Option<CpuThrottling> {
        let (cgroup, file, before) = self.started.remove(&pid)?;
        let after = parse_stat(&fs::read_to_string(file).ok()?);
        Some(CpuThrottling {
            cgroup,
            while_traced: ThrottleCounts {
                nr_throttled: after.nr_throttled.saturating_sub(before.nr_throttled),
                throttled_ns: after.throttled_ns.saturating_sub(before.throttled_ns),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_and_v2_cpu_stat_files_are_found_and_read() {
        let dir = std::env::temp_dir().join(format!("gostw-cpu-stat-{}", std::process::id()));
        let v1 = dir.join("cpu/kube/pod1");
        let v2 = dir.join("app.slice");
        fs::create_dir_all(&v1).unwrap();
        fs::create_dir_all(&v2).unwrap();
        fs::write(
            v1.join("cpu.stat"),
            "nr_periods 9\nnr_throttled 4\nthrottled_time 123456\n",
        )
        .unwrap();
        fs::write(
            v2.join("cpu.stat"),
            "usage_usec 5\nnr_throttled 2\nthrottled_usec 7\n",
        )
        .unwrap();
        let proc_v1 = "12:memory:/kube\n4:cpu,cpuacct:/kube/pod1\n0::/app.slice\n";
        let (cg, f) = stat_path(proc_v1, &dir).unwrap();
        assert_eq!(cg, "/kube/pod1");
        assert_eq!(
            parse_stat(&fs::read_to_string(f).unwrap()),
            ThrottleCounts {
                nr_throttled: 4,
                throttled_ns: 123_456
            }
        );
        let (cg, f) = stat_path("0::/app.slice\n", &dir).unwrap();
        assert_eq!(cg, "/app.slice");
        assert_eq!(
            parse_stat(&fs::read_to_string(f).unwrap()).throttled_ns,
            7_000
        );
        assert!(stat_path("0::/nowhere\n", &dir).is_none());
        fs::remove_dir_all(&dir).unwrap();
    }
}
