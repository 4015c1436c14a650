//! The `gostw` command line.

use std::{io::Write as _, process::ExitCode};

use clap::Parser as _;
use tracer::cli::{
    self,
    command::{Cli, Command},
};

/// The logger: with `RUST_LOG` set, its filter and env_logger's developer
/// format; otherwise warnings and errors only, worded for the user
/// ("gostw: warning: ..."), not as raw log lines with module paths.
fn logger(rust_log: bool) -> env_logger::Builder {
    use std::io::Write as _;

    if rust_log {
        return env_logger::Builder::from_env(env_logger::Env::default());
    }
    let mut b = env_logger::Builder::new();
    b.filter_level(log::LevelFilter::Warn).format(|buf, r| {
        let level = match r.level() {
            log::Level::Error => "error",
            _ => "warning",
        };
        writeln!(buf, "gostw: {level}: {}", r.args())
    });
    b
}

/// An error and its causes on one line, each said once. Many errors end
/// their own message with their source's ("cannot read X: Is a directory
/// (os error 21)"); `{:#}` would print that source again after it.
fn message(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut log = logger(std::env::var_os("RUST_LOG").is_some());
    if matches!(cli.command, Command::Agent(_)) {
        // The agent's event loop logs: through a queue once it runs, so a
        // standard error nobody reads never stops it.
        log.target(env_logger::Target::Pipe(Box::new(
            tracer::agent::log_queue::LogWriter::agent(),
        )));
    }
    log.init();
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
            Command::Inspect(args) => cli::inspect::run(&args).map(|()| 0),
            Command::Stacks(args) => cli::stacks::run(args).await,
            Command::Agent(args) => cli::agent::run(args).await.map(|()| 0),
            Command::Faults(args) => cli::faults::run(args).await,
            Command::Pauses(args) => cli::pauses::run(args),
            Command::Memory(args) => cli::memory::run(args),
            Command::Check(args) => cli::check::run(&args),
        }
    });
    // Whatever way gostw ends, what it mounted goes.
    tracer::kernel::faults::unmount_tracefs();
    // The agent's log lines still queued go before its last words (a no-op
    // elsewhere).
    tracer::agent::log_queue::finish(
        std::time::Instant::now() + std::time::Duration::from_millis(500),
    );
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            // Standard error may be gone too (`2>&1 | head`): nothing to do then.
            let _ = writeln!(std::io::stderr(), "gostw: {}", message(&e));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
#[path = "main_tests.rs"]
mod tests;
