//! `cargo xtask demo`: the README's first command. Builds gostw and a bundled
//! Go workload, traces it with `gostw run`, then runs the page-out scenario
//! under `gostw run` (pageout.rs): the workload's memory pushed to swap
//! between GCs, so its stop-the-world pauses take major faults on GC
//! metadata; gostw's own output, then Go's own pause histogram.

use std::{path::PathBuf, process::Command};

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
    let gostw = crate::build::gostw(crate::arch::Arch::Amd64)?;
    let out = build_stw_workload(toolchain, &opts.go)?;
    step(
        "gostw run --slow-pause 200us -- stw (forced GCs, ReadMemStats and GOMAXPROCS calls): \
         a line per pause of 200 us or more, then the summary",
    );
    exec(
        Command::new(&gostw)
            .args(["run", "--slow-pause", "200us", "--"])
            .arg(&out),
    )?;
    step(
        "the page-out scenario: gostw run on a Go heap pushed to swap before each GC; its pauses \
         take major faults on GC metadata (swap file and cgroup removed at the end)",
    );
    let gcswap = build_workload(toolchain, &opts.go, "gcswap")?;
    crate::pageout::run(&gostw, &gcswap)
}

/// Build the bundled `stw` workload with `toolchain`; returns the binary.
pub fn build_stw_workload(toolchain: go::Toolchain, version: &str) -> anyhow::Result<PathBuf> {
    build_workload(toolchain, version, "stw")
}

/// Build `scripts/workloads/<name>` with `toolchain` into
/// `target/go-workloads/<version>/<name>`; returns the binary.
pub fn build_workload(
    toolchain: go::Toolchain,
    version: &str,
    name: &str,
) -> anyhow::Result<PathBuf> {
    step(&format!(
        "build the bundled workload {name} with Go {version}"
    ));
    let out = workspace_root()
        .join("target/go-workloads")
        .join(version)
        .join(name);
    exec(&mut toolchain.build(name, &[], &out))?;
    Ok(out)
}
