//! Program variants for older kernels (`tracer_common::compat`). The same
//! traced workload runs twice: as this kernel needs (the variants where it
//! lacks the newer helpers, as 5.10 does), and with `GOSTW_COMPAT=force`
//! (every variant). Both must explain the same pauses the same way; the
//! kernel's run-time statistics (the summary's `health`) give each
//! program's cost per run, printed side by side.

use std::process::{Command, Stdio};

use serde_json::Value;
use tracer::kernel::compat::Compat;

use crate::{
    laggards::names_spinner,
    support::{json_records, newest_go, ns, require_root},
};

const MS: u64 = 1_000_000;

/// `gostw run --json` (tracepoint fault backend, sampled stack growth,
/// explanations) of the stw workload with a spinning goroutine; returns its
/// pauses and its summary.
fn run(force: bool) -> (Vec<Value>, Value) {
    let go = newest_go();
    let path = crate::support::build_workload("stw", &go, "", &[]);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gostw"));
    cmd.args(["run", "--json", "--fault-source", "tracepoint"])
        .args(["--stacks", "sampled", "--"])
        .arg(&path)
        .args(["-spinners", "1", "-spin-chunk", "20ms", "-gc", "1"])
        .args(["-readmemstats", "0", "-gomaxprocs", "0", "-alloc-mb", "0"])
        .args(["-duration", "1500ms", "-interval", "40ms"])
        .env("GODEBUG", "asyncpreemptoff=1")
        .env("GOMAXPROCS", "2")
        .stdin(Stdio::null());
    if force {
        cmd.env("GOSTW_COMPAT", "force");
    }
    let out = cmd.output().expect("running gostw");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "force {force}: gostw run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = json_records(&stdout, "summary")
        .pop()
        .unwrap_or_else(|| panic!("force {force}: no summary record"));
    (json_records(&stdout, "pause"), summary)
}

/// (runs, ns per run) of `program` in a summary, if it was loaded.
fn cost(summary: &Value, program: &str) -> Option<(u64, f64)> {
    summary["health"]["programs"]
        .as_array()?
        .iter()
        .find(|p| p["program"] == program)
        .map(|p| (ns(&p["runs"]), p["ns_per_run"].as_f64().unwrap_or(0.0)))
}

/// Share of the pauses that waited 1 ms or more to stop whose laggard is
/// the spinner, and how many there were.
fn spinner_named(pauses: &[Value]) -> (usize, usize) {
    let waited: Vec<&Value> = pauses
        .iter()
        .filter(|p| ns(&p["stopping_ns"]) >= MS)
        .collect();
    let named = waited.iter().filter(|p| names_spinner(p)).count();
    (named, waited.len())
}

#[test]
fn variants_explain_the_same_pauses_and_their_cost_is_measured() {
    require_root();
    let compat = Compat::detect();
    let old_kernel = !compat.missing.is_empty();
    eprintln!("this kernel lacks: {:?}", compat.missing);
    assert!(
        compat.layout_error().is_none(),
        "task layout for the register variants: {compat:?}"
    );
    let (pauses, native) = run(false);
    let (forced_pauses, forced) = run(true);
    assert!(
        native["health"]["bpf_stats_enabled"] == true
            && forced["health"]["bpf_stats_enabled"] == true,
        "BPF statistics were not on: {native}"
    );
    let variants = [
        "fault_tp_switch_compat",
        "explain_switch_compat",
        "stack_sample_compat",
    ];
    let preferred = [
        "fault_tp_switch",
        "explain_switch",
        "stack_sample",
        "switch_both",
    ];
    // The forced run loads the variants only, and they run.
    for v in variants {
        let (runs, _) = cost(&forced, v).unwrap_or_else(|| panic!("{v} not loaded: {forced}"));
        assert!(runs > 0, "{v} never ran");
    }
    for p in preferred {
        assert!(cost(&forced, p).is_none(), "{p} loaded though forced off");
    }
    // The native run loads what this kernel needs.
    if old_kernel {
        for v in variants {
            assert!(cost(&native, v).is_some_and(|c| c.0 > 0), "{v}: {native}");
        }
        for p in preferred {
            assert!(
                cost(&native, p).is_none(),
                "{p} loaded on a kernel without its helper"
            );
        }
    } else {
        for p in ["switch_both", "stack_sample"] {
            assert!(cost(&native, p).is_some_and(|c| c.0 > 0), "{p}: {native}");
        }
        for v in variants {
            assert!(
                cost(&native, v).is_none(),
                "{v} loaded on a kernel with the helpers"
            );
        }
    }
    // Same results: the spinner is named in both runs' pauses that waited.
    for (what, p) in [("native", &pauses), ("forced", &forced_pauses)] {
        let (named, waited) = spinner_named(p);
        eprintln!(
            "{what}: {} pauses, {waited} waited 1 ms to stop, {named} name the spinner",
            p.len()
        );
        assert!(
            waited >= 10,
            "{what}: only {waited} pauses waited for the spinner"
        );
        assert!(
            named * 10 >= waited * 9,
            "{what}: {named} of {waited} name the spinner"
        );
    }
    eprintln!(
        "GOSTW_COMPAT_COST kernel {}",
        std::env::var("GOSTW_VM").unwrap_or_default()
    );
    for name in preferred
        .iter()
        .chain(variants.iter())
        .chain(["fault_tp_user", "explain_waking"].iter())
    {
        for (run, s) in [("native", &native), ("forced", &forced)] {
            if let Some((runs, ns)) = cost(s, name) {
                eprintln!("GOSTW_COMPAT_COST {run:<6} {name:<24} {runs:>9} runs {ns:>9.0} ns/run");
                // Measured: the kernel's statistics gave each program that
                // ran a run time (the figures are `cargo xtask bench
                // compat`'s to compare).
                assert!(
                    runs == 0 || ns > 0.0,
                    "{run} {name}: {runs} runs and no run time measured"
                );
            }
        }
    }
}
