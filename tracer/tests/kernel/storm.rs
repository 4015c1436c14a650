//! A page-out storm: four times the page-out scenario's heap (256 MiB live,
//! read back from swap by eight walkers before every GC) pushed to real swap
//! before each of its GCs, while the real `gostw attach --json` traces it.
//! gostw is stopped (SIGSTOP) through each round, as a tracer starved of CPU
//! would be, so nothing drains the buffers while the round's events come.
//! The walkers' faults outside pauses are what fills the fault ring buffer;
//! pauses have a ring of their own and faults are counted in the kernel, so:
//! every stop the program made is a pause record (the kernel's count of
//! `stopTheWorldWithSema` entries; Go's own GC pause histogram, bucket for
//! bucket, over the traced stretch), gostw's fault
//! total is the kernel's majflt, and every fault inside a pause has its stack.

use std::{process::Output, time::Duration};

use serde_json::Value;

use crate::{
    agent::{Procs, free_port, http_get, start_agent, sum_series, wait_until},
    faults::{Bucket, GcSwapReport, auto_backend, majflt_agrees},
    memory::signal,
    scenario::{GcSwap, MemCgroup, SwapFile, majflt, swap_out},
    support::{attach_json, build_workload, finish_gostw, newest_go, require_root},
};

/// Four times `gostw_scenario::PAGEOUT_ARGS`' live heap.
const STORM_ARGS: &[&str] = &["-live-mb", "256", "-goroutines", "4000", "-walkers", "8"];
const ROUNDS: usize = 4;

fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
fn pageout_storm_loses_no_pause_and_counts_every_fault() {
    require_root();
    let _swap = SwapFile::create("storm", 2);
    let go = newest_go();
    let path = build_workload("gcswap", &go, "", &[]);
    let cgroup = MemCgroup::create("gostw-storm");
    let mut workload = GcSwap::start(&path, STORM_ARGS, &[("GOMAXPROCS", "8")], |pid| {
        cgroup.add(pid)
    });
    let pid = workload.pid;
    let (gostw, stderr) = attach_json(pid);
    // gostw is stopped through each round, as a tracer starved of CPU
    // would be: nothing is read while the round's faults and pauses
    // arrive, so the fault ring fills past half and sheds.
    // Go's GC pause histogram before the storm: the report's at exit less
    // this is what Go counted over the traced stretch.
    let before: Vec<Bucket> =
        serde_json::from_str(workload.ask("hist", "HIST ").strip_prefix("HIST ").unwrap()).unwrap();
    let mut paged = 0;
    for _ in 0..ROUNDS {
        signal(gostw.id(), libc::SIGSTOP);
        paged += swap_out(pid, &cgroup);
        workload.gc();
        signal(gostw.id(), libc::SIGCONT);
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    signal(gostw.id(), libc::SIGINT);
    let gostw_pid = gostw.id();
    let (out, _) = finish_gostw(gostw, stderr);
    // What it made in tracefs (the kprobe backend's return probes) went
    // with it.
    crate::support::assert_probe_events_removed(gostw_pid);
    let (line, majflt) = workload.quit();
    let report: GcSwapReport =
        serde_json::from_str(line.strip_prefix("GOSTW_REPORT ").unwrap()).unwrap();

    let lines = json_lines(&out);
    let pauses: Vec<&Value> = lines.iter().filter(|v| v["type"] == "pause").collect();
    let s = lines
        .iter()
        .find(|v| v["type"] == "summary")
        .expect("no summary line");
    let p = &s["processes"][0];
    let faults = &s["faults"]["processes"][0];
    let lost = &s["lost"]["kernel"];
    eprintln!(
        "storm: {} MiB paged out over {ROUNDS} rounds; {} pause records, {} stops counted, \
         Go's GC pauses (its whole life) {}; faults: gostw {} (in pauses {}, outside {} of which {} sent, {} \
         shed), majflt {majflt}; lost {}",
        paged >> 20,
        pauses.len(),
        n(&p["stops_counted"]),
        report.gc_pause_hist.iter().map(|b| b.count).sum::<u64>(),
        n(&faults["all"]["faults"]),
        n(&faults["in_pauses"]["faults"]),
        n(&faults["outside_pauses"]["faults"]),
        n(&faults["outside_pauses_sent"]),
        n(&faults["shed"]),
        s["lost"],
    );
    // A storm it is: more faults than the fault ring holds at once
    // (4 MiB of ~280-byte records), so some were shed.
    assert!(majflt > 15_000, "only {majflt} major faults: no storm");
    assert!(n(&faults["shed"]) > 0, "nothing shed: no storm");
    // No pause lost: a record for every stop the kernel counted, and for
    // every GC pause Go counted.
    assert_eq!(n(&p["pauses"]), pauses.len() as u64);
    assert_eq!(n(&p["stops_counted"]), pauses.len() as u64, "{p}");
    assert_eq!(n(&p["pauses_lost"]), 0);
    assert_eq!(n(&lost["ringbuf_full_pause"]), 0, "{lost}");
    assert_eq!(n(&lost["ringbuf_full_detail"]), 0, "{lost}");
    let gc_records = pauses
        .iter()
        .filter(|v| v["reason"].as_str().is_some_and(|r| r.starts_with("gc_")))
        .count() as u64;
    // Each GC the workload asked for while traced is two pauses (sweep and
    // mark termination); the heap stays under its GC goal between them.
    assert_eq!(report.gcs as usize, ROUNDS);
    assert_eq!(
        gc_records,
        2 * ROUNDS as u64,
        "GC pause records vs the GCs Go ran"
    );
    // Go 1.22+: the records' durations (Go's own) fall in Go's buckets
    // exactly as Go counted them over the traced stretch.
    let go_counts: Vec<(f64, f64, u64)> = report
        .gc_pause_hist
        .iter()
        .map(|b| {
            let earlier = before.iter().find(|e| e.ge == b.ge).map_or(0, |e| e.count);
            (b.ge, b.le, b.count - earlier)
        })
        .filter(|&(_, _, n)| n > 0)
        .collect();
    let mut ours: Vec<(f64, f64, u64)> = Vec::new();
    for p in pauses
        .iter()
        .filter(|v| v["reason"].as_str().is_some_and(|r| r.starts_with("gc_")))
    {
        let d = n(&p["duration_ns"]) as f64 / 1e9;
        let (ge, le) = report
            .gc_pause_hist
            .iter()
            .find(|b| b.ge <= d && d < b.le)
            .map_or((d, d), |b| (b.ge, b.le));
        match ours.iter_mut().find(|o| o.0 == ge) {
            Some(o) => o.2 += 1,
            None => ours.push((ge, le, 1)),
        }
    }
    ours.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert_eq!(
        ours, go_counts,
        "gostw's GC pauses bucketed like Go's vs Go's own"
    );
    // Every fault counted: the kernel's majflt, to 0.1%.
    assert!(
        majflt_agrees(n(&faults["all"]["faults"]), majflt, auto_backend()),
        "gostw counted {} major faults, /proc/PID/stat says {majflt}",
        faults["all"]["faults"]
    );
    assert_eq!(faults["counted_in_kernel"], true);
    // Every fault inside a pause has its stack: the in-pause events all
    // arrived (none lost to a full buffer) and each names a frame.
    assert_eq!(n(&lost["ringbuf_full_fault"]), 0, "{lost}");
    let in_records: u64 = s["faults"]["pauses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| n(&w["all"]["faults"]))
        .sum();
    assert!(in_records > 0, "no fault inside a pause");
    for w in s["faults"]["pauses"].as_array().unwrap() {
        if n(&w["all"]["faults"]) > 0 {
            assert!(
                !w["top_sites"].as_array().unwrap().is_empty(),
                "a pause's faults without stacks: {w}"
            );
        }
    }
}

/// The same storm through the agent, on two processes at once (128 MiB live
/// each: four times the scenario's heap together), the agent stopped through
/// each round: its pause series count every stop the kernel counted, and
/// its fault series (sent and shed faults together) every major fault of
/// both processes since they were traced.
#[test]
fn agent_counts_every_pause_and_fault_of_a_storm() {
    require_root();
    let _swap = SwapFile::create("storm-agent", 2);
    let cgroup = MemCgroup::create("gostw-storm-agent");
    let mut procs = Procs::new("storm-agent");
    // A copy of the workload at a path of this test's own, for --match.
    let path = procs.dir().join("gcswap-storm");
    std::fs::copy(build_workload("gcswap", &newest_go(), "", &[]), &path).unwrap();
    let port = free_port();
    let matching = format!("^{}$", regex::escape(&path.display().to_string()));
    start_agent(&mut procs, port, &matching, &[]);
    let agent = procs.children[0].1.id();
    let args = ["-live-mb", "128", "-goroutines", "4000", "-walkers", "8"];
    let mut workloads: Vec<GcSwap> = (0..2)
        .map(|_| GcSwap::start(&path, &args, &[("GOMAXPROCS", "8")], |pid| cgroup.add(pid)))
        .collect();
    let scrape = || {
        let (status, body) = http_get(port, "/metrics").expect("scraping the agent");
        assert_eq!(status, 200);
        body
    };
    let exe = r#"executable="gcswap-storm""#;
    wait_until("the agent to trace both", Duration::from_secs(30), || {
        let body = scrape();
        (sum_series(&body, "gostw_traced_processes", &[exe]) == 2.0).then_some(())
    });
    let base: u64 = workloads.iter().map(|w| majflt(w.pid)).sum();
    let before = scrape();
    eprintln!(
        "before the storm: {} pauses, {} stops",
        sum_series(&before, "gostw_pause_duration_seconds_count", &[exe]),
        sum_series(&before, "gostw_stop_the_world_entries_total", &[exe])
    );
    for _ in 0..ROUNDS {
        signal(agent, libc::SIGSTOP);
        for w in &mut workloads {
            swap_out(w.pid, &cgroup);
        }
        for w in &mut workloads {
            w.gc();
        }
        signal(agent, libc::SIGCONT);
        std::thread::sleep(Duration::from_millis(300));
    }
    let faults: u64 = workloads.iter().map(|w| majflt(w.pid)).sum::<u64>() - base;
    // The agent reads the kernel's counts once a second, and releases a
    // pause 50 ms after it: both series settle within a few seconds.
    let settled = |body: &str| {
        let counted = sum_series(body, "gostw_major_faults_total", &[exe]) as u64;
        let pauses = sum_series(body, "gostw_pause_duration_seconds_count", &[exe]);
        let stops = sum_series(body, "gostw_stop_the_world_entries_total", &[exe]);
        majflt_agrees(counted, faults, auto_backend()) && pauses == stops
    };
    let mut body = scrape();
    for _ in 0..20 {
        if settled(&body) {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
        body = scrape();
    }
    let counted = sum_series(&body, "gostw_major_faults_total", &[exe]) as u64;
    let shed = sum_series(
        &body,
        "gostw_agent_bpf_errors_total",
        &[r#"counter="fault_shed""#],
    ) as u64;
    let pauses = sum_series(&body, "gostw_pause_duration_seconds_count", &[exe]) as u64;
    let stops = sum_series(&body, "gostw_stop_the_world_entries_total", &[exe]) as u64;
    let lost = sum_series(&body, "gostw_agent_events_lost_total", &[]) as u64;
    eprintln!(
        "agent storm: {faults} major faults since traced, {counted} counted ({shed} shed); \
         {pauses} pauses, {stops} stops counted; {lost} events lost"
    );
    assert!(shed > 0, "nothing shed: no storm");
    assert!(
        majflt_agrees(counted, faults, auto_backend()),
        "the agent counted {counted} major faults, /proc says {faults}"
    );
    let errors: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("gostw_agent_bpf_errors_total"))
        .collect();
    assert_eq!(
        pauses, stops,
        "a stop without its pause in the series: {errors:#?}"
    );
    assert!(pauses >= 2 * 2 * ROUNDS as u64, "{pauses} pauses");
    assert_eq!(lost, 0, "events lost:\n{body}");
    for w in workloads {
        let _ = w.quit();
    }
}
