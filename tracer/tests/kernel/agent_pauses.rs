//! The agent's record of every slow pause, end to end: a real agent with
//! its default explanation and threshold, a Go program whose goroutine will
//! not stop (a leaf loop without a safe point, asynchronous preemption off)
//! and which calls `runtime.ReadMemStats` from a named function; the
//! records in `/debug/pauses`, in the pause log and through `gostw pauses`
//! against the program's own pause histograms.

use std::{
    collections::BTreeMap,
    io::{BufReader, Read as _},
    process::{Command, Stdio},
    time::Duration,
};

use serde::Deserialize;
use serde_json::Value;

use crate::{
    agent::{
        Procs, free_port, http_get, release_once_traced, start_agent, start_prometheus_with,
        url_encode, wait_until,
    },
    laggards::names_spinner,
    support::{build_workload, newest_go, ns, parse_report, require_root},
};

const GOSTW: &str = env!("CARGO_BIN_EXE_gostw");
const MS: u64 = 1_000_000;

/// Go's own pause histograms, bucket by bucket: `[low, high, count]` in ns.
#[derive(Deserialize)]
struct Report {
    histograms: BTreeMap<String, Vec<[u64; 3]>>,
}

/// Start the stw workload `cmd` (with `-start-on-signal`), let it go once
/// the agent on `port` traces it, wait for its end and for the agent to
/// settle its last events (the fault correlator's grace): its pid and its
/// output after the wait.
fn run_traced(cmd: &mut Command, port: u16) -> (u32, String) {
    let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    release_once_traced(&mut out, pid, port);
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(child.wait().unwrap().success());
    std::thread::sleep(Duration::from_millis(2500));
    (pid, rest)
}

/// The records `/debug/pauses` serves for `query`.
fn records(port: u16, query: &str) -> Vec<Value> {
    let (status, body) = http_get(port, &format!("/debug/pauses?{query}"))
        .expect("the agent did not answer /debug/pauses");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn functions(frames: &Value) -> Vec<&str> {
    frames
        .as_array()
        .map(|a| a.iter().filter_map(|f| f["function"].as_str()).collect())
        .unwrap_or_default()
}

#[test]
fn every_slow_pause_go_counted_is_recorded_and_explained() {
    require_root();
    let go = newest_go();
    let mut procs = Procs::new("agent-pauses");
    let bin = procs.own(&build_workload("stw", &go, "", &[]));
    let port = free_port();
    let log = procs.dir().join("pauses.jsonl");
    let matching = format!("^{}$", regex::escape(&bin.display().to_string()));
    let log_arg = ["--pause-log", log.to_str().unwrap()];
    start_agent(&mut procs, port, &matching, &log_arg);
    let prometheus =
        start_prometheus_with(&mut procs, port, &["--enable-feature=exemplar-storage"]);
    // Its first scrape comes up to 5 s after it starts (target updates are
    // applied every 5 s): the pauses must come after it.
    wait_until(
        "Prometheus to scrape the agent",
        Duration::from_secs(30),
        || {
            http_get(prometheus, "/api/v1/query?query=up")
                .filter(|(_, body)| body.contains(r#""value":["#) && body.contains(r#","1"]"#))
        },
    );
    // The program waits for SIGUSR1, so the agent sees its every pause.
    let (pid, rest) = run_traced(
        Command::new(&bin)
            .args(["-start-on-signal", "-spinners", "1", "-spin-chunk", "20ms"])
            .args(["-gc", "1", "-readmemstats", "1", "-gomaxprocs", "0"])
            .args(["-alloc-mb", "0", "-duration", "2s", "-interval", "40ms"])
            .env("GODEBUG", "asyncpreemptoff=1")
            .env("GOMAXPROCS", "2"),
        port,
    );
    let report: Report = parse_report(&rest);

    let recs = records(port, &format!("pid={pid}&limit=100000"));
    // Go's pauses of 1 ms or more, bucket by bucket, against the records:
    // a bucket wholly at or above 1 ms holds exactly the records in it; the
    // one across 1 ms at least those of 1 ms or more.
    let buckets: Vec<[u64; 3]> = ["gc", "other"]
        .iter()
        .flat_map(|k| report.histograms[&format!("/sched/pauses/total/{k}:seconds")].clone())
        .collect();
    let mut merged: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    for [lo, hi, n] in buckets {
        *merged.entry((lo, hi)).or_default() += n;
    }
    let (mut go_slow, mut recorded) = (0, 0);
    for (&(lo, hi), &n) in merged.iter().filter(|((_, hi), _)| *hi > MS) {
        let inside = recs
            .iter()
            .filter(|r| (lo.max(MS)..hi).contains(&ns(&r["duration_ns"])))
            .count() as u64;
        if lo >= MS {
            assert_eq!(
                inside, n,
                "Go counted {n} pauses in [{lo}, {hi}) ns, the agent {inside}"
            );
            go_slow += n;
        } else if hi > MS {
            assert!(
                inside <= n,
                "[{lo}, {hi}) ns: {inside} records, Go counted {n}"
            );
        }
        recorded += inside;
    }
    assert!(
        recs.iter().all(|r| ns(&r["duration_ns"]) >= MS),
        "a record under the 1 ms threshold"
    );
    assert_eq!(recorded, recs.len() as u64, "records outside Go's buckets");

    // Explained: the spinner named where the world waited for it, the
    // parts adding up to within 10%, the caller of ReadMemStats named.
    let waited: Vec<&Value> = recs
        .iter()
        .filter(|r| ns(&r["stopping_ns"]) >= MS)
        .collect();
    let named = waited.iter().filter(|r| names_spinner(r)).count();
    let explained = recs
        .iter()
        .filter(|r| ns(&r["breakdown"]["unexplained_ns"]) * 10 <= ns(&r["duration_ns"]))
        .count();
    let rms: Vec<&Value> = recs
        .iter()
        .filter(|r| r["reason"] == "read_mem_stats")
        .collect();
    // Each round's in main.readStats, the last in main.report.
    let rms_named = rms
        .iter()
        .filter(|r| {
            let f = functions(&r["caller"]);
            f.contains(&"main.readStats") || f.contains(&"main.report")
        })
        .count();
    eprintln!(
        "Go counted {go_slow} pauses wholly of 1 ms or more; {} records ({} waited 1 ms or more \
         to stop, {named} name the spinner; {explained} explained to 10%; {} of {} \
         ReadMemStats stops name their caller)",
        recs.len(),
        waited.len(),
        rms_named,
        rms.len()
    );
    assert!(go_slow >= 20, "too few slow pauses to judge: {go_slow}");
    assert!(
        named * 10 >= waited.len() * 9,
        "spinner named in {named} of {}",
        waited.len()
    );
    assert!(
        explained * 10 >= recs.len() * 8,
        "{explained} of {} explained",
        recs.len()
    );
    assert!(
        !rms.is_empty() && rms_named == rms.len(),
        "{rms_named} of {}",
        rms.len()
    );
    for r in &recs {
        assert_eq!(r["labels"]["executable"], "stw", "{r}");
        assert_eq!(r["id"], format!("{pid}-{}", ns(&r["start_mono_ns"])), "{r}");
    }

    // The pause log has the same records, line for line.
    let logged: BTreeMap<String, Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["pid"] == pid)
        .map(|v| (v["id"].as_str().unwrap().to_owned(), v))
        .collect();
    let served: BTreeMap<String, Value> = recs
        .iter()
        .map(|v| (v["id"].as_str().unwrap().to_owned(), v.clone()))
        .collect();
    assert_eq!(
        logged.len(),
        served.len(),
        "log and /debug/pauses differ in number"
    );
    assert!(
        logged == served,
        "the log's records differ from /debug/pauses"
    );

    // `gostw pauses` prints them, the spinner named.
    let text = Command::new(GOSTW)
        .args(["pauses", "--agent", &format!("127.0.0.1:{port}")])
        .args(["--pid", &pid.to_string(), "--limit", "100000"])
        .output()
        .unwrap();
    assert!(text.status.success(), "{text:?}");
    let text = String::from_utf8_lossy(&text.stdout);
    assert_eq!(text.lines().count(), recs.len(), "{text}");
    assert!(
        text.contains("laggard tid") && text.contains("in main.spinLoop"),
        "{text}"
    );
    let (status, _) = http_get(port, "/debug/pauses?min=fast").unwrap();
    assert_eq!(status, 400);

    // Pause time as a profile: the spinner's loop first in `go tool pprof
    // -top`, and its laggard total the records' stopping time their
    // critical laggards account for.
    let profile = get_bytes(port, &format!("/debug/pprof/pauses?pid={pid}"));
    let decoded = tracer::formats::pprof::decode(&profile).expect("not a pprof profile");
    let profiled: i64 = decoded.sample.iter().map(|s| s.value[0]).sum();
    let expected: u64 = recs
        .iter()
        .filter(|r| r["laggards"].get(0).is_some())
        .map(|r| {
            let b = &r["breakdown"];
            [
                "stopping_on_cpu_ns",
                "stopping_fault_ns",
                "stopping_runnable_ns",
                "stopping_blocked_ns",
            ]
            .iter()
            .map(|k| ns(&b[*k]))
            .sum::<u64>()
        })
        .sum();
    assert_eq!(profiled as u64, expected, "the profile's laggard time");
    let file = procs.dir().join("pauses.pb.gz");
    std::fs::write(&file, &profile).unwrap();
    let top = Command::new(&go.go)
        .args(["tool", "pprof", "-top"])
        .arg(&file)
        .env("HOME", procs.dir())
        .output()
        .unwrap();
    let top = String::from_utf8_lossy(&top.stdout);
    let first = top
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .nth(1)
        .and_then(|l| l.split_whitespace().last())
        .unwrap_or_default()
        .to_owned();
    eprintln!("go tool pprof -top: {first} first; laggard time {profiled} ns");
    assert_eq!(first, "main.spinLoop", "{top}");

    // Prometheus keeps the exemplars of the duration buckets: each names a
    // record /debug/pauses has.
    let mut exemplars = Vec::new();
    for _ in 0..30 {
        exemplars = exemplar_ids(prometheus);
        if !exemplars.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        !exemplars.is_empty(),
        "no exemplars in Prometheus; its log:\n{}",
        std::fs::read_to_string(procs.dir().join("prometheus.log")).unwrap_or_default()
    );
    let unknown: Vec<&String> = exemplars
        .iter()
        .filter(|id| !served.contains_key(*id))
        .collect();
    eprintln!(
        "{} exemplars in Prometheus, {} not a record",
        exemplars.len(),
        unknown.len()
    );
    assert!(
        unknown.is_empty(),
        "exemplars naming no record: {unknown:?}"
    );

    // The agent restarts (SIGTERM, then a new one on the same log): the
    // log still has every record.
    let agent = procs
        .children
        .iter()
        .find(|(name, _)| name == "gostw agent")
        .map(|(_, c)| c.id())
        .unwrap();
    // SAFETY: signalling our own child.
    assert_eq!(
        unsafe { libc::kill(agent as libc::pid_t, libc::SIGTERM) },
        0
    );
    wait_until("the agent to exit", Duration::from_secs(30), || {
        let stat = std::fs::read_to_string(format!("/proc/{agent}/stat")).ok()?;
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
            .then_some(())
    });
    start_agent(&mut procs, free_port(), &matching, &log_arg);
    let kept = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["pid"] == pid)
        .count();
    assert_eq!(kept, served.len(), "records in the log after the restart");
}

/// The body of a GET, as bytes.
fn get_bytes(port: u16, path: &str) -> Vec<u8> {
    let (status, body) =
        gostw_scenario::loopback::http_get_bytes(port, path, std::time::Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    assert_eq!(status, 200, "GET {path}");
    body
}

/// The `pause_id`s of the exemplars Prometheus holds for the agent's
/// pause durations (the last hour).
fn exemplar_ids(prometheus: u16) -> Vec<String> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let q = url_encode("gostw_pause_duration_seconds_bucket{executable=\"stw\"}");
    let Some((200, body)) = http_get(
        prometheus,
        &format!(
            "/api/v1/query_exemplars?query={q}&start={}&end={}",
            now - 3600,
            now + 60
        ),
    ) else {
        return Vec::new();
    };

    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["data"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|series| series["exemplars"].as_array().cloned().unwrap_or_default())
        .filter_map(|e| e["labels"]["pause_id"].as_str().map(str::to_owned))
        .collect()
}

/// A kB figure of `/proc/PID/status` (`VmRSS:`, `VmHWM:`).
fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} for pid {pid}"))
}

/// A storm: every pause recorded (`--slow-pause 0`) while a program stops
/// the world thousands of times a second. The store stays at its bound and
/// the log at its rate, what they let go is counted, and the agent's memory
/// stays within its budget.
#[test]
fn a_storm_of_slow_pauses_stays_bounded_and_counted() {
    require_root();
    let go = newest_go();
    let mut procs = Procs::new("agent-pause-storm");
    let bin = procs.own(&build_workload("stw", &go, "", &[]));
    let port = free_port();
    let log = procs.dir().join("pauses.jsonl");
    let matching = format!("^{}$", regex::escape(&bin.display().to_string()));
    let agent_log = start_agent(
        &mut procs,
        port,
        &matching,
        &["--slow-pause", "0", "--pause-log", log.to_str().unwrap()],
    );
    let agent = procs.children.last().unwrap().1.id();
    let before_kib = status_kib(agent, "VmRSS:");
    run_traced(
        Command::new(&bin)
            .args(["-start-on-signal", "-gc", "0", "-readmemstats", "20000"])
            .args(["-gomaxprocs", "0", "-alloc-mb", "0", "-duration", "8s"]),
        port,
    );
    let m = http_get(port, "/metrics")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let get = |name: &str| {
        m.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{m}"))
    };
    let recorded = get("gostw_agent_slow_pauses_recorded_total");
    let evicted = get("gostw_agent_slow_pauses_evicted_total");
    let unlogged = get("gostw_agent_slow_pauses_unlogged_total");
    let kept = get("gostw_agent_slow_pauses_kept");
    let logged = std::fs::read_to_string(&log).unwrap().lines().count() as f64;
    let served = records(port, "limit=1000000").len() as f64;
    let peak_kib = status_kib(agent, "VmHWM:");
    eprintln!(
        "{recorded} recorded, {kept} kept ({served} served), {evicted} evicted, {logged} logged, \
         {unlogged} not; agent RSS {before_kib} kB before, peak {peak_kib} kB"
    );
    let log_text = std::fs::read_to_string(&agent_log).unwrap_or_default();
    // Enough to overrun both bounds many times over (200 kept, at most 650
    // logged); the count itself depends on the host's load (18,882 to
    // 103,832 seen), so the floor is the bounds', not the machine's.
    assert!(
        recorded >= 5_000.0,
        "too few pauses for a storm: {recorded}\n{log_text}"
    );
    // The defaults: 200 per label set (one here), 50 lines a second.
    assert_eq!((kept, served), (200.0, 200.0));
    assert_eq!(kept + evicted, recorded);
    assert_eq!(logged + unlogged, recorded);
    assert!(logged <= 50.0 * 13.0, "the log's rate: {logged} lines");
    assert!(
        peak_kib < before_kib + 32 * 1024,
        "the agent grew from {before_kib} kB to {peak_kib} kB"
    );
}
