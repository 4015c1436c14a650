//! The agent's record of every slow pause, end to end: a real agent with
//! its default explanation and threshold, a Go program whose goroutine will
//! not stop (a leaf loop without a safe point, asynchronous preemption off)
//! and which calls `runtime.ReadMemStats` from a named function; the
//! records in `/debug/pauses`, in the pause log and through `gostw pauses`
//! against the program's own pause histograms.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Read as _},
    process::{Command, Stdio},
    time::Duration,
};

use serde::Deserialize;
use serde_json::Value;

use crate::{
    agent::{Procs, free_port, http_get, start_agent, sum_series, wait_until},
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
    let metrics = || {
        http_get(port, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default()
    };

    // The program waits for SIGUSR1, so the agent sees its every pause.
    let mut child = Command::new(&bin)
        .args(["-start-on-signal", "-spinners", "1", "-spin-chunk", "20ms"])
        .args(["-gc", "1", "-readmemstats", "1", "-gomaxprocs", "0"])
        .args(["-alloc-mb", "0", "-duration", "2s", "-interval", "40ms"])
        .env("GODEBUG", "asyncpreemptoff=1")
        .env("GOMAXPROCS", "2")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "GOSTW_WAITING", "the workload did not wait");
    wait_until("the workload to be traced", Duration::from_secs(30), || {
        (sum_series(
            &metrics(),
            "gostw_traced_processes",
            &[r#"executable="stw""#],
        ) == 1.0)
            .then_some(())
    });
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGUSR1) }, 0);
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(child.wait().unwrap().success());
    let report: Report = parse_report(&rest);
    // Its last events are read and settled (the fault correlator's grace).
    std::thread::sleep(Duration::from_millis(2500));

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
    let rms_named = rms
        .iter()
        .filter(|r| functions(&r["caller"]).contains(&"main.readStats"))
        .count();
    eprintln!(
        "Go counted {go_slow} pauses wholly of 1 ms or more; {} records ({} waited 1 ms or more \
         to stop, {named} name the spinner; {explained} explained to 10%; {} of {} \
         ReadMemStats stops name main.readStats)",
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
}
