//! The command line's front ends: each is a target, options and a report
//! view on the one engine (`trace`).

pub mod agent;
pub mod attach;
pub mod check;
pub mod command;
pub mod faults;
pub mod inspect;
pub mod memory;
pub mod outputs;
pub mod pauses;
pub mod policy;
pub mod run;
pub mod stacks;
mod values;

use std::{ffi::OsString, path::PathBuf, time::Duration};

use anyhow::{Context as _, bail};
use policy::{AfterGrace, OnSignal, OutputState};
use tracer::{
    engine::{Engine, Stop, Until},
    kernel::{CoreOptions, capabilities::FaultSource, stacks::StackGrowthOptions},
    model::pause::SlowThreshold,
    sink::{
        file::{SharedFile, WholeFile},
        queued::{Bounds, LineQueue, OutputCounters, RawStdout},
        report::{Output, ReportSink, View, output, text},
    },
    stackgrowth::Mode,
    targets::{Target, tracker::Limits},
    units::{parse_duration, parse_interval, parse_positive_duration},
};

/// Options of `attach` and `run`.
#[derive(clap::Args, Debug)]
pub struct TraceOptions {
    /// Stop tracing after this long (e.g. 30s, 5m); default: until Ctrl-C or
    /// the process exits.
    #[arg(long, value_parser = parse_positive_duration)]
    pub duration: Option<Duration>,
    /// Print a line for each pause at least this long (0 = every pause);
    /// default 1ms, or every pause with --json. (Formerly --threshold.)
    #[arg(long, value_name = "DURATION", alias = "threshold", value_parser = parse_duration)]
    pub slow_pause: Option<Duration>,
    /// JSON lines (docs/reference/json.md) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Write the trace to this file instead of standard output; it appears
    /// when tracing ends, complete.
    #[arg(long, short, value_parser = outputs::output_path)]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub files: outputs::FileOptions,
    /// Which kernel mechanism observes major page faults.
    #[arg(long, value_enum, default_value_t)]
    pub fault_source: FaultSource,
    /// Do not trace major page faults.
    #[arg(long)]
    pub no_faults: bool,
    /// Goroutine stack growth: off, sampled (CPU-clock samples, near-zero
    /// cost) or exact (a probe on every stack copy, 1s in every 10s).
    #[arg(long, value_enum, default_value_t = StacksOption::Sampled)]
    pub stacks: StacksOption,
    /// Do not read Go's stopping phase (Go 1.22+): its probe fires inside
    /// every pause and adds its own latency to it (docs/guide/attach-and-run.md, "Stopping phase").
    #[arg(long)]
    pub no_stopping: bool,
    /// Do not explain pauses (the goroutine stack that asked for each stop).
    #[arg(long)]
    pub no_explain: bool,
    /// Read the process's memory exposure this often, besides at the start
    /// and end of the trace (0: only then; else at least 100ms);
    /// docs/guide/memory.md.
    #[arg(long, value_parser = parse_interval, default_value = "2s")]
    pub exposure_every: Duration,
}

/// `--stacks`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StacksOption {
    Off,
    Sampled,
    Exact,
}

impl TraceOptions {
    /// What the core traces for these options.
    pub fn core(&self) -> CoreOptions {
        let mode = match self.stacks {
            StacksOption::Off => None,
            StacksOption::Sampled => Some(Mode::Sampled),
            StacksOption::Exact => Some(Mode::Exact),
        };
        CoreOptions {
            faults: (!self.no_faults).then_some(self.fault_source),
            stacks: mode.map(|mode| StackGrowthOptions {
                mode,
                ..StackGrowthOptions::default()
            }),
            stopping: !self.no_stopping,
            explain: !self.no_explain,
            ..CoreOptions::default()
        }
    }

    /// The live output these options ask for; an `--output` file is
    /// completed by `files`.
    pub fn output(&self, files: &mut outputs::Outputs) -> anyhow::Result<Output> {
        let default = if self.json {
            Duration::ZERO
        } else {
            Duration::from_millis(1)
        };
        let slow = SlowThreshold::at_least(self.slow_pause.unwrap_or(default));
        let out: Box<dyn std::io::Write> = match &self.output {
            Some(path) => {
                let f = SharedFile::new(
                    WholeFile::create(path)
                        .with_context(|| format!("creating {}", path.display()))?,
                );
                files.output = Some(f.clone());
                Box::new(f)
            }
            None => return Ok(stdout_output(self.json, slow)),
        };
        Ok(Output::new(out, self.json, slow))
    }
}

/// What may wait for standard output's reader: a burst this long is
/// written late rather than lost, and a reader that stopped costs at most
/// this much memory.
const STDOUT_BOUNDS: Bounds = Bounds {
    lines: 16 * 1024,
    bytes: 4 << 20,
};

/// Live records and the summary to standard output, through a queue (a
/// slow reader costs lines, counted, never the trace), watched for its
/// reader going away when it is a pipe.
pub fn stdout_output(json: bool, slow: SlowThreshold) -> Output {
    let queue = LineQueue::start(
        "stdout",
        STDOUT_BOUNDS,
        RawStdout,
        OutputCounters::default(),
    );
    let mut o = match queue {
        Ok(q) => Output::queued(q, json, slow),
        Err(e) => {
            log::warn!("standard output written directly: {e}");
            Output::new(Box::new(std::io::stdout()), json, slow)
        }
    };
    o.watch = tracer::sink::file::stdout_pipe();
    o
}

/// Say on standard error what standard output could not take (the summary
/// says it too, unless it is what was lost).
fn say_unwritten(report: &ReportSink) {
    let Some((lost, unwritten)) = report.unwritten() else {
        return;
    };
    if lost.total() > 0 {
        tracer::say!("gostw: {}", text::unwritten_text(&lost));
    }
    if unwritten.lines > 0 {
        tracer::say!(
            "gostw: {} lines, the summary among them, were still unwritten when standard output's reader had read nothing for {:?}",
            unwritten.lines,
            output::END_STALL
        );
    }
}

/// `--pid PID` or `-- CMD ARGS`, as a target.
pub fn target_of(pid: Option<u32>, command: &[OsString]) -> anyhow::Result<Target> {
    match (pid, command.split_first()) {
        (Some(pid), _) => Ok(Target::pid(pid)?),
        (None, Some((program, args))) => {
            let path = which_program(program)?;
            // Before anything starts: the program must be one gostw can trace.
            match tracer::image::ExecutableImage::open(&path) {
                Err(
                    tracer::binary::BinaryError::NotGo { .. }
                    | tracer::binary::BinaryError::NotElf { .. },
                ) => {
                    bail!(
                        "{} is not a Go program: gostw traces Go programs (Go 1.19 or later)",
                        path.display()
                    )
                }
                Err(e) => return Err(e.into()),
                Ok(_) => {}
            }
            Target::child(path, args)
        }
        (None, None) => bail!("give --pid PID or -- COMMAND ARGS"),
    }
}

/// One front end's trace.
pub struct Trace {
    pub target: Target,
    pub core: CoreOptions,
    pub sink: ReportSink,
    /// `--pprof`, `--timeline`.
    pub files: outputs::Outputs,
    pub duration: Option<Duration>,
    /// After tracing stops, wait for a started program and take its exit
    /// code (`run`); otherwise it keeps running untraced.
    pub wait_for_child: bool,
}

/// Run `t` on the engine until its process exits, its duration passes, a
/// signal, or standard output's reader goes away; then write the report.
/// Returns the exit code for gostw: a started program's, otherwise 0 (also
/// when the reader of the trace went away: it had read what it wanted).
pub async fn trace(mut t: Trace) -> anyhow::Result<i32> {
    let mut engine = Engine::new(t.core, Limits::default())?;
    // One process is traced; when it goes, so does gostw.
    engine.core().leave();
    let mut deadline = t.duration.map(Until::After);
    t.sink.announce = matches!(t.target, Target::Pid(_));
    if let Some(every) = t.sink.exposure_every {
        engine.watch_exposure(every, true);
    }
    let mut sinks = (t.sink, t.files);
    let mut output = OutputState::default();
    loop {
        let stop = engine.run(&mut t.target, &mut sinks, &mut deadline).await;
        if let Some(e) = sinks.0.take_write_error() {
            output.write_failed(e);
        }
        let sig = match stop? {
            Stop::OutputClosed => {
                output.reader_gone();
                break;
            }
            Stop::Exited | Stop::Duration => break,
            Stop::Signal(sig) => sig,
        };
        let started = t.target.child_mut().map(|c| c.id());
        let forward = match policy::on_signal(sig, started.is_some(), t.wait_for_child) {
            OnSignal::End => false,
            OnSignal::Forward => true,
            OnSignal::Grace { then } => {
                if tokio::time::timeout(policy::SIGINT_GRACE, t.target.exited())
                    .await
                    .is_ok()
                {
                    continue;
                }
                then == AfterGrace::Forward
            }
        };
        match (forward, started) {
            // SAFETY: signalling our own child.
            (true, Some(pid)) => unsafe {
                libc::kill(pid as libc::pid_t, sig);
            },
            _ => break,
        }
    }
    let pid = t.target.single();
    if output.closed {
        tracer::say!("gostw: standard output was closed; tracing stopped");
        // The summary goes where it can still be read.
        sinks.0.to_stderr();
    }
    engine.finish(&mut sinks);
    let exited = t.target.finished();
    if let Some(word) = policy::last_word(pid, exited, t.target.child_mut().is_some()) {
        tracer::say!("{word}");
    }
    let (mut report, mut files) = sinks;
    let elapsed = engine.elapsed().as_nanos() as u64;
    let mut summary = report.finish(elapsed);
    if output.summary_reader_gone(&summary) {
        // The reader went away at the very end: as above.
        tracer::say!("gostw: standard output was closed; tracing stopped");
        report.to_stderr();
        summary = report.finish(elapsed);
    }
    say_unwritten(&report);
    if !output.output_file_complete(&summary) {
        // An --output file that is not complete never appears.
        files.output = None;
    }
    let written = files.finish();
    if let Some(e) = output.write_error {
        return Err(e).context("writing the trace");
    }
    // With standard output closed the summary went to standard error,
    // which may be gone too: then it is said nowhere.
    if !output.closed {
        summary.context("writing the summary")?;
    }
    written?;
    let code = match (t.target.exit_status(), t.target.child_mut()) {
        (Some(code), _) => code,
        (None, Some(child)) if t.wait_for_child => tracer::targets::exit_code(child.wait()?),
        _ => 0,
    };
    // Everything is untraced and written: let the kernel detach the probes
    // after gostw has gone.
    let after = engine.core().after_exit();
    tracer::kernel::teardown::detach_after_exit(engine, after);
    Ok(code)
}

/// A report sink for `view` with what `core` traces.
pub fn report(view: View, output: Output, core: &CoreOptions) -> ReportSink {
    ReportSink::new(
        view,
        output,
        core.faults.is_some(),
        core.stacks.map(|s| s.mode),
    )
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
