//! `gostw stacks`: goroutine stack growth of one process, started under
//! gostw (`-- CMD ARGS`) or already running (`--pid PID`), until it exits,
//! `--duration` passes, or Ctrl-C.

use std::{
    ffi::OsString,
    path::PathBuf,
    process::Child,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use tracer::{
    binary::GoBinary,
    process::StoppedChild,
    session::Session,
    stackgrowth::{
        DutyCycle, GoSymbols, Mode, StackGrowthAggregator, StackGrowthOptions, StackGrowthProbes,
        goroutines,
    },
    units::parse_duration,
};

/// Arguments of `gostw stacks`.
#[derive(clap::Args)]
pub struct StacksArgs {
    /// Trace this running process.
    #[arg(long, conflicts_with = "command", required_unless_present = "command")]
    pid: Option<u32>,
    /// sampled: CPU-clock samples, near-zero cost (default); exact: a probe on
    /// every stack copy, attached part of the time (see --exact-on).
    #[arg(long, value_enum, default_value_t)]
    mode: Mode,
    /// Stop after this long (e.g. 30s, 500ms); default: until the process
    /// exits or Ctrl-C.
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
    /// Sampled mode: samples per second per CPU.
    #[arg(long, default_value_t = 99)]
    sample_hz: u64,
    /// Exact mode: attach the probe this long...
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    exact_on: Duration,
    /// ...out of every this long...
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    exact_period: Duration,
    /// ...or until this many copies in one window (checked every 100 ms).
    #[arg(long, default_value_t = 50_000)]
    exact_max_events: u64,
    /// Exact mode: keep the probe attached all the time (full counts; the
    /// traced program pays 15-20 us per stack copy).
    #[arg(long)]
    exact_always: bool,
    /// Exact mode: one sampled goroutine stack per this many growths per CPU.
    #[arg(long, default_value_t = 64)]
    event_every: u32,
    /// Goroutine count for the memory estimate (e.g. from the program's
    /// /sched/goroutines:goroutines); default: the process's peak
    /// (runtime.allglen), else the goroutines seen growing.
    #[arg(long)]
    goroutines: Option<u64>,
    /// The program to start and trace, after `--`.
    #[arg(last = true)]
    command: Vec<OsString>,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Run `gostw stacks`.
pub fn run(args: StacksArgs) -> anyhow::Result<i32> {
    let opts = StackGrowthOptions {
        mode: args.mode,
        sample_hz: args.sample_hz,
        duty: if args.exact_always {
            DutyCycle::ALWAYS
        } else {
            DutyCycle {
                on: args.exact_on,
                period: args.exact_period.max(args.exact_on),
                max_events: args.exact_max_events,
            }
        },
        exact_event_every: args.event_every,
    };
    let path = match (args.pid, args.command.first()) {
        (Some(pid), _) => PathBuf::from(format!("/proc/{pid}/exe")),
        (None, Some(program)) => super::run::which_program(program)?,
        (None, None) => bail!("give --pid PID or -- COMMAND ARGS"),
    };
    let binary = GoBinary::open(&path)?;
    let mut symbols = GoSymbols::new(&binary)
        .with_context(|| format!("reading symbols of {}", path.display()))?;
    let mut session = Session::new()?;
    let mut probes = StackGrowthProbes::attach(session.programs(), &binary, opts)?;
    let mut ring = session.programs().take_events()?;

    let mut child: Option<Child> = None;
    let pid = match args.pid {
        Some(pid) => {
            session.trace_process(pid, &binary)?;
            pid
        }
        None => {
            let rest: Vec<&std::ffi::OsStr> =
                args.command[1..].iter().map(|a| a.as_os_str()).collect();
            let stopped = StoppedChild::spawn(path.as_os_str(), &rest, |_| {})?;
            let pid = stopped.pid();
            session.trace_process(pid, &binary)?;
            child = Some(stopped.resume()?);
            pid
        }
    };
    probes.watch(pid);
    // SAFETY: the handler only stores to an atomic.
    unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };

    let mut agg = StackGrowthAggregator::new(args.mode);
    let started = Instant::now();
    let mut bias_known = !binary.pie;
    let mut bad_events = 0u64;
    let mut peak_goroutines = None;
    let mut code = 0;
    let mut drain = |ring: &mut aya::maps::RingBuf<aya::maps::MapData>,
                     agg: &mut StackGrowthAggregator| {
        while let Some(item) = ring.next() {
            if agg.add_event_bytes(&item).is_err() {
                bad_events += 1;
            }
        }
    };
    loop {
        std::thread::sleep(Duration::from_millis(100));
        drain(&mut ring, &mut agg);
        if !bias_known {
            bias_known = symbols.elf.set_bias_from_process(pid).is_ok();
        }
        if bias_known {
            // Read while the process lives; a started one may exit any time.
            peak_goroutines = goroutines::peak_goroutines(pid, &symbols.elf).or(peak_goroutines);
        }
        let exited = match child.as_mut() {
            Some(c) => match c.try_wait()? {
                Some(status) => {
                    code = super::exit_code(status);
                    true
                }
                None => false,
            },
            None => !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        };
        if exited
            || INTERRUPTED.load(Ordering::Relaxed)
            || args.duration.is_some_and(|d| started.elapsed() >= d)
        {
            break;
        }
        probes.tick(session.programs())?;
    }
    drain(&mut ring, &mut agg);
    probes.collect(session.programs(), pid, &mut agg)?;
    session.programs().untrace(pid)?;
    tracer::stackgrowth::probes::forget_process(session.programs(), pid)?;
    probes.detach(session.programs())?;
    if bad_events > 0 {
        log::warn!("{bad_events} events could not be decoded");
    }
    let goroutines = args
        .goroutines
        .map(|n| (n, "--goroutines"))
        .or(peak_goroutines.map(|n| (n, goroutines::SOURCE)));
    let summary = agg.summary(&symbols, goroutines);
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else if child.is_some() {
        eprint!(
            "gostw: pid {pid} ({}):\n{}",
            binary.version,
            summary.render_text()
        );
    } else {
        print!("pid {pid} ({}):\n{}", binary.version, summary.render_text());
    }
    if let Some(mut c) = child {
        if INTERRUPTED.load(Ordering::Relaxed) || args.duration.is_some() {
            // The program keeps running untraced, as it would without gostw.
            return Ok(0);
        }
        let status = c.wait()?;
        code = super::exit_code(status);
    }
    Ok(code)
}
