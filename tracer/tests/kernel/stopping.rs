//! Go's stopping phase (Go 1.22+), read where `stopTheWorldWithSema`
//! records it (its calls of `timeHistogram.record`):
//! per pause, `stopping_ns` bucketed with Go's own bucket boundaries must
//! give Go's `/sched/pauses/stopping/{gc,other}` histograms bucket for
//! bucket, and `duration_ns` its `/sched/pauses/total/{gc,other}`.

use std::{collections::BTreeMap, process::Command};

use serde::Deserialize;
use serde_json::Value;
use tracer::model::pause::StwReason;

use crate::support::{STW_ARGS, build_workload, go_matrix, gostw_stdout, newest_go, require_root};

const GOSTW: &str = env!("CARGO_BIN_EXE_gostw");

/// One histogram as the stw workload prints it: non-empty buckets as
/// `[low_ns, high_ns, count]`, low inclusive, high exclusive.
type Buckets = Vec<[i64; 3]>;

#[derive(Debug, Deserialize)]
struct Report {
    histograms: BTreeMap<String, Buckets>,
}

/// `gostw run --json [extra] -- stw STW_ARGS`: the pause records and the
/// workload's report.
fn run(go: &crate::support::GoToolchain, extra: &[&str]) -> (Vec<Value>, Report) {
    let path = build_workload("stw", go, "", &[]);
    let stdout = gostw_stdout(
        Command::new(GOSTW)
            .arg("run")
            .arg("--json")
            .args(extra)
            .arg("--")
            .arg(&path)
            .args(STW_ARGS),
        &format!("Go {}: gostw run", go.version),
    );
    let mut pauses = Vec::new();
    let mut report = None;
    for line in stdout.lines() {
        if let Some(r) = line.strip_prefix("GOSTW_REPORT ") {
            report = Some(serde_json::from_str(r).expect("workload report"));
        } else if line.starts_with('{') {
            let v: Value = serde_json::from_str(line).expect("gostw JSON");
            if v["type"] == "pause" {
                pauses.push(v);
            }
        }
    }
    (pauses, report.expect("the workload printed no report"))
}

/// `values` counted into the buckets of `go` (Go's boundaries), as the same
/// `[low, high, count]` list of non-empty buckets. A value outside every
/// bucket Go filled gets a bucket of its own, `[v, v, 1]`, so it shows.
fn bucket(values: &[u64], go: &Buckets) -> Buckets {
    let mut counts: BTreeMap<(i64, i64), i64> = BTreeMap::new();
    for &v in values {
        let v = v as i64;
        let key = go
            .iter()
            .find(|b| b[0] <= v && v < b[1])
            .map_or((v, v), |b| (b[0], b[1]));
        *counts.entry(key).or_default() += 1;
    }
    counts.into_iter().map(|((l, h), n)| [l, h, n]).collect()
}

fn field(p: &Value, name: &str) -> Option<u64> {
    p[name].as_u64()
}

/// Every Go 1.22+ version of the matrix: stopping and total times of each
/// pause, bucketed like Go, are Go's own histograms exactly.
#[test]
fn stopping_and_total_equal_go_histograms_bucket_for_bucket() {
    require_root();
    let versions: Vec<_> = go_matrix()
        .into_iter()
        .filter(|g| g.major_minor() >= (1, 22))
        .collect();
    assert!(!versions.is_empty(), "the Go matrix has no 1.22+ version");
    for go in versions {
        let (pauses, report) = run(&go, &[]);
        let v = &go.version;
        assert!(pauses.len() > 20, "Go {v}: {} pauses", pauses.len());
        for (class, gc) in [("gc", true), ("other", false)] {
            let of_class: Vec<&Value> = pauses
                .iter()
                .filter(|p| StwReason(p["reason_code"].as_u64().unwrap() as u32).is_gc() == gc)
                .collect();
            let stopping: Vec<u64> = of_class
                .iter()
                .map(|p| {
                    field(p, "stopping_ns")
                        .unwrap_or_else(|| panic!("Go {v}: a pause without stopping_ns: {p}"))
                })
                .collect();
            let total: Vec<u64> = of_class
                .iter()
                .map(|p| field(p, "duration_ns").unwrap())
                .collect();
            for (metric, ours) in [("stopping", &stopping), ("total", &total)] {
                let name = format!("/sched/pauses/{metric}/{class}:seconds");
                let go_hist = report
                    .histograms
                    .get(&name)
                    .unwrap_or_else(|| panic!("Go {v}: the workload did not report {name}"));
                let got = bucket(ours, go_hist);
                eprintln!(
                    "Go {v}: {name}: {} pauses, {} buckets",
                    ours.len(),
                    go_hist.len()
                );
                assert_eq!(&got, go_hist, "Go {v}: {name}, gostw's vs Go's");
            }
            // Stopping is part of the pause.
            for (s, t) in stopping.iter().zip(&total) {
                assert!(s <= t, "Go {v}: stopping {s} ns > total {t} ns");
            }
        }
    }
}

/// The negative control: `--no-stopping` leaves the probe off, so no pause
/// has a stopping time (and the check above would fail); versions before
/// 1.22 have none either.
#[test]
fn without_the_probe_or_before_go_1_22_stopping_is_null() {
    require_root();
    let go = newest_go();
    let (pauses, report) = run(&go, &["--no-stopping"]);
    assert!(!pauses.is_empty());
    assert!(
        pauses.iter().all(|p| p["stopping_ns"].is_null()),
        "--no-stopping still read stopping times"
    );
    let go_stopping = &report.histograms["/sched/pauses/stopping/gc:seconds"];
    assert!(!go_stopping.is_empty(), "Go counted stopping times itself");
    let old = go_matrix()
        .into_iter()
        .filter(|g| g.major_minor() < (1, 22))
        .max_by_key(|g| g.major_minor())
        .expect("the matrix has a version before 1.22");
    let (pauses, _) = run(&old, &[]);
    assert!(!pauses.is_empty());
    assert!(
        pauses.iter().all(|p| p["stopping_ns"].is_null()),
        "Go {}: a stopping time where the version has none",
        old.version
    );
}
