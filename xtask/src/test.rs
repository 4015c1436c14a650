//! `cargo xtask test`: everything CI checks, in order, with the time each
//! step took. Kernel tests need root; they fail (not skip) without it. The
//! last step runs the kernel tests again inside a VM on a distro kernel
//! (`cargo xtask vm-test`).

use std::{process::Command, time::Instant};

use anyhow::bail;

use crate::{
    cmd::{exec, step, workspace_root},
    go, setup, vm,
};

#[derive(clap::Args)]
pub struct Options {
    /// Skip `cargo xtask setup` (for a machine already set up).
    #[arg(long)]
    pub no_setup: bool,
    /// Skip the VM step (kernel tests on a distro kernel under QEMU).
    #[arg(long)]
    pub no_vm: bool,
    /// Extra arguments for the kernel test binary (e.g. a test name filter).
    #[arg(last = true)]
    pub kernel_test_args: Vec<String>,
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut timings = Vec::new();
    let mut timed = |name: &str, f: &mut dyn FnMut() -> anyhow::Result<()>| -> anyhow::Result<()> {
        let t = Instant::now();
        let r = f();
        timings.push((name.to_owned(), t.elapsed(), r.is_ok()));
        r
    };
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
        timed("unit tests", &mut || {
            step("unit tests");
            exec(cargo().args(["test", "--workspace", "--exclude", "tracer-ebpf"]))
        })?;
        timed("kernel tests", &mut || {
            step("kernel tests (real eBPF programs, real Go binaries; serial)");
            if !setup::is_root() {
                bail!(
                    "the kernel tests load eBPF programs and need root: run `sudo -E cargo xtask test`"
                );
            }
            exec(
                kernel_tests()
                    .args(["--", "--test-threads=1"])
                    .args(vm::HOST_SKIP.iter().flat_map(|t| ["--skip", *t]))
                    .args(&opts.kernel_test_args)
                    .env("GOSTW_GO_MATRIX", go::matrix_env())
                    .env("GOSTW_CADDY", setup::caddy_path()),
            )
        })?;
        if !opts.no_vm {
            timed("VM kernel tests", &mut || {
                step("kernel tests in a VM (Debian's 6.1 kernel, QEMU/TCG)");
                vm::run(&vm::Options::default())
            })?;
        }
        Ok(())
    })();
    eprintln!("\n==> summary ({:.0?} in all)", started.elapsed());
    for (name, took, ok) in &timings {
        eprintln!(
            "  {:<24} {:>8.1?}  {}",
            name,
            took,
            if *ok { "ok" } else { "FAILED" }
        );
    }
    result
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
