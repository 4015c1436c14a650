//! The `gostw` command line's definition: the binary parses it, and the
//! book's CLI reference (`docs/reference/cli.md`) is rendered from it.

use clap::{Parser, Subcommand};

use super::{agent, attach, check, faults, inspect, memory, pauses, run, stacks};

#[derive(Parser)]
#[command(
    name = "gostw",
    version,
    about = "Explains Go stop-the-world pauses and goroutine stack growth on live processes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Trace the stop-the-world pauses of a running Go process.
    Attach(attach::Args),
    /// Start a Go program and trace it from its first instruction; exits with
    /// the program's exit code.
    Run(run::Args),
    /// Show what gostw finds in a Go binary or a running process's executable.
    Inspect(inspect::Args),
    /// Goroutine stack growth: call sites, sizes, cost, and the starting
    /// stack that would avoid it (`--pid PID` or `-- CMD ARGS`).
    Stacks(stacks::StacksArgs),
    /// Node agent: trace every Go process of the host, serve Prometheus
    /// metrics, and record every slow pause with its explanation.
    Agent(agent::Args),
    /// The agent's slow-pause records (its /debug/pauses), newest first:
    /// what held the world, who asked for the stop, and the faults.
    Pauses(pauses::Args),
    /// Major page faults of a process and the pauses they lengthen.
    Faults(faults::Args),
    /// What gostw can do on this host: kernel, probe families, fault
    /// backend, and each feature (works / degraded / unavailable, and why).
    /// Exit status: 0 all works, 1 something degraded, 2 no pauses.
    Check(check::Args),
    /// Memory and swap exposure of a Go process now, by what Go uses it
    /// for, with its cgroup, the host's swap traffic, and advice.
    Memory(memory::Args),
}
