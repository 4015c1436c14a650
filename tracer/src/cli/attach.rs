//! `gostw attach --pid PID`: trace a running Go process until Ctrl-C,
//! `--duration`, or its exit.

use tracer::{sink::report::View, targets::Target};

use super::{
    Trace, TraceOptions,
    outputs::{Outputs, Profiles},
    report, trace,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The process to trace.
    #[arg(long)]
    pub pid: u32,
    #[command(flatten)]
    pub trace: TraceOptions,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let target = Target::pid(args.pid)?;
    let core = args.trace.core();
    let mut files = Outputs::new(&args.trace.files, Profiles::Traced, &core)?;
    let mut sink = report(View::Trace, args.trace.output(&mut files)?, &core);
    sink.exposure_every = Some(args.trace.exposure_every);
    trace(Trace {
        target,
        sink,
        files,
        core,
        duration: args.trace.duration,
        wait_for_child: false,
    })
    .await
}
