//! `gostw check` against what tracing really does on this kernel: the
//! features it says work load exactly the programs it names when
//! `gostw run` traces a workload, with the fault backend it names.

use std::{
    collections::HashSet,
    process::{Command, Stdio},
};

use serde_json::Value;

use crate::support::{build_workload, json_records, newest_go, require_root};

const GOSTW: &str = env!("CARGO_BIN_EXE_gostw");

#[test]
fn check_answers_match_what_tracing_loads() {
    require_root();
    check_against_run();
}

/// With kernel addresses hidden from everyone (`kernel.kptr_restrict=2`,
/// root included), check and the run both say the kernel waits lose their
/// names, in the same words (the run knows it before tracing begins).
#[test]
fn hidden_kernel_addresses_are_said_by_check_and_the_run_alike() {
    require_root();
    let _hidden = KptrRestrict::set("2");
    let report = check_against_run();
    let waits = report["features"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "kernel waits")
        .unwrap();
    assert_eq!(waits["status"], "degraded", "{waits}");
    assert!(
        waits["why"].as_str().unwrap().contains("/proc/kallsyms"),
        "{waits}"
    );
}

/// `kernel.kptr_restrict` set for as long as the value lives.
struct KptrRestrict(String);

impl KptrRestrict {
    const PATH: &str = "/proc/sys/kernel/kptr_restrict";

    fn set(value: &str) -> KptrRestrict {
        let old = std::fs::read_to_string(Self::PATH).expect("reading kptr_restrict");
        std::fs::write(Self::PATH, value).expect("setting kptr_restrict");
        KptrRestrict(old.trim().to_owned())
    }
}

impl Drop for KptrRestrict {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, &self.0);
    }
}

/// `gostw check --json`, then `gostw run` of a workload with every feature
/// on: what check says works loads, and what it calls degraded the run says
/// once and keeps in its summary. Check's report.
fn check_against_run() -> Value {
    let out = Command::new(GOSTW)
        .args(["check", "--json"])
        .output()
        .expect("running gostw check");
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    eprintln!("{report:#}");
    assert_eq!(
        out.status.code(),
        report["exit_code"].as_i64().map(|c| c as i32),
        "exit status and report disagree"
    );
    let feature = |name: &str| -> &Value {
        report["features"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("no feature {name}: {report}"))
    };
    assert_eq!(feature("pauses")["status"], "works");

    let go = newest_go();
    let path = build_workload("stw", &go, "", &[]);
    let run = Command::new(GOSTW)
        .args(["run", "--json", "--stacks", "sampled", "--"])
        .arg(&path)
        .args(["-duration", "1s", "-interval", "50ms", "-gc", "1"])
        .stdin(Stdio::null())
        .output()
        .expect("running gostw run");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "gostw run failed: {stderr}");
    let summary = json_records(&String::from_utf8_lossy(&run.stdout), "summary")
        .pop()
        .expect("a summary record");
    let loaded: HashSet<&str> = summary["health"]["programs"]
        .as_array()
        .expect("health.programs (BPF statistics on)")
        .iter()
        .filter_map(|p| p["program"].as_str())
        .collect();
    eprintln!("loaded by gostw run: {loaded:?}");
    // The combined sched_switch program stands for both parts it runs.
    let stands_for = |p: &str| {
        loaded.contains(p)
            || (loaded.contains("switch_both")
                && ["fault_tp_switch", "explain_switch"].contains(&p))
    };
    for name in [
        "pauses",
        "stopping phase",
        "explanation",
        "kernel waits",
        "stack growth (sampled)",
        "faults",
    ] {
        let f = feature(name);
        let programs: Vec<&str> = f["programs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p.as_str())
            .collect();
        if f["status"] == "unavailable" {
            assert!(programs.iter().all(|p| !loaded.contains(p)), "{name}: {f}");
        } else {
            assert!(!programs.is_empty(), "{name} works with no program: {f}");
            for p in &programs {
                assert!(
                    stands_for(p),
                    "{name}: check names {p}, gostw run did not load it"
                );
            }
        }
    }
    let backend = report["fault_backend"]["backend"].as_str().unwrap();
    if feature("faults")["status"] == "unavailable" {
        assert!(stderr.contains("major faults not traced"), "{stderr}");
    } else {
        let said = format!("gostw: fault backend {backend}:");
        assert!(
            stderr.contains(&said),
            "check says {backend}; gostw run: {stderr}"
        );
    }
    // What check calls degraded (of the features this run used), the run
    // says once on standard error and keeps in its summary, in the same
    // words; what check says works, the run does not call degraded (in the
    // VM the kprobe backend leaves the kernel waits degraded).
    let in_use = ["kernel waits", "stack growth (sampled)", "faults"];
    let check_degraded: Vec<(&str, &str)> = in_use
        .iter()
        .map(|&n| (n, feature(n)))
        .filter(|(_, f)| f["status"] == "degraded")
        .map(|(n, f)| (n, f["why"].as_str().unwrap()))
        .collect();
    let run_degraded: Vec<(&str, &str)> = summary["health"]["degraded"]
        .as_array()
        .expect("health.degraded")
        .iter()
        .map(|d| (d["feature"].as_str().unwrap(), d["why"].as_str().unwrap()))
        .collect();
    eprintln!("degraded: check {check_degraded:?}, gostw run {run_degraded:?}");
    assert_eq!(run_degraded, check_degraded, "check and gostw run disagree");
    for (name, why) in &run_degraded {
        let said = format!("gostw: {name} degraded here: {why}");
        assert_eq!(
            stderr.matches(&said).count(),
            1,
            "{said:?} not said once: {stderr}"
        );
    }
    report
}
