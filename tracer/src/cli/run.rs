//! `gostw run -- CMD ARGS`: start a Go program held stopped, trace it from
//! its first instruction, and exit with its exit code.

use std::{ffi::OsString, path::PathBuf};

use anyhow::Context as _;
use tracer::{
    binary::GoBinary, process::StoppedChild, report::ProcessInfo, session::Session,
    target::ExitWatch,
};

use super::{Explainers, Stop, Trace, TraceOptions, exit_code};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub trace: TraceOptions,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<OsString>,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let (program, rest) = args.command.split_first().context("no program given")?;
    let path = which_program(program)?;
    let binary = GoBinary::open(&path)?;
    let output = args.trace.output()?;
    let mut session = Session::new()?;
    let mut explainers = Explainers::attach(&mut session, &args.trace, &binary)?;
    session.attach_binary(&binary)?;
    let stopped = StoppedChild::spawn(
        path.as_os_str(),
        &rest.iter().map(|a| a.as_os_str()).collect::<Vec<_>>(),
        |_| {},
    )?;
    let pid = stopped.pid();
    let ready = session
        .trace_process(pid, &binary)
        .and_then(|()| Ok(ExitWatch::new(pid)?))
        .and_then(|watch| {
            explainers.watch(pid, false);
            Ok((watch, Trace::new(session, output, explainers)?))
        });
    let (watch, mut trace) = match ready {
        Ok(r) => r,
        Err(e) => {
            // Do not leave the program stopped forever.
            let mut child = stopped.child;
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    let mut child = stopped.resume()?;
    let deadline = args.trace.duration.map(|d| tokio::time::Instant::now() + d);
    loop {
        match trace.run_until(watch.exited(), deadline).await? {
            Stop::Exited | Stop::Duration => break,
            Stop::Signal(sig) => {
                // Ctrl-C reaches the program through the terminal too; give it
                // a moment to act on that before passing the signal on.
                if sig == libc::SIGINT
                    && tokio::time::timeout(std::time::Duration::from_secs(2), watch.exited())
                        .await
                        .is_ok()
                {
                    break;
                }
                // SAFETY: signalling our own child.
                unsafe { libc::kill(pid as libc::pid_t, sig) };
            }
        }
    }
    trace.drain()?;
    trace.session.forget_process(pid)?;
    let traced_to_exit = watch.has_exited();
    if !traced_to_exit {
        eprintln!("gostw: tracing stopped; pid {pid} keeps running untraced");
    }
    let code = traced_to_exit
        .then(|| child.wait().map(exit_code))
        .transpose()?;
    let info = ProcessInfo {
        pid,
        exe: path.display().to_string(),
        go_version: binary.version.to_string(),
        exit_code: code,
    };
    trace.finish(&[info])?;
    // `run` takes the program's exit code even when tracing stopped first.
    match code {
        Some(c) => Ok(c),
        None => Ok(exit_code(child.wait()?)),
    }
}

/// Resolve a program name the way a shell would.
pub fn which_program(program: &std::ffi::OsStr) -> anyhow::Result<PathBuf> {
    let p = std::path::Path::new(program);
    if p.components().count() > 1 {
        return p.canonicalize().with_context(|| format!("{}", p.display()));
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join(p))
        .find(|c| c.is_file())
        .with_context(|| format!("{} not found in PATH", p.display()))
}
