//! Scenario pieces for the fault tests, each cleaned up on drop (also when a
//! test panics): a swap file, a memory cgroup (v1), pushing a process's
//! anonymous memory to swap, and the `gcswap` workload driven over stdin.

use std::{
    fs,
    io::{BufRead as _, BufReader, Write as _},
    path::PathBuf,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use tracer::targets::child::StoppedChild;

/// A swap file, enabled while this value lives (or the swap the machine
/// already has, e.g. the VM's swap disk, left alone).
pub struct SwapFile {
    path: Option<PathBuf>,
}

/// Swap already enabled on this machine, in kB.
fn swap_total_kb() -> u64 {
    fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("SwapTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

impl SwapFile {
    /// `fallocate`, `mkswap`, `swapon` a file of `gib` GiB under /var/tmp,
    /// unless at least half that much swap is already enabled.
    pub fn create(name: &str, gib: u32) -> SwapFile {
        if swap_total_kb() >= u64::from(gib) << 19 {
            return SwapFile { path: None };
        }
        let path = PathBuf::from(format!("/var/tmp/gostw-{name}-{}.swap", std::process::id()));
        let me = SwapFile { path: Some(path) };
        let p = me.path.as_ref().unwrap().to_str().unwrap();
        run(Command::new("fallocate").args(["-l", &format!("{gib}G"), p]));
        run(Command::new("chmod").args(["600", p]));
        run(Command::new("mkswap").arg(p));
        run(Command::new("swapon").arg(p));
        me
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        if let Some(path) = &self.path {
            let _ = Command::new("swapoff").arg(path).status();
            let _ = fs::remove_file(path);
        }
    }
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A memory cgroup (v1 where its memory controller is mounted, as on these
/// machines, else v2, as in the VM); its processes are killed and the group
/// removed on drop.
pub struct MemCgroup {
    pub path: PathBuf,
    v2: bool,
}

const CGROUP_V1_MEMORY: &str = "/sys/fs/cgroup/memory";
const CGROUP_V2: &str = "/sys/fs/cgroup";

impl MemCgroup {
    pub fn create(name: &str) -> MemCgroup {
        let v2 = !std::path::Path::new(CGROUP_V1_MEMORY)
            .join("memory.limit_in_bytes")
            .exists();
        let root = if v2 {
            // The memory controller must be enabled for the root's children.
            let _ = fs::write(
                std::path::Path::new(CGROUP_V2).join("cgroup.subtree_control"),
                "+memory",
            );
            CGROUP_V2
        } else {
            CGROUP_V1_MEMORY
        };
        let path = PathBuf::from(root).join(format!("{name}-{}", std::process::id()));
        fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("creating {} (memory cgroup): {e}", path.display()));
        MemCgroup { path, v2 }
    }

    /// Whether this is a cgroup v1 memory group (v2 names its files differently).
    pub fn is_v1(&self) -> bool {
        !self.v2
    }

    pub fn write(&self, file: &str, value: &str) {
        fs::write(self.path.join(file), value)
            .unwrap_or_else(|e| panic!("writing {value} to {}/{file}: {e}", self.path.display()));
    }

    pub fn add(&self, pid: u32) {
        self.write("cgroup.procs", &pid.to_string());
    }

    /// Reclaim everything the group holds: the swap cache a page-out leaves
    /// behind (clean, unmapped, still "in memory": the next touch would be a
    /// minor fault) and whatever is still mapped.
    pub fn force_empty(&self) {
        if self.v2 {
            // Asks for more than the group holds: reclaims what it can and
            // answers EAGAIN for the rest, which is fine here.
            let _ = fs::write(self.path.join("memory.reclaim"), "4G");
        } else {
            self.write("memory.force_empty", "0");
        }
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        if let Ok(pids) = fs::read_to_string(self.path.join("cgroup.procs")) {
            for pid in pids.lines().filter_map(|p| p.parse::<i32>().ok()) {
                // SAFETY: plain kill(2) of a process this test started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while fs::remove_dir(&self.path).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Push `pid`'s anonymous memory to swap, let the swap writes finish, then
/// drop the clean swap cache they leave behind (or the next touch is only a
/// minor fault). Returns the bytes advised.
pub fn swap_out(pid: u32, cgroup: &MemCgroup) -> u64 {
    let bytes = page_out(pid);
    std::thread::sleep(std::time::Duration::from_millis(300));
    cgroup.force_empty();
    bytes
}

/// Push every private, writable, anonymous mapping of `pid` to swap with
/// `process_madvise(MADV_PAGEOUT)`. Returns the bytes advised.
pub fn page_out(pid: u32) -> u64 {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).expect("reading maps");
    let mut ranges = Vec::new();
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(range), Some(perms)) = (f.first(), f.get(1)) else {
            continue;
        };
        let path = f.get(5).copied().unwrap_or("");
        if !perms.starts_with("rw")
            || !perms.ends_with('p')
            || !(path.is_empty() || path == "[heap]")
        {
            continue;
        }
        let (s, e) = range.split_once('-').unwrap();
        ranges.push((
            u64::from_str_radix(s, 16).unwrap(),
            u64::from_str_radix(e, 16).unwrap(),
        ));
    }
    page_out_ranges(pid, &ranges)
}

/// Push the memory of `pid` in `ranges` (start, end) to swap with
/// `process_madvise(MADV_PAGEOUT)`. Returns the bytes advised.
pub fn page_out_ranges(pid: u32, ranges: &[(u64, u64)]) -> u64 {
    // SAFETY: plain syscalls; the iovec points at a live local.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    assert!(
        pidfd >= 0,
        "pidfd_open({pid}): {}",
        std::io::Error::last_os_error()
    );
    let mut total = 0u64;
    for &(s, e) in ranges {
        let iov = libc::iovec {
            iov_base: s as *mut libc::c_void,
            iov_len: (e - s) as usize,
        };
        // SAFETY: as above.
        let r = unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                pidfd,
                &iov as *const libc::iovec,
                1,
                libc::MADV_PAGEOUT,
                0,
            )
        };
        if r > 0 {
            total += r as u64;
        }
    }
    // SAFETY: closing the fd opened above.
    unsafe { libc::close(pidfd as libc::c_int) };
    total
}

/// Major faults of `pid` (`/proc/PID/stat` field 12: the whole process,
/// exited threads included).
pub fn majflt(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("reading stat");
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split_whitespace().nth(9).unwrap().parse().unwrap()
}

/// The `gcswap` workload: one GC per `gc()`, report on `quit()`. Killed on drop.
pub struct GcSwap {
    pub pid: u32,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl GcSwap {
    /// Start `binary` stopped, let `before_exec` see its pid (add it to the
    /// traced set, a cgroup), then run it until it is ready.
    pub fn start(
        binary: &std::path::Path,
        args: &[&str],
        env: &[(&str, &str)],
        before_exec: impl FnOnce(u32),
    ) -> GcSwap {
        let stopped = StoppedChild::spawn(
            binary.as_os_str(),
            &args.iter().map(|a| a.as_ref()).collect::<Vec<_>>(),
            |cmd| {
                cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
                cmd.envs(env.iter().copied());
            },
        )
        .expect("spawning gcswap");
        let pid = stopped.pid();
        before_exec(pid);
        let mut child = stopped.resume().expect("resuming gcswap");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut me = GcSwap {
            pid,
            child,
            stdin,
            stdout,
        };
        me.expect_line("READY");
        me
    }

    fn expect_line(&mut self, prefix: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).expect("reading gcswap");
            assert!(n > 0, "gcswap exited before printing {prefix:?}");
            if line.starts_with(prefix) {
                return line.trim_end().to_owned();
            }
        }
    }

    /// Send `cmd` and return the first line of the reply that starts with
    /// `reply` (e.g. "metrics" -> the "METRICS {...}" line).
    pub fn ask(&mut self, cmd: &str, reply: &str) -> String {
        writeln!(self.stdin.as_mut().unwrap(), "{cmd}").unwrap();
        self.expect_line(reply)
    }

    /// Run one GC and wait for it to finish.
    pub fn gc(&mut self) {
        writeln!(self.stdin.as_mut().unwrap(), "gc").unwrap();
        self.expect_line("GC ");
    }

    /// Ask for the report and wait for the exit. Returns the report line
    /// and the process's major faults over its whole life, read from
    /// `/proc/PID/stat` while it is a zombie (exited, not yet reaped).
    pub fn quit(mut self) -> (String, u64) {
        writeln!(self.stdin.as_mut().unwrap(), "quit").unwrap();
        let report = self.expect_line("GOSTW_REPORT ");
        self.stdin = None;
        // SAFETY: waitid on our own child with a valid siginfo; WNOWAIT
        // leaves it unreaped so its /proc entry stays.
        let ret = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(
                libc::P_PID,
                self.pid,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        assert_eq!(ret, 0, "waitid: {}", std::io::Error::last_os_error());
        let majflt = majflt(self.pid);
        let status = self.child.wait().expect("waiting for gcswap");
        assert!(status.success(), "gcswap failed: {status:?}");
        (report, majflt)
    }
}

impl Drop for GcSwap {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
