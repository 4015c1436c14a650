//! `gostw faults`: major page faults of one process, and how much of each of
//! its stop-the-world pauses they explain. Pause windows come from the pause
//! probes (the same records `attach`/`run` print) when the process is a Go
//! program gostw can probe; otherwise only faults are reported.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, bail};
use tracer::{
    binary::GoBinary,
    faults::{FaultSource, FaultTracer, PauseWindow, report::render_text},
    pauses::WallClock,
    pipeline::{Pipeline, Record},
    process::StoppedChild,
    session::Session,
    units::parse_duration,
};
use tracer_common::process::TracedProcess;

#[derive(clap::Args)]
pub struct Args {
    /// Which kernel mechanism observes faults.
    #[arg(long, value_enum, default_value_t)]
    pub fault_source: FaultSource,
    /// Stop after this long (e.g. 30s, 5m); default: until Ctrl-C or exit.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Trace this running process.
    #[arg(long, conflicts_with = "command", required_unless_present = "command")]
    pub pid: Option<u32>,
    /// Or start this program and trace it from its first instruction.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<OsString>,
}

/// How the traced process is held.
enum Target {
    Running(u32),
    Child(std::process::Child),
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let mut session = Session::new()?;
    let mut tracer = FaultTracer::attach(session.programs(), args.fault_source)?;
    eprintln!(
        "gostw: fault backend {:?}: {}",
        tracer.choice.backend, tracer.choice.reason
    );
    let mut reader = session.event_reader()?;
    let mut pipeline = Pipeline::new(WallClock::now());

    let (pid, go, mut target) = match args.pid {
        Some(pid) => {
            let binary = GoBinary::open(Path::new(&format!("/proc/{pid}/exe"))).ok();
            let go = trace(&mut session, pid, binary.as_ref())?;
            tracer.add_process(pid)?;
            (pid, go, Target::Running(pid))
        }
        None => {
            let (program, rest) = args.command.split_first().context("no program given")?;
            let path = resolve(Path::new(program))?;
            let binary = GoBinary::open(&path).ok();
            let stopped = StoppedChild::spawn(
                path.as_os_str(),
                &rest.iter().map(|a| a.as_os_str()).collect::<Vec<_>>(),
                |_| {},
            )?;
            let pid = stopped.pid();
            let go = trace(&mut session, pid, binary.as_ref())?;
            (pid, go, Target::Child(stopped.resume()?))
        }
    };

    let mut handle = |raw: &[u8]| {
        if let Some(Record::Pause(p)) = pipeline.feed(raw) {
            tracer.add_window(PauseWindow::from(&p));
        }
        tracer.handle_event(raw);
    };
    let deadline = args.duration.map(|d| tokio::time::Instant::now() + d);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let status = loop {
        tokio::select! {
            r = reader.read_batch(&mut handle) => { r?; }
            _ = tokio::signal::ctrl_c() => break None,
            _ = tick.tick() => {
                if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                    break None;
                }
                match &mut target {
                    Target::Child(c) => if let Some(s) = c.try_wait()? { break Some(s) },
                    Target::Running(p) => if !Path::new(&format!("/proc/{p}")).exists() { break None },
                }
            }
        }
    };
    reader.drain(&mut handle);
    let summary = tracer.summary();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", render_text(&summary, 10));
        if !go {
            println!("(pid {pid} is not a Go program gostw can probe: no pause windows)");
        }
    }
    for (counter, n) in session.counters()? {
        if n > 0 {
            eprintln!("gostw: kernel counter {}: {n}", counter.name());
        }
    }
    // Interrupted or out of time: a started program keeps running, as with
    // `attach`; only the tracing stops.
    Ok(status.map_or(0, super::exit_code))
}

/// Add `pid` to the traced set; for a Go program also attach the pause
/// probes (returns whether it is one).
fn trace(session: &mut Session, pid: u32, binary: Option<&GoBinary>) -> anyhow::Result<bool> {
    if let Some(b) = binary {
        match session.attach_binary(b) {
            Ok(()) => {
                session.trace_process(pid, b)?;
                return Ok(true);
            }
            Err(e) => log::warn!("no pause probes for {}: {e:#}", b.path.display()),
        }
    }
    session.programs().trace(pid, TracedProcess::default())?;
    Ok(false)
}

/// Resolve a program name the way a shell would.
fn resolve(p: &Path) -> anyhow::Result<PathBuf> {
    if p.components().count() > 1 {
        return p.canonicalize().with_context(|| format!("{}", p.display()));
    }
    match std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join(p))
        .find(|c| c.is_file())
    {
        Some(path) => Ok(path),
        None => bail!("{} not found in PATH", p.display()),
    }
}
