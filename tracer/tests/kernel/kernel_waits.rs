//! Where in the kernel a pause's threads slept (`kernel_waits`, and the
//! breakdown's `mmap_lock`, `reclaim` and `probe` parts), on a real Go
//! binary of the newest Go (the breakdown needs Go's stopping phase): the
//! stw workload's `-mmap-lock-mb` keeps the address space's lock held for
//! writing (`mprotect` of a populated 256 MiB mapping, over and over)
//! beside a goroutine that keeps faulting pages of that mapping in.
//! - with the holder, sleeps on that lock are named by their kernel stack
//!   (`rwsem_down_*`: kind `mmap_lock`, or `uprobe` where gostw's own probe
//!   waited for it), they make up most of the slow pauses' time, and every
//!   breakdown still adds up to its pause;
//! - the control, the same program without the holder: no pause has a
//!   sleep on the lock.

use std::process::Command;

use serde_json::Value;

use crate::support::{build_workload, gostw_stdout, json_records, newest_go, ns, require_root};

const GOSTW: &str = env!("CARGO_BIN_EXE_gostw");
const MS: u64 = 1_000_000;
const ON_THE_LOCK: [&str; 2] = ["mmap_lock", "uprobe"];

/// The pause records of `gostw run --json` of the stw workload with the
/// toucher (and the holder if `holder`), a GC every 40 ms for 3 s.
fn pauses(holder: bool) -> Vec<Value> {
    let go = newest_go();
    let path = build_workload("stw", &go, "", &[]);
    let stdout = gostw_stdout(
        Command::new(GOSTW)
            .args(["run", "--json", "--no-faults", "--stacks", "off", "--"])
            .arg(&path)
            .args(["-mmap-lock-mb", "256"])
            .arg(format!("-mmap-lock-holder={holder}"))
            .args(["-gc", "1", "-readmemstats", "0", "-gomaxprocs", "0"])
            .args(["-alloc-mb", "0", "-duration", "3s", "-interval", "40ms"]),
        &format!("Go {}: gostw run (holder {holder})", go.version),
    );
    json_records(&stdout, "pause")
}

/// A pause's kernel waits on the address space's lock.
fn lock_waits(p: &Value) -> Vec<&Value> {
    p["kernel_waits"]
        .as_array()
        .map(|w| {
            w.iter()
                .filter(|w| ON_THE_LOCK.contains(&w["kind"].as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default()
}

/// Sum of a breakdown's parts.
fn parts_sum(b: &Value) -> u64 {
    b.as_object()
        .expect("breakdown object")
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum()
}

#[test]
fn sleeps_on_the_address_space_lock_are_named_and_the_control_has_none() {
    require_root();
    let with = pauses(true);
    assert!(with.len() >= 20, "{} pauses with the holder", with.len());
    let mut waiting = 0;
    for p in &with {
        if let Some(b) = p.get("breakdown") {
            assert_eq!(parts_sum(b), ns(&p["duration_ns"]), "{p}");
        }
        let waits = lock_waits(p);
        for w in &waits {
            let frames: Vec<&str> = w["frames"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(Value::as_str)
                .collect();
            assert!(
                frames.iter().any(|f| f.starts_with("rwsem_down_")),
                "a wait on the lock without the lock's frames: {w}"
            );
        }
        waiting += usize::from(!waits.is_empty());
    }
    // The slow pauses' time is mostly named (seen here: 92%).
    let slow: Vec<&Value> = with
        .iter()
        .filter(|p| ns(&p["duration_ns"]) >= MS && p.get("breakdown").is_some())
        .collect();
    let total: u64 = slow.iter().map(|p| ns(&p["duration_ns"])).sum();
    let named: u64 = slow
        .iter()
        .map(|p| ns(&p["breakdown"]["mmap_lock_ns"]) + ns(&p["breakdown"]["probe_ns"]))
        .sum();
    eprintln!(
        "holder: {} pauses, {waiting} with a sleep on the lock; {} of 1 ms or more, {:.1} of {:.1} ms named",
        with.len(),
        slow.len(),
        named as f64 / 1e6,
        total as f64 / 1e6
    );
    assert!(waiting >= 3, "{waiting} pauses slept on the lock");
    assert!(slow.len() >= 3, "{} slow pauses", slow.len());
    assert!(
        named * 2 >= total,
        "{named} ns of {total} ns of slow pauses named"
    );

    let without = pauses(false);
    assert!(without.len() >= 20, "{} pauses without", without.len());
    let control: Vec<&Value> = without
        .iter()
        .filter(|p| !lock_waits(p).is_empty())
        .collect();
    eprintln!(
        "control: {} pauses, {} with a sleep on the lock",
        without.len(),
        control.len()
    );
    assert!(control.is_empty(), "{:?}", control.first());
}
