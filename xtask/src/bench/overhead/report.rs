//! The figures of `bench overhead`: work time per configuration with ratios
//! to untraced and to bpftrace, then the BPF cost per program.

use std::collections::BTreeMap;

use super::{
    OverheadOptions, median,
    run::{Cell, RunResult, Tracer, Trap, Workload},
};
use crate::bench::bpf::PROG_TYPE_KPROBE;

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
}

/// "median [min-max]".
fn spread(v: &[f64]) -> String {
    let (lo, hi) = min_max(v);
    format!("{:.3} [{lo:.3}-{hi:.3}]", median(v))
}

/// Estimated BPF cost of one run: program time plus one trap per uprobe hit.
fn bpf_ns(r: &RunResult, trap: &Trap) -> f64 {
    r.progs
        .iter()
        .map(|p| {
            let traps = if p.prog_type == PROG_TYPE_KPROBE {
                p.runs as f64 * trap.ns(&p.name)
            } else {
                0.0
            };
            p.run_ns as f64 + traps
        })
        .sum()
}

/// The lost-events column: gostw's drops, and pauses seen of those the Go
/// runtime counted.
fn lost(cell: &Cell) -> String {
    let mut parts = Vec::new();
    if let Some(dropped) = cell.runs.iter().filter_map(|r| r.dropped).max() {
        parts.push(format!("{dropped} dropped"));
    }
    let pairs: Vec<(u64, u64)> = cell
        .runs
        .iter()
        .filter_map(|r| r.go_pauses.zip(r.seen_pauses))
        .collect();
    if !pairs.is_empty() {
        let missed: u64 = pairs
            .iter()
            .map(|(go, seen)| go.saturating_sub(*seen))
            .sum();
        let extra: u64 = pairs
            .iter()
            .map(|(go, seen)| seen.saturating_sub(*go))
            .sum();
        let go: u64 = pairs.iter().map(|p| p.0).sum();
        parts.push(format!(
            "pauses {}/{go} seen{}",
            go - missed,
            if extra > 0 {
                format!(", {extra} extra")
            } else {
                String::new()
            }
        ));
    }
    parts.join(", ")
}

pub fn print(
    workloads: &[Workload],
    cells: &[Cell],
    trap: &Trap,
    rounds: u32,
    o: &OverheadOptions,
    go_version: &str,
) {
    println!(
        "\noverhead: {rounds} interleaved rounds, Go {go_version}, GOMAXPROCS={}; work timed by \
         the workload itself; medians [min-max]; ratios of medians (> 1: slower)",
        o.gomaxprocs
    );
    for (kind, t) in [
        ("single-stepped", &trap.stepped),
        ("emulated (on a branch)", &trap.emulated),
    ] {
        println!(
            "uprobe trap beyond its program, {kind}, per hit (median call of {} runs): {:.1} us \
             cold (the empty program {:.0} ns), {:.1} us hot ({:.0} ns)",
            t.runs,
            t.cold_ns / 1e3,
            t.cold_prog_ns,
            t.hot_ns / 1e3,
            t.hot_prog_ns
        );
    }
    println!(
        "estimates below add the cold trap of each program's kind: emulated for gostw's uprobes \
         (stw_stop, stw_stopped, stw_start_ret, stack_copy: a branch or a call), single-stepped \
         for bpftrace's (function entries)"
    );
    for (w, workload) in workloads.iter().enumerate() {
        let of = |f: &dyn Fn(&Tracer) -> bool| {
            cells
                .iter()
                .find(|c| c.workload == w && f(&c.config.tracer))
        };
        let Some(untraced) = of(&|t| matches!(t, Tracer::None)) else {
            continue;
        };
        let bpftrace = of(&|t| matches!(t, Tracer::Bpftrace));
        let cpu = |c: &Cell| median(&c.runs.iter().map(|r| r.cpu_s).collect::<Vec<_>>());
        let wall = |c: &Cell| median(&c.runs.iter().map(|r| r.wall_s).collect::<Vec<_>>());
        println!("\n{} ({})", workload.name, workload.what);
        println!(
            "  {:<26} {:>24} {:>24}  {:>13} {:>13}  lost",
            "", "work wall s", "work CPU s", "vs untraced", "vs bpftrace"
        );
        for cell in cells.iter().filter(|c| c.workload == w) {
            let walls: Vec<f64> = cell.runs.iter().map(|r| r.wall_s).collect();
            let cpus: Vec<f64> = cell.runs.iter().map(|r| r.cpu_s).collect();
            let vs_bpftrace = bpftrace.map_or(String::new(), |b| {
                format!("{:.3} {:.3}", wall(cell) / wall(b), cpu(cell) / cpu(b))
            });
            println!(
                "  {:<26} {:>24} {:>24}  {:>13} {:>13}  {}",
                cell.config.name,
                spread(&walls),
                spread(&cpus),
                format!(
                    "{:.3} {:.3}",
                    wall(cell) / wall(untraced),
                    cpu(cell) / cpu(untraced)
                ),
                vs_bpftrace,
                lost(cell)
            );
        }
        println!("  (ratios: wall, CPU)");
        for cell in cells
            .iter()
            .filter(|c| c.workload == w && !matches!(c.config.tracer, Tracer::None))
        {
            print_costs(cell, trap);
        }
    }
}

/// Per-program hits and ns per hit in the work window, and the estimate.
fn print_costs(cell: &Cell, trap: &Trap) {
    let mut by_prog: BTreeMap<&str, (bool, Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for r in &cell.runs {
        for p in &r.progs {
            let e = by_prog.entry(&p.name).or_insert((
                p.prog_type == PROG_TYPE_KPROBE,
                Vec::new(),
                Vec::new(),
            ));
            e.1.push(p.runs as f64);
            if p.runs > 0 {
                e.2.push(p.run_ns as f64 / p.runs as f64);
            }
        }
    }
    println!(
        "  BPF in the work window, {}: median hits per run, ns per hit [range]",
        cell.config.name
    );
    let mut rows: Vec<_> = by_prog
        .iter()
        .filter(|(_, (_, hits, _))| median(hits) > 0.0)
        .collect();
    rows.sort_by(|a, b| {
        let total = |(_, h, n): &(bool, Vec<f64>, Vec<f64>)| median(h) * median(n);
        total(b.1).total_cmp(&total(a.1))
    });
    for (name, (uprobe, hits, ns)) in rows {
        let (lo, hi) = min_max(ns);
        println!(
            "    {:<22} {:>9.0} hits {:>7.0} ns [{lo:.0}-{hi:.0}]{}",
            name,
            median(hits),
            median(ns),
            if *uprobe { "  + trap" } else { "" }
        );
    }
    let cost: Vec<f64> = cell.runs.iter().map(|r| bpf_ns(r, trap) / 1e6).collect();
    let share: Vec<f64> = cell
        .runs
        .iter()
        .map(|r| bpf_ns(r, trap) / (r.cpu_s * 1e9) * 100.0)
        .collect();
    let (lo, hi) = min_max(&share);
    let mut line = format!(
        "    estimated BPF + trap cost: {:.2} ms per run = {:.2}% [{lo:.2}-{hi:.2}] of the work's CPU time",
        median(&cost),
        median(&share)
    );
    let own: Vec<f64> = cell
        .runs
        .iter()
        .filter_map(|r| Some(r.tracer_cpu_s? / r.cpu_s * 100.0))
        .collect();
    if !own.is_empty() {
        line += &format!("; tracer process {:.2}% of it", median(&own));
    }
    println!("{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_ranges() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert!(median(&[]).is_nan());
        assert_eq!(min_max(&[3.0, 1.0, 2.0]), (1.0, 3.0));
        assert_eq!(spread(&[1.0, 2.0, 4.0]), "2.000 [1.000-4.000]");
    }
}
