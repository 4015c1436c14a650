//! The `gostw` command line.

use std::process::ExitCode;

use clap::Parser as _;
use tracer::cli::{
    self,
    command::{Cli, Command},
};

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
