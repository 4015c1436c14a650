//! `gostw stacks`: goroutine stack growth of one process, started under
//! gostw (`-- CMD ARGS`) or already running (`--pid PID`), until it exits,
//! `--duration` passes, or Ctrl-C: the engine's stack-growth view.

use std::{ffi::OsString, time::Duration};

use tracer::{
    kernel::{
        CoreOptions,
        stacks::{DutyCycle, StackGrowthOptions},
    },
    sink::report::{Output, View},
    stackgrowth::Mode,
    units::parse_positive_duration,
};

use super::{
    Trace,
    outputs::{FileOptions, Outputs, Profiles},
    report, stdout_output, target_of, trace,
};

/// Arguments of `gostw stacks`.
#[derive(clap::Args)]
pub struct StacksArgs {
    /// Trace this running process.
    #[arg(long, conflicts_with = "command", required_unless_present = "command")]
    pid: Option<u32>,
    /// sampled: CPU-clock samples, near-zero cost (default); exact: a probe on
    /// every stack copy, attached part of the time (see --exact-on).
    #[arg(long, value_enum, default_value_t)]
    mode: Mode,
    /// Stop after this long (e.g. 30s, 500ms); default: until the process
    /// exits or Ctrl-C.
    #[arg(long, value_parser = parse_positive_duration)]
    duration: Option<Duration>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
    /// Sampled mode: samples per second per CPU.
    #[arg(long, default_value_t = crate::kernel::stacks::SAMPLE_HZ, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    sample_hz: u64,
    /// Exact mode: attach the probe this long...
    #[arg(long, value_parser = parse_positive_duration, default_value = "1s")]
    exact_on: Duration,
    /// ...out of every this long...
    #[arg(long, value_parser = parse_positive_duration, default_value = "10s")]
    exact_period: Duration,
    /// ...or until this many copies in one window (checked every 100 ms).
    #[arg(long, default_value_t = 50_000)]
    exact_max_events: u64,
    /// Exact mode: keep the probe attached all the time (full counts; the
    /// traced program pays 15-20 us per stack copy).
    #[arg(long)]
    exact_always: bool,
    /// Exact mode: one sampled goroutine stack per this many growths per CPU.
    #[arg(long, default_value_t = 64)]
    event_every: u32,
    /// Goroutine count for the memory estimate (e.g. from the program's
    /// /sched/goroutines:goroutines); default: the process's peak
    /// (goroutines alive in runtime.allgs), else unknown.
    #[arg(long)]
    goroutines: Option<u64>,
    #[command(flatten)]
    files: FileOptions,
    /// The program to start and trace, after `--`.
    #[arg(last = true)]
    command: Vec<OsString>,
}

/// Run `gostw stacks`.
pub async fn run(args: StacksArgs) -> anyhow::Result<i32> {
    let core = CoreOptions {
        faults: None,
        stacks: Some(StackGrowthOptions {
            mode: args.mode,
            sample_hz: args.sample_hz,
            duty: if args.exact_always {
                DutyCycle::ALWAYS
            } else {
                DutyCycle {
                    on: args.exact_on,
                    period: args.exact_period.max(args.exact_on),
                    max_events: args.exact_max_events,
                }
            },
            exact_event_every: args.event_every,
        }),
        ..CoreOptions::default()
    };
    let files = Outputs::new(&args.files, Profiles::StackGrowth, &core)?;
    // Files first: a bad path fails before a program starts.
    let target = target_of(args.pid, &args.command)?;
    // A started program keeps the terminal's standard output for its own
    // text (JSON stays on standard output, one line, for machines).
    let out = if args.pid.is_none() && !args.json {
        Output::new(
            Box::new(std::io::stderr()),
            args.json,
            tracer::model::pause::SlowThreshold::NONE,
        )
    } else {
        stdout_output(args.json, tracer::model::pause::SlowThreshold::NONE)
    };
    let mut sink = report(View::Stacks, out, &core);
    sink.goroutines = args.goroutines;
    trace(Trace {
        target,
        sink,
        files,
        core,
        duration: args.duration,
        wait_for_child: false,
    })
    .await
}
