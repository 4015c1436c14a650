//! The tracing subcommands (`attach`, `run`, `stacks`): their shared options and the
//! event loop both run until the trace ends.

pub mod attach;
pub mod faults;
pub mod memory;
pub mod run;
pub mod stacks;

use std::{future::Future, path::PathBuf, time::Duration};

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};
use tracer::{
    binary::GoBinary,
    events::EventReader,
    faults::{FaultSource, FaultTracer},
    pipeline::Pipeline,
    report::{Output, ProcessInfo, Summary},
    session::Session,
    stackgrowth::{
        GoSymbols, Mode, StackGrowthAggregator, StackGrowthOptions, StackGrowthProbes, goroutines,
    },
    units::parse_duration,
};

/// Options of every tracing subcommand.
#[derive(clap::Args, Debug)]
pub struct TraceOptions {
    /// Stop tracing after this long (e.g. 30s, 5m); default: until Ctrl-C or
    /// the process exits.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Print a line for each pause at least this long (0 = every pause);
    /// default 1ms, or every pause with --json.
    #[arg(long, value_parser = parse_duration)]
    pub threshold: Option<Duration>,
    /// JSON lines (README.md, "JSON output") instead of text.
    #[arg(long)]
    pub json: bool,
    /// Write the trace to this file instead of standard output.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
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
}

/// `--stacks`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StacksOption {
    Off,
    Sampled,
    Exact,
}

impl TraceOptions {
    /// The output these options ask for.
    pub fn output(&self) -> anyhow::Result<Output> {
        let default = if self.json {
            Duration::ZERO
        } else {
            Duration::from_millis(1)
        };
        let threshold = self.threshold.unwrap_or(default).as_nanos() as u64;
        let out: Box<dyn std::io::Write> = match &self.output {
            Some(path) => Box::new(std::io::BufWriter::new(
                std::fs::File::create(path)
                    .with_context(|| format!("creating {}", path.display()))?,
            )),
            None => Box::new(std::io::stdout()),
        };
        Ok(Output::new(out, self.json, threshold))
    }
}

/// The tracers besides pauses (major faults, stack growth), attached before
/// the traced process is added to the session.
pub struct Explainers {
    faults: Option<FaultTracer>,
    stacks: Option<StackWatch>,
}

/// Stack growth of the one traced process.
struct StackWatch {
    probes: StackGrowthProbes,
    mode: Mode,
    symbols: GoSymbols,
    bias_known: bool,
    pid: u32,
    peak_goroutines: Option<u64>,
}

impl Explainers {
    /// Attach what `opts` asks for to `session`, for `binary`. A tracer
    /// that cannot attach on this kernel is left out with a warning, so
    /// pauses are still traced.
    pub fn attach(
        session: &mut Session,
        opts: &TraceOptions,
        binary: &GoBinary,
    ) -> anyhow::Result<Explainers> {
        let faults = if opts.no_faults {
            None
        } else {
            match FaultTracer::attach(session.programs(), opts.fault_source) {
                Ok(t) => {
                    log::info!("fault backend {:?}: {}", t.choice.backend, t.choice.reason);
                    Some(t)
                }
                Err(e) if opts.fault_source == FaultSource::Auto => {
                    eprintln!("gostw: major faults not traced: {e:#}");
                    None
                }
                Err(e) => return Err(e.context("attaching the fault backend")),
            }
        };
        let mode = match opts.stacks {
            StacksOption::Off => None,
            StacksOption::Sampled => Some(Mode::Sampled),
            StacksOption::Exact => Some(Mode::Exact),
        };
        let stacks = match mode {
            None => None,
            Some(mode) => {
                let attached = GoSymbols::new(binary).and_then(|symbols| {
                    let o = StackGrowthOptions {
                        mode,
                        ..StackGrowthOptions::default()
                    };
                    let probes = StackGrowthProbes::attach(session.programs(), binary, o)?;
                    Ok(StackWatch {
                        probes,
                        mode,
                        bias_known: !binary.pie,
                        symbols,
                        pid: 0,
                        peak_goroutines: None,
                    })
                });
                match attached {
                    Ok(w) => Some(w),
                    Err(e) => {
                        eprintln!("gostw: stack growth not traced: {e:#}");
                        None
                    }
                }
            }
        };
        Ok(Explainers { faults, stacks })
    }

    /// Watch `pid` (once it is in the session's traced set); `running`
    /// when it already runs its program (attach), not just exec'd (run).
    pub fn watch(&mut self, pid: u32, running: bool) {
        if let Some(f) = &mut self.faults
            && running
            && let Err(e) = f.add_process(pid)
        {
            log::warn!("fault symbols of pid {pid}: {e:#}");
        }
        if let Some(s) = &mut self.stacks {
            s.probes.watch(pid);
            s.pid = pid;
        }
    }
}

impl StackWatch {
    /// Drive the exact mode's duty cycle; read the load bias and goroutine
    /// count while the process lives.
    fn tick(&mut self, session: &mut Session) -> anyhow::Result<()> {
        if !self.bias_known {
            self.bias_known = self.symbols.elf.set_bias_from_process(self.pid).is_ok();
        }
        if self.bias_known {
            self.peak_goroutines =
                goroutines::peak_goroutines(self.pid, &self.symbols.elf).or(self.peak_goroutines);
        }
        self.probes.tick(session.programs())
    }
}

/// Why the event loop returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// `--duration` elapsed.
    Duration,
    /// SIGINT or SIGTERM (the signal number).
    Signal(i32),
    /// The traced process exited.
    Exited,
}

/// The state of one trace: the session, its events and where they go.
pub struct Trace {
    pub session: Session,
    pub reader: EventReader,
    pub pipeline: Pipeline,
    pub output: Output,
    pub started: std::time::Instant,
    stacks: Option<StackWatch>,
}

impl Trace {
    /// Start reading events of `session` into `output`.
    pub fn new(
        mut session: Session,
        output: Output,
        explainers: Explainers,
    ) -> anyhow::Result<Trace> {
        let mut pipeline = Pipeline::new(tracer::pauses::WallClock::now());
        pipeline.faults = explainers.faults;
        pipeline.stacks = explainers
            .stacks
            .as_ref()
            .map(|s| StackGrowthAggregator::new(s.mode));
        Ok(Trace {
            reader: session.event_reader()?,
            session,
            pipeline,
            output,
            started: std::time::Instant::now(),
            stacks: explainers.stacks,
        })
    }

    /// Handle events until `exited` resolves, `deadline` passes, or a
    /// signal arrives.
    pub async fn run_until(
        &mut self,
        exited: impl Future<Output = ()>,
        deadline: Option<tokio::time::Instant>,
    ) -> anyhow::Result<Stop> {
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut sigterm = signal(SignalKind::terminate())?;
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(exited, sleep);
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let Trace {
            session,
            reader,
            pipeline,
            output,
            stacks,
            ..
        } = self;
        let mut write_error = None;
        let stop = loop {
            tokio::select! {
                r = reader.read_batch(|raw| handle(pipeline, output, raw, &mut write_error)) => {
                    r.context("reading the events ring buffer")?;
                    if let Some(e) = write_error.take() {
                        return Err(e).context("writing the trace");
                    }
                }
                _ = tick.tick() => {
                    if let Some(s) = stacks {
                        s.tick(session)?;
                    }
                }
                () = &mut exited => break Stop::Exited,
                () = &mut sleep => break Stop::Duration,
                _ = sigint.recv() => break Stop::Signal(libc::SIGINT),
                _ = sigterm.recv() => break Stop::Signal(libc::SIGTERM),
            }
        };
        self.drain()?;
        Ok(stop)
    }

    /// Handle the events already in the ring buffer.
    pub fn drain(&mut self) -> anyhow::Result<()> {
        let Trace {
            reader,
            pipeline,
            output,
            ..
        } = self;
        let mut write_error = None;
        reader.drain(|raw| handle(pipeline, output, raw, &mut write_error));
        write_error.map_or(Ok(()), Err).context("writing the trace")
    }

    /// Print the summary for `processes`.
    pub fn finish(&mut self, processes: &[ProcessInfo]) -> anyhow::Result<()> {
        self.drain()?;
        let counters = self.session.counters()?;
        let stack_growth = match (&mut self.stacks, &mut self.pipeline.stacks) {
            (Some(s), Some(agg)) => {
                // The process may be gone; what was read while it lived stands.
                let _ = s.tick(&mut self.session);
                s.probes.collect(self.session.programs(), s.pid, agg)?;
                let goroutines = s.peak_goroutines.map(|n| (n, goroutines::SOURCE));
                let summary = agg.summary(&s.symbols, goroutines);
                tracer::stackgrowth::forget_process(self.session.programs(), s.pid)?;
                Some(summary)
            }
            _ => None,
        };
        let mut summary = Summary::new(
            &self.pipeline,
            processes,
            &counters,
            self.started.elapsed().as_nanos() as u64,
        );
        summary.stack_growth = stack_growth;
        self.output.summary(&summary).context("writing the summary")
    }
}

/// One raw event through the pipeline to the output; keeps the first write
/// error (the caller stops on it after the batch).
fn handle(
    pipeline: &mut Pipeline,
    output: &mut Output,
    raw: &[u8],
    write_error: &mut Option<std::io::Error>,
) {
    if let Some(rec) = pipeline.feed(raw)
        && let Err(e) = output.record(&rec)
    {
        write_error.get_or_insert(e);
    }
}

/// The exit code a shell would report for a wait status.
pub fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}
