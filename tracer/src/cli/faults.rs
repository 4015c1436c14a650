//! `gostw faults`: major page faults of one Go process, and how much of each
//! of its stop-the-world pauses they explain: the engine's fault view.

use std::{ffi::OsString, time::Duration};

use tracer::{
    kernel::{CoreOptions, capabilities::FaultSource},
    sink::report::View,
    units::parse_positive_duration,
};

use super::{
    Trace,
    outputs::{FileOptions, Outputs, Profiles},
    report, stdout_output, target_of, trace,
};

#[derive(clap::Args)]
pub struct Args {
    /// Which kernel mechanism observes faults.
    #[arg(long, value_enum, default_value_t)]
    pub fault_source: FaultSource,
    /// Stop after this long (e.g. 30s, 5m); default: until Ctrl-C or exit.
    #[arg(long, value_parser = parse_positive_duration)]
    pub duration: Option<Duration>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub files: FileOptions,
    /// Trace this running process.
    #[arg(long, conflicts_with = "command", required_unless_present = "command")]
    pub pid: Option<u32>,
    /// Or start this program and trace it from its first instruction.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<OsString>,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let core = CoreOptions {
        faults: Some(args.fault_source),
        ..CoreOptions::default()
    };
    let files = Outputs::new(&args.files, Profiles::Faults, &core)?;
    // Files first: a bad path fails before a program starts.
    let target = target_of(args.pid, &args.command)?;
    let output = stdout_output(args.json, tracer::model::pause::SlowThreshold::NONE);
    trace(Trace {
        target,
        sink: report(View::Faults, output, &core),
        files,
        core,
        duration: args.duration,
        wait_for_child: false,
    })
    .await
}
