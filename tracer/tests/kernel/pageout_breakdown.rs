//! The page-out scenario explained: the gcswap workload's memory is pushed
//! to swap before each GC, so its pauses fault on GC metadata. The slow
//! pauses' breakdown must say so: their largest part is faults (the
//! stopping thread's, or the laggard's while the world stopped), and their
//! faults are reported by the phase they began in, the restart's apart.

use serde_json::Value;

use crate::{
    faults::{ARGS, ENV, start_gostw},
    scenario::{paged_gcswap, swap_out},
    support::{json_records, ns, require_root},
};

const MS: u64 = 1_000_000;

#[test]
fn pageout_pauses_are_explained_by_faults_by_phase() {
    require_root();
    let (_swap, cgroup, mut workload) = paged_gcswap("breakdown", ARGS, ENV);
    let pid = workload.pid;
    let (gostw, _stderr) = start_gostw(
        &["attach", "--json", "--pid", &pid.to_string()],
        "tracing pid",
    );
    workload.gc();
    for _ in 0..4 {
        swap_out(pid, &cgroup);
        workload.gc();
    }
    let _ = workload.quit();
    let out = gostw.wait_with_output().expect("waiting for gostw");
    assert!(
        out.status.success(),
        "gostw attach failed: {:?}",
        out.status
    );
    let pauses = json_records(&String::from_utf8_lossy(&out.stdout), "pause");
    let slow: Vec<&Value> = pauses
        .iter()
        .filter(|p| ns(&p["duration_ns"]) >= MS && ns(&p["faults"]["all"]["faults"]) > 0)
        .collect();
    assert!(
        !slow.is_empty(),
        "no paged-out pause of 1 ms or more faulted"
    );
    let mut dominated = 0;
    for p in &slow {
        let b = p["breakdown"]
            .as_object()
            .unwrap_or_else(|| panic!("no breakdown: {p}"));
        let parts: u64 = b.values().map(ns).sum();
        assert_eq!(parts, ns(&p["duration_ns"]), "parts: {p}");
        let faults = ns(&b["faults_ns"]) + ns(&b["stopping_fault_ns"]);
        let largest_other = b
            .iter()
            .filter(|(k, _)| *k != "faults_ns" && *k != "stopping_fault_ns")
            .map(|(_, v)| ns(v))
            .max()
            .unwrap_or(0);
        let phases = &p["faults"]["by_phase"];
        let by_phase: u64 = ["stopping", "stopped", "restarting"]
            .iter()
            .map(|ph| ns(&phases[*ph]["faults"]))
            .sum();
        assert_eq!(
            by_phase,
            ns(&p["faults"]["all"]["faults"]),
            "faults by phase must add up: {p}"
        );
        eprintln!(
            "{} {} us: faults {} us (stopper {} us, laggard {} us), largest other {} us; by phase {}/{}/{}",
            p["reason"],
            ns(&p["duration_ns"]) / 1000,
            faults / 1000,
            ns(&b["faults_ns"]) / 1000,
            ns(&b["stopping_fault_ns"]) / 1000,
            largest_other / 1000,
            ns(&phases["stopping"]["faults"]),
            ns(&phases["stopped"]["faults"]),
            ns(&phases["restarting"]["faults"]),
        );
        if faults > largest_other {
            dominated += 1;
        }
    }
    assert!(
        dominated * 10 >= slow.len() * 8,
        "only {dominated} of {} slow paged-out pauses are mostly faults",
        slow.len()
    );
}
