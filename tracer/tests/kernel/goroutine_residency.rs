//! The goroutine count of `--stacks sampled` (`stackgrowth::goroutines`)
//! reads only pages in memory: a gcswap with 4000 parked goroutines, paged
//! out to real swap and frozen, is traced by the real `gostw attach` for a
//! few seconds and keeps its swap (`VmSwap`, read before and after), while
//! the same workload resident gets its goroutines counted.

use std::{fs, time::Duration};

use serde_json::Value;

use crate::{
    memory::{ARGS, freeze, signal},
    scenario::{paged_gcswap, swap_out},
    support::{finish_gostw, require_root, start_gostw},
};

/// `VmSwap` of `pid`, in bytes.
fn vm_swap(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSwap:"))
        .unwrap_or_else(|| panic!("no VmSwap in /proc/{pid}/status"))
        .split_whitespace()
        .next()
        .unwrap();
    kb.parse::<u64>().unwrap() * 1024
}

/// `gostw attach --json --stacks sampled` on `pid` for `secs` seconds:
/// the summary's stack growth section and gostw's standard error.
fn trace(pid: u32, secs: u64) -> (Value, String) {
    let pid_arg = pid.to_string();
    let (gostw, stderr) = start_gostw(
        &["attach", "--json", "--stacks", "sampled", "--pid", &pid_arg],
        "tracing pid",
    );
    std::thread::sleep(Duration::from_secs(secs));
    signal(gostw.id(), libc::SIGINT);
    let (out, err) = finish_gostw(gostw, stderr);
    let summary = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .find(|v| v["type"] == "summary")
        .expect("no summary line");
    (summary["stack_growth"].clone(), err)
}

/// A few pages: what the rest of a trace may legitimately touch (none was
/// touched in the runs measured; the kernel's own reclaim can move a page).
const FEW_PAGES: u64 = 8 * 4096;

#[test]
fn a_paged_out_frozen_process_keeps_its_swap_and_a_resident_one_is_counted() {
    require_root();
    let (_swap, cgroup, workload) = paged_gcswap("goroutine-residency", ARGS, &[]);
    let pid = workload.pid;

    // Resident: the 4000 parked goroutines are counted.
    let (stacks, _) = trace(pid, 2);
    let rec = &stacks["recommendation"];
    assert_eq!(
        rec["goroutines_source"], "runtime.allglen: peak goroutines",
        "{stacks:#}"
    );
    let counted = rec["goroutines"].as_u64().unwrap();
    assert!((4000..4200).contains(&counted), "{counted} goroutines");

    // Paged out and frozen: nothing comes back from swap.
    swap_out(pid, &cgroup);
    freeze(pid);
    let before = vm_swap(pid);
    let (stacks, err) = trace(pid, 4);
    let after = vm_swap(pid);
    signal(pid, libc::SIGCONT);
    drop(workload);
    eprintln!(
        "resident: {counted} goroutines; paged out: VmSwap {} KiB before, {} KiB after \
         the trace; goroutines {}; {}",
        before >> 10,
        after >> 10,
        stacks["recommendation"]["goroutines"],
        err.lines()
            .find(|l| l.contains("goroutine count incomplete"))
            .unwrap_or("")
    );
    assert!(before >= 16 << 20, "only {before} bytes paged out");
    assert!(
        after + FEW_PAGES >= before,
        "the trace swapped in {} KiB",
        (before - after) >> 10
    );
    // The walk did run and left the swapped pages unread, saying so.
    assert!(
        err.contains("not in memory left unread"),
        "no skipped pages reported: {err}"
    );
}
