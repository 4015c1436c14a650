//! `cargo xtask scenario <name>`: a reproduction scenario. `pageout` runs
//! the real `gostw run` on it and shows gostw's own output (pageout.rs, as
//! in the demo); the others run as their kernel test with output shown.
//! Each sets up and cleans up (swap file, cgroup, processes) even when it
//! fails.

use anyhow::{Context as _, bail};

use crate::{
    cmd::{exec, step},
    demo, go, setup,
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
    /// major faults on GC metadata inside stop-the-world pauses, as
    /// `gostw run` reports them.
    Pageout,
    /// The same workload without page-out: pauses with no faults.
    Control,
    /// A memory cgroup with a limit, a neighbour re-reading a large buffer,
    /// and a Go process with allocation spikes: natural GCs under reclaim.
    Neighbour,
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    if !setup::is_root() {
        bail!("scenarios need root (swap, cgroups, eBPF): run `sudo -E cargo xtask scenario ...`");
    }
    let test = match opts.name {
        Scenario::Pageout => {
            let toolchain =
                go::toolchain(go::DEFAULT).context("the default Go is in the matrix")?;
            let gostw = crate::build::gostw(crate::arch::Arch::Amd64)?;
            let gcswap = demo::build_workload(toolchain, go::DEFAULT, "gcswap")?;
            step("the page-out scenario under gostw run");
            return crate::pageout::run(&gostw, &gcswap);
        }
        Scenario::Control => "faults::without_pageout_pauses_have_no_faults",
        Scenario::Neighbour => "faults::neighbour_pressure_faults_agree_with_majflt",
    };
    step(&format!("scenario: {test}"));
    exec(
        crate::build::kernel_tests()
            .args(["--", "--test-threads=1", "--nocapture", "--exact", test])
            .env("GOSTW_GO_MATRIX", go::matrix_env()),
    )
}
