//! `cargo xtask test`: everything CI checks, in order, with the time each
//! step took. Kernel tests need root; they fail (not skip) without it. The
//! last step runs the kernel tests again inside a VM on a distro kernel
//! (`cargo xtask vm-test`). Everything the tests run is built once, up
//! front, in the `build` step (the release `gostw` of the cost tests
//! included), so no test compiles inside its own measurement.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, bail};

use crate::{
    arch::Arch,
    cmd::{exec, free_bytes, step, workspace_root},
    demo, go, setup, vm,
};

#[derive(clap::Args)]
pub struct Options {
    /// Skip `cargo xtask setup` (for a machine already set up).
    #[arg(long)]
    pub no_setup: bool,
    /// Skip the VM step (kernel tests on a distro kernel under QEMU).
    #[arg(long)]
    pub no_vm: bool,
    /// Kernels the VM step boots, one after the other (`cargo xtask vm-test
    /// --kernel` names; `arm64:NAME` for an arm64 guest).
    #[arg(long, value_delimiter = ',', default_values_t = vm::CI_KERNELS.map(String::from))]
    pub vm_kernels: Vec<String>,
    /// Run the kernel tests (host, and VM unless --no-vm) this many times
    /// and report each test's pass count; fails unless every run passed.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub repeat: u32,
    /// Extra arguments for the kernel test binary (e.g. a test name filter).
    #[arg(last = true)]
    pub kernel_test_args: Vec<String>,
}

/// Whether the VM step boots an arm64 guest.
fn boots_arm64(opts: &Options) -> bool {
    !opts.no_vm
        && opts
            .vm_kernels
            .iter()
            .any(|k| vm::kernel_entry(k).is_ok_and(|(arch, _)| arch == Arch::Arm64))
}

/// What a full run writes under `target/` on a fresh clone: 11 GiB
/// (measured: the fresh-clone run of 3cc5a24, all steps and guests), plus
/// room for the toolchains and images setup fetches on a fresh machine.
const ROOM_NEEDED: u64 = 14 << 30;

/// Fail at once, saying so, where the run would stop minutes later on a
/// full disk (a run once died in the build step with "No space left").
fn check_room() -> anyhow::Result<()> {
    let target = workspace_root().join("target");
    let at = if target.exists() {
        target
    } else {
        workspace_root()
    };
    let free = free_bytes(&at)?;
    let gib = free as f64 / (1u64 << 30) as f64;
    eprintln!("disk: {gib:.1} GiB free at {}", at.display());
    if free < ROOM_NEEDED {
        bail!(
            "{} has {gib:.1} GiB free; a full test run needs {} GiB (builds, Go toolchains, VM images): free some space first",
            at.display(),
            ROOM_NEEDED >> 30
        );
    }
    Ok(())
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    let started = Instant::now();
    check_room()?;
    let mut timings = Vec::new();
    let mut timed = |name: &str, f: &mut dyn FnMut() -> anyhow::Result<()>| -> anyhow::Result<()> {
        let t = Instant::now();
        let r = f();
        timings.push((name.to_owned(), t.elapsed(), r.is_ok()));
        r
    };
    let mut tally = Tally::default();
    let result = (|| -> anyhow::Result<()> {
        if !opts.no_setup {
            timed("setup", &mut || setup::run(&setup::Options::default()))?;
        }
        timed("fmt", &mut || {
            step("cargo fmt --check");
            exec(cargo().args(["fmt", "--all", "--", "--check"]))
        })?;
        timed("clippy (user crates)", &mut || {
            step("clippy: user crates");
            exec(
                cargo()
                    .args([
                        "clippy",
                        "--workspace",
                        "--exclude",
                        "tracer-ebpf",
                        "--all-targets",
                        "--all-features",
                    ])
                    .args(["--", "-D", "warnings"]),
            )
        })?;
        timed("clippy (eBPF crate)", &mut || {
            step("clippy: eBPF crate (BPF target)");
            exec(
                Command::new("cargo")
                    .current_dir(workspace_root())
                    .args([
                        "+nightly",
                        "clippy",
                        "--package",
                        "tracer-ebpf",
                        "--bins",
                        "--release",
                    ])
                    .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core"])
                    .args(["--", "-D", "warnings"]),
            )
        })?;
        timed("book", &mut || {
            crate::book::build(&std::env::temp_dir().join("gostw-book"))
        })?;
        let mut release = None;
        timed("build", &mut || {
            step(
                "build everything the tests run, once: unit and kernel test binaries, release gostw",
            );
            exec(cargo().args([
                "test",
                "--workspace",
                "--exclude",
                "tracer-ebpf",
                "--no-run",
            ]))?;
            exec(kernel_tests().arg("--no-run"))?;
            release = Some(demo::build_gostw_release()?);
            Ok(())
        })?;
        let release = release.context("the build step gave no release binary")?;
        timed("unit tests", &mut || {
            step("unit tests");
            exec(cargo().args(["test", "--workspace", "--exclude", "tracer-ebpf"]))
        })?;
        timed("dist", &mut || {
            // The arm64 artifacts where the run boots an arm64 guest: it runs
            // that same static build, so building it here costs nothing more.
            let mut builds = vec![(Arch::Amd64, release.clone())];
            if boots_arm64(opts) {
                builds.push((Arch::Arm64, crate::dist::build_static(Arch::Arm64)?));
            }
            crate::dist::artifacts(&builds)
        })?;
        for round in 1..=opts.repeat {
            let of = if opts.repeat > 1 {
                format!(" (run {round} of {})", opts.repeat)
            } else {
                String::new()
            };
            let r = timed(&format!("kernel tests{of}"), &mut || {
                step(&format!(
                    "kernel tests (real eBPF programs, real Go binaries; serial){of}"
                ));
                if !setup::is_root() {
                    bail!(
                        "the kernel tests load eBPF programs and need root: run `sudo -E cargo xtask test`"
                    );
                }
                let mut cmd = kernel_tests();
                cmd.args(["--", "--test-threads=1"])
                    .args(vm::HOST_SKIP.iter().flat_map(|t| ["--skip", *t]))
                    .args(&opts.kernel_test_args)
                    .env("GOSTW_GO_MATRIX", go::matrix_env())
                    .env("GOSTW_CADDY", setup::caddy_path())
                    .env("GOSTW_OTLP_PYTHONPATH", setup::otlp_receiver_path())
                    .env("GOSTW_RELEASE_BIN", &release);
                tally.run(&mut cmd)
            });
            if opts.repeat == 1 {
                r?;
            }
            for kernel in opts.vm_kernels.iter().filter(|_| !opts.no_vm) {
                let r = timed(&format!("VM kernel tests, {kernel}{of}"), &mut || {
                    step(&format!("kernel tests in a VM ({kernel}, QEMU/TCG){of}"));
                    let (arch, kernel) = vm::kernel_entry(kernel)?;
                    vm::run(&vm::Options {
                        arch,
                        kernel,
                        ..vm::Options::default()
                    })
                });
                tally.vm(kernel, r.is_ok());
                if opts.repeat == 1 {
                    r?;
                }
            }
        }
        if opts.repeat > 1 {
            tally.report(opts.repeat)?;
        }
        Ok(())
    })();
    eprintln!("\n==> summary ({:.0?} in all)", started.elapsed());
    for (name, took, ok) in &timings {
        eprintln!(
            "  {:<28} {:>8.1?}  {}",
            name,
            took,
            if *ok { "ok" } else { "FAILED" }
        );
    }
    result
}

/// Pass counts per kernel test over repeated runs.
#[derive(Default)]
struct Tally {
    /// Test name: (passed, ran).
    tests: BTreeMap<String, (u32, u32)>,
    /// VM suite runs per kernel: (passed, ran).
    vm: BTreeMap<String, (u32, u32)>,
}

impl Tally {
    /// Run the kernel test binary through `cmd`, its output passed through
    /// as it comes, counting each test's result.
    fn run(&mut self, cmd: &mut Command) -> anyhow::Result<()> {
        eprintln!("+ {cmd:?}");
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the kernel tests")?;
        let stdout = child.stdout.take().context("kernel test output")?;
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            println!("{line}");
            if let Some((name, ok)) = result_of(&line) {
                let e = self.tests.entry(name.to_owned()).or_default();
                e.0 += u32::from(ok);
                e.1 += 1;
            }
        }
        let status = child.wait()?;
        if !status.success() {
            bail!("the kernel tests failed ({status})");
        }
        Ok(())
    }

    fn vm(&mut self, kernel: &str, ok: bool) {
        let e = self.vm.entry(kernel.to_owned()).or_default();
        e.0 += u32::from(ok);
        e.1 += 1;
    }

    /// Print every test's pass count; fail unless all passed every time.
    fn report(&self, runs: u32) -> anyhow::Result<()> {
        step(&format!("kernel tests over {runs} runs"));
        let flaky: Vec<_> = self
            .tests
            .iter()
            .filter(|(_, (passed, ran))| passed < ran || *ran < runs)
            .collect();
        for (name, (passed, ran)) in &self.tests {
            println!("  {passed:>3}/{ran:<3} {name}");
        }
        for (kernel, (passed, ran)) in &self.vm {
            println!("  {passed:>3}/{ran:<3} VM suite ({kernel})");
        }
        let vm_failed = self.vm.values().any(|(passed, ran)| passed < ran);
        println!(
            "{} tests, {} passed every run, {} did not",
            self.tests.len(),
            self.tests.len() - flaky.len(),
            flaky.len()
        );
        if !flaky.is_empty() || vm_failed {
            bail!(
                "not every run passed: {:?}{}",
                flaky.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
                if vm_failed { " and the VM suite" } else { "" }
            );
        }
        Ok(())
    }
}

/// A libtest result line: `test NAME ... ok` or `... FAILED`.
fn result_of(line: &str) -> Option<(&str, bool)> {
    let rest = line.strip_prefix("test ")?;
    let (name, result) = rest.rsplit_once(" ... ")?;
    match result.trim() {
        "ok" => Some((name, true)),
        "FAILED" => Some((name, false)),
        _ => None,
    }
}

/// `cargo` run from the workspace root.
fn cargo() -> Command {
    let mut c = Command::new("cargo");
    c.current_dir(workspace_root());
    c
}

/// `cargo test` of the kernel test binary; arguments after a `--` go to it.
pub fn kernel_tests() -> Command {
    let mut c = cargo();
    c.args(["test", "--package", "tracer", "--features", "kernel-tests"])
        .args(["--test", "kernel"]);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_read_from_libtest_lines() {
        assert_eq!(
            result_of("test faults::kprobe_backend_pageout ... ok"),
            Some(("faults::kprobe_backend_pageout", true))
        );
        assert_eq!(
            result_of("test storm::pageout_storm ... FAILED"),
            Some(("storm::pageout_storm", false))
        );
        assert_eq!(result_of("test result: ok. 3 passed; 0 failed"), None);
        assert_eq!(result_of("running 3 tests"), None);
    }

    #[test]
    fn a_test_that_failed_once_fails_the_report() {
        let mut t = Tally::default();
        t.tests.insert("a".into(), (2, 2));
        assert!(t.report(2).is_ok());
        t.tests.insert("b".into(), (1, 2));
        assert!(t.report(2).is_err());
    }
}
