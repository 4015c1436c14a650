//! `gostw memory`: a Go process's memory and swap exposure now, by what Go
//! uses it for, with its cgroup, the host's swap traffic over a short
//! interval, and advice. Reads /proc only: no probe, nothing attached.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use tracer::{
    memory::{Exposure, HostSwap, MemoryReport, render_text},
    units::parse_interval,
};

/// Arguments of `gostw memory`.
#[derive(clap::Args)]
pub struct Args {
    /// The process to read.
    #[arg(long)]
    pid: u32,
    /// The report as one JSON document (docs/reference/json.md).
    #[arg(long)]
    json: bool,
    /// Measure the host's swap traffic over this long (0: do not; else at
    /// least 100ms).
    #[arg(long, value_parser = parse_interval, default_value = "1s")]
    interval: Duration,
}

/// Run `gostw memory`; returns the exit code.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let started = Instant::now();
    let first = (!args.interval.is_zero())
        .then(HostSwap::snapshot)
        .transpose()
        .context("reading the host's swap counters")?;
    let exposure = Exposure::read(args.pid)?;
    let host_swap = match first {
        Some(a) => {
            std::thread::sleep(args.interval.saturating_sub(started.elapsed()));
            let b = HostSwap::snapshot().context("reading the host's swap counters")?;
            Some(HostSwap::delta(&a, &b))
        }
        None => None,
    };
    let report = MemoryReport::new(exposure, host_swap);
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", render_text(&report));
    }
    Ok(0)
}
