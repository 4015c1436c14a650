//! The agent over OTLP (gRPC, then HTTP/protobuf) to a real OTLP receiver:
//! scripts/otlp-receiver, made of OpenTelemetry's own protocol package
//! (opentelemetry-proto) and grpcio, which writes every export request it
//! decodes. What it received must be what the agent serves itself: the
//! pauses per reason of `/metrics` (and Go's own count of them), the
//! stop-the-world entries, and one log record per `/debug/pauses` record
//! with the same id.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;

use crate::{
    agent::{Procs, start_agent, sum_series},
    loopback::{free_port, http_get, wait_until},
    support::{STW_ARGS, StwReport, build_workload, newest_go, parse_report, require_root},
};

/// The receiver's packages, installed by `cargo xtask setup`.
fn python_path() -> PathBuf {
    std::env::var_os("GOSTW_OTLP_PYTHONPATH")
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .unwrap_or_else(|| {
            panic!(
                "GOSTW_OTLP_PYTHONPATH is not set or not a directory: run the kernel tests \
                 through `cargo xtask test` (setup installs opentelemetry-proto and grpcio)"
            )
        })
}

/// Start the receiver; returns (gRPC port, HTTP port, the file it writes).
fn start_receiver(procs: &mut Procs) -> (u16, u16, PathBuf) {
    let (grpc, http) = (free_port(), free_port());
    let out = procs.dir().join("otlp-received.jsonl");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/otlp-receiver/receiver.py");
    let log = fs::File::create(procs.dir().join("otlp-receiver.log")).unwrap();
    procs.spawn(
        "otlp receiver",
        Command::new("python3")
            .arg(script)
            .args(["--grpc-port", &grpc.to_string()])
            .args(["--http-port", &http.to_string()])
            .arg("--out")
            .arg(&out)
            .env("PYTHONPATH", python_path())
            .stdout(Stdio::null())
            .stderr(log),
    );
    // Its HTTP side answers any GET (501) once both servers listen.
    wait_until("the OTLP receiver", Duration::from_secs(30), || {
        http_get(http, "/").map(|_| ())
    });
    (grpc, http, out)
}

/// The export requests received so far of `signal`.
fn received(out: &Path, signal: &str) -> Vec<Value> {
    fs::read_to_string(out)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["signal"] == signal)
        .map(|v| v["request"].clone())
        .collect()
}

/// An attribute's value (string or integer, as protobuf's JSON writes it).
fn attr<'a>(attributes: &'a Value, key: &str) -> Option<&'a str> {
    attributes.as_array()?.iter().find_map(|a| {
        (a["key"] == key).then(|| {
            let v = &a["value"];
            v["stringValue"].as_str().or_else(|| v["intValue"].as_str())
        })?
    })
}

/// From the newest metrics export: per metric name and reason, the value
/// (sum) or count (histogram) of the points of executable `exe`, and the
/// resource's attributes.
fn latest_metrics(exports: &[Value], exe: &str) -> (BTreeMap<(String, String), u64>, Value) {
    let mut values = BTreeMap::new();
    let mut resource = Value::Null;
    let Some(last) = exports.last() else {
        return (values, resource);
    };
    for rm in last["resourceMetrics"].as_array().into_iter().flatten() {
        resource = rm["resource"]["attributes"].clone();
        for sm in rm["scopeMetrics"].as_array().into_iter().flatten() {
            for m in sm["metrics"].as_array().into_iter().flatten() {
                let name = m["name"].as_str().unwrap_or_default().to_owned();
                let points = m["sum"]["dataPoints"]
                    .as_array()
                    .or_else(|| m["exponentialHistogram"]["dataPoints"].as_array());
                for p in points.into_iter().flatten() {
                    if attr(&p["attributes"], "process.executable.name") != Some(exe) {
                        continue;
                    }
                    let reason = attr(&p["attributes"], "gostw.pause.reason").unwrap_or("");
                    let v = p["asInt"]
                        .as_str()
                        .or_else(|| p["count"].as_str())
                        .and_then(|s| s.parse::<u64>().ok())
                        .unwrap_or(0);
                    *values.entry((name.clone(), reason.to_owned())).or_default() += v;
                }
            }
        }
    }
    (values, resource)
}

/// The slow-pause log records received: id -> (its body, its attributes).
fn pause_logs(exports: &[Value]) -> BTreeMap<String, (Value, Value)> {
    let mut out = BTreeMap::new();
    for e in exports {
        for rl in e["resourceLogs"].as_array().into_iter().flatten() {
            for sl in rl["scopeLogs"].as_array().into_iter().flatten() {
                for r in sl["logRecords"].as_array().into_iter().flatten() {
                    if r["eventName"] != "gostw.slow_pause" {
                        continue;
                    }
                    let body: Value =
                        serde_json::from_str(r["body"]["stringValue"].as_str().unwrap_or("null"))
                            .unwrap();
                    let id = attr(&r["attributes"], "gostw.pause.id").unwrap().to_owned();
                    out.insert(id, (body, r["attributes"].clone()));
                }
            }
        }
    }
    out
}

/// Pauses per reason the agent's /metrics counted for `exe`.
fn prometheus_pauses(port: u16, exe: &str) -> BTreeMap<String, u64> {
    let (_, body) = http_get(port, "/metrics").unwrap_or_default();
    let mut out = BTreeMap::new();
    for (labels, v) in
        gostw_scenario::loopback::samples(&body, "gostw_pause_duration_seconds_count")
    {
        if !labels
            .split(',')
            .any(|l| l == format!("executable=\"{exe}\""))
        {
            continue;
        }
        let reason = labels
            .split(',')
            .find_map(|l| l.strip_prefix("reason=\""))
            .unwrap_or("")
            .trim_end_matches('"');
        *out.entry(reason.to_owned()).or_default() += v as u64;
    }
    out
}

fn one_protocol(protocol: &str) {
    let go = newest_go();
    let bin = build_workload("stw", &go, "", &[]);
    let mut procs = Procs::new(&format!("otlp-{}", protocol.replace('/', "-")));
    let bin = procs.own(&bin);
    let exe = bin.file_name().unwrap().to_str().unwrap().to_owned();
    let (grpc, http, out) = start_receiver(&mut procs);
    let endpoint = match protocol {
        "grpc" => format!("http://127.0.0.1:{grpc}"),
        _ => format!("http://127.0.0.1:{http}"),
    };
    let port = free_port();
    let matching = format!(
        "^{}$",
        regex::escape(&bin.canonicalize().unwrap().display().to_string())
    );
    start_agent(
        &mut procs,
        port,
        &matching,
        &[
            "--slow-pause",
            "0",
            "--otlp-endpoint",
            &endpoint,
            "--otlp-protocol",
            protocol,
            "--otlp-interval",
            "500ms",
        ],
    );
    // The workload waits for SIGUSR1 until the agent traces it, so every
    // pause it counts is one the agent saw; then stays alive (-hold) while
    // the counts are compared.
    let mut child = Command::new(&bin)
        .args(STW_ARGS)
        .args(["-start-on-signal", "-hold", "60s"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    procs.children.push(("stw".into(), child));
    assert_eq!(lines.next().unwrap().unwrap(), "GOSTW_WAITING");
    wait_until(
        "the agent to trace the workload",
        Duration::from_secs(30),
        || {
            let (_, body) = http_get(port, "/metrics")?;
            (sum_series(
                &body,
                "gostw_traced_processes",
                &[&format!("executable=\"{exe}\"")],
            ) == 1.0)
                .then_some(())
        },
    );
    unsafe { libc::kill(pid as i32, libc::SIGUSR1) };
    let report: StwReport = parse_report(
        &lines
            .by_ref()
            .map(Result::unwrap)
            .find(|l| l.starts_with("GOSTW_REPORT "))
            .expect("the workload's report"),
    );
    let go_pauses = (report.stw_gc + report.stw_other) as u64;

    // The agent's own view, settled: /metrics counts every pause Go counted.
    let prom = wait_until(
        "/metrics to count Go's pauses",
        Duration::from_secs(30),
        || {
            let p = prometheus_pauses(port, &exe);
            (p.values().sum::<u64>() == go_pauses).then_some(p)
        },
    );
    // The receiver's newest export says the same, per reason.
    let (otlp, resource) = wait_until(
        "the OTLP export to count the same pauses",
        Duration::from_secs(30),
        || {
            let (m, r) = latest_metrics(&received(&out, "metrics"), &exe);
            let per_reason: BTreeMap<String, u64> = m
                .iter()
                .filter(|((name, _), _)| name == "gostw.pause.duration")
                .map(|((_, reason), v)| (reason.clone(), *v))
                .collect();
            (per_reason == prom).then_some((m, r))
        },
    );
    // Every stop here is a pause: the kernel's count of entries is Go's too
    // (read once a second by the agent).
    let entries = wait_until(
        "/metrics to count every stop",
        Duration::from_secs(30),
        || {
            let (_, body) = http_get(port, "/metrics")?;
            let e = sum_series(
                &body,
                "gostw_stop_the_world_entries_total",
                &[&format!("executable=\"{exe}\"")],
            ) as u64;
            (e == go_pauses).then_some(e)
        },
    );
    let otlp_entries = wait_until("the OTLP entries to match", Duration::from_secs(30), || {
        let (m, _) = latest_metrics(&received(&out, "metrics"), &exe);
        let e = m
            .get(&("gostw.stop_the_world.entries".into(), String::new()))
            .copied()
            .unwrap_or(0);
        (e == entries).then_some(e)
    });
    assert_eq!(attr(&resource, "service.name"), Some("gostw-agent"));
    assert!(attr(&resource, "host.name").is_some_and(|h| !h.is_empty()));

    // One log record per /debug/pauses record, the same ids and bodies.
    let (_, served) = http_get(
        port,
        &format!("/debug/pauses?format=json&pid={pid}&limit=100000"),
    )
    .unwrap();
    let served: BTreeMap<String, Value> = served
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (v["id"].as_str().unwrap().to_owned(), v)
        })
        .collect();
    assert_eq!(
        served.len() as u64,
        go_pauses,
        "every pause is a record (--slow-pause 0)"
    );
    let logs = wait_until("a log record per pause", Duration::from_secs(30), || {
        let l = pause_logs(&received(&out, "logs"));
        let ids: BTreeSet<&String> = l.keys().collect();
        (ids == served.keys().collect()).then_some(l)
    });
    for (id, (body, attributes)) in &logs {
        assert_eq!(
            body, &served[id],
            "the log record's body is the served record"
        );
        assert_eq!(
            attr(attributes, "process.pid"),
            Some(pid.to_string().as_str())
        );
        assert_eq!(
            attr(attributes, "process.executable.name"),
            Some(exe.as_str())
        );
    }
    eprintln!(
        "{protocol}: Go counted {go_pauses} pauses; /metrics {prom:?}; OTLP {otlp:?}; \
         entries {entries} = {otlp_entries}; {} log records = {} served",
        logs.len(),
        served.len()
    );
}

#[test]
fn agent_sends_metrics_and_slow_pauses_over_otlp_grpc_and_http() {
    require_root();
    one_protocol("grpc");
    one_protocol("http/protobuf");
}
