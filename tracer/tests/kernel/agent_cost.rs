//! The agent's own cost, read from its own /metrics: the per-program BPF
//! series agree with the kernel's counts (`bpftool`), and with 20 traced Go
//! processes it stays within its budget (1% of a core, 40 MB resident),
//! net of what the host's own activity costs an agent that traces nothing
//! (a control agent beside it, same window).

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::{
    agent::{Procs, free_port, http_get, promtool_check, run_counts, sum_series, wait_until},
    support::{build_workload, gostw_stdout, newest_go, require_root},
};

/// The release build of gostw (the budget is that of the binary users
/// run; a dev build's is several times slower), built by `cargo xtask
/// test` before the kernel tests, which names it even where the tests
/// themselves were built otherwise (a plain `cargo test`).
fn release_gostw() -> std::path::PathBuf {
    let path = std::env::var_os("GOSTW_RELEASE_BIN").unwrap_or_else(|| {
        panic!(
            "GOSTW_RELEASE_BIN is not set: run the kernel tests through `cargo xtask test`, \
             which builds the release gostw first"
        )
    });
    let path = std::path::PathBuf::from(path);
    assert!(path.is_file(), "no release gostw at {}", path.display());
    path
}

/// Traced processes of the budget.
const PROCESSES: usize = 20;
/// The budget: a share of one core, and resident memory.
const MAX_CPU_SHARE: f64 = 0.01;
const MAX_RSS_BYTES: f64 = 40e6;

fn metrics(port: u16) -> String {
    let (status, body) = http_get(port, "/metrics").expect("scraping the agent");
    assert_eq!(status, 200, "{body}");
    body
}

/// The value of the unlabelled series `name`.
fn value(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{body}"))
}

/// 20 Go processes with a GC or two every second each, traced
/// by one agent for a steady window: the agent's CPU share and resident
/// memory, as its own metrics say, are within the budget; its BPF series
/// count what the kernel counted for its programs; /metrics passes promtool.
#[test]
fn agent_with_20_processes_stays_within_its_budget() {
    require_root();
    let gostw = release_gostw();
    let mut procs = Procs::new("agent-cost");
    // The workload from a path of this test's own: the agent matches it, and
    // no other process on the host (another copy of the same workload
    // included) can be traced into the budget.
    let bin = procs.dir().join("stw-agent-cost");
    std::fs::copy(build_workload("stw", &newest_go(), "", &[]), &bin).unwrap();
    let port = free_port();
    let matching = format!(
        "^{}$",
        regex::escape(&bin.canonicalize().unwrap().display().to_string())
    );
    // The agent as deployed: release build, default poll interval.
    let log = procs.dir().join("agent.log");
    let agent = procs.spawn(
        "gostw agent",
        Command::new(&gostw)
            .args(["agent", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--match", &matching])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap()),
    );
    // A control agent that traces nothing: what the host's own activity
    // (processes started by others, each looked at by any agent) costs an
    // agent over the same window, taken out of the budget's measure.
    let control_port = free_port();
    procs.spawn(
        "control agent",
        Command::new(&gostw)
            .args(["agent", "--listen", &format!("127.0.0.1:{control_port}")])
            .args(["--match", "^/nothing-is-matched-by-this$"])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    for p in [port, control_port] {
        wait_until("the agents' /healthz", Duration::from_secs(30), || {
            http_get(p, "/healthz").filter(|(s, _)| *s == 200)
        });
    }
    let mut pids = Vec::new();
    for i in 0..PROCESSES {
        pids.push(
            procs.spawn(
                &format!("go {i}"),
                Command::new(&bin)
                    .args(["-duration", "60s", "-interval", "1s", "-alloc-mb", "8"])
                    .args(["-live-mb", "4", "-gc", "1", "-readmemstats", "0"])
                    .args(["-gomaxprocs", "0"])
                    .env("GOMAXPROCS", "2")
                    .stdout(Stdio::null()),
            ),
        );
    }
    wait_until(
        "the agent to trace every process",
        Duration::from_secs(30),
        || {
            let n = value(&metrics(port), "gostw_agent_processes_traced");
            (n as usize == PROCESSES).then_some(())
        },
    );
    // Past start-up (binary analysis, attach): a steady window.
    std::thread::sleep(Duration::from_secs(5));
    let (b0, c0, t0) = (metrics(port), metrics(control_port), Instant::now());
    std::thread::sleep(Duration::from_secs(30));
    let (b1, c1, t1) = (metrics(port), metrics(control_port), Instant::now());
    promtool_check(&b1);
    let secs = (t1 - t0).as_secs_f64();
    let cpu_of = |a: &str, b: &str| {
        (value(b, "process_cpu_seconds_total") - value(a, "process_cpu_seconds_total")) / secs
    };
    let (whole, host) = (cpu_of(&b0, &b1), cpu_of(&c0, &c1));
    let cpu = whole - host;
    eprintln!(
        "agent CPU {:.3}% of a core, control agent (tracing nothing) {:.3}%",
        100.0 * whole,
        100.0 * host
    );
    let rss = value(&b1, "process_resident_memory_bytes");
    let bpf = (sum_series(&b1, "gostw_bpf_program_run_seconds_total", &[])
        - sum_series(&b0, "gostw_bpf_program_run_seconds_total", &[]))
        / secs;
    let pauses = sum_series(&b1, "gostw_stop_the_world_entries_total", &[])
        - sum_series(&b0, "gostw_stop_the_world_entries_total", &[]);
    eprintln!(
        "agent with {PROCESSES} traced processes: {:.3}% of a core, RSS {:.1} MB, \
         BPF programs {:.3}% of a core, {:.0} pauses/s",
        100.0 * cpu,
        rss / 1e6,
        100.0 * bpf,
        pauses / secs
    );
    let agent_log = || std::fs::read_to_string(&log).unwrap_or_default();
    // The window saw real work: the budget is not met by tracing nothing.
    assert!(
        pauses / secs > 10.0,
        "only {pauses} pauses in {secs:.0} s; agent log:\n{}",
        agent_log()
    );
    // The agent worked (its CPU is read, not zero); its cost net of the
    // control's may come out near zero on an idle host, never above budget.
    assert!(whole > 0.0, "the agent's CPU was not read");
    assert!(
        cpu <= MAX_CPU_SHARE,
        "agent CPU {:.3}% of a core net of the control's (budget {}%)",
        100.0 * cpu,
        100.0 * MAX_CPU_SHARE
    );
    assert!(
        rss > 1e6 && rss <= MAX_RSS_BYTES,
        "agent RSS {:.1} MB (budget {} MB)",
        rss / 1e6,
        MAX_RSS_BYTES / 1e6
    );

    // Once nothing is traced no pause probe runs: the series must then
    // equal the kernel's own count of the agent's stw_stop program.
    for pid in pids {
        // SAFETY: plain kill(2) of our own child.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    wait_until("the agent to untrace them", Duration::from_secs(30), || {
        (value(&metrics(port), "gostw_agent_processes_traced") == 0.0).then_some(())
    });
    let kernel = run_counts(agent, &["stw_stop"]);
    assert!(kernel > 0, "stw_stop never ran");
    wait_until(
        "gostw_bpf_program_runs_total to catch up",
        Duration::from_secs(10),
        || {
            let series = sum_series(
                &metrics(port),
                "gostw_bpf_program_runs_total",
                &["program=\"stw_stop\""],
            );
            (series as u64 == kernel).then_some(())
        },
    );
}

/// `gostw run --json`: the summary's health section lists the programs the
/// kernel ran for it, with `stw_stop` run once per pause of the traced
/// program (it is the only process of that binary), its own CPU and peak
/// RSS, and the same loss total as `lost`.
#[test]
fn run_summary_reports_its_own_cost() {
    require_root();
    let bin = build_workload("stw", &newest_go(), "", &[]);
    let stdout = gostw_stdout(
        Command::new(env!("CARGO_BIN_EXE_gostw"))
            .args(["run", "--json", "--"])
            .arg(&bin)
            .args(["-gc", "5", "-alloc-mb", "64"]),
        "gostw run",
    );
    let summary: serde_json::Value = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["type"] == "summary")
        .unwrap_or_else(|| panic!("no summary in:\n{stdout}"));
    let h = &summary["health"];
    assert_eq!(h["bpf_stats_enabled"], true, "{h}");
    // Each program's cost on this kernel and CPU (the arm64 guest's figures
    // in the book come from here).
    for p in h["programs"].as_array().into_iter().flatten() {
        eprintln!(
            "{}: {} runs, {:.0} ns/run",
            p["program"].as_str().unwrap_or("?"),
            p["runs"],
            p["ns_per_run"].as_f64().unwrap_or(f64::NAN)
        );
    }
    let pauses = summary["processes"][0]["pauses"].as_u64().unwrap();
    assert!(pauses >= 10, "{pauses} pauses");
    let stop = h["programs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["program"] == "stw_stop")
        .unwrap_or_else(|| panic!("no stw_stop in {h}"));
    assert_eq!(stop["runs"].as_u64(), Some(pauses), "{h}");
    assert!(
        stop["ns_per_run"].as_f64().is_some_and(|ns| ns > 0.0),
        "{h}"
    );
    assert!(h["bpf_ns"].as_u64().unwrap() >= stop["run_ns"].as_u64().unwrap());
    assert!(h["cpu_ns"].as_u64().unwrap() > 0, "{h}");
    assert!(h["peak_rss_bytes"].as_u64().unwrap() > 1 << 20, "{h}");
    assert_eq!(h["events_lost"], summary["lost"]["total"], "{h}");
}
