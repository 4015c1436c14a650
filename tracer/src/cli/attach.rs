//! `gostw attach --pid PID`: trace a running Go process until Ctrl-C,
//! `--duration`, or its exit.

use anyhow::Context as _;
use tracer::{
    report::ProcessInfo,
    session::Session,
    target::{LiveTarget, TargetError},
};

use super::{Explainers, Stop, Trace, TraceOptions};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The process to trace.
    #[arg(long)]
    pub pid: u32,
    #[command(flatten)]
    pub trace: TraceOptions,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let target = LiveTarget::open(args.pid)?;
    let pid = target.pid;
    let output = args.trace.output()?;
    let mut session = Session::new()?;
    let mut explainers = Explainers::attach(&mut session, &args.trace, &target.binary)?;
    let attached = session
        .attach_binary(&target.binary)
        .and_then(|()| session.trace_process(pid, &target.binary));
    if target.watch.has_exited() {
        return Err(TargetError::ExitedDuringAttach(pid).into());
    }
    attached.with_context(|| format!("attaching to pid {pid}"))?;
    explainers.watch(pid, true);
    let mut trace = Trace::new(session, output, explainers)?;
    eprintln!(
        "gostw: tracing pid {pid} ({}, {}); Ctrl-C to stop",
        target.exe_name, target.binary.version
    );
    let deadline = args.trace.duration.map(|d| tokio::time::Instant::now() + d);
    let stop = trace.run_until(target.watch.exited(), deadline).await?;
    trace.session.forget_process(pid)?;
    let info = ProcessInfo {
        pid,
        exe: target.exe_name.clone(),
        go_version: target.binary.version.to_string(),
        exit_code: None,
    };
    if stop == Stop::Exited {
        eprintln!("gostw: pid {pid} exited");
    }
    trace.finish(&[info])?;
    Ok(0)
}
