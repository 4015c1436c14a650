//! Stack growth overhead on the goroutine-per-batch workload (one growth per
//! task, the worst case for a newstack/copystack probe): throughput of the
//! untraced workload against gostw's sampled mode (the default), its exact
//! mode (default duty cycle, and always attached), and a bpftrace one-liner
//! counting runtime.newstack hits. Configurations are interleaved round by
//! round, in a rotating order, so machine noise hits them alike; ratios are
//! of medians.

use std::{path::Path, process::Command};

use anyhow::{Context as _, bail};

use super::Options;
use crate::{
    cmd::{output, step},
    demo, go, setup,
};

struct Config {
    name: &'static str,
    /// Command prefix; the workload and its arguments follow.
    prefix: Vec<String>,
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    let (rounds, seconds) = (opts.rounds() as usize, opts.seconds);
    let Some(toolchain) = go::toolchain(&opts.go) else {
        bail!("Go {} is not in the matrix", opts.go);
    };
    if !setup::is_root() {
        bail!("gostw loads eBPF programs and needs root: run `sudo -E cargo xtask bench stack`");
    }
    let gostw = crate::build::gostw(crate::arch::Arch::Amd64)?;
    let workload = demo::build_workload(toolchain, &opts.go, "stackgrowth")?;
    let gostw = gostw.to_string_lossy().into_owned();
    let bt = format!(
        "uprobe:{}:runtime.newstack {{ @newstack = count(); }}",
        workload.display()
    );
    let configs = [
        Config {
            name: "untraced",
            prefix: vec![],
        },
        Config {
            name: "gostw stacks (sampled, 99 Hz; default)",
            prefix: vec![gostw.clone(), "stacks".into(), "--".into()],
        },
        Config {
            name: "gostw stacks --mode exact (1 s of 10 s)",
            prefix: vec![
                gostw.clone(),
                "stacks".into(),
                "--mode".into(),
                "exact".into(),
                "--".into(),
            ],
        },
        Config {
            name: "gostw stacks --mode exact --exact-always",
            prefix: vec![
                gostw.clone(),
                "stacks".into(),
                "--mode".into(),
                "exact".into(),
                "--exact-always".into(),
                "--".into(),
            ],
        },
        Config {
            name: "bpftrace newstack count",
            prefix: vec!["bpftrace".into(), "-e".into(), bt, "-c".into()],
        },
    ];
    let args = format!("-mode batch -duration {seconds}s");
    // Per configuration: tasks per wall second, tasks per CPU second.
    let mut results: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); configs.len()];
    for round in 0..rounds {
        // Rotate the order each round so no configuration always runs
        // right after the same neighbour.
        for k in 0..configs.len() {
            let i = (k + round) % configs.len();
            let c = &configs[i];
            step(&format!("round {}/{rounds}: {}", round + 1, c.name));
            let (wall, cpu) = run_once(c, &workload, &args)?;
            eprintln!("  {wall:.0} tasks/s, {cpu:.0} tasks per CPU second");
            results[i].0.push(wall);
            results[i].1.push(cpu);
        }
    }
    let medians: Vec<(f64, f64)> = results
        .iter()
        .map(|(w, c)| (median(w), median(c)))
        .collect();
    println!(
        "\nstack growth overhead: goroutine-per-batch workload (Go {}, one 2->32 KB growth per task), \
         {rounds} interleaved rounds of {seconds} s; medians, and ratios to untraced",
        opts.go
    );
    println!(
        "  {:<44} {:>10} {:>8}  {:>12} {:>8}",
        "", "tasks/s", "ratio", "tasks/CPU-s", "ratio"
    );
    for (c, (wall, cpu)) in configs.iter().zip(&medians) {
        println!(
            "  {:<44} {:>10.0} {:>7.3}x  {:>12.0} {:>7.3}x",
            c.name,
            wall,
            wall / medians[0].0,
            cpu,
            cpu / medians[0].1,
        );
    }
    Ok(())
}

/// Run the workload once under `c`; its tasks per wall and per CPU second.
fn run_once(c: &Config, workload: &Path, args: &str) -> anyhow::Result<(f64, f64)> {
    let mut cmd = match c.prefix.split_first() {
        None => Command::new(workload),
        Some((program, rest)) => {
            let mut cmd = Command::new(program);
            cmd.args(rest);
            cmd
        }
    };
    if c.prefix.first().is_some_and(|p| p == "bpftrace") {
        // bpftrace -c takes the whole command line as one argument.
        cmd.arg(format!("{} {args}", workload.display()));
    } else {
        if !c.prefix.is_empty() {
            cmd.arg(workload);
        }
        cmd.args(args.split(' '));
    }
    let out = output(&mut cmd)?;
    let get =
        |name| report_number(&out, name).with_context(|| format!("{}: reading its report", c.name));
    Ok((get("tasks_per_sec")?, get("tasks_per_cpu_sec")?))
}

/// Field `name` (a number) of the workload's `GOSTW_REPORT {json}` line.
fn report_number(stdout: &str, name: &str) -> anyhow::Result<f64> {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("GOSTW_REPORT "))
        .context("no GOSTW_REPORT line")?;
    let key = format!("\"{name}\":");
    let Some(at) = line.find(&key) else {
        bail!("no {name} in {line}");
    };
    let rest = &line[at + key.len()..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    Ok(rest[..end].trim().parse()?)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_rate_from_the_report() {
        let out = "x\nGOSTW_REPORT {\"deep_calls\":3,\"tasks_per_sec\":8.5e5,\"z\":1}\n";
        assert_eq!(report_number(out, "tasks_per_sec").unwrap(), 850000.0);
        assert_eq!(report_number(out, "z").unwrap(), 1.0);
        assert!(report_number("nothing", "z").is_err());
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
    }
}
