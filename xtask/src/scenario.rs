//! `cargo xtask scenario <name>`: a reproduction scenario, run as its kernel
//! test with output shown, so it sets up and cleans up (swap file, cgroup,
//! processes) exactly as CI does, even when it fails.

use anyhow::bail;

use crate::{
    cmd::{exec, step},
    go, setup,
};

#[derive(clap::Args)]
pub struct Options {
    /// Which scenario.
    #[arg(value_enum)]
    pub name: Scenario,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Scenario {
    /// A Go process's memory pushed to swap (process_madvise) between GCs:
    /// major faults on GC metadata inside stop-the-world pauses.
    Pageout,
    /// The same workload without page-out: pauses with no faults.
    Control,
    /// A memory cgroup with a limit, a neighbour re-reading a large buffer,
    /// and a Go process with allocation spikes: natural GCs under reclaim.
    Neighbour,
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    run_with_go(opts.name, &go::matrix_env())
}

/// Run scenario `name` with the Go toolchains of `matrix`
/// (`GOSTW_GO_MATRIX` form).
pub fn run_with_go(name: Scenario, matrix: &str) -> anyhow::Result<()> {
    if !setup::is_root() {
        bail!("scenarios need root (swap, cgroups, eBPF): run `sudo -E cargo xtask scenario ...`");
    }
    let test = match name {
        Scenario::Pageout => "faults::pageout_pauses_fault_on_gc_metadata",
        Scenario::Control => "faults::without_pageout_pauses_have_no_faults",
        Scenario::Neighbour => "faults::neighbour_pressure_faults_agree_with_majflt",
    };
    step(&format!("scenario: {test}"));
    exec(
        crate::test::kernel_tests()
            .args(["--", "--test-threads=1", "--nocapture", "--exact", test])
            .env("GOSTW_GO_MATRIX", matrix),
    )
}
