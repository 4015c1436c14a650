//! gostw's development tasks. `cargo xtask setup` brings a fresh machine to a
//! working state; `cargo xtask test` runs every check CI runs; `cargo xtask
//! demo` traces a bundled Go workload; `cargo xtask bench` measures overhead;
//! `cargo xtask vm-test` runs the kernel tests in a VM on a distro kernel.

mod arch;
mod bench;
mod book;
mod build;
mod cmd;
mod demo;
mod dist;
mod fuzz;
mod go;
mod pageout;
mod scenario;
mod setup;
mod soak;
mod test;
mod testlog;
mod vm;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building and testing gostw needs (idempotent).
    Setup(setup::Options),
    /// Set up, then run formatting, lints, unit tests and kernel tests.
    Test(test::Options),
    /// Set up, build, and trace a bundled Go workload with gostw.
    Demo(demo::Options),
    /// Build what people install into target/dist: a static gostw, its
    /// SHA-256 and a .deb with the agent's systemd unit.
    Dist(dist::Options),
    /// Measure tracing overhead: traced vs untraced runs of a Go workload.
    Bench(bench::Options),
    /// Rewrite the book's generated reference pages (docs/reference/cli.md)
    /// and build the book (`mkdocs build --strict`, into target/book).
    Book(book::Options),
    /// Run the kernel tests in a QEMU VM on a distro kernel (kprobes).
    VmTest(vm::Options),
    /// Run `gostw agent` for a while as Go processes come and go; report its
    /// RSS and CPU (not part of CI).
    SoakAgent(soak::Options),
    /// Fuzz gostw's binary parsers for a bounded time (cargo-fuzz; not part
    /// of CI); new crashers go into tracer/fuzz/crashers.
    Fuzz(fuzz::Options),
    /// Run a reproduction scenario: pageout with `gostw run`'s own output,
    /// the others as their kernel test, verbose.
    Scenario(scenario::Options),
    /// (internal) The page-fault-heavy program `bench faults` times.
    #[command(hide = true)]
    BenchFaultWorker(bench::faults::WorkerOptions),
    /// (internal) Calls a function `bench overhead` puts a uprobe on.
    #[command(hide = true)]
    BenchTrapWorker(bench::overhead::TrapWorkerOptions),
}

fn main() -> std::process::ExitCode {
    let result = match Cli::parse().task {
        Task::Setup(opts) => setup::run(&opts),
        Task::Test(opts) => test::run(&opts),
        Task::Demo(opts) => demo::run(&opts),
        Task::Dist(opts) => dist::run(&opts),
        Task::Bench(opts) => bench::run(&opts),
        Task::Book(opts) => book::run(&opts),
        Task::VmTest(opts) => {
            let mut out = vm::VmRun::default();
            let r = vm::run(&opts, &mut out);
            for reboot in &out.reboots {
                eprint!("{reboot}");
            }
            r
        }
        Task::SoakAgent(opts) => soak::run(&opts),
        Task::Scenario(opts) => scenario::run(&opts),
        Task::Fuzz(opts) => fuzz::run(&opts),
        Task::BenchFaultWorker(opts) => bench::faults::worker(&opts),
        Task::BenchTrapWorker(opts) => bench::overhead::trap_worker(&opts),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
