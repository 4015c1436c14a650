//! The tracing subcommands (`attach`, `run`, `stacks`): their shared options and the
//! event loop both run until the trace ends.

pub mod attach;
pub mod faults;
pub mod run;
pub mod stacks;

use std::{future::Future, path::PathBuf, time::Duration};

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};
use tracer::{
    events::EventReader,
    pipeline::Pipeline,
    report::{Output, ProcessInfo, Summary},
    session::Session,
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
}

impl Trace {
    /// Start reading events of `session` into `output`.
    pub fn new(mut session: Session, output: Output) -> anyhow::Result<Trace> {
        Ok(Trace {
            reader: session.event_reader()?,
            session,
            pipeline: Pipeline::new(tracer::pauses::WallClock::now()),
            output,
            started: std::time::Instant::now(),
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
        let Trace {
            reader,
            pipeline,
            output,
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
        let summary = Summary::new(
            &self.pipeline,
            processes,
            &counters,
            self.started.elapsed().as_nanos() as u64,
        );
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
