//! The `gostw` command line.

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Trace the stop-the-world pauses of a running Go process.
    Attach(cli::attach::Args),
    /// Start a Go program and trace it from its first instruction; exits with
    /// the program's exit code.
    Run(cli::run::Args),
    /// Show what gostw finds in a Go binary or a running process's executable.
    Inspect(tracer::inspect::InspectArgs),
    /// Goroutine stack growth: call sites, sizes, cost, and the starting
    /// stack that would avoid it (`--pid PID` or `-- CMD ARGS`).
    Stacks(cli::stacks::StacksArgs),
    /// Node agent: trace every Go process of the host, serve Prometheus metrics.
    Agent(tracer::agent::Args),
    /// Major page faults of a process and the pauses they lengthen.
    Faults(cli::faults::Args),
    /// What gostw can do on this host: kernel, probe families, fault
    /// backend, and each feature (works / degraded / unavailable, and why).
    /// Exit status: 0 all works, 1 something degraded, 2 no pauses.
    Check(tracer::check::CheckArgs),
    /// Memory and swap exposure of a Go process now, by what Go uses it
    /// for, with its cgroup, the host's swap traffic, and advice.
    Memory(cli::memory::Args),
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gostw: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Attach(args) => cli::attach::run(args).await,
            Command::Run(args) => cli::run::run(args).await,
            Command::Inspect(args) => tracer::inspect::run(&args).map(|()| 0),
            Command::Stacks(args) => cli::stacks::run(args).await,
            Command::Agent(args) => tracer::agent::run(args).await.map(|()| 0),
            Command::Faults(args) => cli::faults::run(args).await,
            Command::Memory(args) => cli::memory::run(args),
            Command::Check(args) => tracer::check::run(&args),
        }
    });
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("gostw: {e:#}");
            ExitCode::FAILURE
        }
    }
}
