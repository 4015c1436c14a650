//! Booting the guest under QEMU (TCG) and following its serial console: every
//! line goes to our stdout and to a log file; the `GOSTW_VM_*` lines init.sh
//! prints are collected; the run ends at `GOSTW_VM_EXIT=<code>`, when QEMU
//! exits, or at the time limit (then QEMU is killed).

use std::{
    fs::File,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{arch::Arch, testlog::TestLog};

/// What to boot.
pub struct Boot<'a> {
    pub arch: Arch,
    pub vmlinuz: &'a Path,
    pub initrd: &'a Path,
    /// A raw image attached as a virtio disk (the guest's swap).
    pub swap_disk: &'a Path,
    pub memory_mib: u32,
    pub cpus: u32,
    pub timeout: Duration,
    /// Where the console is logged.
    pub log: &'a Path,
    /// Put before every console line on our stdout (guests may run side by
    /// side).
    pub label: &'a str,
    /// How long the tests may print nothing before the guest's watchdog
    /// says it stalled ([`GUEST_QUIET_LIMIT`] unless asked otherwise).
    pub quiet: Duration,
}

/// What the guest reported.
#[derive(Debug, Default)]
pub struct Report {
    /// `GOSTW_VM_<KEY>=<value>` lines, in order.
    pub facts: Vec<(String, String)>,
    /// The test binary's exit code.
    pub exit_code: Option<i32>,
    /// Tests the test binary ran (its `running N tests` lines, summed).
    pub tests_run: u64,
    /// From starting QEMU to `GOSTW_VM_BOOTED`.
    pub boot_time: Option<Duration>,
    /// From starting QEMU to `GOSTW_VM_EXIT`.
    pub total_time: Duration,
    /// The longest the console was silent while the tests ran (what
    /// [`GUEST_QUIET_LIMIT`] must stay above).
    pub longest_quiet: Duration,
    /// The tests' results and times, as the console showed them.
    pub tests: TestLog,
}

/// Where a guest was when it was stopped: the test it was in, if any, and
/// the console's last lines.
#[derive(Debug, Default, Clone)]
pub struct LastSeen {
    pub test: Option<String>,
    pub tail: Vec<String>,
}

/// How many console lines a [`LastSeen`] keeps.
const TAIL_LINES: usize = 12;

impl Report {
    /// The value of `GOSTW_VM_<key>`, if the guest printed it.
    pub fn fact(&self, key: &str) -> Option<&str> {
        self.facts
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `GOSTW_VM_<key>`, in the order the guest printed them.
    pub fn facts_of<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> {
        self.facts
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// How long QEMU may take to exit once the guest reported its exit code.
const POWEROFF_GRACE: Duration = Duration::from_secs(30);

/// How long the guest may take to reach its tests (`GOSTW_VM_BOOTED`): it
/// takes 3-17 s. Seen once in about twenty boots: a 5.10 guest that printed
/// its swap line and nothing more for 20 minutes, before any test ran.
const BOOT_LIMIT: Duration = Duration::from_secs(180);

/// The guest never reached its tests within [`BOOT_LIMIT`]: no test ran, so
/// the boot may be tried again.
#[derive(Debug)]
pub struct NotBooted(pub LastSeen);

impl std::fmt::Display for NotBooted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the guest did not reach its tests within {BOOT_LIMIT:?} (killed before any test ran)"
        )
    }
}

impl std::error::Error for NotBooted {}

/// How long the guest's tests may print nothing before init.sh's watchdog
/// says where every task waits: longer than any one test of the VM lists
/// takes there (the VM summary prints the longest silence of each run).
pub const GUEST_QUIET_LIMIT: Duration = Duration::from_secs(600);

/// After the guest said it stalled, time for it to print its tasks.
const STALL_DUMP: Duration = Duration::from_secs(60);

/// With no line at all for this long past the guest's own quiet limit while
/// the tests run, the guest is stalled even if its watchdog could not say
/// so (the watchdog looks every 15 s).
const HOST_QUIET_GRACE: Duration = Duration::from_secs(90);

/// The guest stopped making progress in its tests (its watchdog's
/// `GOSTW_VM_SILENT`, or a silent console): seen once, a 5.10 guest silent
/// for 9 minutes in `compat::` with QEMU busy, an emulator stall like the
/// boots that never reach their tests. Killed; the boot may be tried once
/// more, and its console is kept.
#[derive(Debug)]
pub struct GuestStalled(pub String, pub LastSeen);

impl std::fmt::Display for GuestStalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the guest stalled in its tests: {}", self.0)
    }
}

impl std::error::Error for GuestStalled {}

/// The guest's kernel panicked before the tests ended (its console's first
/// `Oops`/`BUG` line, or the panic's): seen once, an `int3` Oops in
/// `__perf_event_overflow` while the kernel patched its own text on
/// another vCPU (6.12 under TCG, 2026-12-04), a race of the emulator's, not
/// of a test. The run may be tried again; the console is kept.
#[derive(Debug)]
pub struct GuestPanicked(pub String, pub LastSeen);

impl std::fmt::Display for GuestPanicked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the guest's kernel panicked: {}", self.0)
    }
}

impl std::error::Error for GuestPanicked {}

/// The line that says why a guest kernel died, if `line` is one.
fn kernel_death(line: &str) -> Option<&str> {
    ["Oops:", "BUG:", "Kernel panic - not syncing"]
        .iter()
        .find_map(|m| line.find(m).map(|at| line[at..].trim()))
}

/// How a guest of one architecture is started.
struct Emulator {
    /// The QEMU system emulator, and the Debian package it is in.
    binary: &'static str,
    package: &'static str,
    /// The board, where the emulator has no default one.
    machine: &'static [&'static str],
    /// The emulated CPU model.
    cpu: &'static str,
    /// The kernel's command line.
    append: &'static str,
}

/// The emulator for `arch`. amd64: the TSC as clocksource: the
/// kernel would pick the emulated HPET, where every clock read of the
/// guest's Go programs is a slow system call (their nanotime skips the
/// vDSO), which no production machine does and which made the runtime's
/// own scheduler hold stops for milliseconds under emulation. arm64: QEMU's
/// `virt` board; the architected timer, which the vDSO reads, is the
/// clocksource anyway. The CPU is a Neoverse N1, the core of the common
/// arm64 servers, rather than `max`: `max` has pointer authentication,
/// which Debian's kernel uses in every function, and QEMU emulates it with
/// the QARMA cipher, which slows all kernel code (the book's VM page has
/// the measurement).
fn emulator(arch: Arch) -> Emulator {
    match arch {
        Arch::Amd64 => Emulator {
            binary: "qemu-system-x86_64",
            package: "qemu-system-x86",
            machine: &[],
            cpu: "max",
            append: "console=ttyS0 panic=-1 quiet clocksource=tsc tsc=reliable",
        },
        Arch::Arm64 => Emulator {
            binary: "qemu-system-aarch64",
            package: "qemu-system-arm",
            machine: &["-M", "virt"],
            cpu: "neoverse-n1",
            append: "console=ttyAMA0 panic=-1 quiet",
        },
    }
}

/// Boot, stream the console, and return what the guest reported once it has
/// printed its exit code. Fails on a missing QEMU, a time-out, or a guest
/// that stops without an exit code.
pub fn run(boot: &Boot) -> anyhow::Result<Report> {
    let emu = emulator(boot.arch);
    let qemu = emu.binary;
    let mut cmd = Command::new(qemu);
    // TCG: a KVM guest hangs at boot on these machines (PLATFORM.md).
    cmd.args(emu.machine)
        .args(["-accel", "tcg", "-cpu", emu.cpu])
        .args(["-m", &boot.memory_mib.to_string()])
        .args(["-smp", &boot.cpus.to_string()])
        .arg("-kernel")
        .arg(boot.vmlinuz)
        .arg("-initrd")
        .arg(boot.initrd)
        .arg("-drive")
        .arg(format!(
            "file={},format=raw,if=virtio,cache=unsafe",
            boot.swap_disk.display()
        ))
        .args(["-append", emu.append])
        .args(["-nographic", "-no-reboot", "-nic", "none"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    eprintln!("+ {cmd:?}");
    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            anyhow::anyhow!("{qemu} is not installed: apt-get install {}", emu.package)
        } else {
            anyhow::Error::new(e).context(format!("starting {qemu}"))
        }
    })?;
    let mut log = File::create(boot.log)
        .with_context(|| format!("creating the console log {}", boot.log.display()))?;

    // One thread per pipe turns bytes into lines; the main thread owns the
    // clock, so a silent, hung guest still ends at the time limit.
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    for pipe in [
        Box::new(stdout) as Box<dyn std::io::Read + Send>,
        Box::new(stderr),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(pipe);
            let mut buf = Vec::new();
            while reader.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
                let line = String::from_utf8_lossy(&buf)
                    .trim_end_matches(['\r', '\n'])
                    .to_owned();
                if tx.send(line).is_err() {
                    break;
                }
                buf.clear();
            }
        });
    }
    drop(tx);

    let mut report = Report::default();
    let mut death: Option<String> = None;
    let mut stalled: Option<String> = None;
    let mut deadline = started + boot.timeout;
    let booting = started + BOOT_LIMIT;
    let mut last_line = Instant::now();
    let mut tail: std::collections::VecDeque<String> = Default::default();
    let outcome = loop {
        let testing = report.boot_time.is_some() && report.exit_code.is_none();
        let until = if report.boot_time.is_none() {
            deadline.min(booting)
        } else if testing {
            deadline.min(last_line + boot.quiet + HOST_QUIET_GRACE)
        } else {
            deadline
        };
        let left = until.saturating_duration_since(Instant::now());
        let got = rx.recv_timeout(left);
        if testing {
            report.longest_quiet = report.longest_quiet.max(last_line.elapsed());
        }
        last_line = Instant::now();
        match got {
            Ok(line) => {
                println!("{}{line}", boot.label);
                writeln!(log, "{line}")?;
                report.tests_run += tests_started(&line).unwrap_or(0);
                report.tests.line(&line, last_line);
                if tail.len() == TAIL_LINES {
                    tail.pop_front();
                }
                tail.push_back(line.clone());
                if death.is_none() {
                    death = kernel_death(&line).map(str::to_owned);
                }
                if let Some((key, value)) = fact(&line) {
                    if key == "SILENT"
                        && report.boot_time.is_some()
                        && report.exit_code.is_none()
                        && stalled.is_none()
                    {
                        stalled = Some(value.to_owned());
                        deadline = deadline.min(Instant::now() + STALL_DUMP);
                    }
                    if key == "BOOTED" {
                        report.boot_time = Some(started.elapsed());
                    }
                    if key == "EXIT" {
                        report.exit_code = value.trim().parse().ok();
                        report.total_time = started.elapsed();
                        // The guest powers off next; do not wait long for it.
                        deadline = deadline.min(Instant::now() + POWEROFF_GRACE);
                    }
                    report.facts.push((key.to_owned(), value.to_owned()));
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if testing && stalled.is_none() && Instant::now() < deadline {
                    stalled = Some(format!(
                        "no console output for {:?}",
                        boot.quiet + HOST_QUIET_GRACE
                    ));
                }
                break Outcome::TimedOut;
            }
            // Both pipes closed: QEMU has exited.
            Err(mpsc::RecvTimeoutError::Disconnected) => break Outcome::Exited,
        }
    };
    if report.exit_code.is_none() {
        report.total_time = started.elapsed();
    }
    let seen = LastSeen {
        test: report.tests.running().map(str::to_owned),
        tail: tail.into(),
    };
    if matches!(outcome, Outcome::TimedOut) && report.boot_time.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        return Err(NotBooted(seen).into());
    }
    // The guest said it was silent past its limit, or the host heard
    // nothing past its own: that boot stalled, even if its tests went on to
    // end before the host stopped it.
    if let Some(why) = stalled {
        let _ = child.kill();
        let _ = child.wait();
        return Err(GuestStalled(why, seen).into());
    }
    if matches!(outcome, Outcome::TimedOut) && report.exit_code.is_some() {
        eprintln!("the guest did not power off; stopping QEMU");
        let _ = child.kill();
    }
    if matches!(outcome, Outcome::TimedOut) && report.exit_code.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        bail!(
            "the VM did not finish within {:?} (killed; console log: {}). \
             Raise --timeout-minutes or narrow the test filter",
            boot.timeout,
            boot.log.display()
        );
    }
    let status = child.wait()?;
    if let (None, Some(why)) = (report.exit_code, death) {
        return Err(GuestPanicked(why, seen).into());
    }
    if report.exit_code.is_none() {
        bail!(
            "the VM stopped ({status}) without printing GOSTW_VM_EXIT: the guest crashed or \
             init.sh failed before the tests ended; console log: {}",
            boot.log.display()
        );
    }
    Ok(report)
}

enum Outcome {
    Exited,
    TimedOut,
}

/// `GOSTW_VM_KEY=value` anywhere in a console line (kernel messages can share
/// a line with ours) -> ("KEY", "value").
fn fact(line: &str) -> Option<(&str, &str)> {
    let start = line.find("GOSTW_VM_")?;
    line[start + "GOSTW_VM_".len()..].split_once('=')
}

/// N of libtest's `running N tests` line.
fn tests_started(line: &str) -> Option<u64> {
    let rest = line.strip_prefix("running ")?;
    let n = rest
        .strip_suffix(" tests")
        .or_else(|| rest.strip_suffix(" test"))?;
    n.parse().ok()
}

/// A fresh sparse raw image of `size_mib` MiB for the guest's swap.
pub fn swap_disk(path: &Path, size_mib: u64) -> anyhow::Result<PathBuf> {
    let f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.set_len(size_mib << 20)?;
    Ok(path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_are_found_in_console_lines() {
        assert_eq!(fact("GOSTW_VM_EXIT=0"), Some(("EXIT", "0")));
        assert_eq!(
            kernel_death("test check::a ... [   63.048525] Oops: int3: 0000 [#1] PREEMPT SMP"),
            Some("Oops: int3: 0000 [#1] PREEMPT SMP")
        );
        assert_eq!(
            kernel_death("[   63.05] Kernel panic - not syncing: Fatal exception"),
            Some("Kernel panic - not syncing: Fatal exception")
        );
        assert_eq!(kernel_death("test oops::x ... ok"), None);
        assert_eq!(
            fact("[  3.1] x GOSTW_VM_KPROBES=ok (p:a b)"),
            Some(("KPROBES", "ok (p:a b)"))
        );
        assert_eq!(fact("test stw_probe::x ... ok"), None);
        // `gostw check`'s lines keep their own `=` and blanks.
        assert_eq!(
            fact("GOSTW_VM_CHECK_LINE=  pauses  works (a=b)"),
            Some(("CHECK_LINE", "  pauses  works (a=b)"))
        );
        assert_eq!(fact("GOSTW_VM_CHECK_LINE="), Some(("CHECK_LINE", "")));
        assert_eq!(tests_started("running 2 tests"), Some(2));
        assert_eq!(tests_started("running 0 tests"), Some(0));
        assert_eq!(tests_started("running 1 test"), Some(1));
        assert_eq!(tests_started("test running 2 tests ... ok"), None);
    }
}
