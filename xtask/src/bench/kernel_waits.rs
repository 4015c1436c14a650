//! `cargo xtask bench kernel-waits`: what naming the kernel's part of a
//! pause costs per program run, from the kernel's BPF statistics (the
//! summary's `health.programs` of `gostw attach --json`), in the two
//! scenarios the kernel-wait tests use:
//! - `spinner`: one goroutine spinning without preemption (the world is
//!   stopping a third of the time: the scheduler programs and the laggard
//!   sampler work inside pauses most);
//! - `reclaim`: two goroutines touching huge pages in a 64 MiB memory cgroup
//!   whose page cache a writer keeps full and dirty (threads asleep in
//!   reclaim inside page faults: the fault backend takes their kernel
//!   stacks, outside pauses too).
//!
//! Rounds alternate the scenarios; each program's figures are the median
//! and range of its ns per run over the rounds.

use std::{
    collections::BTreeMap,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};
use gostw_scenario::{DirtyWriter, MemCgroup};

use super::{Options, bpf, median};
use crate::{cmd::step, demo, go, setup};

/// One program's figures in one run.
#[derive(Clone, Copy)]
pub(super) struct Prog {
    runs: u64,
    ns_per_run: f64,
}

/// One traced run: the programs that ran, the pauses, gostw's peak RSS.
pub(super) struct Run {
    pub programs: BTreeMap<String, Prog>,
    pub pauses: usize,
    pub peak_rss_bytes: u64,
}

const SCENARIOS: [&str; 2] = ["spinner", "reclaim"];

pub fn run(opts: &Options) -> anyhow::Result<()> {
    let Some(toolchain) = go::toolchain(&opts.go) else {
        bail!("Go {} is not in the matrix", opts.go);
    };
    if !setup::is_root() {
        bail!(
            "gostw loads eBPF programs and needs root: run `sudo -E cargo xtask bench kernel-waits`"
        );
    }
    let gostw = crate::build::gostw(crate::arch::Arch::Amd64)?;
    let workload = demo::build_stw_workload(toolchain, &opts.go)?;
    let _stats = bpf::Stats::enable()?;
    step(&format!(
        "{} rounds of {} s of `gostw attach` on each scenario: {} (Go {})",
        opts.rounds(),
        opts.seconds,
        SCENARIOS.join(", "),
        opts.go
    ));
    let mut runs: [Vec<Run>; 2] = Default::default();
    for round in 1..=opts.rounds() {
        for (i, name) in SCENARIOS.iter().enumerate() {
            let r = match i {
                0 => spinner(&gostw, &workload, opts.seconds, &Gostw::default())?,
                _ => reclaim(&gostw, &workload, opts.seconds)?,
            };
            eprintln!(
                "round {round} {name}: {} pauses, {} programs ran, peak RSS {:.1} MB",
                r.pauses,
                r.programs.len(),
                r.peak_rss_bytes as f64 / 1e6
            );
            runs[i].push(r);
        }
    }
    for (name, runs) in SCENARIOS.iter().zip(&runs) {
        report("kernel-waits", name, runs);
    }
    Ok(())
}

/// Print each program's runs and ns per run: median (min-max) over `runs`,
/// each line headed `bench: scenario`.
pub(super) fn report(bench: &str, scenario: &str, runs: &[Run]) {
    let names: std::collections::BTreeSet<&String> =
        runs.iter().flat_map(|r| r.programs.keys()).collect();
    for name in names {
        let of = |f: &dyn Fn(&Prog) -> f64| -> Vec<f64> {
            runs.iter()
                .filter_map(|r| r.programs.get(name))
                .map(f)
                .collect()
        };
        let mut ns = of(&|p| p.ns_per_run);
        let mut n = of(&|p| p.runs as f64);
        let (lo, hi) = min_max(&ns);
        println!(
            "{bench}: {scenario:>9} {name:<22} {:>9.0} runs, {:>6.0} ns/run ({lo:.0}-{hi:.0}, {} runs of gostw)",
            median(&mut n),
            median(&mut ns),
            ns.len()
        );
    }
    let mut rss: Vec<f64> = runs.iter().map(|r| r.peak_rss_bytes as f64).collect();
    let (lo, hi) = min_max(&rss);
    println!(
        "{bench}: {scenario:>9} gostw peak RSS {:.1} MB ({:.1}-{:.1})",
        median(&mut rss) / 1e6,
        lo / 1e6,
        hi / 1e6
    );
}

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)))
}

/// What a bench adds to `gostw attach --json --duration S --pid P`.
#[derive(Default)]
pub(super) struct Gostw<'a> {
    pub args: &'a [&'a str],
    pub env: &'a [(&'a str, &'a str)],
}

/// The stw workload's spinner, asynchronous preemption off.
pub(super) fn spinner(
    gostw: &Path,
    workload: &Path,
    seconds: u32,
    with: &Gostw,
) -> anyhow::Result<Run> {
    let program = Command::new(workload)
        .env("GODEBUG", "asyncpreemptoff=1")
        .args(["-spinners", "1", "-interval", "40ms", "-gc", "1"])
        .args(["-alloc-mb", "1", "-readmemstats", "0", "-gomaxprocs", "0"])
        .args(["-duration", &format!("{}s", seconds + 5)])
        .stdout(Stdio::null())
        .spawn()
        .context("starting the stw workload")?;
    traced(gostw, program, seconds, with)
}

/// Touchers of huge pages in a full memory cgroup beside a dirty writer.
fn reclaim(gostw: &Path, workload: &Path, seconds: u32) -> anyhow::Result<Run> {
    let cg = MemCgroup::create("gostw-bench-reclaim")?;
    if cg.is_v1() {
        cg.write("memory.limit_in_bytes", "64M")?;
        cg.write("memory.swappiness", "0")?;
    } else {
        cg.write("memory.max", "64M")?;
        cg.write("memory.swap.max", "0")?;
    }
    let procs = cg.path.join("cgroup.procs");
    let writer = DirtyWriter::start(&cg, "bench-reclaim")?;
    std::thread::sleep(Duration::from_secs(2));
    let program = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$0" && exec "$@""#)
        .arg(&procs)
        .arg(workload)
        .args(["-touch-mb", "8", "-touch-huge", "-touchers", "2"])
        .args(["-gc", "1", "-interval", "20ms", "-alloc-mb", "0"])
        .args(["-readmemstats", "0", "-gomaxprocs", "0"])
        .args(["-duration", &format!("{}s", seconds + 5)])
        .stdout(Stdio::null())
        .spawn()
        .context("starting the stw workload")?;
    let run = traced(gostw, program, seconds, &Gostw::default());
    drop(writer);
    run
}

/// `gostw attach --json --duration SECONDS` on `program` (`--stacks off`
/// unless `with` says otherwise), which is then stopped: the summary's
/// program figures.
fn traced(gostw: &Path, mut program: Child, seconds: u32, with: &Gostw) -> anyhow::Result<Run> {
    // Past its start-up: the runtime's threads and the workload's goroutines run.
    std::thread::sleep(Duration::from_millis(500));
    let stacks: &[&str] = if with.args.contains(&"--stacks") {
        &[]
    } else {
        &["--stacks", "off"]
    };
    let out = Command::new(gostw)
        .args(["attach", "--json"])
        .args(stacks)
        .args(with.args)
        .envs(with.env.iter().copied())
        .arg("--duration")
        .arg(format!("{seconds}s"))
        .arg("--pid")
        .arg(program.id().to_string())
        .stderr(Stdio::null())
        .output()
        .context("running gostw attach");
    let _ = program.kill();
    let _ = program.wait();
    let out = out?;
    if !out.status.success() {
        bail!("gostw attach failed ({})", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let records: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let summary = records
        .iter()
        .rfind(|r| r["type"] == "summary")
        .context("gostw printed no summary")?;
    let health = &summary["health"];
    let programs = health["programs"]
        .as_array()
        .context("the summary has no health.programs")?
        .iter()
        .filter(|p| p["runs"].as_u64().unwrap_or(0) > 0)
        .filter_map(|p| {
            Some((
                p["program"].as_str()?.to_owned(),
                Prog {
                    runs: p["runs"].as_u64()?,
                    ns_per_run: p["ns_per_run"].as_f64()?,
                },
            ))
        })
        .collect();
    Ok(Run {
        programs,
        pauses: records.iter().filter(|r| r["type"] == "pause").count(),
        peak_rss_bytes: health["peak_rss_bytes"].as_u64().unwrap_or(0),
    })
}
