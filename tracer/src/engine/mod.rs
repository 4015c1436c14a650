//! The engine: one event loop for every front end. Kernel records flow one
//! way: ring buffer -> `reader` -> `Stream` (decode once, symbolize,
//! correlate) -> the observed stream -> sinks. The target says which
//! processes come and go; the tracker attaches and traces them through the
//! core. `attach`, `run`, `faults`, `stacks` and the agent differ only in
//! their target, their options and their sink.
//!
//! - `event`: decoding raw records; `reader`: the async ring-buffer reader.
//! - `caller`: who asked for a stop; `explain`, `breakdown`: why a pause
//!   took as long as it did (what a pause, a fault and a laggard are lives
//!   in `model`).
//! - `correlate`: which faults belong to which pause (the one rule).
//! - `stream`: the pure pipeline, which produces `model::observed`;
//!   `annotate`: what the `/proc` watches (throttling, exposure) add to it.
//! - `code`: stack growth's return addresses symbolized, once, for every sink.
//! - `changes`: a target's changes applied to the tracker and the stream;
//!   `goroutines`: the goroutine counts of a one-process trace.

pub mod annotate;
pub mod breakdown;
pub mod caller;
mod changes;
pub mod code;
pub mod correlate;
pub mod event;
pub mod explain;
mod goroutines;
pub mod reader;
pub mod stream;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};

pub use self::changes::apply;
use self::{
    goroutines::GoroutineCounts,
    reader::EventReader,
    stream::{Stream, StreamOptions},
};
use crate::{
    clock::{WallClock, monotonic_ns},
    kernel::{Core, CoreOptions},
    memory::watch::ExposureWatch,
    model::{
        backend::{BackendChoice, HostLimits},
        observed::{Observed, Sink},
    },
    targets::{
        Changes, Target,
        cpu_throttle::ThrottleWatch,
        tracker::{Limits, Tracker},
    },
};

/// How often the loop looks at the target, the kernel's counts and time.
const TICK: Duration = Duration::from_millis(50);
/// Records read from each ring buffer before what they became is delivered
/// (a pause record with its explanation is a few KiB decoded).
const BATCH: usize = 4096;

/// How often the counts and health of a host target are read.
const HOST_COUNTS_PERIOD: Duration = Duration::from_secs(1);

/// What woke the loop.
/// Sleep until CLOCK_MONOTONIC `at_ns` (forever for `None`).
async fn release_at(at_ns: Option<u64>) {
    match at_ns {
        Some(at) => {
            let wait = at.saturating_sub(monotonic_ns());
            tokio::time::sleep(std::time::Duration::from_nanos(wait)).await;
        }
        None => std::future::pending().await,
    }
}

enum Wake {
    Events,
    Tick,
    Exit,
}

/// When `Engine::run` stops on its own.
#[derive(Clone, Copy, Debug)]
pub enum Until {
    /// This long after the target is traced.
    After(Duration),
    /// At this instant.
    At(tokio::time::Instant),
}

/// Why `Engine::run` returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The deadline passed.
    Duration,
    /// SIGINT, SIGTERM or SIGHUP (the signal number).
    Signal(i32),
    /// The one traced process exited (or exited while being attached).
    Exited,
    /// The sink's output can no longer be written (`Sink::closed`: its
    /// reader went away, or a write failed).
    OutputClosed,
}

/// The loaded core, what it traces, and the stream of what it observed.
pub struct Engine {
    tracker: Tracker<Core>,
    reader: EventReader,
    stream: Stream,
    started: Instant,
    announced_backend: bool,
    sampling: bool,
    /// Goroutine counts of a one-process trace with stack growth.
    goroutines: GoroutineCounts,
    stacks: bool,
    /// Pauses are explained: report CPU cgroup throttling too.
    explain: bool,
    throttle: ThrottleWatch,
    /// The traced processes' memory exposure (`attach`, `run`).
    exposure: Option<ExposureWatch>,
    /// BPF statistics held on, and gostw's own cost read from time to time.
    cost: crate::bpf_stats::CostWatch,
    /// When a host target's counts were last read.
    counted: Option<Instant>,
    /// Pauses are explained and the host hides kernel addresses.
    symbols_hidden: bool,
    /// Symbolizes stack growth for the sinks.
    code: code::GrowthCode,
    out: Vec<Observed>,
}

impl Engine {
    /// Load the kernel programs; nothing is traced until a target is run.
    pub fn new(opts: CoreOptions, limits: Limits) -> anyhow::Result<Engine> {
        let mut core = Core::load(opts)?;
        if let Some(Err(e)) = core.fault_choice()
            && opts.faults != Some(Default::default())
        {
            // An explicit --fault-source that cannot work fails now.
            return Err(e);
        }
        let pauses = core.object().take_pause_events()?;
        let reader = EventReader::new(pauses, core.object().take_events()?)
            .context("watching the ring buffers")?;
        let mut stream = Stream::new(
            WallClock::now(),
            StreamOptions {
                faults: opts.faults.is_some(),
                stacks: opts.stacks.is_some(),
            },
        );
        if opts.explain {
            stream.set_pause_stack_source(Box::new(core.object().take_pause_stacks()?));
            // Kernel stacks of pauses are named from /proc/kallsyms: read
            // it now, off the event loop.
            crate::procfs::kallsyms::KernelSymbols::preload();
        }
        let mut engine = Engine {
            tracker: Tracker::new(core, limits),
            reader,
            stream,
            started: Instant::now(),
            announced_backend: false,
            sampling: false,
            goroutines: GoroutineCounts::default(),
            stacks: opts.stacks.is_some(),
            explain: opts.explain,
            throttle: ThrottleWatch::default(),
            exposure: None,
            cost: crate::bpf_stats::CostWatch::start(),
            counted: None,
            symbols_hidden: opts.explain && crate::procfs::kallsyms::host_addresses_hidden(),
            code: code::GrowthCode::default(),
            out: Vec::new(),
        };
        if opts.faults.is_none() {
            // No fault backend to wait for: what the host takes is known now.
            engine.announce_degraded(None);
        }
        Ok(engine)
    }

    /// Say once what this host takes from the features in use, with the
    /// fault backend in use (if any).
    fn announce_degraded(&mut self, backend: Option<&BackendChoice>) {
        let degraded = HostLimits {
            backend,
            layout_error: self.tracker.kernel().object().compat().layout_error(),
            symbols_hidden: self.symbols_hidden,
            explain: self.explain,
            stacks: self.stacks,
        }
        .degraded();
        if !degraded.is_empty() {
            self.out.push(Observed::Degraded(degraded));
        }
    }

    /// Read the traced processes' memory exposure at their start, every
    /// `every`, and with `at_end` when their trace ends (`Observed::Exposure`).
    pub fn watch_exposure(&mut self, every: Duration, at_end: bool) {
        self.exposure = Some(ExposureWatch::new(every, at_end));
    }

    /// The core, for what front ends report of it.
    pub fn core(&mut self) -> &mut Core {
        self.tracker.kernel()
    }

    /// The tracker (which processes are traced).
    pub fn tracker(&self) -> &Tracker<Core> {
        &self.tracker
    }

    /// Time since the engine started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Trace `target` into `sink` until the one traced process exits,
    /// `deadline` passes, SIGINT/SIGTERM/SIGHUP arrives, or the sink is
    /// closed (checked after each delivery and every tick). A deadline given as a
    /// duration counts from when the target is traced (attaching can take a
    /// second on a loaded machine) and is rewritten to the instant it
    /// became, for the next call. May be called again to
    /// go on (e.g. after passing a signal on to a started program).
    /// Returns why it stopped; a single target that cannot be traced is an
    /// error.
    pub async fn run(
        &mut self,
        target: &mut Target,
        sink: &mut dyn Sink,
        deadline: &mut Option<Until>,
    ) -> anyhow::Result<Stop> {
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut sigterm = signal(SignalKind::terminate())?;
        // A closed terminal ends the trace as Ctrl-C would, not mid-file.
        let mut sighup = signal(SignalKind::hangup())?;
        if let Some(why) = self.poll_target(target, sink)? {
            // A process that exits while it is attached to is one that
            // exited, not one that cannot be traced.
            if target.exited_now() {
                return Ok(Stop::Exited);
            }
            return Err(why);
        }
        target.resume()?;
        let at = deadline.map(|d| match d {
            Until::After(d) => tokio::time::Instant::now() + d,
            Until::At(at) => at,
        });
        *deadline = at.map(Until::At);
        let sleep = async {
            match at {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(sleep);
        let mut tick = tokio::time::interval(TICK);
        loop {
            if target.finished() {
                return Ok(Stop::Exited);
            }
            if sink.closed() {
                return Ok(Stop::OutputClosed);
            }
            // A held pause is released when its grace ends, not at the next
            // read: live lines come ~50 ms after the pause, not up to 70.
            let release = release_at(self.stream.next_release_ns());
            let wake = tokio::select! {
                r = self.reader.wait() => {
                    r.context("reading the events ring buffer")?;
                    Wake::Events
                }
                _ = tick.tick() => Wake::Tick,
                () = release => Wake::Events,
                () = target.exited() => Wake::Exit,
                () = &mut sleep => return Ok(Stop::Duration),
                _ = sigint.recv() => return Ok(Stop::Signal(libc::SIGINT)),
                _ = sigterm.recv() => return Ok(Stop::Signal(libc::SIGTERM)),
                _ = sighup.recv() => return Ok(Stop::Signal(libc::SIGHUP)),
            };
            match wake {
                Wake::Events => loop {
                    // Batches: what is decoded reaches the sinks before more
                    // is read, so memory stays bounded under a storm. A pause
                    // is released only once the faults of its grace period
                    // were read: up to now if the fault buffer was read to its
                    // end, else up to the newest fault read.
                    let (n, read_up_to) = self.drain_batch();
                    let now = monotonic_ns();
                    let settled = read_up_to.map_or(now, |t| t.min(now));
                    self.stream.settle(settled, &mut self.out);
                    self.deliver(sink);
                    if n < BATCH {
                        break;
                    }
                },
                Wake::Tick => self.tick(target, sink)?,
                Wake::Exit => {
                    self.poll_target(target, sink)?;
                }
            }
        }
    }

    /// Trace process `pid`, which runs (or is about to exec) the executable at
    /// `path`: for callers that start and stop processes themselves (tests,
    /// benchmarks). The target-driven `run` does this for its targets.
    pub fn trace_process(
        &mut self,
        pid: u32,
        path: &std::path::Path,
        sink: &mut dyn Sink,
    ) -> anyhow::Result<()> {
        let p = crate::targets::discovery::NewProcess {
            pid,
            exe: crate::image::ExeId::of(path)?,
            exe_path: path.to_owned(),
            comm: String::new(),
            cgroup: std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default(),
            names: None,
        };
        let changes = Changes {
            started: vec![(p, path.to_owned())],
            ..Changes::default()
        };
        let failure = apply(
            &mut self.tracker,
            &mut self.stream,
            changes,
            true,
            &mut self.out,
        );
        self.announce_backend();
        self.deliver(sink);
        failure.map_or(Ok(()), Err)
    }

    /// Read what the ring buffer holds now, release what time settles, and
    /// hand it all to `sink`.
    pub fn pump(&mut self, sink: &mut dyn Sink) {
        if let Err(e) = self.tracker.kernel().tick() {
            log::warn!("{e:#}");
        }
        self.drain();
        self.tracker.poll_counts(&mut self.out);
        self.stream.settle(monotonic_ns(), &mut self.out);
        self.emit_health();
        self.deliver(sink);
    }

    /// Process `pid` exited (or is no longer to be traced): its events are
    /// read, its pauses released, and it is untraced.
    pub fn process_exited(&mut self, pid: u32, sink: &mut dyn Sink) {
        let changes = Changes {
            exited: vec![pid],
            ..Changes::default()
        };
        self.drain();
        apply(
            &mut self.tracker,
            &mut self.stream,
            changes,
            false,
            &mut self.out,
        );
        self.deliver(sink);
    }

    /// End the trace: every event in, every process released and untraced,
    /// final counts out.
    pub fn finish(&mut self, sink: &mut dyn Sink) {
        self.goroutines.finish();
        self.drain();
        self.cost.read_next_now();
        self.emit_health();
        let pids: Vec<u32> = self.tracker.pids();
        for pid in pids {
            self.stream.exited(pid, &mut self.out);
            self.tracker.exited(pid, &mut self.out);
        }
        self.stream.finish(&mut self.out);
        self.emit_health();
        self.deliver(sink);
    }

    fn tick(&mut self, target: &mut Target, sink: &mut dyn Sink) -> anyhow::Result<()> {
        self.tracker.kernel().tick()?;
        self.poll_target(target, sink)?;
        // Counts and health are map reads per process and per counter: for
        // the host (the agent, scraped every few seconds) once a second is
        // enough, and costs a twentieth.
        let counts_due = target.single().is_some()
            || self
                .counted
                .is_none_or(|t| t.elapsed() >= HOST_COUNTS_PERIOD);
        if counts_due {
            self.counted = Some(Instant::now());
            self.tracker.resolve_images();
            self.tracker.poll_counts(&mut self.out);
        }
        if self.stacks && target.single().is_some() {
            self.read_goroutines();
        }
        self.stream.settle(monotonic_ns(), &mut self.out);
        if counts_due {
            self.emit_health();
        }
        self.deliver(sink);
        Ok(())
    }

    /// Apply what the target says changed. For a one-process target, the
    /// reason it could not be traced.
    fn poll_target(
        &mut self,
        target: &mut Target,
        sink: &mut dyn Sink,
    ) -> anyhow::Result<Option<anyhow::Error>> {
        let polled = Instant::now();
        let Some(changes) = target.poll(polled)? else {
            return Ok(None);
        };
        // A process's events are in the ring buffer before it is seen gone:
        // read them before it is forgotten.
        if !changes.exited.is_empty() {
            self.drain();
        }
        for pid in &changes.exited {
            self.goroutines.exited(*pid);
        }
        let single = target.single().is_some();
        let changes_scanned = changes.scanned;
        let failure = apply(
            &mut self.tracker,
            &mut self.stream,
            changes,
            single,
            &mut self.out,
        );
        if let Some(h) = target.host_state()
            && changes_scanned
        {
            self.out.push(Observed::HostPolled {
                known: h.known(),
                took: polled.elapsed(),
                exec_notifications: h.exec_notifications,
            });
        }
        self.announce_backend();
        self.deliver(sink);
        Ok(failure)
    }

    fn announce_backend(&mut self) {
        let sampling = self.tracker.kernel().sampling();
        if sampling != self.sampling {
            self.sampling = sampling;
            self.out.push(Observed::SamplerAttached(sampling));
        }
        if self.announced_backend {
            return;
        }
        let core = self.tracker.kernel();
        if let Some(choice) = core.fault_backend().cloned() {
            self.stream.set_file_faults_seen(choice.file_faults_seen);
            self.out.push(Observed::FaultBackend(choice.clone()));
            self.announce_degraded(Some(&choice));
            self.announced_backend = true;
        } else if let Some(why) = core.fault_failure() {
            self.out.push(Observed::FaultsUnavailable(why.to_owned()));
            self.announced_backend = true;
        }
    }

    fn read_goroutines(&mut self) {
        self.goroutines.read(self.tracker.infos(), &mut self.out);
    }

    fn emit_health(&mut self) {
        if let Ok(counters) = self.tracker.kernel().counters() {
            self.out.push(Observed::KernelCounters(counters));
        }
        self.out.push(Observed::Losses {
            user: self.stream.losses,
            correlator: self.stream.correlator_stats(),
        });
        if let Some(c) = self.cost.reading(self.tracker.kernel().object().ebpf()) {
            self.out.push(Observed::Cost(Arc::new(c)));
        }
    }

    fn drain(&mut self) {
        let Engine {
            reader,
            stream,
            out,
            ..
        } = self;
        reader.drain(|raw| stream.feed(raw, out));
    }

    /// `drain`, at most `BATCH` records of each ring buffer: the larger
    /// count, and the time of the newest fault or stack-growth record read
    /// if that buffer was not read to its end.
    fn drain_batch(&mut self) -> (usize, Option<u64>) {
        let Engine {
            reader,
            stream,
            out,
            ..
        } = self;
        let pauses = reader.drain_pauses(BATCH, |raw| stream.feed(raw, out));
        let mut newest = 0;
        let events = reader.drain_events(BATCH, |raw| {
            newest = newest.max(self::reader::record_ts_ns(raw));
            stream.feed(raw, out)
        });
        (pauses.max(events), (events >= BATCH).then_some(newest))
    }

    fn deliver(&mut self, sink: &mut dyn Sink) {
        if self.explain {
            annotate::throttling(&mut self.throttle, &mut self.out);
        }
        if let Some(w) = &mut self.exposure {
            annotate::exposure(w, &mut self.out);
        }
        self.code.annotate(&mut self.out);
        sink.observe_all(&self.out);
        self.out.clear();
    }
}
