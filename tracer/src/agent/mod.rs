//! `gostw agent`: one per host, for weeks. Its target is every Go process of
//! the host (a `/proc` diff every poll interval, sooner after an exec
//! notification); the engine attaches once per executable, traces every
//! process of it and detaches when the last one exits; its sinks are the
//! Prometheus metrics, the profile store and the slow-pause records (also
//! written to the pause log), served over HTTP on a thread of its own
//! (`/metrics`, `/debug/pprof/faults`, `/debug/pprof/stackgrowth`,
//! `/debug/pauses`). The loop never waits on an output: the pause log has
//! a queue and a thread of its own, and `/healthz` says when the loop
//! stopped turning or an output loses lines (`health`). After SIGTERM the
//! agent flushes what it can and is gone within `STOP_WITHIN`
//! (`shutdown`).

pub mod health;
pub mod log_queue;
pub mod server;
mod shutdown;

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;

use crate::{
    engine::{Engine, Stop, Until},
    kernel::{
        CoreOptions,
        capabilities::FaultSource,
        stacks::{SAMPLE_HZ, StackGrowthOptions},
    },
    sink::{
        metrics::{Metrics, MetricsSink},
        otlp::{OtlpOptions, OtlpSink},
        pause_log::PauseLog,
        profile::{GrowthCounting, ProfileCollector, store::Store},
        queued::OutputCounters,
        slow_pauses::{SlowPauseSink, SlowPauseStore, StoreLimits},
    },
    stackgrowth::Mode,
    targets::{
        Target,
        container_names::{Resolver, Runtime, Runtimes},
        containerd::Containerd,
        discovery::Filter,
        docker::Docker,
        podman::Podman,
        tracker::Limits,
    },
};

/// What the agent does (`cli::agent` makes it from the command line).
#[derive(Debug)]
pub struct Options {
    /// Where /metrics, /healthz and the /debug endpoints are served.
    pub listen: SocketAddr,
    /// Serve /debug/* to peers other than loopback ones.
    pub debug_allow_remote: bool,
    pub filter: Filter,
    pub poll_interval: Duration,
    /// containerd's socket, for containers' Kubernetes names (None: not
    /// asked).
    pub containerd_socket: Option<std::path::PathBuf>,
    /// Podman's storage root, for its containers' names (None: not read).
    pub podman_root: Option<std::path::PathBuf>,
    /// Docker's socket, asked for its containers' names.
    pub docker_socket: Option<std::path::PathBuf>,
    pub max_executables: u32,
    pub max_label_sets: u32,
    /// Gather each pause's explanation (stopping phase, laggards, caller,
    /// breakdown).
    pub explain: bool,
    /// How often each traced process's memory exposure is read (zero: never).
    pub exposure_every: Duration,
    /// The pauses recorded.
    pub slow: crate::model::pause::SlowThreshold,
    pub store: StoreLimits,
    pub pause_log: PauseLogTo,
    pub pause_log_max_bytes: u64,
    pub pause_log_rate: u32,
    /// Also send the metrics and slow-pause records over OTLP.
    pub otlp: Option<OtlpOptions>,
}

/// Where the pause log goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PauseLogTo {
    Stdout,
    Off,
    File(std::path::PathBuf),
}

/// What the agent traces: pauses, faults (auto backend), sampled stack
/// growth, and Go's stopping phase and the pauses' explanation if
/// `explain`.
pub fn core_options(explain: bool) -> CoreOptions {
    CoreOptions {
        faults: Some(FaultSource::Auto),
        stacks: Some(StackGrowthOptions {
            mode: Mode::Sampled,
            sample_hz: SAMPLE_HZ,
            ..StackGrowthOptions::default()
        }),
        // The breakdown needs the stopping phase.
        stopping: explain,
        explain,
        ..CoreOptions::default()
    }
}

/// Run the agent until SIGINT or SIGTERM.
pub async fn run(args: Options) -> anyhow::Result<()> {
    // Bind first: a port in use fails before anything touches the kernel.
    let listener = server::bind(args.listen)?;
    let addr = listener.local_addr()?;
    let limits = Limits {
        max_executables: args.max_executables as usize,
        max_label_sets: args.max_label_sets as usize,
        ..Limits::default()
    };
    let mut engine = Engine::new(core_options(args.explain), limits)?;
    if !args.exposure_every.is_zero() {
        engine.watch_exposure(args.exposure_every, false);
    }
    let metrics = Arc::new(Metrics::new());
    // Until a process is traced no fault backend is attached.
    metrics.fault_backend("none");
    let profiles = server::Profiles {
        store: Arc::new(std::sync::Mutex::new(Store::new())),
        sample_hz: SAMPLE_HZ,
        allow_remote: args.debug_allow_remote,
        windows: Default::default(),
    };
    let pauses = server::Pauses {
        store: Arc::new(std::sync::Mutex::new(SlowPauseStore::new(args.store))),
        allow_remote: args.debug_allow_remote,
    };
    // The pause log's losses count in the slow-pause records' `unlogged`
    // too.
    let counters = OutputCounters {
        any_loss: Some(metrics.slow_pauses.unlogged.clone()),
        ..metrics.outputs.counters("pause_log")
    };
    let log = match &args.pause_log {
        PauseLogTo::Off => None,
        PauseLogTo::Stdout => Some(PauseLog::stdout(args.pause_log_rate, counters)?),
        PauseLogTo::File(path) => Some(PauseLog::file(
            path.clone(),
            args.pause_log_max_bytes,
            args.pause_log_rate,
            counters,
        )?),
    };
    // The agent's own log is an output too (see `log_queue`).
    let own_log = log_queue::start(metrics.outputs.counters("log"))
        .context("starting the agent log's writer")?;
    let health = Arc::new(health::Health::new(
        log.iter().map(PauseLog::watch).chain([own_log]).collect(),
    ));
    let stopped = Arc::new(AtomicBool::new(false));
    let (server_done_tx, server_done_rx) = tokio::sync::oneshot::channel::<()>();
    let (served_tx, served_rx) = std::sync::mpsc::channel::<anyhow::Result<()>>();
    {
        let (metrics, health, stopped) = (metrics.clone(), health.clone(), stopped.clone());
        let (profiles, pauses) = (profiles.clone(), pauses.clone());
        std::thread::Builder::new()
            .name("gostw-http".into())
            .spawn(move || {
                let result = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .context("starting the HTTP runtime")
                    .and_then(|rt| {
                        rt.block_on(async move {
                            server::serve(listener, metrics, health, profiles, pauses, async move {
                                let _ = server_done_rx.await;
                            })
                            .await
                        })
                    });
                stopped.store(true, Ordering::SeqCst);
                let _ = served_tx.send(result);
            })
            .context("starting the HTTP thread")?;
    }
    log_queue::say(&format!(
        "gostw agent: serving http://{addr}/metrics, /debug/pauses and /debug/pprof/{{faults,stackgrowth}} ({}); polling /proc every {:?}; recording pauses of {} or more",
        if args.debug_allow_remote {
            "records and profiles to any peer"
        } else {
            "records and profiles to loopback peers"
        },
        args.poll_interval,
        crate::units::fmt_ns(args.slow.min_ns())
    ));
    let mut runtimes: Vec<Box<dyn Runtime>> = Vec::new();
    if let Some(socket) = &args.containerd_socket {
        runtimes.push(Box::new(Containerd::new(socket.clone())?));
    }
    if let Some(socket) = &args.docker_socket {
        runtimes.push(Box::new(Docker::new(socket.clone())));
    }
    if let Some(root) = &args.podman_root {
        runtimes.push(Box::new(Podman::new(root.clone())));
    }
    let names = if runtimes.is_empty() {
        None
    } else {
        Some(Resolver::start(Runtimes(runtimes)).context("starting the container names thread")?)
    };
    let mut target = Target::host(args.filter, args.poll_interval, names);
    // The same stream to the metrics, the profiles and the records the HTTP
    // thread reads.
    let sink = (
        (
            MetricsSink::new(metrics.clone()).with_record_exemplars(args.slow),
            ProfileCollector::new(profiles.store.clone(), GrowthCounting::Events),
        ),
        SlowPauseSink::new(pauses.store.clone(), args.slow, log, metrics.clone()),
    );
    let otlp = match &args.otlp {
        Some(o) => {
            let sink = OtlpSink::start(o, &metrics.outputs)?;
            log_queue::say(&format!(
                "gostw agent: sending metrics every {:?} and slow-pause records over OTLP ({}) to {}",
                o.interval,
                o.protocol.name(),
                o.endpoint
                    .as_deref()
                    .unwrap_or("the endpoint of OTEL_EXPORTER_OTLP_* (or the default)")
            ));
            Some(sink)
        }
        None => None,
    };
    let mut sink = (sink, otlp);
    let result = loop {
        // Back every second to see whether the HTTP server still runs, and
        // to say the loop turns.
        let mut check = Some(Until::After(Duration::from_secs(1)));
        let turn = engine.run(&mut target, &mut sink, &mut check).await;
        health.beat();
        match turn {
            Ok(Stop::Signal(_)) => break Ok(()),
            Ok(_) if stopped.load(Ordering::SeqCst) => {
                break Err(anyhow::anyhow!("the HTTP server stopped"));
            }
            Ok(_) => continue,
            Err(e) => break Err(e),
        }
    };
    // From here on the agent is gone by the deadline, whatever an output
    // is doing.
    let stopping = Instant::now();
    let deadline = stopping + shutdown::FLUSH_WITHIN;
    shutdown::exit_at(
        stopping + shutdown::STOP_WITHIN,
        if result.is_ok() { 0 } else { 1 },
    );
    engine.finish(&mut sink);
    let flushed = shutdown::Flush {
        log: sink.0.1.take_log(),
        otlp: sink.1.take(),
        server: (server_done_tx, served_rx),
    }
    .within(deadline);
    log_queue::say(&format!("gostw agent: stopped{}", flushed.left_behind()));
    log_queue::finish(stopping + shutdown::LOG_FLUSH_WITHIN);
    result.and(flushed.served)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::Sink as _;
    use crate::{
        clock::WallClock,
        engine::{
            apply,
            stream::{Stream, StreamOptions, tests::pause_event},
        },
        targets::{
            Changes,
            discovery::{Discovery, ProcSource as _, tests::FakeProc},
            tracker::{Tracker, tests::FakeKernel},
        },
    };

    fn text(m: &Metrics) -> String {
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, m.registry()).unwrap();
        s
    }

    /// /proc snapshots in, series out, through the agent's stages: a
    /// process's last pause, read after the diff saw it exit, still counts;
    /// then its series go.
    #[test]
    fn processes_come_and_go_through_the_whole_agent() {
        let metrics = Arc::new(Metrics::new());
        let mut sink = MetricsSink::new(metrics.clone());
        let proc = FakeProc::default();
        let mut discovery = Discovery::new(Filter::default());
        let mut tracker = Tracker::new(FakeKernel::default(), Limits::default());
        let mut stream = Stream::new(WallClock::default(), StreamOptions::default());
        let mut poll =
            |tracker: &mut Tracker<FakeKernel>, stream: &mut Stream, out: &mut Vec<_>| {
                let c = discovery.poll(&proc).unwrap();
                let changes = Changes {
                    started: c
                        .started
                        .into_iter()
                        .map(|p| {
                            let link = proc.exe_link(p.pid);
                            (p, link)
                        })
                        .collect(),
                    exited: c.exited,
                    statuses: Vec::new(),
                    scanned: true,
                };
                assert!(apply(tracker, stream, changes, false, out).is_none());
            };
        let mut out = Vec::new();
        proc.start(10, 1, 100, "/srv/api");
        proc.start(11, 1, 100, "/srv/api");
        proc.start(12, 1, 200, "/bin/bash");
        poll(&mut tracker, &mut stream, &mut out);
        sink.observe_all(&out);
        out.clear();
        assert_eq!(metrics.processes_traced.get(), 2);
        stream.feed(&pause_event(10, 1, 1_000, 30_000), &mut out);
        proc.exit(10);
        proc.exit(11);
        // The last pause of pid 11, in the ring buffer before the diff.
        stream.feed(&pause_event(11, 1, 1_000, 30_000), &mut out);
        poll(&mut tracker, &mut stream, &mut out);
        sink.observe_all(&out);
        out.clear();
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
        stream.feed(&pause_event(11, 1, 100_000, 30_000), &mut out);
        sink.observe_all(&out);
        assert!(text(&metrics).contains("gostw_agent_events_lost_total{stage=\"unattributed\"} 1"));
        assert_eq!(tracker.kernel().detaches, [1]);
    }
}
