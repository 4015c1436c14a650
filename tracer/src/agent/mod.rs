//! `gostw agent`: one per host, for weeks. Finds Go processes (a `/proc` diff
//! every poll interval), attaches once per executable, traces every process
//! of it, detaches when the last one exits, and serves what it saw as
//! Prometheus metrics.
//!
//! Stages: discovery (`/proc` diff) -> tracker (attach/trace/detach) ->
//! observations from the tracing pipeline (`observe::Observer`) -> metrics ->
//! HTTP server (its own thread).

pub mod discovery;
pub mod events;
pub mod exec_events;
pub mod faults;
pub mod kernel;
pub mod labels;
pub mod metrics;
pub mod observe;
pub mod server;
pub mod tracker;

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use anyhow::Context as _;
use regex::Regex;

use self::{
    discovery::{Discovery, Filter, ProcFs, ProcSource},
    events::EventStage,
    kernel::EbpfKernel,
    metrics::Metrics,
    observe::{FaultObservation, Observer, PauseObservation, StackGrowthObservation},
    tracker::{Limits, Tracker},
};
use crate::ebpf::Programs;

/// `gostw agent` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to serve /metrics and /healthz on.
    #[arg(long, default_value = "127.0.0.1:9477")]
    pub listen: SocketAddr,
    /// Only trace processes whose executable path or command name matches.
    #[arg(long = "match", value_name = "REGEX", value_parser = parse_regex)]
    pub name: Option<Regex>,
    /// Only trace processes in this cgroup or below (e.g. /kubepods.slice).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<String>,
    /// How often /proc is compared with the previous poll (new processes are
    /// traced at most this long after they start). E.g. 500ms, 1s, 2m.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub poll_interval: Duration,
    /// Executables traced at once; more are counted as attach failures.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_executables: u32,
    /// Distinct (executable, container) label sets at once; more share the
    /// container label "_overflow".
    #[arg(long, value_name = "N", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_label_sets: u32,
}

fn parse_regex(s: &str) -> Result<Regex, String> {
    Regex::new(s).map_err(|e| format!("not a valid regular expression: {e}"))
}

/// A poll interval: "250ms", "1s", "2m" (`units::parse_duration`), between
/// 10 ms and 1 hour.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = crate::units::parse_duration(s)?;
    if !(Duration::from_millis(10)..=Duration::from_secs(3600)).contains(&d) {
        return Err(format!("{s} is outside 10ms..1h"));
    }
    Ok(d)
}

/// How often the loop wakes between polls to read events (the 4 MiB ring
/// buffer holds far more than 100 ms of pauses) and check for shutdown.
const TICK: Duration = Duration::from_millis(100);

/// Shortest time between two polls that exec notifications trigger (their
/// cost is bounded on a host that starts many programs).
const EXEC_POLL_GAP: Duration = Duration::from_millis(100);

/// The agent's state on its main thread.
pub struct Agent<K: tracker::Kernel> {
    discovery: Discovery,
    tracker: Tracker<K>,
    metrics: Arc<Metrics>,
}

impl<K: tracker::Kernel> Agent<K> {
    pub fn new(filter: Filter, kernel: K, limits: Limits, metrics: Arc<Metrics>) -> Agent<K> {
        Agent {
            discovery: Discovery::new(filter),
            tracker: Tracker::new(kernel, limits),
            metrics,
        }
    }

    /// One `/proc` diff: trace what started, forget what exited.
    /// `before_exits` runs between the diff and forgetting the exited
    /// processes: a process's events are in the ring buffer before /proc
    /// shows it gone, so reading them there attributes its last pauses.
    pub fn poll(
        &mut self,
        proc: &impl ProcSource,
        before_exits: impl FnOnce(&mut Self),
    ) -> anyhow::Result<()> {
        let changes = self.discovery.poll(proc).context("reading /proc")?;
        before_exits(self);
        for pid in changes.exited {
            self.tracker.exited(pid, &self.metrics);
        }
        for p in &changes.started {
            self.tracker
                .started(p, &proc.exe_link(p.pid), &self.metrics);
        }
        self.tracker.poll_counts(&self.metrics);
        self.metrics.proc_known.set(self.discovery.known() as i64);
        Ok(())
    }

    pub fn tracker(&mut self) -> &mut Tracker<K> {
        &mut self.tracker
    }

    /// Detach everything.
    pub fn shutdown(&mut self) {
        self.tracker.shutdown(&self.metrics);
    }
}

/// Observations of a pid the agent no longer (or not yet) traces are counted
/// as lost, not attributed to another process.
impl<K: tracker::Kernel> Observer for Agent<K> {
    fn pause(&mut self, pid: u32, pause: &PauseObservation) {
        match self.tracker.labels(pid) {
            Some(l) => self.metrics.pause(l, pause),
            None => self.metrics.events_lost("unattributed", 1),
        }
    }

    fn fault(&mut self, pid: u32, fault: &FaultObservation) {
        match self.tracker.labels(pid) {
            Some(l) => self.metrics.fault(l, fault),
            None => self.metrics.events_lost("unattributed", 1),
        }
    }

    fn stack_growth(&mut self, pid: u32, growth: &StackGrowthObservation) {
        match self.tracker.labels(pid) {
            Some(l) => self.metrics.stack_growth(l, growth),
            None => self.metrics.events_lost("unattributed", 1),
        }
    }

    fn stop_the_world_entries(&mut self, pid: u32, n: u64) {
        if let Some(l) = self.tracker.labels(pid) {
            self.metrics.stop_the_world_entries(l, n);
        }
    }
}

/// Kernel health counters: the agent exports deltas of the summed values.
#[derive(Default)]
struct KernelCounters {
    last: Vec<u64>,
}

impl KernelCounters {
    fn update(&mut self, programs: &Programs, metrics: &Metrics) {
        let Ok(now) = programs.counters() else {
            return;
        };
        self.last.resize(now.len(), 0);
        for (i, (counter, value)) in now.into_iter().enumerate() {
            let delta = value.saturating_sub(self.last[i]);
            self.last[i] = value;
            if delta > 0 {
                metrics.bpf_error(counter.name(), delta);
                if counter == tracer_common::counters::Counter::RingbufFull {
                    metrics.events_lost("ringbuf_full", delta);
                }
            }
        }
    }
}

/// Run the agent until SIGINT or SIGTERM.
pub fn run(args: Args) -> anyhow::Result<()> {
    // Bind first: a port in use fails before anything touches the kernel.
    let listener = server::bind(args.listen)?;
    let addr = listener.local_addr()?;
    let programs = Programs::load()?;
    let metrics = Arc::new(Metrics::new());
    let stop = Arc::new(AtomicBool::new(false));
    let (server_done_tx, server_done_rx) = tokio::sync::oneshot::channel::<()>();
    let server = {
        let (metrics, stop) = (metrics.clone(), stop.clone());
        std::thread::Builder::new()
            .name("gostw-http".into())
            .spawn(move || -> anyhow::Result<()> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .context("starting the HTTP runtime")?;
                let stop2 = stop.clone();
                let result = rt.block_on(async move {
                    let shutdown = async move {
                        tokio::select! {
                            _ = wait_for_signal() => {}
                            _ = server_done_rx => {}
                        }
                        stop2.store(true, Ordering::SeqCst);
                    };
                    server::serve(listener, metrics, shutdown).await
                });
                stop.store(true, Ordering::SeqCst);
                result
            })
            .context("starting the HTTP thread")?
    };
    eprintln!(
        "gostw agent: serving http://{addr}/metrics; polling /proc every {:?}",
        args.poll_interval
    );
    let filter = Filter {
        name: args.name,
        cgroup: args.cgroup,
    };
    let limits = Limits {
        max_executables: args.max_executables as usize,
        max_label_sets: args.max_label_sets as usize,
        ..Limits::default()
    };
    let mut programs = programs;
    let mut ring = programs.take_events()?;
    let mut stage = EventStage::default();
    stage.faults = faults::FaultStage::attach(&mut programs, &metrics);
    let mut agent = Agent::new(filter, EbpfKernel::new(programs), limits, metrics.clone());
    let proc = ProcFs::new("/proc");
    let mut counters = KernelCounters::default();
    let mut result = Ok(());
    let mut next_poll = Instant::now();
    let mut last_poll = Instant::now();
    let mut execs = match exec_events::watch() {
        Ok(rx) => Some(rx),
        Err(e) => {
            log::info!(
                "no exec notifications ({e}): new processes are found by polling every {:?}",
                args.poll_interval
            );
            None
        }
    };
    let mut drain = |agent: &mut Agent<EbpfKernel>| {
        while let Some(raw) = ring.next() {
            stage.handle(&raw, agent, &metrics);
        }
        stage.settle(agent);
    };
    while !stop.load(Ordering::SeqCst) {
        drain(&mut agent);
        if Instant::now() >= next_poll {
            let started = Instant::now();
            if let Err(e) = agent.poll(&proc, &mut drain) {
                result = Err(e);
                break;
            }
            counters.update(agent.tracker().kernel().programs(), &metrics);
            metrics
                .stack_sampler_attached
                .set(i64::from(agent.tracker().kernel().sampling()));
            metrics
                .poll_duration
                .observe(started.elapsed().as_secs_f64());
            metrics.last_poll_unix_seconds.set(
                SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64()),
            );
            last_poll = started;
            next_poll = started + args.poll_interval;
        }
        let wait = TICK.min(next_poll.saturating_duration_since(Instant::now()));
        match execs.as_ref().map(|rx| rx.recv_timeout(wait)) {
            Some(Ok(_)) => {
                let n = 1 + execs.as_ref().map_or(0, |rx| rx.try_iter().count());
                metrics.exec_notifications.inc_by(n as u64);
                // A program started: poll now, but not more often than
                // EXEC_POLL_GAP however many programs a host starts.
                next_poll = next_poll.min(last_poll + EXEC_POLL_GAP);
            }
            Some(Err(std::sync::mpsc::RecvTimeoutError::Timeout)) => {}
            Some(Err(std::sync::mpsc::RecvTimeoutError::Disconnected)) => execs = None,
            None => std::thread::sleep(wait),
        }
    }
    drain(&mut agent);
    agent.shutdown();
    let _ = server_done_tx.send(());
    let served = server
        .join()
        .map_err(|_| anyhow::anyhow!("the HTTP thread panicked"))?;
    eprintln!("gostw agent: stopped");
    result.and(served)
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        // Without signal handlers the default action still ends the process.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{discovery::tests::FakeProc, tracker::tests::FakeKernel};

    fn text(m: &Metrics) -> String {
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, m.registry()).unwrap();
        s
    }

    const GC: PauseObservation = PauseObservation {
        reason: "gc_mark_termination",
        duration_ns: 30_000,
        major_faults: 0,
    };

    /// /proc snapshots in, series out: a process's last pause, read between
    /// the diff and forgetting it, still counts; then its series go.
    #[test]
    fn processes_come_and_go_through_the_whole_agent() {
        let metrics = Arc::new(Metrics::new());
        let proc = FakeProc::default();
        let mut agent = Agent::new(
            Filter::default(),
            FakeKernel::default(),
            Limits::default(),
            metrics.clone(),
        );
        proc.start(10, 1, 100, "/srv/api");
        proc.start(11, 1, 100, "/srv/api");
        proc.start(12, 1, 200, "/bin/bash");
        agent.poll(&proc, |_| {}).unwrap();
        assert_eq!(metrics.processes_traced.get(), 2);
        agent.pause(10, &GC);
        proc.exit(10);
        proc.exit(11);
        agent
            .poll(&proc, |a| {
                // The last pause of pid 11, read after the diff saw it exit.
                a.pause(11, &GC);
            })
            .unwrap();
        assert_eq!(metrics.processes_traced.get(), 0);
        assert_eq!(metrics.live_label_sets(), 0);
        let t = text(&metrics);
        assert!(
            !t.contains("/srv/api") && !t.contains("executable=\"api\""),
            "{t}"
        );
        assert!(
            t.contains("gostw_agent_events_lost_total{stage=\"unattributed\"} 0"),
            "{t}"
        );
        // After that, a pause of the forgotten pid is counted as lost.
        agent.pause(11, &GC);
        assert!(text(&metrics).contains("gostw_agent_events_lost_total{stage=\"unattributed\"} 1"));
        assert_eq!(agent.tracker().kernel().detaches, [1]);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        for bad in ["1", "s", "2h", "0", "5ms", "2d", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
