//! gostw's own cost, as the kernel and `/proc` count it: run time and run
//! count of each loaded BPF program (the kernel keeps these only while BPF
//! statistics are enabled: `StatsGuard`), and this process's CPU time and
//! resident memory.

use std::os::fd::OwnedFd;

/// Why a cost figure could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error(
        "enabling BPF run-time statistics (BPF_ENABLE_STATS) failed: {0}; \
         it needs root (CAP_SYS_ADMIN) and Linux 5.8 or later"
    )]
    Enable(#[source] aya::sys::SyscallError),
    #[error("reading {path}: {source}")]
    Read {
        path: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} has no {field} this parser understands")]
    Parse {
        path: &'static str,
        field: &'static str,
    },
}

/// BPF run-time statistics, on for every program on the host while this
/// lives (the kernel counts holders; `kernel.bpf_stats_enabled` shows 1).
/// They cost two clock reads per program run.
#[derive(Debug)]
pub struct StatsGuard {
    _fd: OwnedFd,
}

/// Turn BPF run-time statistics on (`BPF_ENABLE_STATS`, `BPF_STATS_RUN_TIME`)
/// until the guard is dropped.
pub fn enable() -> Result<StatsGuard, StatsError> {
    let fd = aya::sys::enable_stats(aya::sys::Stats::RunTime).map_err(StatsError::Enable)?;
    Ok(StatsGuard { _fd: fd })
}

/// Time and runs of one program since it was loaded (counted only while
/// statistics were on).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProgramCost {
    /// The program's name in the object (not the kernel's 16-byte cut).
    pub name: String,
    pub runs: u64,
    pub run_ns: u64,
}

impl ProgramCost {
    /// Mean run time in ns, if it ran.
    pub fn ns_per_run(&self) -> Option<f64> {
        (self.runs > 0).then(|| self.run_ns as f64 / self.runs as f64)
    }

    /// What ran between `earlier` (the same program, read before) and this.
    pub fn since(&self, earlier: &ProgramCost) -> ProgramCost {
        ProgramCost {
            name: self.name.clone(),
            runs: self.runs.saturating_sub(earlier.runs),
            run_ns: self.run_ns.saturating_sub(earlier.run_ns),
        }
    }
}

/// The cost of every loaded program of `ebpf`, by name. Programs never
/// loaded (features not in use) are left out.
pub fn program_costs(ebpf: &aya::Ebpf) -> Vec<ProgramCost> {
    let mut costs: Vec<ProgramCost> = ebpf
        .programs()
        .filter_map(|(name, program)| {
            // Not loaded: no fd, no info.
            let info = program.info().ok()?;
            Some(ProgramCost {
                name: name.to_owned(),
                runs: info.run_count(),
                run_ns: info.run_time().as_nanos() as u64,
            })
        })
        .collect();
    costs.sort_by(|a, b| a.name.cmp(&b.name));
    costs
}

/// This process's CPU time (user + system, every thread) and resident set.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct SelfUsage {
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
    /// The largest resident set so far (`VmHWM`).
    pub peak_rss_bytes: u64,
}

impl SelfUsage {
    /// Read `/proc/self/stat` and `/proc/self/status`.
    pub fn read() -> Result<SelfUsage, StatsError> {
        let read = |path: &'static str| {
            std::fs::read_to_string(path).map_err(|source| StatsError::Read { path, source })
        };
        let (stat, status) = (read("/proc/self/stat")?, read("/proc/self/status")?);
        // SAFETY: sysconf has no preconditions.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let ticks = if ticks > 0 { ticks as u64 } else { 100 };
        Ok(SelfUsage {
            cpu_seconds: cpu_ticks(&stat).ok_or(StatsError::Parse {
                path: "/proc/self/stat",
                field: "utime/stime",
            })? as f64
                / ticks as f64,
            rss_bytes: rss_bytes(&status).ok_or(StatsError::Parse {
                path: "/proc/self/status",
                field: "VmRSS",
            })?,
            peak_rss_bytes: status_kb(&status, "VmHWM:").ok_or(StatsError::Parse {
                path: "/proc/self/status",
                field: "VmHWM",
            })?,
        })
    }
}

/// utime + stime (fields 14 and 15, in clock ticks) of a `/proc/PID/stat`
/// line. The command name (field 2) may hold spaces and parentheses, so
/// fields are counted from its last `)`.
pub fn cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the name: state is field 3, so utime (14) is the 12th.
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// `VmRSS` of a `/proc/PID/status` text, in bytes.
pub fn rss_bytes(status: &str) -> Option<u64> {
    status_kb(status, "VmRSS:")
}

/// The `key` line (e.g. `VmHWM:`) of a `/proc/PID/status` text, in bytes.
fn status_kb(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    let mut words = line[key.len()..].split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => Some(n * 1024),
        _ => None,
    }
}

/// What gostw cost so far: its programs' run counts and times (empty when
/// statistics could not be enabled) and its own CPU and memory.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CostReading {
    /// BPF run-time statistics were on (`BPF_ENABLE_STATS`) while it ran.
    pub stats_enabled: bool,
    pub programs: Vec<ProgramCost>,
    /// None when `/proc/self` could not be read.
    pub usage: Option<SelfUsage>,
}

impl CostReading {
    /// Run time of every program, summed, in ns.
    pub fn bpf_ns(&self) -> u64 {
        self.programs.iter().map(|p| p.run_ns).sum()
    }
}

/// How often a `CostWatch` reads, at most: each reading is one syscall per
/// program and two `/proc` reads, not worth doing on every engine tick.
pub const COST_READ_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

/// Holds BPF statistics on for as long as it lives and reads gostw's cost
/// at most every `COST_READ_PERIOD` (or at once after `read_next_now`).
#[derive(Debug)]
pub struct CostWatch {
    guard: Option<StatsGuard>,
    last: Option<std::time::Instant>,
}

impl CostWatch {
    /// Enable statistics; where that fails (not root, old kernel), say so
    /// once and go on with CPU and memory alone.
    pub fn start() -> CostWatch {
        let guard = match enable() {
            Ok(g) => Some(g),
            Err(e) => {
                log::warn!("{e}: the per-program BPF cost will not be reported");
                None
            }
        };
        CostWatch { guard, last: None }
    }

    /// The next `reading` reads, however recent the last one was.
    pub fn read_next_now(&mut self) {
        self.last = None;
    }

    /// The cost now, if `COST_READ_PERIOD` passed since the last reading.
    pub fn reading(&mut self, ebpf: &aya::Ebpf) -> Option<CostReading> {
        let now = std::time::Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < COST_READ_PERIOD)
        {
            return None;
        }
        self.last = Some(now);
        let usage = SelfUsage::read().inspect_err(|e| log::debug!("{e}")).ok();
        Some(CostReading {
            stats_enabled: self.guard.is_some(),
            programs: if self.guard.is_some() {
                program_costs(ebpf)
            } else {
                Vec::new()
            },
            usage,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_counts_from_the_last_parenthesis() {
        // A real line (`cat /proc/self/stat`), with a name made awkward.
        let stat = "4242 (a) b (c) R 1 4242 4242 0 -1 4194304 117 0 0 0 37 5 0 0 20 0 1 0 \
                    1793 8470528 256 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(cpu_ticks(stat), Some(42));
        assert_eq!(cpu_ticks("1 (x) R 1 2"), None);
        assert_eq!(cpu_ticks("no parenthesis"), None);
    }

    #[test]
    fn rss_is_read_in_bytes() {
        let status = "Name:\tgostw\nVmPeak:\t  20000 kB\nVmRSS:\t    1234 kB\nThreads:\t3\n";
        assert_eq!(rss_bytes(status), Some(1234 * 1024));
        assert_eq!(rss_bytes("Name:\tx\n"), None);
        assert_eq!(rss_bytes("VmRSS:\t12 MB\n"), None);
        assert_eq!(status_kb(status, "VmPeak:"), Some(20000 * 1024));
    }

    #[test]
    fn own_usage_is_read_from_proc() {
        // Burn a little CPU so the figure cannot be a default zero.
        let t = std::time::Instant::now();
        let mut x = 1u64;
        while t.elapsed() < std::time::Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let u = SelfUsage::read().unwrap();
        assert!(u.cpu_seconds > 0.0, "{u:?}");
        assert!(u.rss_bytes > 1 << 20, "{u:?}");
        assert!(u.peak_rss_bytes >= u.rss_bytes, "{u:?}");
    }

    #[test]
    fn cost_per_run_and_differences() {
        let a = ProgramCost {
            name: "p".into(),
            runs: 10,
            run_ns: 1000,
        };
        let b = ProgramCost {
            name: "p".into(),
            runs: 30,
            run_ns: 5000,
        };
        assert_eq!(b.since(&a).ns_per_run(), Some(200.0));
        assert_eq!(a.since(&b).ns_per_run(), None);
    }
}
