//! The agent against outputs that fail for real: a stdout pipe nobody
//! reads, a pause log on a filesystem that fills up, an OTLP receiver that
//! accepts connections and never answers, and HTTP clients that never read
//! or never finish their request. In each, a Go program with slow pauses
//! runs under the agent twice, with and without the fault: the records in
//! `/debug/pauses` (against Go's own count) must stay within 10% of the
//! run without it, the fault must show where the issue says (metrics,
//! `/healthz`), and SIGTERM must end the agent within 2 s.

use std::{
    fs,
    io::{BufReader, Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use serde::Deserialize;

use crate::{
    agent::{Procs, free_port, http_get, release_once_traced, sum_series, wait_until},
    support::{build_workload, newest_go, ns, parse_report, require_root},
};

const GOSTW: &str = env!("CARGO_BIN_EXE_gostw");
const MS: u64 = 1_000_000;

/// The agent is gone this long after SIGTERM, whatever its outputs do.
const STOP_WITHIN: Duration = Duration::from_secs(2);

/// Go's own pause histograms: `[low, high, count]` in ns.
#[derive(Deserialize)]
struct Report {
    histograms: std::collections::BTreeMap<String, Vec<[u64; 3]>>,
}

/// One traced run of the slow-pause workload.
#[derive(Debug)]
struct Run {
    /// Go's pauses in its histogram buckets wholly at or above 1 ms.
    go_slow: u64,
    /// The agent's records of those (same lower bound).
    recorded: u64,
}

impl Run {
    /// The share of Go's slow pauses the agent recorded.
    fn coverage(&self) -> f64 {
        self.recorded as f64 / self.go_slow.max(1) as f64
    }
}

/// Start `gostw agent` for `bin` with standard output to `stdout` and
/// `extra` arguments; its port once `/healthz` answers 200. Every record is
/// kept and logged (no eviction, no rate limit): what is missing is the
/// fault's doing.
fn start_agent(procs: &mut Procs, bin: &Path, stdout: Stdio, extra: &[&str]) -> u16 {
    start_agent_env(procs, bin, stdout, extra, &[])
}

/// `start_agent` with `env` added to the agent's environment.
fn start_agent_env(
    procs: &mut Procs,
    bin: &Path,
    stdout: Stdio,
    extra: &[&str],
    env: &[(&str, &str)],
) -> u16 {
    let port = free_port();
    let log = fs::File::create(procs.dir().join("agent.log")).unwrap();
    let matching = format!("^{}$", regex::escape(&bin.display().to_string()));
    procs.spawn(
        "gostw agent",
        Command::new(GOSTW)
            .args(["agent", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--match", &matching, "--poll-interval", "200ms"])
            .args(["--slow-pauses-kept", "1000000"])
            .args(["--slow-pauses-per-set", "1000000"])
            .args(["--pause-log-rate", "1000000"])
            .args(extra)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(stdout)
            .stderr(log),
    );
    wait_until("the agent's /healthz", Duration::from_secs(30), || {
        http_get(port, "/healthz").filter(|(s, _)| *s == 200)
    });
    port
}

/// The agent's metric `name` summed over the series with `filters`.
fn metric(port: u16, name: &str, filters: &[&str]) -> f64 {
    let body = http_get(port, "/metrics")
        .map(|(_, b)| b)
        .unwrap_or_default();
    sum_series(&body, name, filters)
}

fn dropped(port: u16, reason: &str) -> f64 {
    metric(
        port,
        "gostw_agent_output_dropped_total",
        &[r#"output="pause_log""#, &format!("reason=\"{reason}\"")],
    )
}

fn lines_written(port: u16) -> f64 {
    metric(
        port,
        "gostw_agent_output_lines_total",
        &[r#"output="pause_log""#],
    )
}

/// The control of a fault: the same agent with its pause log off and no
/// fault, traced as the fault's run is, stopped by SIGTERM in time.
fn control_run(bin: &Path, name: &str, what: &str) -> Run {
    let mut procs = Procs::new(name);
    let own = procs.own(bin);
    let port = start_agent(&mut procs, &own, Stdio::null(), &["--pause-log", "off"]);
    let control = traced_run(&mut procs, &own, port, 6, || {});
    stops_in_time(&mut procs, what);
    control
}

/// Run the stw workload with slow pauses (a goroutine the world waits for,
/// asynchronous preemption off) for `secs` under the agent on `port`,
/// from its first pause; `during` is called every 200 ms while it runs.
fn traced_run(
    procs: &mut Procs,
    bin: &Path,
    port: u16,
    secs: u32,
    mut during: impl FnMut(),
) -> Run {
    procs.spawn(
        "stw",
        Command::new(bin)
            .args(["-start-on-signal", "-spinners", "1", "-spin-chunk", "20ms"])
            .args(["-gc", "1", "-readmemstats", "1", "-gomaxprocs", "0"])
            .args(["-alloc-mb", "0", "-interval", "10ms"])
            .args(["-duration", &format!("{secs}s")])
            .env("GODEBUG", "asyncpreemptoff=1")
            .env("GOMAXPROCS", "2")
            .stdout(Stdio::piped()),
    );
    let (_, child) = procs.children.last_mut().unwrap();
    let pid = child.id();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    release_once_traced(&mut out, pid, port);
    let reader = std::thread::spawn(move || {
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        rest
    });
    let limit = Instant::now() + Duration::from_secs(u64::from(secs) + 60);
    while !reader.is_finished() {
        assert!(Instant::now() < limit, "the workload did not end");
        during();
        std::thread::sleep(Duration::from_millis(200));
    }
    let report: Report = parse_report(&reader.join().unwrap());
    // The agent releases a pause after its faults' grace.
    std::thread::sleep(Duration::from_millis(2500));
    let buckets: Vec<[u64; 3]> = ["gc", "other"]
        .iter()
        .flat_map(|k| report.histograms[&format!("/sched/pauses/total/{k}:seconds")].clone())
        .collect();
    let from = buckets
        .iter()
        .map(|b| b[0])
        .filter(|&lo| lo >= MS)
        .min()
        .expect("no bucket at or above 1 ms");
    let go_slow = buckets.iter().filter(|b| b[0] >= from).map(|b| b[2]).sum();
    let (status, body) = http_get(port, &format!("/debug/pauses?pid={pid}&limit=1000000"))
        .expect("the agent did not answer /debug/pauses");
    assert_eq!(status, 200, "{body}");
    let recorded = body
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| ns(&r["duration_ns"]) >= from)
        .count() as u64;
    Run { go_slow, recorded }
}

/// SIGTERM to the agent: how long it took to exit, and how.
fn sigterm(procs: &mut Procs) -> (Duration, ExitStatus) {
    let (_, agent) = procs
        .children
        .iter_mut()
        .find(|(name, _)| name == "gostw agent")
        .unwrap();
    // SAFETY: signalling our own child.
    assert_eq!(
        unsafe { libc::kill(agent.id() as libc::pid_t, libc::SIGTERM) },
        0
    );
    let t0 = Instant::now();
    loop {
        if let Some(status) = agent.try_wait().unwrap() {
            return (t0.elapsed(), status);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the agent still runs 15 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// SIGTERM ends the agent within `STOP_WITHIN`, cleanly; its last words.
fn stops_in_time(procs: &mut Procs, what: &str) -> (Duration, String) {
    let (took, status) = sigterm(procs);
    let log = fs::read_to_string(procs.dir().join("agent.log")).unwrap_or_default();
    eprintln!("{what}: the agent exited {took:?} after SIGTERM ({status})");
    assert!(took < STOP_WITHIN, "{what}: {took:?} after SIGTERM\n{log}");
    assert!(status.success(), "{what}: {status}\n{log}");
    (took, log)
}

/// The records under the fault are within 10% of those without it.
fn within_ten_percent(fault: &Run, control: &Run, what: &str) {
    eprintln!(
        "{what}: {} of Go's {} slow pauses recorded ({:.1}%); without it {} of {} ({:.1}%)",
        fault.recorded,
        fault.go_slow,
        fault.coverage() * 100.0,
        control.recorded,
        control.go_slow,
        control.coverage() * 100.0
    );
    assert!(
        control.go_slow >= 50,
        "too few slow pauses to judge: {control:?}"
    );
    assert!(
        fault.go_slow >= 50,
        "too few slow pauses to judge: {fault:?}"
    );
    assert!(
        fault.coverage() >= control.coverage() * 0.9,
        "{what}: {fault:?} against {control:?}"
    );
}

/// Control: standard output drained. Fault: a pipe whose reading end is
/// held open and never read (a log collector that stalled). Tracing goes
/// on at the control's rate, the lines lost are counted as queue_full,
/// `/healthz` says so while it happens (and never in the control), and
/// SIGTERM ends the agent within 2 s with its writer still blocked.
#[test]
fn a_stdout_nobody_reads_costs_log_lines_not_tracing() {
    require_root();
    let bin = build_workload("stw", &newest_go(), "", &[]);

    let mut procs = Procs::new("outputs-drained");
    let own = procs.own(&bin);
    let (mut r, w) = std::io::pipe().unwrap();
    let drain = std::thread::spawn(move || std::io::copy(&mut r, &mut std::io::sink()));
    let port = start_agent(&mut procs, &own, Stdio::from(w), &[]);
    let mut statuses = Vec::new();
    let control = traced_run(&mut procs, &own, port, 6, || {
        statuses.extend(http_get(port, "/healthz").map(|(s, _)| s));
    });
    let written = lines_written(port);
    let lost = dropped(port, "queue_full") + dropped(port, "write_error");
    eprintln!("drained: {written} log lines written, {lost} lost; /healthz {statuses:?}");
    assert_eq!(lost, 0.0);
    assert!(written >= control.recorded as f64, "{written} lines");
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    stops_in_time(&mut procs, "drained");
    drop(procs);
    drain.join().unwrap().unwrap();

    let mut procs = Procs::new("outputs-stalled");
    let own = procs.own(&bin);
    let (r, w) = std::io::pipe().unwrap();
    let port = start_agent(&mut procs, &own, Stdio::from(w), &[]);
    let (mut unhealthy, mut reason) = (0, String::new());
    let stalled = traced_run(&mut procs, &own, port, 6, || {
        if let Some((s, body)) = http_get(port, "/healthz")
            && s != 200
        {
            unhealthy += 1;
            reason = body;
        }
    });
    let full = dropped(port, "queue_full");
    let blocked = metric(
        port,
        "gostw_agent_output_blocked_seconds",
        &[r#"output="pause_log""#],
    );
    eprintln!(
        "stalled: {} log lines written, {full} lost to a full queue, its write blocked {blocked}s; \
         /healthz non-200 {unhealthy} times: {reason}",
        lines_written(port)
    );
    within_ten_percent(&stalled, &control, "stdout never read");
    assert!(full > 0.0, "no line counted as lost");
    assert!(blocked > 1.0, "the writer is not seen blocked: {blocked}");
    assert!(unhealthy > 0, "/healthz never said the log loses lines");
    assert!(
        reason.contains("output pause_log is losing lines"),
        "{reason}"
    );
    let (_, log) = stops_in_time(&mut procs, "stalled");
    assert!(
        log.contains("pause log lines (its write blocked for"),
        "{log}"
    );
    drop(r);
}

/// A tmpfs of 64 KiB, unmounted when dropped.
struct SmallFs(PathBuf);

impl SmallFs {
    fn mount(dir: PathBuf) -> SmallFs {
        fs::create_dir_all(&dir).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "gostw-test"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(status.success(), "mounting a tmpfs on {}", dir.display());
        SmallFs(dir)
    }

    /// Fill it with a file of its own: ENOSPC for anything else.
    fn fill(&self) -> u64 {
        let mut f = fs::File::create(self.0.join("filler")).unwrap();
        let chunk = [b'x'; 4096];
        let mut n = 0;
        // Bounded: 64 KiB take at most 16 chunks.
        for _ in 0..64 {
            match f.write(&chunk) {
                Ok(0) | Err(_) => break,
                Ok(k) => n += k as u64,
            }
        }
        n
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The pause log on a 64 KiB tmpfs. Full from the start: each line is a
/// write error, counted, `/healthz` says so, and the records are all in
/// `/debug/pauses`. Room again: lines are written again (until it fills
/// once more), and the file holds whole lines only, as many as counted
/// written.
#[test]
fn a_full_disk_costs_log_lines_and_the_log_comes_back() {
    require_root();
    let bin = build_workload("stw", &newest_go(), "", &[]);
    let mut procs = Procs::new("outputs-enospc");
    let own = procs.own(&bin);
    let small = SmallFs::mount(procs.dir().join("small"));
    let log = small.0.join("pauses.jsonl");
    let filled = small.fill();
    let port = start_agent(
        &mut procs,
        &own,
        Stdio::null(),
        &["--pause-log", log.to_str().unwrap()],
    );

    let mut unhealthy = 0;
    let full = traced_run(&mut procs, &own, port, 6, || {
        unhealthy += http_get(port, "/healthz").is_some_and(|(s, _)| s == 503) as u32;
    });
    let (errors, written) = (dropped(port, "write_error"), lines_written(port));
    eprintln!(
        "full ({filled} bytes of filler): {errors} write errors, {written} lines written, \
         /healthz 503 {unhealthy} times"
    );
    assert!(errors >= full.recorded as f64 * 0.9, "{errors} errors");
    assert_eq!(written, 0.0);
    assert!(unhealthy > 0, "/healthz never said the log fails");

    fs::remove_file(small.0.join("filler")).unwrap();
    let room = traced_run(&mut procs, &own, port, 6, || {});
    let again = lines_written(port);
    let errors_after = dropped(port, "write_error") - errors;
    eprintln!("room again: {again} lines written, {errors_after} more write errors");
    within_ten_percent(&full, &room, "log on a full disk");
    assert!(again > 0.0, "no line written once there was room");
    let text = fs::read_to_string(&log).unwrap();
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "a partial last line"
    );
    for l in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: a cut line {l:?}"));
        assert_eq!(v["type"], "pause");
    }
    assert_eq!(text.lines().count() as f64, again, "lines in the file");
    stops_in_time(&mut procs, "full disk");
}

/// A receiver that accepts TCP connections and never answers (at most 64,
/// until dropped).
struct Mute {
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    accepted: std::thread::JoinHandle<usize>,
}

impl Mute {
    fn start() -> Mute {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let accepted = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut held = Vec::new();
                let limit = Instant::now() + Duration::from_secs(120);
                while !stop.load(std::sync::atomic::Ordering::SeqCst)
                    && Instant::now() < limit
                    && held.len() < 64
                {
                    match listener.accept() {
                        Ok((s, _)) => held.push(s),
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
                held.len()
            })
        };
        Mute {
            port,
            stop,
            accepted,
        }
    }

    fn stop(self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.accepted.join().unwrap()
    }
}

/// OTLP to a receiver that accepts connections and never answers, then to
/// one that refuses them, against the same agent without OTLP: tracing
/// goes on at the control's rate, the exports are counted as timed out
/// (as failed), and SIGTERM ends the agent within 2 s.
#[test]
fn an_otlp_receiver_that_never_answers_costs_exports_not_tracing() {
    require_root();
    let bin = build_workload("stw", &newest_go(), "", &[]);
    let control = control_run(&bin, "outputs-otlp-control", "no OTLP");

    let mute = Mute::start();
    let mut procs = Procs::new("outputs-otlp-mute");
    let own = procs.own(&bin);
    let endpoint = format!("http://127.0.0.1:{}", mute.port);
    // Exports cut at 1 s (the SDK's own variable), so several time out
    // during the run.
    let port = start_agent_env(
        &mut procs,
        &own,
        Stdio::null(),
        &[
            "--pause-log",
            "off",
            "--otlp-endpoint",
            &endpoint,
            "--otlp-protocol",
            "grpc",
            "--otlp-interval",
            "1s",
        ],
        &[("OTEL_EXPORTER_OTLP_TIMEOUT", "1000")],
    );
    let hung = traced_run(&mut procs, &own, port, 6, || {});
    let exports = |signal: &str, result: &str| {
        metric(
            port,
            "gostw_agent_otlp_exports_total",
            &[
                &format!("signal=\"{signal}\""),
                &format!("result=\"{result}\""),
            ],
        )
    };
    let timeouts = exports("metrics", "timeout") + exports("logs", "timeout");
    let (ok, errors) = (
        exports("metrics", "ok") + exports("logs", "ok"),
        exports("metrics", "error") + exports("logs", "error"),
    );
    eprintln!("mute receiver: exports {timeouts} timed out, {errors} failed, {ok} ok");
    within_ten_percent(&hung, &control, "OTLP receiver never answers");
    assert!(timeouts >= 3.0, "{timeouts} exports timed out");
    assert_eq!(ok, 0.0);
    stops_in_time(&mut procs, "mute OTLP receiver");
    let connections = mute.stop();
    assert!(connections > 0, "the agent never connected");
    drop(procs);

    // A receiver that refuses (nothing listens on its port): errors.
    let mut procs = Procs::new("outputs-otlp-refused");
    let own = procs.own(&bin);
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    let port = start_agent_env(
        &mut procs,
        &own,
        Stdio::null(),
        &[
            "--pause-log",
            "off",
            "--otlp-endpoint",
            &endpoint,
            "--otlp-interval",
            "1s",
        ],
        &[("OTEL_EXPORTER_OTLP_TIMEOUT", "1000")],
    );
    let refused = traced_run(&mut procs, &own, port, 6, || {});
    let result = |r: &str| {
        metric(
            port,
            "gostw_agent_otlp_exports_total",
            &[&format!("result=\"{r}\"")],
        )
    };
    let (errors, timeouts, ok) = (result("error"), result("timeout"), result("ok"));
    eprintln!("refusing receiver: {errors} exports failed, {timeouts} timed out, {ok} ok");
    within_ten_percent(&refused, &control, "OTLP receiver refuses");
    // The exporter's client may wait out its reconnect instead of failing
    // at once: either way counted, never ok.
    assert!(
        errors + timeouts >= 3.0,
        "{errors} failed, {timeouts} timed out"
    );
    assert_eq!(ok, 0.0);
    stops_in_time(&mut procs, "refusing OTLP receiver");
}

/// A `/metrics` client that sends requests and never reads the answers,
/// and 200 clients that send part of a request and hold it (slowloris),
/// on the agent's port, against the same agent without them: the records
/// keep coming at the control's rate, a well-behaved client is still
/// served, and SIGTERM ends the agent within 2 s with the connections
/// still open.
#[test]
fn http_clients_that_never_read_or_never_finish_cost_nothing() {
    require_root();
    let bin = build_workload("stw", &newest_go(), "", &[]);
    let control = control_run(&bin, "outputs-http-control", "no slow clients");

    let mut procs = Procs::new("outputs-http-slow");
    let own = procs.own(&bin);
    let port = start_agent(&mut procs, &own, Stdio::null(), &["--pause-log", "off"]);
    let addr = ("127.0.0.1", port);
    let mut held = Vec::new();
    let mut deaf = TcpStream::connect(addr).unwrap();
    let request = format!("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    // Enough answers to fill both sides' socket buffers; never read.
    deaf.set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let sent = (0..200)
        .take_while(|_| deaf.write_all(request.as_bytes()).is_ok())
        .count();
    held.push(deaf);
    for _ in 0..200 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .unwrap();
        held.push(s);
    }
    let mut served = (0, 0);
    let slow = traced_run(&mut procs, &own, port, 6, || {
        served.1 += 1;
        served.0 += http_get(port, "/healthz").is_some_and(|(s, _)| s == 200) as u32;
    });
    eprintln!(
        "{} connections held ({sent} unread /metrics requests on one); /healthz answered 200 \
         {} of {} times",
        held.len(),
        served.0,
        served.1
    );
    within_ten_percent(&slow, &control, "slow HTTP clients");
    assert_eq!(served.0, served.1, "a well-behaved client was not served");
    stops_in_time(&mut procs, "slow HTTP clients");
    drop(held);
}
