//! `gostw run -- CMD ARGS`: start a Go program held stopped, trace it from
//! its first instruction, and exit with its exit code.

use std::ffi::OsString;

use tracer::sink::report::View;

use super::{
    Trace, TraceOptions,
    outputs::{Outputs, Profiles},
    report, target_of, trace,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub trace: TraceOptions,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<OsString>,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let core = args.trace.core();
    let mut files = Outputs::new(&args.trace.files, Profiles::Traced, &core)?;
    let output = args.trace.output(&mut files)?;
    // Files first: a bad path fails before a program starts.
    let target = target_of(None, &args.command)?;
    let mut sink = report(View::Trace, output, &core);
    sink.exposure_every = Some(args.trace.exposure_every);
    trace(Trace {
        target,
        sink,
        files,
        core,
        duration: args.trace.duration,
        wait_for_child: true,
    })
    .await
}
