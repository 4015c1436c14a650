//! `cargo xtask bench NAME`: overhead measurements, traced against untraced
//! runs of the same Go workload, interleaved so drifts in machine load hit
//! both sides alike. A benchmark prints figures; it does not pass or fail.

mod bpf;
mod compat;
pub mod faults;
mod kernel_waits;
pub mod overhead;
mod stack;
mod stopping;
mod storm;

use std::process::Command;

use anyhow::{Context as _, bail};

use crate::{
    cmd::{output, step},
    demo, go, setup,
};

#[derive(clap::Args)]
pub struct Options {
    /// Which benchmark: `overhead` (every feature's cost, per event from the
    /// kernel's BPF statistics and end to end, against untraced runs and the
    /// bpftrace equivalent), `pauses` (stop-the-world probes on a GC-heavy
    /// workload), `stack` (stack-growth modes and a bpftrace newstack
    /// counter on a goroutine-per-task workload), `faults` (page faults of
    /// a process gostw does not trace), `stopping` (what the stopping-phase
    /// probe adds to Go's own pause figures), `kernel-waits` (per-run cost
    /// of the programs that name the kernel's part of a pause, from the
    /// kernel's BPF statistics), `compat` (the same statistics for the
    /// older-kernel program variants beside the programs they replace, both
    /// on this kernel) or `storm` (what the CLI and the agent keep under a
    /// page-out storm beside a pause storm).
    pub name: String,
    /// Rounds (untraced/traced pairs; `overhead`: every configuration once);
    /// default 7, `overhead` 9 (at least).
    #[arg(long)]
    pub rounds: Option<u32>,
    /// Seconds each workload run lasts.
    #[arg(long, default_value_t = 3)]
    pub seconds: u32,
    /// `storm`: gcswap processes paged out at once.
    #[arg(long, default_value_t = 3)]
    pub processes: u32,
    /// Go version of the workload.
    #[arg(long, default_value = go::DEFAULT)]
    pub go: String,
    #[command(flatten)]
    pub overhead: overhead::OverheadOptions,
}

impl Options {
    pub fn rounds(&self) -> u32 {
        self.rounds.unwrap_or(7)
    }
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    match opts.name.as_str() {
        "overhead" => overhead::run(opts.rounds.unwrap_or(9), &opts.go, &opts.overhead),
        "pauses" => pauses(opts),
        "stack" => stack::run(opts),
        "stopping" => stopping::run(opts),
        "kernel-waits" => kernel_waits::run(opts),
        "compat" => compat::run(opts),
        "storm" => storm::run(opts.processes, opts.rounds.unwrap_or(4), &opts.go),
        "faults" => faults::run(&faults::Options {
            runs: opts.rounds() as usize,
            ..faults::Options::default()
        }),
        other => {
            bail!(
                "unknown benchmark {other:?} (known: overhead, pauses, stack, faults, stopping, kernel-waits, compat, storm)"
            )
        }
    }
}

/// One workload run: what it did and how fast.
struct Sample {
    /// Garbage allocated per second of wall-clock time.
    mib_per_s: f64,
    /// Garbage allocated per second of the workload's own CPU time (user +
    /// system, which includes the uprobe traps): on a shared machine this
    /// moves far less with other load than the wall-clock figure.
    mib_per_cpu_s: f64,
    pauses_per_s: f64,
}

/// The stw workload allocating as fast as it can with a small live heap: a
/// GC cycle (two pauses) every few milliseconds. Throughput is MiB of garbage
/// allocated per second; tracing costs two uprobe hits per pause.
fn pauses(opts: &Options) -> anyhow::Result<()> {
    let Some(toolchain) = go::toolchain(&opts.go) else {
        bail!("Go {} is not in the matrix", opts.go);
    };
    if !setup::is_root() {
        bail!("gostw loads eBPF programs and needs root: run `sudo -E cargo xtask bench pauses`");
    }
    let gostw = crate::build::gostw(crate::arch::Arch::Amd64)?;
    let workload = demo::build_stw_workload(toolchain, &opts.go)?;
    let duration = format!("{}s", opts.seconds);
    let args = [
        "-duration",
        duration.as_str(),
        "-gc",
        "0",
        "-readmemstats",
        "0",
        "-gomaxprocs",
        "0",
        "-live-mb",
        "4",
        "-alloc-mb",
        "32",
    ];
    step(&format!(
        "{} rounds of untraced then traced, {}s each (Go {})",
        opts.rounds(),
        opts.seconds,
        opts.go
    ));
    let mut wall = Vec::new();
    let mut cpu = Vec::new();
    let mut pauses = Vec::new();
    for round in 1..=opts.rounds() {
        let u = sample(Command::new(&workload).args(args))?;
        let t = sample(
            Command::new(&gostw)
                .args(["run", "--json", "--output", "/dev/null", "--"])
                .arg(&workload)
                .args(args),
        )?;
        eprintln!(
            "round {round}: untraced {:.0} MiB/s, {:.0} MiB/CPU-s; traced {:.0} MiB/s, {:.0} MiB/CPU-s, {:.0} pauses/s",
            u.mib_per_s, u.mib_per_cpu_s, t.mib_per_s, t.mib_per_cpu_s, t.pauses_per_s
        );
        wall.push(t.mib_per_s / u.mib_per_s);
        cpu.push(t.mib_per_cpu_s / u.mib_per_cpu_s);
        pauses.push(t.pauses_per_s);
    }
    println!(
        "pauses: traced/untraced throughput per CPU second {:.3} (median of {} rounds; min {:.3}, max {:.3}); \
         per wall-clock second {:.3}; {:.0} pauses/s traced",
        median(&mut cpu),
        opts.rounds(),
        cpu[0],
        cpu[cpu.len() - 1],
        median(&mut wall),
        median(&mut pauses)
    );
    Ok(())
}

/// The median (sorts `v`).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Run the workload (maybe under gostw) and read its GOSTW_REPORT.
fn sample(cmd: &mut Command) -> anyhow::Result<Sample> {
    let out = output(cmd)?;
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("GOSTW_REPORT "))
        .context("the workload printed no GOSTW_REPORT")?;
    let v: serde_json::Value = serde_json::from_str(line)?;
    let num = |k: &str| {
        v[k].as_f64()
            .with_context(|| format!("{k} missing from the report"))
    };
    let secs = num("elapsed_ns")? / 1e9;
    let pauses = match num("stw_gc").ok().filter(|n| *n >= 0.0) {
        Some(gc) => gc + num("stw_other")?,
        None => num("gc_pauses")?,
    };
    let mib = num("allocated_mib")?;
    Ok(Sample {
        mib_per_s: mib / secs,
        mib_per_cpu_s: mib / (num("cpu_ns")? / 1e9),
        pauses_per_s: pauses / secs,
    })
}
