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
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{
    arch::Arch,
    build,
    cmd::{WORKSPACE, exec, free_bytes, step, workspace_root},
    go, setup,
    testlog::{Outcome, TestLog},
    vm,
};

#[derive(clap::Args)]
pub struct Options {
    /// Skip `cargo xtask setup` (for a machine already set up).
    #[arg(long)]
    pub no_setup: bool,
    /// Skip the VM step (kernel tests on a distro kernel under QEMU).
    #[arg(long)]
    pub no_vm: bool,
    /// Skip the host's kernel tests (to run the guests alone).
    #[arg(long)]
    pub no_host: bool,
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

/// What a full run writes under `target/` on a fresh clone, with room to
/// spare: 11 GiB when the tests were built apart from the release binary
/// (the fresh-clone run of 3cc5a24), 4.2 GiB with one build form (8442455);
/// plus room for the toolchains and images setup fetches on a fresh
/// machine.
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

/// The whole suite's budget on a 2-core machine: half of CI's 90 minutes,
/// so that what comes next has room.
const BUDGET: Duration = Duration::from_secs(2700);

/// One step's name, time and result, for the summary.
struct Step {
    name: String,
    took: Duration,
    ok: bool,
}

/// What the summary shows besides the steps: each kernel test run's slowest
/// tests, what it skipped and why, and the guests booted twice.
#[derive(Default)]
struct Seen {
    steps: Vec<Step>,
    runs: Vec<(String, TestLog)>,
    reboots: Vec<vm::Reboot>,
}

/// Run `f` as the step `name`, its time and result kept in `seen`.
fn timed(
    seen: &Mutex<Seen>,
    name: &str,
    f: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let t = Instant::now();
    let r = f();
    seen.lock().unwrap().steps.push(Step {
        name: name.to_owned(),
        took: t.elapsed(),
        ok: r.is_ok(),
    });
    r
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    let started = Instant::now();
    check_room()?;
    let seen = Mutex::new(Seen::default());
    let mut tally = Tally::default();
    let result = (|| -> anyhow::Result<()> {
        if !opts.no_setup {
            timed(&seen, "setup", || setup::run(&setup::Options::default()))?;
        }
        timed(&seen, "fmt", || {
            step("cargo fmt --check");
            exec(cargo().args(["fmt", "--all", "--", "--check"]))
        })?;
        timed(&seen, "clippy (user crates)", || {
            step("clippy: user crates");
            exec(
                cargo()
                    .args(["clippy", "--all-targets"])
                    .args(WORKSPACE)
                    .args(["--", "-D", "warnings"]),
            )
        })?;
        timed(&seen, "clippy (eBPF crate)", || {
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
        timed(&seen, "book", || {
            // Under target/, so that the clone's removal takes it too.
            crate::book::build(&workspace_root().join("target/book"))
        })?;
        let mut release = None;
        timed(&seen, "build", || {
            step(
                "build everything the tests run, once: unit and kernel test binaries, release gostw",
            );
            // One form for all (build.rs): the release gostw compiles
            // nothing after the test build.
            build::tests(Arch::Amd64)?;
            release = Some(build::gostw(Arch::Amd64)?);
            Ok(())
        })?;
        let release = release.context("the build step gave no release binary")?;
        timed(&seen, "unit tests", || {
            step("unit tests");
            exec(build::cargo(Arch::Amd64, "test").args(["--lib", "--bins"]))?;
            exec(build::cargo(Arch::Amd64, "test").arg("--doc"))
        })?;
        let host_filters: Vec<&String> = opts
            .kernel_test_args
            .iter()
            .filter(|a| !a.starts_with('-'))
            .collect();
        if !host_filters.is_empty() {
            check_host_filters(&opts.kernel_test_args)?;
        }
        for round in 1..=opts.repeat {
            let of = if opts.repeat > 1 {
                format!(" (run {round} of {})", opts.repeat)
            } else {
                String::new()
            };
            let host = if opts.no_host {
                Ok(())
            } else {
                timed(&seen, &format!("kernel tests{of}"), || {
                    step(&format!(
                        "kernel tests (real eBPF programs, real Go binaries; serial){of}"
                    ));
                    if !setup::is_root() {
                        bail!(
                            "the kernel tests load eBPF programs and need root: run `sudo -E cargo xtask test`"
                        );
                    }
                    let mut cmd = build::kernel_tests();
                    cmd.args(["--", "--test-threads=1"])
                        .args(vm::HOST_SKIP.iter().flat_map(|(t, _)| ["--skip", *t]))
                        .args(&opts.kernel_test_args)
                        .env("GOSTW_GO_MATRIX", go::matrix_env())
                        .env("GOSTW_CADDY", setup::caddy_path())
                        .env("GOSTW_OTLP_PYTHONPATH", setup::otlp_receiver_path())
                        .env("GOSTW_RELEASE_BIN", &release);
                    let mut log = TestLog::default();
                    let r = tally.run(&mut cmd, &mut log);
                    seen.lock().unwrap().runs.push((format!("host{of}"), log));
                    r
                })
            };
            // The guests run whatever the host's tests gave: one run of
            // the suite shows every failure. The static builds, the package
            // and the images are checked once, before the guests.
            let dist = round == 1;
            let vm_ok = guests(opts, &release, dist, &of, &seen, &mut tally);
            if opts.repeat == 1 {
                host?;
                vm_ok?;
            }
        }
        if opts.repeat > 1 {
            tally.report(opts.repeat)?;
        }
        Ok(())
    })();
    summary(&seen.into_inner().unwrap(), started.elapsed(), opts);
    result
}

/// `dist` (where asked), then the guests, one after the other. On a
/// 2-core machine they are not run side by side: a TCG guest takes both
/// cores when its tests work, and the arm64 cross builds beside an amd64
/// guest slowed it fourfold (5 of 21 tests in 16 minutes on 5.10).
fn guests(
    opts: &Options,
    release: &std::path::Path,
    dist: bool,
    of: &str,
    seen: &Mutex<Seen>,
    tally: &mut Tally,
) -> anyhow::Result<()> {
    let entries: Vec<(Arch, String, &String)> = if opts.no_vm {
        Vec::new()
    } else {
        opts.vm_kernels
            .iter()
            .map(|k| vm::kernel_entry(k).map(|(arch, name)| (arch, name, k)))
            .collect::<anyhow::Result<_>>()?
    };
    if dist {
        timed(seen, "dist", || {
            let mut builds = vec![(Arch::Amd64, release.to_owned())];
            if entries.iter().any(|(arch, _, _)| *arch == Arch::Arm64) {
                // The arm64 guest's test binary first: the release build
                // then compiles nothing (build.rs).
                build::tests(Arch::Arm64)?;
                builds.push((Arch::Arm64, build::gostw(Arch::Arm64)?));
            }
            crate::dist::artifacts(&builds)
        })?;
    }
    let mut first_err = None;
    for (arch, kernel, entry) in &entries {
        let r = timed(seen, &format!("VM kernel tests, {entry}{of}"), || {
            step(&format!("kernel tests in a VM ({entry}, QEMU/TCG){of}"));
            let mut out = vm::VmRun::default();
            let r = vm::run(
                &vm::Options {
                    arch: *arch,
                    kernel: kernel.clone(),
                    ..vm::Options::default()
                },
                &mut out,
            );
            let mut seen = seen.lock().unwrap();
            seen.runs.push((format!("{entry}{of}"), out.tests));
            seen.reboots.extend(out.reboots);
            r
        });
        tally.vm(entry, r.is_ok());
        // Every guest runs, whatever the one before gave: one run shows
        // every failure.
        if let Err(e) = r {
            eprintln!("VM {entry}: {e:#}");
            first_err.get_or_insert(e.context(format!("VM {entry}")));
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// Filters given to the host's kernel tests must each match a test, as the
/// VM's must: one that matches none would leave its part unrun, silently.
fn check_host_filters(args: &[String]) -> anyhow::Result<()> {
    let list = crate::cmd::output(build::kernel_tests().args(["--", "--list"]))?;
    let names: Vec<&str> = list
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .collect();
    let unmatched = vm::unmatched_filters(&names, args);
    if !unmatched.is_empty() {
        bail!("kernel test filter(s) {unmatched:?} match no kernel test");
    }
    Ok(())
}

/// Every step's time against the budget; each kernel test run's slowest
/// tests; what was skipped and why; every guest booted twice.
fn summary(seen: &Seen, total: Duration, opts: &Options) {
    eprintln!("\n==> summary ({total:.0?} in all)");
    for s in &seen.steps {
        eprintln!(
            "  {:<34} {:>8.1?}  {}",
            s.name,
            s.took,
            if s.ok { "ok" } else { "FAILED" }
        );
    }
    let times = workspace_root().join("target/test-times");
    let _ = std::fs::create_dir_all(&times);
    for (run, log) in &seen.runs {
        // Every test's time, for whoever looks at where the time goes.
        let file = times.join(format!("{}.tsv", run.replace([' ', ':', '(', ')'], "_")));
        let rows: String = log
            .results
            .iter()
            .map(|r| format!("{:.1}\t{}\t{:?}\n", r.took.as_secs_f64(), r.name, r.outcome))
            .collect();
        let _ = std::fs::write(&file, rows);
        let slowest: Vec<String> = log
            .slowest(5)
            .iter()
            .map(|r| format!("{} {:.0?}", r.name, r.took))
            .collect();
        eprintln!(
            "  {run}: {} tests (times in {}); slowest: {}",
            log.results.len(),
            file.display(),
            slowest.join(", ")
        );
        for (name, why) in log.ignored() {
            eprintln!("    skipped {name}: {why}");
        }
    }
    if seen.runs.iter().any(|(run, _)| run.starts_with("host")) {
        for (test, why) in vm::HOST_SKIP {
            eprintln!("  host skipped {test}: {why} (runs in the VM)");
        }
    }
    for r in &seen.reboots {
        eprint!("{r}");
    }
    // A run that asked for part of the suite has no budget to keep.
    let whole =
        opts.kernel_test_args.is_empty() && !opts.no_vm && !opts.no_host && opts.repeat == 1;
    if whole {
        if total <= BUDGET {
            eprintln!("  within the budget: {total:.0?} of {BUDGET:.0?}");
        } else {
            eprintln!(
                "  OVER THE BUDGET: {total:.0?} where the suite must take {BUDGET:.0?} at most"
            );
        }
    }
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
    fn run(&mut self, cmd: &mut Command, log: &mut TestLog) -> anyhow::Result<()> {
        eprintln!("+ {cmd:?}");
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the kernel tests")?;
        let stdout = child.stdout.take().context("kernel test output")?;
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            println!("{line}");
            let before = log.results.len();
            log.line(&line, Instant::now());
            for r in &log.results[before..] {
                let ok = match r.outcome {
                    Outcome::Passed => true,
                    Outcome::Failed => false,
                    Outcome::Ignored(_) => continue,
                };
                let e = self.tests.entry(r.name.clone()).or_default();
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

/// `cargo` run from the workspace root.
fn cargo() -> Command {
    let mut c = Command::new("cargo");
    c.current_dir(workspace_root());
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_that_failed_once_fails_the_report() {
        let mut t = Tally::default();
        t.tests.insert("a".into(), (2, 2));
        assert!(t.report(2).is_ok());
        t.tests.insert("b".into(), (1, 2));
        assert!(t.report(2).is_err());
    }
}
