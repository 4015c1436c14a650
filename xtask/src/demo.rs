//! `cargo xtask demo`: the README's first command. Builds gostw and a bundled
//! Go workload, then traces the workload with `gostw run`.

use std::process::Command;

use anyhow::bail;

use crate::{
    cmd::{exec, step, workspace_root},
    go, setup,
};

#[derive(clap::Args)]
pub struct Options {
    /// Go version of the workload (one of the test matrix).
    #[arg(long, default_value = go::DEFAULT)]
    pub go: String,
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    let Some(toolchain) = go::toolchain(&opts.go) else {
        bail!("Go {} is not in the matrix", opts.go);
    };
    setup::run(&setup::Options { minimal: true })?;
    if !matches!(toolchain.source, go::Source::Pip) || opts.go != go::DEFAULT {
        setup::run(&setup::Options { minimal: false })?;
    }
    if !setup::is_root() {
        bail!("gostw loads eBPF programs and needs root: run `sudo -E cargo xtask demo`");
    }
    step("build gostw");
    exec(Command::new("cargo").current_dir(workspace_root()).args([
        "build",
        "--release",
        "--package",
        "tracer",
        "--bin",
        "gostw",
    ]))?;
    step(&format!("build the bundled workload with Go {}", opts.go));
    let out = workspace_root()
        .join("target/go-workloads")
        .join(&opts.go)
        .join("stw");
    exec(
        Command::new(toolchain.go())
            .current_dir(workspace_root().join("scripts/workloads/stw"))
            .args(["build", "-o"])
            .arg(&out)
            .arg(".")
            .env("GOTOOLCHAIN", "local")
            .env("GOFLAGS", "-buildvcs=false"),
    )?;
    step("gostw run -- stw (a workload with forced GCs, ReadMemStats and GOMAXPROCS calls)");
    exec(
        Command::new(workspace_root().join("target/release/gostw"))
            .arg("run")
            .arg("--")
            .arg(&out),
    )
}
