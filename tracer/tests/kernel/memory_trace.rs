//! The memory exposure and advice of `gostw attach` summaries, end to end:
//! a gcswap workload paged out to real swap before its GCs is traced by the
//! real binary; its summary's advice cites the trace's own numbers (the
//! swapped GC metadata it read at the end, the fault time of the pauses its
//! live records carry) and its exposure equals the kernel's smaps `Swap:`
//! total (the workload frozen while both are read). A control run without
//! page-out carries no advice; a process that exits keeps its last read;
//! gone pids fail clearly.

use std::{
    io::BufReader,
    process::{Child, ChildStderr, Output},
    time::Duration,
};

use serde_json::Value;
use tracer::{memory::HostSwap, units};

use crate::{
    memory::{ARGS, assert_fails, freeze, n, pause_evidence, signal, smaps_swap},
    scenario::{paged_gcswap, swap_out},
    support::{finish_gostw, require_root, start_gostw},
};

/// `gostw attach --json --pid PID` with `extra` options, traced from now
/// (its standard error kept open: gostw writes to it until the end).
fn attach(pid: u32, extra: &[&str]) -> (Child, BufReader<ChildStderr>) {
    let pid = pid.to_string();
    let mut args = vec!["attach", "--json", "--pid", &pid];
    args.extend_from_slice(extra);
    start_gostw(&args, "tracing pid")
}

/// Stop `gostw` with Ctrl-C; its output, checked successful.
fn interrupt(gostw: Child, stderr: BufReader<ChildStderr>) -> Output {
    signal(gostw.id(), libc::SIGINT);
    finish_gostw(gostw, stderr).0
}

/// The summary line of a JSON trace.
fn summary(stdout: &[u8]) -> Value {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .find(|v| v["type"] == "summary")
        .expect("no summary line")
}

fn class_swapped(exposure: &Value, name: &str) -> u64 {
    let c = exposure["classes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["class"] == name)
        .unwrap_or_else(|| panic!("no class {name}: {exposure}"));
    n(c, "swapped_bytes")
}

fn advice_of<'a>(s: &'a Value, kind: &str) -> &'a Value {
    s["advice"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} advice: {}", s["advice"]))
}

fn text<'a>(a: &'a Value, key: &str) -> &'a str {
    a[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} missing in {a}"))
}

/// Paged out before each of three GCs and once more before the trace ends:
/// the summary read the exposure at the end, equal to smaps, and its swap
/// and pause advice cite the GC metadata in swap and the fault time of the
/// pauses the same trace recorded.
#[test]
fn attach_summary_of_a_pageout_carries_swap_advice_citing_its_numbers() {
    require_root();
    let (_swap, cgroup, mut workload) = paged_gcswap("memory-attach", ARGS, &[]);
    let pid = workload.pid;
    let host_before = HostSwap::snapshot().unwrap();
    // Stack growth off: this test is about exposure alone (the goroutine
    // count reads no page in swap: `goroutine_residency`).
    let (gostw, stderr) = attach(pid, &["--exposure-every", "500ms", "--stacks", "off"]);
    workload.paged_gcs(&cgroup, 3);
    // Exposed now, when the trace ends.
    swap_out(pid, &cgroup);
    freeze(pid);
    let out = interrupt(gostw, stderr);
    let kernel_swap = smaps_swap(pid, None);
    let host_after = HostSwap::snapshot().unwrap();
    signal(pid, libc::SIGCONT);
    let _ = workload.quit();

    let s = summary(&out.stdout);
    let section = &s["exposure"];
    assert_eq!(section["pid"], pid, "{section}");
    assert_eq!(section["read_at"], "end", "{section}");
    assert!(n(section, "reads") >= 2, "{section}");
    let e = &section["exposure"];
    assert_eq!(n(&e["total"], "swapped_bytes"), kernel_swap, "{e}");
    let meta_swapped = class_swapped(e, "gc_metadata");
    assert!(meta_swapped >= 64 << 10, "{e}");
    assert_eq!(
        n(&e["gc_metadata_reads"], "swapped_bytes"),
        meta_swapped,
        "{e}"
    );
    // The host's traffic over the trace lies within what the test saw
    // around it, and the page-outs are in it.
    let host = &section["host_swap"];
    let around = HostSwap::delta(&host_before, &host_after);
    assert!(n(host, "pswpout") > 0, "{host}");
    assert!(n(host, "pswpout") <= around.pswpout, "{host} vs {around:?}");

    let pauses = pause_evidence(&out.stdout, pid);
    assert!(pauses.pauses_with_faults >= 3, "{pauses:?}");
    let kinds: Vec<&str> = s["advice"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds[..2],
        ["gc_metadata_swapped", "pause_faults"],
        "{kinds:?}"
    );
    let swap = advice_of(&s, "gc_metadata_swapped");
    let evidence = text(swap, "evidence");
    let per_fault = pauses.fault_ns_in_pauses / pauses.faults_in_pauses;
    for cited in [
        format!("{} of GC metadata in swap", units::fmt_bytes(meta_swapped)),
        format!(
            "at the {} per fault measured in pauses",
            units::fmt_short_duration(per_fault)
        ),
        "pages/s swapped in".to_owned(),
        "cgroup v1 /gostw-memory-attach".to_owned(),
    ] {
        assert!(evidence.contains(&cited), "{cited:?} not in {evidence}");
    }
    assert!(
        text(swap, "action").contains("memory.swappiness=0"),
        "{swap}"
    );
    assert!(!text(swap, "finding").is_empty());
    let faults = advice_of(&s, "pause_faults");
    let cited = format!(
        "{} of {} pauses had major faults ({} faults); faults took {} of {} pause time",
        pauses.pauses_with_faults,
        pauses.pauses,
        pauses.faults_in_pauses,
        units::fmt_ms(pauses.fault_ns_in_pauses),
        units::fmt_ms(pauses.pause_ns)
    );
    assert!(
        text(faults, "evidence").contains(&cited),
        "{cited:?} not in {faults}"
    );
    eprintln!(
        "exposure reads: {} in {:.1} ms mean, {:.1} ms max; {}",
        n(section, "reads"),
        section["read_ms_mean"].as_f64().unwrap(),
        section["read_ms_max"].as_f64().unwrap(),
        evidence
    );
}

/// The control: the same workload and GCs without page-out: an exposure
/// with nothing swapped and no advice. The workload quits while traced:
/// its last refresh stands for the end.
#[test]
fn attach_without_pageout_carries_no_advice_and_an_exited_process_keeps_its_last_read() {
    require_root();
    let (_swap, _cgroup, mut workload) = paged_gcswap("memory-attach-control", ARGS, &[]);
    let pid = workload.pid;
    let (gostw, stderr) = attach(pid, &["--exposure-every", "200ms"]);
    for _ in 0..3 {
        workload.gc();
    }
    std::thread::sleep(Duration::from_millis(500));
    let _ = workload.quit();
    let (out, _) = finish_gostw(gostw, stderr);
    let s = summary(&out.stdout);
    let section = &s["exposure"];
    assert_eq!(section["read_at"], "last_before_exit", "{section}");
    assert!(n(section, "reads") >= 2, "{section}");
    let e = &section["exposure"];
    assert_eq!(n(&e["total"], "swapped_bytes"), 0, "{e}");
    assert_eq!(class_swapped(e, "gc_metadata"), 0, "{e}");
    assert!(n(&e["total"], "resident_bytes") > 64 << 20, "{e}");
    assert_eq!(s["advice"], Value::Array(vec![]), "{}", s["advice"]);
    let pauses = pause_evidence(&out.stdout, pid);
    assert!(pauses.pauses >= 3, "{pauses:?}");
}

/// `attach` to a pid that never existed or has exited and been reaped
/// says so on one line, before anything is loaded.
#[test]
fn attach_to_a_gone_pid_fails_clearly() {
    require_root();
    assert_fails(
        &["attach", "--pid", "999999999"],
        &["no process with pid 999999999"],
    );
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    assert_fails(
        &["attach", "--pid", &pid.to_string()],
        &[&format!("no process with pid {pid}"), "has exited"],
    );
}
