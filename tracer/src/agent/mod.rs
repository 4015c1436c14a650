//! `gostw agent`: one per host, for weeks. Its target is every Go process of
//! the host (a `/proc` diff every poll interval, sooner after an exec
//! notification); the engine attaches once per executable, traces every
//! process of it and detaches when the last one exits; its sinks are the
//! Prometheus metrics, the profile store and the slow-pause records (also
//! written to the pause log), served over HTTP on a thread of its own
//! (`/metrics`, `/debug/pprof/faults`, `/debug/pprof/stackgrowth`,
//! `/debug/pauses`).

pub mod server;

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use regex::Regex;

use crate::{
    engine::{Engine, Stop, Until},
    kernel::{CoreOptions, capabilities::FaultSource, stacks::StackGrowthOptions},
    sink::{
        metrics::{Metrics, MetricsSink},
        pause_log::PauseLog,
        profile::{GrowthCounting, ProfileCollector, store::Store},
        slow_pauses::{SlowPauseSink, SlowPauseStore, StoreLimits},
    },
    stackgrowth::Mode,
    targets::{Target, discovery::Filter, tracker::Limits},
};

/// `gostw agent` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to serve /metrics and /healthz on.
    #[arg(long, default_value = "127.0.0.1:9477")]
    pub listen: SocketAddr,
    /// Serve /debug/pprof/* and /debug/pauses to peers other than loopback
    /// ones (profiles and records name code, files and containers; by
    /// default only 127.0.0.0/8 and ::1 get them).
    #[arg(long)]
    pub pprof_allow_remote: bool,
    /// Record every pause at least this long, with its explanation, for
    /// /debug/pauses, `gostw pauses` and the pause log (0: every pause).
    #[arg(long, value_name = "DURATION", default_value = "1ms", value_parser = crate::units::parse_duration)]
    pub slow_pause: Duration,
    /// Slow-pause records kept in memory in all, and per label set
    /// (executable, container); the oldest go first (counted in
    /// gostw_agent_slow_pauses_evicted_total).
    #[arg(long, value_name = "N", default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub slow_pauses_kept: u32,
    #[arg(long, value_name = "N", default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub slow_pauses_per_set: u32,
    /// Where each slow-pause record is written as a JSON line: stdout, off,
    /// or a file (rotated to PATH.1 at --pause-log-max-mib).
    #[arg(long, value_name = "stdout|off|PATH", default_value = "stdout")]
    pub pause_log: String,
    #[arg(long, value_name = "MIB", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub pause_log_max_mib: u64,
    /// Pause log lines written per second at most; the rest are counted
    /// (gostw_agent_slow_pauses_unlogged_total) and stay in /debug/pauses.
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub pause_log_rate: u32,
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
    /// Do not explain pauses: no stopping phase (Go 1.22+), laggards,
    /// callers or breakdown, and no scheduler programs. The explanation is
    /// on by default: the stopping probe lengthens every pause by about
    /// 0.8 us (docs/guide/attach-and-run.md, "Stopping phase"), and what
    /// makes a slow pause slow is known only if it was gathered then.
    #[arg(long)]
    pub no_explain: bool,
    /// The default since the explanation is on by default; kept so that
    /// existing command lines still parse.
    #[arg(long, hide = true, conflicts_with = "no_explain")]
    pub stopping: bool,
    /// How often each traced process's memory exposure is read for
    /// gostw_process_memory_bytes (first at once; 0: never; else at least
    /// 100ms). E.g. 60s, 5m.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = crate::units::parse_interval)]
    pub exposure_every: Duration,
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

/// CPU samples per second per CPU of the stack growth sampler: the
/// affordable default of `gostw stacks` (measured at under 3% throughput on
/// a growth-heavy workload), and off the 100 Hz of timer ticks.
pub const SAMPLE_HZ: u64 = 99;

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
    }
}

/// Run the agent until SIGINT or SIGTERM.
pub async fn run(args: Args) -> anyhow::Result<()> {
    // Bind first: a port in use fails before anything touches the kernel.
    let listener = server::bind(args.listen)?;
    let addr = listener.local_addr()?;
    let limits = Limits {
        max_executables: args.max_executables as usize,
        max_label_sets: args.max_label_sets as usize,
        ..Limits::default()
    };
    let mut engine = Engine::new(core_options(!args.no_explain), limits)?;
    if !args.exposure_every.is_zero() {
        engine.watch_exposure(args.exposure_every, false);
    }
    let metrics = Arc::new(Metrics::new());
    // Until a process is traced no fault backend is attached.
    metrics.fault_backend("none");
    let profiles = server::Profiles {
        store: Arc::new(std::sync::Mutex::new(Store::new())),
        sample_hz: SAMPLE_HZ,
        allow_remote: args.pprof_allow_remote,
        windows: Default::default(),
    };
    let pauses = server::Pauses {
        store: Arc::new(std::sync::Mutex::new(SlowPauseStore::new(StoreLimits {
            total: args.slow_pauses_kept as usize,
            per_label_set: args.slow_pauses_per_set as usize,
        }))),
        allow_remote: args.pprof_allow_remote,
    };
    let log = match args.pause_log.as_str() {
        "off" => None,
        "stdout" | "-" => Some(PauseLog::stdout(args.pause_log_rate)),
        path => Some(PauseLog::file(
            path.into(),
            args.pause_log_max_mib << 20,
            args.pause_log_rate,
        )?),
    };
    let stopped = Arc::new(AtomicBool::new(false));
    let (server_done_tx, server_done_rx) = tokio::sync::oneshot::channel::<()>();
    let server = {
        let (metrics, stopped) = (metrics.clone(), stopped.clone());
        let (profiles, pauses) = (profiles.clone(), pauses.clone());
        std::thread::Builder::new()
            .name("gostw-http".into())
            .spawn(move || -> anyhow::Result<()> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .context("starting the HTTP runtime")?;
                let result = rt.block_on(async move {
                    server::serve(listener, metrics, profiles, pauses, async move {
                        let _ = server_done_rx.await;
                    })
                    .await
                });
                stopped.store(true, Ordering::SeqCst);
                result
            })
            .context("starting the HTTP thread")?
    };
    crate::say!(
        "gostw agent: serving http://{addr}/metrics, /debug/pauses and /debug/pprof/{{faults,stackgrowth}} ({}); polling /proc every {:?}; recording pauses of {} or more",
        if args.pprof_allow_remote {
            "records and profiles to any peer"
        } else {
            "records and profiles to loopback peers"
        },
        args.poll_interval,
        crate::units::fmt_ns(args.slow_pause.as_nanos() as u64)
    );
    let filter = Filter {
        name: args.name,
        cgroup: args.cgroup,
    };
    let mut target = Target::host(filter, args.poll_interval);
    // The same stream to the metrics, the profiles and the records the HTTP
    // thread reads.
    let mut sink = (
        (
            MetricsSink::new(metrics.clone())
                .with_record_exemplars(args.slow_pause.as_nanos() as u64),
            ProfileCollector::new(profiles.store.clone(), GrowthCounting::Events),
        ),
        SlowPauseSink::new(
            pauses.store.clone(),
            args.slow_pause.as_nanos() as u64,
            log,
            metrics.clone(),
        ),
    );
    let result = loop {
        // Back every second to see whether the HTTP server still runs.
        let mut check = Some(Until::After(Duration::from_secs(1)));
        match engine.run(&mut target, &mut sink, &mut check).await {
            Ok(Stop::Signal(_)) => break Ok(()),
            Ok(_) if stopped.load(Ordering::SeqCst) => {
                break Err(anyhow::anyhow!("the HTTP server stopped"));
            }
            Ok(_) => continue,
            Err(e) => break Err(e),
        }
    };
    engine.finish(&mut sink);
    let _ = server_done_tx.send(());
    let served = server
        .join()
        .map_err(|_| anyhow::anyhow!("the HTTP thread panicked"))?;
    crate::say!("gostw agent: stopped");
    result.and(served)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::Sink as _;
    use crate::{
        engine::{
            apply,
            pause::WallClock,
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
