//! Scenario pieces for the fault tests, each cleaned up on drop (also when a
//! test panics): a swap file, a memory cgroup, pushing a process's anonymous
//! memory to swap, and the `gcswap` workload driven over stdin. The pieces
//! live in the `gostw-scenario` crate (scripts/scenario), which `cargo xtask
//! demo` uses too; these wrappers panic with its error, as kernel tests do.

use std::{
    io::BufReader,
    process::{Child, ChildStdin, ChildStdout, Stdio},
};

use gostw_scenario::GcSwapControl;
use tracer::targets::child::StoppedChild;

/// A swap file, enabled while this value lives (or the swap the machine
/// already has, e.g. the VM's swap disk, left alone).
pub struct SwapFile(#[allow(dead_code, reason = "held for its Drop")] gostw_scenario::SwapFile);

impl SwapFile {
    /// A swap file of `gib` GiB under /var/tmp, unless at least half that
    /// much swap is already enabled.
    pub fn create(name: &str, gib: u32) -> SwapFile {
        SwapFile(
            gostw_scenario::SwapFile::create(name, gib)
                .unwrap_or_else(|e| panic!("setting up swap: {e}")),
        )
    }
}

/// A memory cgroup (v1 where its memory controller is mounted, as on these
/// machines, else v2, as in the VM); its processes are killed and the group
/// removed on drop.
pub struct MemCgroup(gostw_scenario::MemCgroup);

/// Its fields (`path`) and the shared crate's methods, where these wrappers
/// do not panic instead.
impl std::ops::Deref for MemCgroup {
    type Target = gostw_scenario::MemCgroup;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl MemCgroup {
    pub fn create(name: &str) -> MemCgroup {
        MemCgroup(gostw_scenario::MemCgroup::create(name).unwrap_or_else(|e| panic!("{e}")))
    }

    /// Whether this is a cgroup v1 memory group (v2 names its files differently).
    pub fn is_v1(&self) -> bool {
        self.0.is_v1()
    }

    pub fn write(&self, file: &str, value: &str) {
        self.0.write(file, value).unwrap_or_else(|e| panic!("{e}"));
    }

    pub fn add(&self, pid: u32) {
        self.0.add(pid).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Push `pid`'s anonymous memory to swap, let the swap writes finish, then
/// drop the clean swap cache they leave behind (or the next touch is only a
/// minor fault). Returns the bytes advised.
pub fn swap_out(pid: u32, cgroup: &MemCgroup) -> u64 {
    gostw_scenario::swap_out(pid, &cgroup.0).unwrap_or_else(|e| panic!("swapping out {pid}: {e}"))
}

/// Push the memory of `pid` in `ranges` (start, end) to swap with
/// `process_madvise(MADV_PAGEOUT)`. Returns the bytes advised.
pub fn page_out_ranges(pid: u32, ranges: &[(u64, u64)]) -> u64 {
    gostw_scenario::page_out_ranges(pid, ranges).unwrap_or_else(|e| panic!("paging out {pid}: {e}"))
}

/// Major faults of `pid` (`/proc/PID/stat` field 12: the whole process,
/// exited threads included).
pub fn majflt(pid: u32) -> u64 {
    gostw_scenario::majflt(pid).unwrap_or_else(|e| panic!("{e}"))
}

/// The `gcswap` workload: one GC per `gc()`, report on `quit()`. Killed on drop.
pub struct GcSwap {
    pub pid: u32,
    child: Child,
    control: GcSwapControl<BufReader<ChildStdout>, ChildStdin>,
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
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut me = GcSwap {
            pid,
            child,
            control: GcSwapControl::new(stdout, stdin),
        };
        me.control
            .ready(&mut |_| {})
            .unwrap_or_else(|e| panic!("{e}"));
        me
    }

    /// Send `cmd` and return the first line of the reply that starts with
    /// `reply` (e.g. "metrics" -> the "METRICS {...}" line).
    pub fn ask(&mut self, cmd: &str, reply: &str) -> String {
        self.control
            .ask(cmd, reply, &mut |_| {})
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// `rounds` times: push it to swap in `cgroup`, then one GC (which
    /// faults its metadata back inside the pause). Returns the fewest bytes
    /// one page-out advised.
    pub fn paged_gcs(&mut self, cgroup: &MemCgroup, rounds: usize) -> u64 {
        (0..rounds)
            .map(|_| {
                let bytes = swap_out(self.pid, cgroup);
                self.gc();
                bytes
            })
            .min()
            .unwrap_or(0)
    }

    /// Run one GC and wait for it to finish.
    pub fn gc(&mut self) {
        self.control
            .gc(&mut |_| {})
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Ask for the report and wait for the exit. Returns the report line
    /// and the process's major faults over its whole life, read from
    /// `/proc/PID/stat` while it is a zombie (exited, not yet reaped).
    pub fn quit(mut self) -> (String, u64) {
        let json = self
            .control
            .quit(&mut |_| {})
            .unwrap_or_else(|e| panic!("{e}"));
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
        (format!("GOSTW_REPORT {json}"), majflt)
    }
}

impl Drop for GcSwap {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The page-out tests' usual start: 1 GiB of swap, a memory cgroup named
/// `gostw-<name>`, and the newest Go's gcswap with `args` and `env` in it.
/// Hold all three (the swap and the cgroup are undone on drop).
pub fn paged_gcswap(
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (SwapFile, MemCgroup, GcSwap) {
    let swap = SwapFile::create(name, 1);
    let cgroup = MemCgroup::create(&format!("gostw-{name}"));
    let path = crate::support::build_workload("gcswap", &crate::support::newest_go(), "", &[]);
    let workload = GcSwap::start(&path, args, env, |pid| cgroup.add(pid));
    (swap, cgroup, workload)
}
