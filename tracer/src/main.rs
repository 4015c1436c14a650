//! The `gostw` command line.

use std::{ffi::OsString, process::ExitCode};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tracer::{binary::GoBinary, process::StoppedChild, session::Session};

#[derive(Parser)]
#[command(
    name = "gostw",
    version,
    about = "Explains Go stop-the-world pauses and goroutine stack growth on live processes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a program and trace it from its first instruction.
    Run {
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<OsString>,
    },
    /// Show what gostw finds in a Go binary or a running process's executable.
    Inspect(tracer::inspect::InspectArgs),
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gostw: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Inspect(args) => tracer::inspect::run(&args).map(|()| ExitCode::SUCCESS),
        Command::Run { command } => {
            let (program, args) = command.split_first().context("no program given")?;
            let path = which_program(program)?;
            let binary = GoBinary::open(&path)?;
            let mut session = Session::new()?;
            session.attach_binary(&binary)?;
            let stopped = StoppedChild::spawn(
                path.as_os_str(),
                &args.iter().map(|a| a.as_os_str()).collect::<Vec<_>>(),
                |_| {},
            )?;
            let pid = stopped.pid();
            session.trace_process(pid, &binary)?;
            let mut child = stopped.resume()?;
            let status = child.wait()?;
            let pauses = session.stop_the_world_count(pid)?;
            eprintln!(
                "gostw: pid {pid} ({}, {}): {pauses} stop-the-world pauses",
                path.display(),
                binary.version
            );
            Ok(ExitCode::from(
                status.code().unwrap_or(1).clamp(0, 255) as u8
            ))
        }
    }
}

/// Resolve a program name the way a shell would.
fn which_program(program: &std::ffi::OsStr) -> anyhow::Result<std::path::PathBuf> {
    let p = std::path::Path::new(program);
    if p.components().count() > 1 {
        return p.canonicalize().with_context(|| format!("{}", p.display()));
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join(p))
        .find(|c| c.is_file())
        .with_context(|| format!("{} not found in PATH", p.display()))
}
