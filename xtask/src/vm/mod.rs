//! `cargo xtask vm-test`: the kernel tests inside a QEMU VM booted on a
//! distro kernel, which has what these machines' kernel lacks (kprobes).
//!
//! The host builds everything (kernel test binary, Go workloads for one Go
//! version, an initramfs; kernel.rs fetches the kernel package once), QEMU
//! boots it with TCG, and the guest's /init (init.sh) mounts what the tests
//! need, sets up swap, proves kprobes work, runs the tests and prints their
//! exit code, which becomes ours.
//!
//! Tests plug in by name: [`coverage::COVERAGE`] says which kernel runs
//! which test filter, and why; [`HOST_SKIP`] lists tests that need a kernel
//! feature only the VM has, which the host's kernel test step skips. In the guest, `GOSTW_VM`
//! names the kernel (e.g. "debian-6.1"), `GOSTW_PREBUILT_WORKLOADS` points the
//! test harness at the pre-built workloads, and `env!("CARGO_BIN_EXE_gostw")`
//! is the real `gostw` binary.

mod coverage;
mod kernel;
pub mod payload;
mod qemu;

use std::{fs, time::Duration};

use anyhow::{Context as _, bail};

use crate::{
    arch::Arch,
    cmd::{step, workspace_root},
    go,
};

/// Kernel tests that only a VM can run (they need kprobes, which the host
/// lacks): the host's kernel test step passes each as `--skip`, and its
/// summary names them with the reason.
pub const HOST_SKIP: &[(&str, &str)] = &[
    ("vm_env::", "needs kprobes and the guest's swap disk"),
    (
        "backend_agreement::",
        "needs kprobes (the kprobe fault backend)",
    ),
    (
        "faults::kprobe_backend_pageout",
        "needs kprobes (the kprobe fault backend)",
    ),
];

pub use coverage::CI_KERNELS;

/// A `--vm-kernels` entry: `NAME` boots the amd64 kernel of that name,
/// `arm64:NAME` the arm64 one.
pub fn kernel_entry(entry: &str) -> anyhow::Result<(Arch, String)> {
    match entry.split_once(':') {
        None => Ok((Arch::Amd64, entry.to_owned())),
        Some((arch, name)) => {
            let arch = <Arch as clap::ValueEnum>::from_str(arch, true)
                .map_err(|e| anyhow::anyhow!("{entry:?}: {e}"))?;
            Ok((arch, name.to_owned()))
        }
    }
}

/// The Go version of the VM's workloads: the newest of the matrix. What
/// differs between Go versions does not depend on the kernel: the host's
/// kernel tests run every version of the matrix, and the binary analysis
/// tests check every version's arm64 builds (probe points, RETs, offsets).
/// A guest runs what differs by kernel and architecture, once.
pub const VM_GO: [&str; 1] = ["1.27.3"];

fn vm_go() -> Vec<go::Toolchain> {
    VM_GO
        .iter()
        .map(|v| go::toolchain(v).unwrap_or_else(|| panic!("Go {v} is not in the matrix")))
        .collect()
}

#[derive(clap::Args)]
pub struct Options {
    /// The guest's architecture: amd64 (qemu-system-x86_64) or arm64
    /// (qemu-system-aarch64, every binary cross-built).
    #[arg(long, value_enum, default_value = "amd64")]
    pub arch: Arch,
    /// Kernel to boot: debian-6.1 (Debian 12's 6.1 LTS, default), debian-5.10
    /// (Debian 11), debian-6.12, debian-7.3 (the newest Debian builds).
    #[arg(long, default_value = "debian-6.1")]
    pub kernel: String,
    /// Kill the VM after this many minutes (default: 20 for amd64, 40 for
    /// arm64, whose list runs about 20 minutes under TCG).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_minutes: Option<u64>,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 2048)]
    pub memory_mib: u32,
    /// Seconds the guest's tests may print nothing before its watchdog
    /// takes the guest as stalled (and the boot is tried once more).
    #[arg(long, default_value_t = qemu::GUEST_QUIET_LIMIT.as_secs(), value_parser = clap::value_parser!(u64).range(30..))]
    pub quiet_limit_secs: u64,
    /// Test name filters and other arguments for the kernel test binary
    /// (default: the VM suite's own list).
    #[arg(last = true)]
    pub test_args: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            arch: Arch::Amd64,
            kernel: "debian-6.1".to_owned(),
            timeout_minutes: None,
            memory_mib: 2048,
            quiet_limit_secs: qemu::GUEST_QUIET_LIMIT.as_secs(),
            test_args: Vec::new(),
        }
    }
}

/// Every name filter of `test_args` (arguments not starting with `-`)
/// matches at least one test of the kernel test binary `tests`: a filter
/// that matches none would leave its part of the suite unrun, silently.
fn check_filters(arch: Arch, tests: &std::path::Path, test_args: &[String]) -> anyhow::Result<()> {
    let list = crate::cmd::output(arch.command(tests).args(["--list"]))?;
    let names: Vec<&str> = list
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .collect();
    let unmatched = unmatched_filters(&names, test_args);
    if !unmatched.is_empty() {
        bail!("VM test filter(s) {unmatched:?} match no kernel test: fix the filter list");
    }
    Ok(())
}

/// The name filters among `args` that are a substring of no name.
pub(crate) fn unmatched_filters<'a>(names: &[&str], args: &'a [String]) -> Vec<&'a str> {
    args.iter()
        .map(String::as_str)
        .filter(|a| !a.starts_with('-'))
        .filter(|f| !names.iter().any(|n| n.contains(f)))
        .collect()
}

/// A boot that ended before its tests did and was tried once more: shown in
/// `cargo xtask test`'s summary, never only on stderr.
#[derive(Clone, Debug)]
pub struct Reboot {
    pub kernel: String,
    pub why: String,
    /// The test it was in.
    pub test: Option<String>,
    /// The console's last lines.
    pub tail: Vec<String>,
    /// Where that boot's console is kept, beside the new one.
    console: &'static str,
}

impl Reboot {
    /// The reboot that `e` calls for, if it is one of the ends a second boot
    /// may mend: a guest that never reached its tests, whose kernel died (an
    /// emulator race), or that stalled in them.
    fn of(kernel: &str, e: &anyhow::Error) -> Option<Reboot> {
        let (console, seen) = if let Some(qemu::NotBooted(seen)) = e.downcast_ref() {
            ("console.not-booted.log", seen)
        } else if let Some(qemu::GuestPanicked(_, seen)) = e.downcast_ref() {
            ("console.panicked.log", seen)
        } else if let Some(qemu::GuestStalled(_, seen)) = e.downcast_ref() {
            ("console.stalled.log", seen)
        } else {
            return None;
        };
        Some(Reboot {
            kernel: kernel.to_owned(),
            why: e.to_string(),
            test: seen.test.clone(),
            tail: seen.tail.clone(),
            console,
        })
    }
}

impl std::fmt::Display for Reboot {
    /// The summary's lines for it: what ended the first boot, in which
    /// test, and that boot's last console lines.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "  REBOOTED {} once: {} (in {})",
            self.kernel,
            self.why,
            self.test.as_deref().unwrap_or("no test")
        )?;
        for line in &self.tail {
            writeln!(f, "    | {line}")?;
        }
        Ok(())
    }
}

/// What a VM run leaves for the summary.
#[derive(Debug, Default)]
pub struct VmRun {
    pub reboots: Vec<Reboot>,
    pub tests: crate::testlog::TestLog,
}

/// Boot the guest and run its tests; what the summary shows goes into `out`
/// as it happens, so a failed run still shows it.
pub fn run(opts: &Options, out: &mut VmRun) -> anyhow::Result<()> {
    let arch = opts.arch;
    // arm64's 15 tests took 1 163 s (bd3f9be) and 1 452 s (52ce83d) in
    // fresh-clone runs, past amd64's 20 minutes: twice that.
    let timeout_minutes = opts.timeout_minutes.unwrap_or(match arch {
        Arch::Amd64 => 20,
        Arch::Arm64 => 40,
    });
    let spec = kernel::spec(&opts.kernel, arch)?;
    let kernel = kernel::fetch(spec)?;
    let binaries = payload::build_binaries(arch)?;
    // The guest's name for itself (`GOSTW_VM`) and its work directory.
    let name = match arch {
        Arch::Amd64 => spec.name.to_owned(),
        arch => format!("{}-{}", spec.name, arch.name()),
    };
    let work = workspace_root().join("target/vm").join(&name);
    fs::create_dir_all(&work)?;
    let workloads = work.join("workloads");
    // Only this run's versions go into the payload.
    let _ = fs::remove_dir_all(&workloads);
    let toolchains = vm_go();
    for toolchain in &toolchains {
        if !toolchain.go().is_file() {
            bail!(
                "Go {} is not installed at {}: run `cargo xtask setup`",
                toolchain.version,
                toolchain.go().display()
            );
        }
        payload::build_workloads(*toolchain, arch, &workloads)?;
    }
    let entry = match arch {
        Arch::Amd64 => opts.kernel.clone(),
        arch => format!("{}:{}", arch.name(), opts.kernel),
    };
    let test_args: Vec<String> = if opts.test_args.is_empty() {
        let rows = coverage::tests_for(&entry);
        step(&format!("the tests {entry} runs, and why (vm::coverage)"));
        for row in &rows {
            eprintln!("  {:<70} {}", row.test, row.why);
        }
        rows.iter().map(|r| r.test.to_owned()).collect()
    } else {
        opts.test_args.clone()
    };
    check_filters(arch, &binaries.tests, &test_args)?;
    let initrd = work.join("initramfs.cpio");
    payload::build_initramfs(
        &payload::Payload {
            kernel: &kernel,
            binaries: &binaries,
            workloads: &workloads,
            go_versions: &VM_GO,
            test_args: &test_args,
            kernel_name: &name,
            // Two minutes before the deadline (booting takes well under one).
            stall_secs: (timeout_minutes * 60).saturating_sub(120).max(60),
            quiet_secs: opts.quiet_limit_secs,
        },
        &work.join("root"),
        &initrd,
    )?;
    let log = work.join("console.log");
    let label = format!("[{name}] ");

    step(&format!(
        "boot {name} ({}) under QEMU/TCG; tests: {}",
        kernel.package,
        test_args.join(" ")
    ));
    let boot = || -> anyhow::Result<qemu::Report> {
        // Enough for the storm tests' 2 GiB (sparse: only what is paged out
        // takes host disk); a fresh one for each boot.
        let swap = qemu::swap_disk(&work.join("swap.img"), 2560)?;
        let report = qemu::run(&qemu::Boot {
            arch,
            vmlinuz: &kernel.vmlinuz,
            initrd: &initrd,
            swap_disk: &swap,
            memory_mib: opts.memory_mib,
            cpus: 2,
            timeout: Duration::from_secs(timeout_minutes * 60),
            log: &log,
            label: &label,
            quiet: Duration::from_secs(opts.quiet_limit_secs),
        });
        let _ = fs::remove_file(&swap);
        report
    };
    // A guest that never reached its tests ran none, and one whose kernel
    // died (an emulator race, `qemu::GuestPanicked`) or that stalled in them
    // (`qemu::GuestStalled`) ended its tests unfinished: boot it once more,
    // and say so (its console is kept beside the new one). The tests must
    // then pass in full.
    let reboots = &mut out.reboots;
    let mut report = match boot() {
        Err(e) => match Reboot::of(&name, &e) {
            Some(reboot) => {
                let kept = work.join(reboot.console);
                fs::rename(&log, &kept)?;
                eprintln!("{e}; booting once more (that console: {})", kept.display());
                let first = reboot.why.clone();
                reboots.push(reboot);
                boot().map_err(|e2| match Reboot::of(&name, &e2) {
                    // A second stall or death is a failure, whatever test
                    // it was in.
                    Some(again) => anyhow::anyhow!(
                        "{e2} (in {}): a second time; the first boot: {first}",
                        again.test.as_deref().unwrap_or("no test")
                    ),
                    None => e2,
                })?
            }
            None => return Err(e),
        },
        Ok(r) => r,
    };
    let boot = report.boot_time.unwrap_or_default();
    out.tests = std::mem::take(&mut report.tests);
    eprintln!("\n==> VM summary ({name})");
    eprintln!("  package      {}", kernel.package);
    for key in [
        "KERNEL",
        "CLOCKSOURCE",
        "KPROBES",
        "BTF",
        "SWAP",
        "KPROBE_HITS",
    ] {
        if let Some(v) = report.fact(key) {
            eprintln!("  {:<12} {v}", key.to_lowercase());
        }
    }
    eprintln!("  tests run    {}", report.tests_run);
    for left in report.facts_of("LEFTOVER") {
        eprintln!("  left running {left}");
    }
    eprintln!(
        "  quiet        {:.0?} at most (a stall is taken at {:?})",
        report.longest_quiet,
        Duration::from_secs(opts.quiet_limit_secs)
    );
    eprintln!("  boot         {boot:.1?} (QEMU start to tests start)");
    eprintln!(
        "  tests        {:.1?}",
        report.total_time.saturating_sub(boot)
    );
    let check: Vec<&str> = report.facts_of("CHECK_LINE").collect();
    let check_file = work.join("check.txt");
    fs::write(&check_file, check.join("\n") + "\n")?;
    eprintln!(
        "  gostw check  exit {} ({})",
        report.fact("CHECK_EXIT").unwrap_or("not run"),
        check_file.display()
    );
    eprintln!("  console log  {}", log.display());
    let code = report.exit_code.context("no exit code")?;
    if let Some(e) = report.fact("PAYLOAD_ERROR") {
        bail!("the guest could not lay out the payload: {e}");
    }
    if !report.fact("KPROBES").is_some_and(|v| v.starts_with("ok")) {
        bail!(
            "kprobes are not usable in the guest kernel ({})",
            kernel.release
        );
    }
    if code == 0 && report.tests_run == 0 {
        bail!(
            "no kernel test ran in the VM: the filter {:?} matches none",
            test_args
        );
    }
    if code != 0 {
        bail!(
            "kernel tests failed inside the VM (exit code {code}); console log: {}",
            log.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_that_matches_no_test_is_named() {
        let names = ["faults::kprobe_backend_pageout", "stw_probe::pauses"];
        let args: Vec<String> = [
            "stw_probe::",
            "--nocapture",
            "memory::gone_",
            "faults::kprobe",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(unmatched_filters(&names, &args), ["memory::gone_"]);
        assert!(unmatched_filters(&names, &args[..2]).is_empty());
    }

    #[test]
    fn kernel_entries_name_their_architecture() {
        assert_eq!(
            kernel_entry("debian-6.1").unwrap(),
            (Arch::Amd64, "debian-6.1".to_owned())
        );
        assert_eq!(
            kernel_entry("arm64:debian-7.3").unwrap(),
            (Arch::Arm64, "debian-7.3".to_owned())
        );
        assert!(kernel_entry("riscv:debian-6.1").is_err());
    }
}
