//! `cargo xtask bench overhead`: what tracing costs, side by side with the
//! bpftrace script that watches the same events, in one interleaved run.
//!
//! Four fixed-work workloads, each timing its own work from inside
//! (start-up, warm-up and attach excluded; `GOSTW_WORK begin/end` lines mark
//! the window): the allocation-heavy `alloc` Go workload, a pause storm
//! (`stw`: 64 KiB garbage objects over a 4 MiB live heap, hundreds of
//! stop-the-world pauses a second, where every uprobe hit counts), the
//! stack-growth storm of `stackgrowth -mode batch` (one new goroutine per
//! task, each growing its stack once), and a page-fault-heavy program that is not Go
//! and not traced (the fault worker), run while gostw or bpftrace trace an
//! idle Go process: untraced processes should pay nothing. Every
//! configuration runs once per round, in an order that rotates each round;
//! figures are medians with their range over the rounds.
//!
//! The kernel's BPF statistics are on for the whole run: each traced run
//! reads the run count and run time of the tracer's programs at the two
//! marks (from `/proc/PID/fdinfo`), so the per-program ns per hit and the
//! estimated BPF cost are those of the work window. The uprobe trap, which
//! the kernel does not count as program time, is measured first and added
//! per uprobe hit.

mod report;
mod run;

use std::{path::PathBuf, process::Command};

use anyhow::bail;

use self::run::{Cell, Config, RunResult, Tracer, Workload};
pub use self::run::{TrapWorkerOptions, trap_worker};
use super::bpf;
use crate::{
    cmd::{exec, step, workspace_root},
    go, setup,
};

/// Work sizes and settings of `bench overhead`.
#[derive(clap::Args, Debug)]
pub struct OverheadOptions {
    /// GOMAXPROCS of every Go workload.
    #[arg(long, default_value_t = 2)]
    pub gomaxprocs: u32,
    /// Requests of the allocation-heavy workload.
    #[arg(long, default_value_t = 400_000)]
    pub alloc_ops: u32,
    /// MiB of 64 KiB garbage objects the pause storm allocates (4 MiB live
    /// heap: a GC cycle every few milliseconds).
    #[arg(long, default_value_t = 12_000)]
    pub storm_mb: u32,
    /// Tasks (goroutines, one stack growth each) of the stack-growth storm.
    #[arg(long, default_value_t = 200_000)]
    pub stack_tasks: u32,
    /// MiB of fresh anonymous memory the fault worker touches (minor faults).
    #[arg(long, default_value_t = 256)]
    pub anon_mb: usize,
    /// MiB of an evicted file the fault worker reads (major faults).
    #[arg(long, default_value_t = 32)]
    pub file_mb: usize,
    /// Calls to a uprobed function per trap-cost measurement.
    #[arg(long, default_value_t = 20_000)]
    pub trap_calls: u32,
}

/// A gostw configuration: name, options, environment.
type GostwConfig = (
    &'static str,
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
);

/// gostw configurations (name, options, environment): the default, each
/// feature alone (pauses are always traced), and the default with the
/// program variants older kernels load (`GOSTW_COMPAT=force`: 5.10's
/// fallbacks for `bpf_loop`, `bpf_task_pt_regs` and the BTF task helpers),
/// so each fallback's cost per run stands beside the preferred program's.
const GOSTW_CONFIGS: &[GostwConfig] = &[
    ("gostw run (default)", &[], &[]),
    (
        "gostw pauses only",
        &["--no-faults", "--stacks", "off"],
        &[],
    ),
    ("gostw + faults", &["--stacks", "off"], &[]),
    ("gostw + stacks (sampled)", &["--no-faults"], &[]),
    ("gostw, 5.10 variants", &[], &[("GOSTW_COMPAT", "force")]),
];

pub fn run(rounds: u32, go_version: &str, o: &OverheadOptions) -> anyhow::Result<()> {
    if rounds < 9 {
        bail!("bench overhead needs at least 9 rounds (got {rounds})");
    }
    let Some(toolchain) = go::toolchain(go_version) else {
        bail!("Go {go_version} is not in the matrix");
    };
    if !setup::is_root() {
        bail!("the overhead bench loads eBPF programs: run `sudo -E cargo xtask bench overhead`");
    }
    let gostw = crate::build::gostw(crate::arch::Arch::Amd64)?;
    let alloc = build_workload(toolchain, go_version, "alloc")?;
    let stackgrowth = build_workload(toolchain, go_version, "stackgrowth")?;
    let stw = build_workload(toolchain, go_version, "stw")?;
    let file = PathBuf::from(format!(
        "/var/tmp/gostw-bench-overhead-{}.dat",
        std::process::id()
    ));
    super::faults::write_file(&file, o.file_mb)?;
    let result = (|| {
        let _stats = bpf::Stats::enable()?;
        let trap = run::measure_trap(o.trap_calls)?;
        let workloads = [
            Workload::go(
                "allocation-heavy",
                &alloc,
                &["-ops", &o.alloc_ops.to_string()],
            ),
            Workload::go(
                "pause storm",
                &stw,
                &[
                    "-gc",
                    "0",
                    "-readmemstats",
                    "0",
                    "-gomaxprocs",
                    "0",
                    "-live-mb",
                    "4",
                    "-alloc-mb",
                    &o.storm_mb.to_string(),
                ],
            ),
            Workload::go(
                "stack-growth storm",
                &stackgrowth,
                &["-mode", "batch", "-tasks", &o.stack_tasks.to_string()],
            ),
            Workload::faults(&alloc, o.anon_mb, &file),
        ];
        let mut cells = Vec::new();
        for (w, workload) in workloads.iter().enumerate() {
            let mut configs = vec![Config {
                name: "untraced",
                tracer: Tracer::None,
            }];
            let gostw_configs = if workload.is_go() {
                GOSTW_CONFIGS
            } else {
                &GOSTW_CONFIGS[..1]
            };
            configs.extend(gostw_configs.iter().map(|(name, args, env)| Config {
                name,
                tracer: Tracer::Gostw(gostw.clone(), args, env),
            }));
            configs.push(Config {
                name: "bpftrace (same events)",
                tracer: Tracer::Bpftrace,
            });
            cells.extend(configs.into_iter().map(|config| Cell {
                workload: w,
                config,
                runs: Vec::new(),
            }));
        }
        step(&format!(
            "{rounds} rounds of {} runs, order rotating each round (GOMAXPROCS={}, Go {go_version})",
            cells.len(),
            o.gomaxprocs
        ));
        let mut reader = bpf::Reader::default();
        let n = cells.len();
        for round in 0..rounds as usize {
            for k in 0..n {
                let cell = &mut cells[(k + round) % n];
                let workload = &workloads[cell.workload];
                let r: RunResult = run::run_once(workload, &cell.config, o, &mut reader)?;
                eprintln!(
                    "  round {}/{rounds}: {:<20} {:<26} work {:.3} s wall, {:.3} s CPU",
                    round + 1,
                    workload.name,
                    cell.config.name,
                    r.wall_s,
                    r.cpu_s
                );
                cell.runs.push(r);
            }
        }
        report::print(&workloads, &cells, &trap, rounds, o, go_version);
        Ok(())
    })();
    let _ = std::fs::remove_file(&file);
    result
}

/// The median of `v` (the upper one of an even count; NaN when empty).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Build workload `name` of scripts/workloads with `toolchain`.
fn build_workload(toolchain: go::Toolchain, version: &str, name: &str) -> anyhow::Result<PathBuf> {
    step(&format!("build the {name} workload with Go {version}"));
    let out = workspace_root()
        .join("target/go-workloads")
        .join(version)
        .join(name);
    exec(
        Command::new(toolchain.go())
            .current_dir(workspace_root().join("scripts/workloads").join(name))
            .args(["build", "-o"])
            .arg(&out)
            .arg(".")
            .env("GOTOOLCHAIN", "local")
            .env("GOFLAGS", "-buildvcs=false"),
    )?;
    Ok(out)
}
