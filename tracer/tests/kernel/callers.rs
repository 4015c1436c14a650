//! The caller of each pause: the goroutine stack that asked for the stop,
//! walked from its saved frame pointers at `stopTheWorldWithSema` entry. The
//! stw workload calls `runtime.ReadMemStats` from `main.readStats` (and once
//! from `main.report`) and `runtime.GOMAXPROCS` from `main.resizeProcs`, on
//! every Go version of the matrix.

use std::process::Command;

use serde_json::Value;

use crate::support::{
    STW_ARGS, STW_GOMAXPROCS, STW_READ_MEM_STATS, build_workload, go_matrix, gostw_stdout,
    json_records, newest_go, require_root,
};

const GOSTW: &str = env!("CARGO_BIN_EXE_gostw");

/// `gostw run --json [extra] -- stw STW_ARGS`: pause records and summary.
fn run(go: &crate::support::GoToolchain, extra: &[&str]) -> (Vec<Value>, Value) {
    let path = build_workload("stw", go, "", &[]);
    let stdout = gostw_stdout(
        Command::new(GOSTW)
            .args(["run", "--json"])
            .args(extra)
            .arg("--")
            .arg(&path)
            .args(STW_ARGS),
        &format!("Go {}: gostw run", go.version),
    );
    let summary = json_records(&stdout, "summary").pop().expect("no summary");
    let pauses = json_records(&stdout, "pause");
    (pauses, summary)
}

/// The function names of a pause's caller stack.
fn caller(p: &Value) -> Vec<String> {
    p["caller"]
        .as_array()
        .unwrap_or_else(|| panic!("a pause without a caller: {p}"))
        .iter()
        .map(|f| f["function"].as_str().unwrap().to_owned())
        .collect()
}

fn count_with(pauses: &[&Value], function: &str) -> u64 {
    pauses
        .iter()
        .filter(|p| caller(p).iter().any(|f| f == function))
        .count() as u64
}

#[test]
fn callers_name_the_functions_that_asked_for_the_stop() {
    require_root();
    for go in go_matrix() {
        let v = &go.version;
        let (pauses, summary) = run(&go, &[]);
        let of = |reason: &str| -> Vec<&Value> {
            pauses.iter().filter(|p| p["reason"] == reason).collect()
        };
        let rms = of("read_mem_stats");
        let procs = of("gomaxprocs");
        assert_eq!(rms.len() as u64, STW_READ_MEM_STATS, "Go {v}");
        assert_eq!(procs.len() as u64, STW_GOMAXPROCS, "Go {v}");
        eprintln!("Go {v}: a ReadMemStats caller: {:?}", caller(rms[0]));
        // Every ReadMemStats stop names its caller: main.readStats, and
        // main.report for the report's own call.
        assert_eq!(
            count_with(&rms, "main.readStats"),
            STW_READ_MEM_STATS - 1,
            "Go {v}"
        );
        assert_eq!(count_with(&rms, "main.report"), 1, "Go {v}");
        assert!(
            rms.iter()
                .all(|p| caller(p).iter().any(|f| f == "runtime.ReadMemStats")),
            "Go {v}: the runtime entry point is on the stack"
        );
        assert_eq!(
            count_with(&procs, "main.resizeProcs"),
            STW_GOMAXPROCS,
            "Go {v}"
        );
        // The forced GCs: sweep termination asked for by runtime.GC in main.main.
        let sweep = of("gc_sweep_termination");
        assert!(
            count_with(&sweep, "runtime.GC") >= 10,
            "Go {v}: forced GCs without runtime.GC as their caller"
        );
        // The summary's top callers per reason.
        let by_reason = summary["processes"][0]["by_reason"].as_array().unwrap();
        let top = |reason: &str| -> Vec<(String, String, u64)> {
            by_reason.iter().find(|r| r["reason"] == reason).unwrap()["top_callers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| {
                    (
                        c["function"].as_str().unwrap().to_owned(),
                        c["via"].as_str().unwrap().to_owned(),
                        c["pauses"].as_u64().unwrap(),
                    )
                })
                .collect()
        };
        assert_eq!(
            top("read_mem_stats"),
            [
                (
                    "main.readStats".to_owned(),
                    "runtime.ReadMemStats".to_owned(),
                    STW_READ_MEM_STATS - 1
                ),
                (
                    "main.report".to_owned(),
                    "runtime.ReadMemStats".to_owned(),
                    1
                )
            ],
            "Go {v}"
        );
        assert_eq!(
            top("gomaxprocs"),
            [(
                "main.resizeProcs".to_owned(),
                "runtime.GOMAXPROCS".to_owned(),
                STW_GOMAXPROCS
            )],
            "Go {v}"
        );
    }
}

/// The negative control: with `--no-explain` no pause has a caller.
#[test]
fn without_explain_pauses_have_no_caller() {
    require_root();
    let (pauses, _) = run(&newest_go(), &["--no-explain"]);
    assert!(!pauses.is_empty());
    assert!(pauses.iter().all(|p| p.get("caller").is_none()));
}
