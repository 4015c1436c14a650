//! Every cargo build of gostw the tasks run, in one form per architecture:
//! the release profile, static (glibc's crt-static), for the architecture's
//! target, with the workspace's user crates and the kernel tests' feature.
//! One form means each crate is compiled once per architecture and run: the
//! unit and kernel test binaries, the `gostw` the tests start and the one
//! `cargo xtask dist` ships come from the same compiled crates. Before, the
//! tests were built in the dev profile for the host and the release binary
//! apart, so every dependency was compiled twice per architecture.
//!
//! The tests therefore run optimised code without a debug build's
//! overflow checks: what they check is what ships. A plain `cargo test`
//! by hand still builds the dev profile, with them.
//!
//! Sharing holds only while the test build and the release build ask for
//! the same features of every crate: a dev-dependency that turns on a
//! feature of a shared crate (tokio's `test-util` did) splits them again.
//! [`gostw`] therefore fails when the release build compiles anything after
//! the test build ([`tests`]), naming what.

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    sync::Mutex,
};

use anyhow::{Context as _, bail, ensure};

use crate::{
    arch::Arch,
    cmd::{WORKSPACE, output, step, workspace_root},
};

/// `cargo SUBCOMMAND` in the one form: release, static, `arch`'s target,
/// the workspace's user crates with the kernel tests' feature.
pub fn cargo(arch: Arch, subcommand: &str) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(workspace_root())
        .arg(subcommand)
        .arg("--release")
        .args(WORKSPACE);
    arch.cargo_static(&mut cmd);
    cmd
}

/// `cargo test` of the kernel test binary (amd64); arguments after a `--`
/// go to it.
pub fn kernel_tests() -> Command {
    let mut cmd = cargo(Arch::Amd64, "test");
    cmd.args(["--test", "kernel"]);
    cmd
}

/// What the test build made for one architecture.
#[derive(Clone)]
pub struct TestBinaries {
    /// The kernel test binary (`--test kernel`).
    pub kernel: PathBuf,
    /// `gostw`, as the tests name it (`CARGO_BIN_EXE_gostw`): the static
    /// release binary.
    pub gostw: PathBuf,
}

/// Build the test binaries for `arch` without running them, once per
/// process (the guests of one architecture boot one after the other and
/// share them): every test target of the workspace for amd64 (the host runs
/// the unit tests too), the kernel test binary alone for a cross
/// architecture. The kernel test binary and `gostw` are found in cargo's
/// JSON messages.
pub fn tests(arch: Arch) -> anyhow::Result<TestBinaries> {
    if let Some((_, b)) = TESTS_BUILT.lock().unwrap().iter().find(|(a, _)| *a == arch) {
        return Ok(b.clone());
    }
    step(&format!(
        "build the test binaries and gostw ({}: release, static)",
        arch.uname()
    ));
    let mut cmd = cargo(arch, "test");
    if arch != Arch::Amd64 {
        cmd.args(["--test", "kernel"]);
    }
    cmd.args(["--no-run", "--message-format=json-render-diagnostics"]);
    let mut kernel = None;
    let mut gostw = None;
    for msg in artifacts(&mut cmd)? {
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        let kind = &msg["target"]["kind"][0];
        // The bin's own unit tests are a "gostw" bin artifact too, built
        // in test mode: not the program the tests start.
        let harness = msg["profile"]["test"] == true;
        match msg["target"]["name"].as_str() {
            Some("kernel") if kind == "test" => kernel = Some(PathBuf::from(exe)),
            Some("gostw") if kind == "bin" && !harness => gostw = Some(PathBuf::from(exe)),
            _ => {}
        }
    }
    let built = TestBinaries {
        kernel: kernel.context("cargo built no `kernel` test executable")?,
        gostw: gostw.context("cargo built no `gostw` executable")?,
    };
    // The guests run the tests' gostw: it must be the static release
    // binary. Compared as files: a path through a symlink names the same.
    let release = release_path(arch);
    ensure!(
        std::fs::canonicalize(&built.gostw)? == std::fs::canonicalize(&release)?,
        "the tests' gostw is {}, not the release binary {}",
        built.gostw.display(),
        release.display()
    );
    check_static(&release)?;
    TESTS_BUILT.lock().unwrap().push((arch, built.clone()));
    Ok(built)
}

/// The test builds this process ran, by architecture.
static TESTS_BUILT: Mutex<Vec<(Arch, TestBinaries)>> = Mutex::new(Vec::new());

/// Build the static release `gostw` for `arch` (checked to have no program
/// interpreter); returns it. After [`tests`] for the same architecture this
/// compiles nothing, and fails if it did.
pub fn gostw(arch: Arch) -> anyhow::Result<PathBuf> {
    step(&format!(
        "build gostw (release, static: crt-static, {})",
        arch.uname()
    ));
    let mut cmd = cargo(arch, "build");
    cmd.args(["--bin", "gostw", "--message-format=json-render-diagnostics"]);
    let msgs = artifacts(&mut cmd)?;
    let built = release_path(arch);
    check_static(&built)?;
    if TESTS_BUILT.lock().unwrap().iter().any(|(a, _)| *a == arch) {
        let compiled: Vec<&str> = msgs
            .iter()
            .filter(|m| m["fresh"] == false)
            .filter_map(|m| m["target"]["name"].as_str())
            .collect();
        if !compiled.is_empty() {
            bail!(
                "the release build compiled {compiled:?} again after the test build: the two must ask for the same features of every crate (xtask/src/build.rs)"
            );
        }
    }
    Ok(built)
}

/// Where cargo puts the static release `gostw` for `arch`.
fn release_path(arch: Arch) -> PathBuf {
    workspace_root().join(format!("target/{}/release/gostw", arch.rust_target()))
}

/// Fail unless `bin` asks for no program interpreter.
fn check_static(bin: &std::path::Path) -> anyhow::Result<()> {
    let interp = crate::dist::interpreter(&std::fs::read(bin)?)?;
    ensure!(
        interp.is_none(),
        "{} asks for a program interpreter ({interp:?}): not static",
        bin.display()
    );
    Ok(())
}

/// Run a cargo build whose messages are JSON; its compiler-artifact
/// messages. Diagnostics are rendered by cargo to stderr as usual.
fn artifacts(cmd: &mut Command) -> anyhow::Result<Vec<serde_json::Value>> {
    cmd.stderr(Stdio::inherit());
    let json = output(cmd)?;
    Ok(json
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .collect())
}
