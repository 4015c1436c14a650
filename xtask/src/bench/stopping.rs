//! `cargo xtask bench stopping`: what the stopping probe (on
//! `stopTheWorldWithSema`'s calls of `timeHistogram.record`, where Go's
//! stopping phase is read) adds to the pauses Go itself reports. The trap
//! fires inside every pause, after Go took `finishedStopping`, so it moves
//! Go's total (`/sched/pauses/total/*`) and not its stopping histogram. The
//! explanation (the scheduler programs, the laggard sampler, the M-list
//! walks) is measured the same way. The stw workload runs untraced, under
//! `gostw run --no-explain --no-stopping` (the pause probes alone),
//! `--no-stopping` (with the explanation) and `gostw run` (the default:
//! both), interleaved; the figures are Go's own, from its histograms and
//! `MemStats.PauseTotalNs`.

use std::process::Command;

use anyhow::{Context as _, bail};

use super::{Options, median};
use crate::{
    cmd::{output, step},
    demo, go, setup,
};

/// Go's own pause figures of one run.
#[derive(Clone, Default)]
struct Run {
    /// Exact median pause by reason, from gostw's records (their
    /// `duration_ns` is Go's own figure); traced runs only.
    by_reason: std::collections::BTreeMap<String, f64>,
    /// Mean GC pause, `PauseTotalNs / stw_gc` (exact).
    gc_mean_ns: f64,
    /// Median of `/sched/pauses/total/gc` and `/total/other` (bucket midpoints).
    gc_median_ns: f64,
    other_median_ns: f64,
    /// Median of `/sched/pauses/stopping/gc` (the probe must not move it).
    gc_stopping_median_ns: f64,
}

const CONFIGS: [(&str, &[&str]); 4] = [
    ("untraced", &[]),
    ("pause probes", &["--no-explain", "--no-stopping"]),
    ("+ explanation", &["--no-stopping"]),
    ("+ stopping", &[]),
];

pub fn run(opts: &Options) -> anyhow::Result<()> {
    let Some(toolchain) = go::toolchain(&opts.go) else {
        bail!("Go {} is not in the matrix", opts.go);
    };
    let minor: u32 = toolchain
        .version
        .split('.')
        .nth(1)
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if minor < 22 {
        bail!("Go {} has no stopping phase to read (1.22+)", opts.go);
    }
    if !setup::is_root() {
        bail!("gostw loads eBPF programs and needs root: run `sudo -E cargo xtask bench stopping`");
    }
    let gostw = crate::build::gostw(crate::arch::Arch::Amd64)?;
    let workload = demo::build_stw_workload(toolchain, &opts.go)?;
    let args = [
        "-gc",
        "40",
        "-readmemstats",
        "20",
        "-gomaxprocs",
        "20",
        "-alloc-mb",
        "32",
    ];
    step(&format!(
        "{} rounds of untraced, pause probes only, + explanation, + stopping probe (the default) (Go {})",
        opts.rounds(),
        opts.go
    ));
    let records = std::env::temp_dir().join("gostw-bench-stopping.jsonl");
    let mut runs: [Vec<Run>; 4] = Default::default();
    for round in 1..=opts.rounds() {
        for (i, (name, extra)) in CONFIGS.iter().enumerate() {
            let mut cmd = if i == 0 {
                Command::new(&workload)
            } else {
                let mut c = Command::new(&gostw);
                c.args([
                    "run",
                    "--json",
                    "--no-faults",
                    "--stacks",
                    "off",
                    "--output",
                ])
                .arg(&records)
                .args(*extra)
                .arg("--")
                .arg(&workload);
                c
            };
            let mut r = sample(cmd.args(args))?;
            if i > 0 {
                r.by_reason = reason_medians(&std::fs::read_to_string(&records)?);
            }
            eprintln!(
                "round {round} {name:>14}: GC mean {:.1} us, GC median {:.1} us, other median {:.1} us, GC stopping median {:.1} us",
                r.gc_mean_ns / 1e3,
                r.gc_median_ns / 1e3,
                r.other_median_ns / 1e3,
                r.gc_stopping_median_ns / 1e3
            );
            runs[i].push(r);
        }
    }
    let med =
        |i: usize, f: &dyn Fn(&Run) -> f64| median(&mut runs[i].iter().map(f).collect::<Vec<_>>());
    for (i, (name, _)) in CONFIGS.iter().enumerate() {
        println!(
            "stopping: {name:>14}: GC mean {:.1} us, GC median {:.1} us, other median {:.1} us, GC stopping median {:.1} us (medians of {} rounds)",
            med(i, &|r: &Run| r.gc_mean_ns) / 1e3,
            med(i, &|r: &Run| r.gc_median_ns) / 1e3,
            med(i, &|r: &Run| r.other_median_ns) / 1e3,
            med(i, &|r: &Run| r.gc_stopping_median_ns) / 1e3,
            opts.rounds()
        );
    }
    let added = |what: &str, from: usize, to: usize| {
        println!(
            "stopping: {what} adds {:.1} us to Go's mean GC pause, {:.1} us to its median GC pause and {:.1} us to its median other pause",
            (med(to, &|r: &Run| r.gc_mean_ns) - med(from, &|r: &Run| r.gc_mean_ns)) / 1e3,
            (med(to, &|r: &Run| r.gc_median_ns) - med(from, &|r: &Run| r.gc_median_ns)) / 1e3,
            (med(to, &|r: &Run| r.other_median_ns) - med(from, &|r: &Run| r.other_median_ns)) / 1e3,
        );
    };
    added("tracing pauses alone", 0, 1);
    added("the explanation", 1, 2);
    added("the stopping probe", 2, 3);
    added("the default (all of it)", 0, 3);
    let reasons: Vec<String> = runs[1]
        .iter()
        .flat_map(|r| r.by_reason.keys().cloned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    for reason in reasons {
        let of = |i: usize| {
            med(i, &|r: &Run| {
                r.by_reason.get(&reason).copied().unwrap_or(f64::NAN)
            })
        };
        println!(
            "stopping: {reason:>22}: median pause (exact, Go's own figure) {:.1} us with the pause probes alone, {:.1} us with the explanation, {:.1} us with the stopping probe too",
            of(1) / 1e3,
            of(2) / 1e3,
            of(3) / 1e3
        );
    }
    Ok(())
}

/// The median `duration_ns` of gostw's pause records, by reason.
fn reason_medians(jsonl: &str) -> std::collections::BTreeMap<String, f64> {
    let mut by: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    for v in jsonl
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["type"] == "pause")
    {
        if let (Some(r), Some(d)) = (v["reason"].as_str(), v["duration_ns"].as_f64()) {
            by.entry(r.to_owned()).or_default().push(d);
        }
    }
    by.into_iter()
        .map(|(r, mut d)| (r, median(&mut d)))
        .collect()
}

/// The median of a histogram given as `[low_ns, high_ns, count]` buckets
/// (the midpoint of the bucket holding the middle pause).
fn hist_median(buckets: &[serde_json::Value]) -> Option<f64> {
    let rows: Vec<(f64, f64, u64)> = buckets
        .iter()
        .filter_map(|b| Some((b[0].as_f64()?, b[1].as_f64()?, b[2].as_u64()?)))
        .collect();
    let total: u64 = rows.iter().map(|r| r.2).sum();
    let mut seen = 0;
    for (lo, hi, n) in rows {
        seen += n;
        if seen * 2 > total {
            // The open-ended last bucket has no midpoint: its low bound.
            return Some(if hi > 1e15 {
                lo
            } else {
                (lo.max(0.0) + hi) / 2.0
            });
        }
    }
    None
}

/// Run the workload (maybe under gostw) and read Go's figures from its report.
fn sample(cmd: &mut Command) -> anyhow::Result<Run> {
    let out = output(cmd)?;
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("GOSTW_REPORT "))
        .context("the workload printed no GOSTW_REPORT")?;
    let v: serde_json::Value = serde_json::from_str(line)?;
    let hist = |name: &str| {
        v["histograms"][name]
            .as_array()
            .and_then(|b| hist_median(b))
            .with_context(|| format!("{name} missing from the report"))
    };
    let gc = v["stw_gc"].as_f64().context("stw_gc")?;
    Ok(Run {
        gc_mean_ns: v["pause_total_ns"].as_f64().context("pause_total_ns")? / gc,
        gc_median_ns: hist("/sched/pauses/total/gc:seconds")?,
        other_median_ns: hist("/sched/pauses/total/other:seconds")?,
        gc_stopping_median_ns: hist("/sched/pauses/stopping/gc:seconds")?,
        by_reason: Default::default(),
    })
}
