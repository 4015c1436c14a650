//! The first end-to-end proof of the pipeline: the uprobe on
//! `runtime.stopTheWorldWithSema` fires exactly once per stop-the-world pause
//! the Go runtime counts of itself.

use tracer::binary::GoBinary;
use tracer_common::process::Probe;

use crate::support::{
    STW_ARGS, STW_GOMAXPROCS, STW_READ_MEM_STATS, Session, StwReport, build_workload, go_matrix,
    parse_report, require_root, run_traced,
};

/// Compare probe hits with the pauses the program counted itself.
///
/// Go 1.22+ counts every stop-the-world in runtime/metrics
/// (`/sched/pauses/total/{gc,other}:seconds`): hits must equal their sum.
/// Older versions only count GC pauses (`/gc/pauses:seconds`, two per
/// cycle; `NumGC` where even that is missing), so there hits must equal those
/// plus the non-GC stops the workload makes by construction (`known_other`).
fn check_counts(hits: u64, report: &StwReport, known_other: u64) -> Result<(), String> {
    let expected = if report.stw_gc >= 0 && report.stw_other >= 0 {
        (report.stw_gc + report.stw_other) as u64
    } else if report.gc_pauses >= 0 {
        report.gc_pauses as u64 + known_other
    } else {
        2 * report.num_gc + known_other
    };
    if hits != expected {
        return Err(format!(
            "{hits} probe hits, Go counted {expected} pauses ({report:?})"
        ));
    }
    Ok(())
}

const ARGS: &[&str] = STW_ARGS;
const KNOWN_OTHER: u64 = STW_READ_MEM_STATS + STW_GOMAXPROCS;

#[test]
fn stop_the_world_hits_equal_go_pause_count() {
    require_root();
    for go in go_matrix() {
        let path = build_workload("stw", &go, "", &[]);
        let binary = GoBinary::open(&path).unwrap();
        let mut session = Session::new();
        session.attach_binary(&binary);
        let (pid, stdout) = run_traced(&mut session, &binary, ARGS);
        let report: StwReport = parse_report(&stdout);
        let hits = session.core.probe_hits(pid, Probe::StopTheWorld);
        eprintln!("Go {}: {hits} hits; report {report:?}", go.version);
        assert!(
            report.num_forced_gc >= 10,
            "workload did not run its GCs: {report:?}"
        );
        if let Err(e) = check_counts(hits, &report, KNOWN_OTHER) {
            panic!("Go {}: {e}", go.version);
        }
    }
}

/// The same check must fail when the probe is not attached: the count comes
/// from the kernel, not from anything the test computes.
#[test]
fn unattached_probe_fails_the_check() {
    require_root();
    let go = crate::support::newest_go();
    let path = build_workload("stw", &go, "", &[]);
    let binary = GoBinary::open(&path).unwrap();
    let mut session = Session::new();
    // No attach_binary: the process is traced but nothing fires.
    let (pid, stdout) = run_traced(&mut session, &binary, ARGS);
    let report: StwReport = parse_report(&stdout);
    let hits = session.core.probe_hits(pid, Probe::StopTheWorld);
    assert_eq!(hits, 0);
    assert!(
        check_counts(hits, &report, KNOWN_OTHER).is_err(),
        "check passed with no probe attached: {report:?}"
    );
}
