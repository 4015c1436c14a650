//! The page-out scenario as a user sees it: the real `gostw run` traces the
//! `gcswap` workload while its anonymous memory is pushed to swap before
//! each GC, so its stop-the-world pauses take major faults on GC metadata.
//! What is printed is gostw's own output (live lines for slow pauses, then
//! its summary), then Go's own pause histogram from the workload's
//! runtime/metrics report, as a table.
//!
//! The machinery (swap file, memory cgroup, page-out, gcswap's protocol) is
//! the kernel tests' own, from the gostw-scenario crate. gostw runs in the
//! scenario's memory cgroup until gcswap is ready, so that gcswap, which
//! `gostw run` forks, is charged there from its first page (emptying the
//! group is what drops the swap cache a page-out leaves behind); gostw then
//! moves back to where it was. The swap file, the cgroup and both processes
//! are removed on every way out, Ctrl-C included.

use std::{
    ffi::CString,
    io::BufReader,
    os::unix::{ffi::OsStrExt as _, process::CommandExt as _},
    path::Path,
    process::{Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
};

use anyhow::{Context as _, bail};
use gostw_scenario::{
    GcSwapControl, MemCgroup, PAGEOUT_ARGS, PAGEOUT_ENV, PAGEOUT_ROUNDS, SwapFile,
};

use crate::cmd::{Reaped, step};

/// Live lines for pauses of at least this long: an ordinary GC pause of
/// gcswap takes 0.1-0.3 ms here, one after a page-out several ms.
const THRESHOLD: &str = "1ms";

/// Run the scenario with the release `gostw` on the `gcswap` binary.
pub fn run(gostw: &Path, gcswap: &Path) -> anyhow::Result<()> {
    let _signals = InterruptGuard::install();
    // Guards have run when this returns: everything is cleaned up.
    let result = scenario(gostw, gcswap);
    if INTERRUPTED.load(Ordering::Relaxed) {
        bail!("interrupted; swap file, cgroup and processes removed");
    }
    result
}

fn scenario(gostw: &Path, gcswap: &Path) -> anyhow::Result<()> {
    let swap = SwapFile::create("demo", 1).context("setting up swap")?;
    match swap.path() {
        Some(p) => eprintln!("swap file {} (1 GiB), removed at the end", p.display()),
        None => eprintln!("using the swap already enabled"),
    }
    let cgroup = MemCgroup::create("gostw-demo")?;
    let home = cgroup.current(std::process::id())?;
    eprintln!(
        "memory cgroup {} (removed at the end)",
        cgroup.path.display()
    );
    let procs = CString::new(cgroup.path.join("cgroup.procs").as_os_str().as_bytes())?;

    let mut cmd = Command::new(gostw);
    cmd.args(["run", "--slow-pause", THRESHOLD, "--"])
        .arg(gcswap)
        .args(PAGEOUT_ARGS)
        .envs(PAGEOUT_ENV.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    // SAFETY: between fork and exec this only calls open/write/close on a
    // path prepared before the fork (no allocation, async-signal-safe).
    unsafe {
        cmd.pre_exec(move || join_cgroup(&procs));
    }
    eprintln!(
        "+ {} run --slow-pause {THRESHOLD} -- {} {}  ({})",
        gostw.display(),
        gcswap.display(),
        PAGEOUT_ARGS.join(" "),
        PAGEOUT_ENV
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut gostw_proc = Reaped(cmd.spawn().context("starting gostw")?);
    let child = &mut gostw_proc.0;
    let gostw_pid = child.id();
    let mut control = GcSwapControl::new(
        BufReader::new(child.stdout.take().expect("piped")),
        child.stdin.take().expect("piped"),
    );
    // Everything on gostw's stdout that is not gcswap's answer is gostw's.
    let mut show = |line: &str| println!("{line}");

    control.ready(&mut show).context("waiting for gcswap")?;
    let pid = traced_child(gostw_pid, gcswap)?;
    cgroup.move_to(gostw_pid, &home)?;
    for round in 1..=PAGEOUT_ROUNDS {
        let bytes = gostw_scenario::swap_out(pid, &cgroup)?;
        eprintln!(
            "page-out {round}/{PAGEOUT_ROUNDS}: {} MiB of gcswap (pid {pid}) pushed to swap, \
             swap cache dropped; then a GC",
            bytes >> 20
        );
        control.gc(&mut show).context("gcswap's GC")?;
    }
    let report = control.quit(&mut show).context("gcswap's report")?;
    control.rest(&mut show)?;
    let status = gostw_proc.0.wait()?;
    if !status.success() {
        bail!("gostw run failed ({status})");
    }
    step("Go's own view: the pause histogram gcswap read from runtime/metrics at its exit");
    let report: serde_json::Value =
        serde_json::from_str(&report).with_context(|| format!("gcswap's report {report:?}"))?;
    print!("{}", go_view(&report)?);
    Ok(())
}

/// Move the calling process into the cgroup whose `cgroup.procs` is `procs`
/// ("0" names the writer, in v1 and v2 alike).
fn join_cgroup(procs: &CString) -> std::io::Result<()> {
    // SAFETY: a valid C string; plain syscalls.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let n = libc::write(fd, b"0".as_ptr().cast(), 1);
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if n != 1 {
            return Err(err);
        }
    }
    Ok(())
}

/// The pid of `gostw`'s child running `exe` (the program `gostw run` started).
fn traced_child(gostw: u32, exe: &Path) -> anyhow::Result<u32> {
    let exe = exe.canonicalize()?;
    let tasks = std::fs::read_dir(format!("/proc/{gostw}/task"))?;
    for task in tasks.filter_map(Result::ok) {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for pid in children.split_whitespace().filter_map(|p| p.parse().ok()) {
            if std::fs::read_link(format!("/proc/{pid}/exe")).ok() == Some(exe.clone()) {
                return Ok(pid);
            }
        }
    }
    bail!("gostw (pid {gostw}) has no child running {}", exe.display())
}

/// Go's own figures from gcswap's report: GCs, major faults, and the GC pause
/// histogram as a table of its non-empty buckets.
fn go_view(report: &serde_json::Value) -> anyhow::Result<String> {
    let buckets = report["gc_pause_hist"]
        .as_array()
        .context("gcswap's report has no gc_pause_hist")?;
    let mut out = format!(
        "{} ({}): {} GCs asked for, NumGC {}, {} major faults (its /proc/self/stat)\n",
        "gcswap",
        report["go_version"].as_str().unwrap_or("?"),
        report["gcs"],
        report["num_gc"],
        report["majflt"],
    );
    out.push_str(&format!(
        "  GC pauses (two per cycle), /sched/pauses/total/gc:seconds\n  {:>10}  {:>10}  {:>6}\n",
        "from", "below", "pauses"
    ));
    let mut total = 0;
    for b in buckets {
        let count = b["count"].as_u64().context("bucket without count")?;
        total += count;
        out.push_str(&format!(
            "  {:>10}  {:>10}  {count:>6}\n",
            seconds(b["ge"].as_f64()),
            seconds(b["le"].as_f64()),
        ));
    }
    out.push_str(&format!("  {:>10}  {:>10}  {total:>6}\n", "all", ""));
    Ok(out)
}

/// A bucket bound in seconds, in the unit a person reads (Go's bounds can
/// be infinite, which JSON cannot carry: then absent).
fn seconds(s: Option<f64>) -> String {
    match s {
        None => "inf".to_owned(),
        Some(s) if s < 1e-6 => format!("{:.0} ns", s * 1e9),
        Some(s) if s < 1e-3 => format!("{:.1} us", s * 1e6),
        Some(s) if s < 1.0 => format!("{:.2} ms", s * 1e3),
        Some(s) => format!("{s:.2} s"),
    }
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// SIGINT and SIGTERM set a flag instead of ending xtask at once, so the
/// scenario's guards (swap file, cgroup, processes) run; the previous
/// dispositions come back on drop. Ctrl-C still reaches gostw and gcswap
/// (the terminal signals the whole group): gcswap ends, gostw prints its
/// summary, and the scenario stops with an error.
struct InterruptGuard(Vec<(libc::c_int, libc::sighandler_t)>);

impl InterruptGuard {
    fn install() -> InterruptGuard {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        InterruptGuard(
            [libc::SIGINT, libc::SIGTERM]
                .into_iter()
                // SAFETY: the handler only stores to an atomic.
                .map(|sig| (sig, unsafe { libc::signal(sig, handler) }))
                .collect(),
        )
    }
}

impl Drop for InterruptGuard {
    fn drop(&mut self) {
        for (sig, old) in &self.0 {
            // SAFETY: restoring the disposition signal() returned.
            unsafe { libc::signal(*sig, *old) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_histogram_as_a_table() {
        let report: serde_json::Value = serde_json::from_str(
            r#"{"go_version":"go1.26.6","gcs":4,"num_gc":5,"majflt":812,
                "gc_pause_hist":[{"ge":0.0000512,"le":0.0000614,"count":3},
                                 {"ge":0.00229,"le":0.00262,"count":2},
                                 {"ge":1.5,"count":1}]}"#,
        )
        .unwrap();
        let text = go_view(&report).unwrap();
        assert!(text.starts_with("gcswap (go1.26.6): 4 GCs asked for, NumGC 5, 812 major faults"));
        assert!(
            text.contains("     51.2 us     61.4 us       3\n"),
            "{text}"
        );
        assert!(
            text.contains("     2.29 ms     2.62 ms       2\n"),
            "{text}"
        );
        assert!(
            text.contains("      1.50 s         inf       1\n"),
            "{text}"
        );
        assert!(
            text.ends_with("         all                   6\n"),
            "{text}"
        );
        assert!(!text.contains('{') && !text.contains("Bucket"), "{text}");
        assert!(go_view(&serde_json::json!({})).is_err());
    }
}
