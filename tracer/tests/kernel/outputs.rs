//! `--pprof`, `--timeline` and the agent's `/debug/pprof/*` end to end: the
//! real gostw binary tracing real Go programs, its files read by the Go
//! toolchain's own `go tool pprof` and checked against gostw's own JSON
//! output of the same run, the agent's profiles against its metrics.

use std::{
    collections::HashMap,
    io::Read as _,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use serde::Deserialize;
use serde_json::Value;
use tracer::{
    binary::GoBinary,
    formats::pprof::{self, proto},
};

use crate::{
    agent::{Procs, free_port, start_agent, sum_series, wait_until},
    faults::{ARGS, ENV, GC_FRAMES, ROUNDS},
    formats::{pprof_tool, top_rows},
    scenario::{GcSwap, MemCgroup, SwapFile},
    support::{
        build_workload, finish_gostw, go_matrix, newest_go, parse_report, require_root, start_gostw,
    },
};

const GOSTW: &str = env!("CARGO_BIN_EXE_gostw");
const DEEP: &str = "main.deep19k";

/// A fresh directory for one test's files, under target/ so they can be
/// looked at afterwards.
fn out_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("target/outputs-test")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The `GOSTW_REPORT` line of scripts/workloads/stackgrowth.
#[derive(Debug, Deserialize)]
struct StackReport {
    deep_goroutines: u64,
}

fn s(p: &proto::Profile, i: i64) -> &str {
    &p.string_table[usize::try_from(i).unwrap()]
}

/// The (type, unit) pairs of a profile's samples.
fn sample_types(p: &proto::Profile) -> Vec<(String, String)> {
    p.sample_type
        .iter()
        .map(|t| (s(p, t.r#type).to_owned(), s(p, t.unit).to_owned()))
        .collect()
}

/// Sum of the first value per leaf function (the innermost line of the
/// first location), largest first.
fn by_leaf(p: &proto::Profile) -> Vec<(String, i64)> {
    let mut sums: HashMap<String, i64> = HashMap::new();
    for x in &p.sample {
        let loc = &p.location[usize::try_from(x.location_id[0]).unwrap() - 1];
        let line = loc.line.last().unwrap();
        let f = &p.function[usize::try_from(line.function_id).unwrap() - 1];
        *sums.entry(s(p, f.name).to_owned()).or_default() += x.value[0];
    }
    let mut v: Vec<_> = sums.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}

/// Sum of the first value over samples whose string label `key` is `value`.
fn with_label(p: &proto::Profile, key: &str, value: &str) -> i64 {
    p.sample
        .iter()
        .filter(|x| {
            x.label
                .iter()
                .any(|l| s(p, l.key) == key && l.str != 0 && s(p, l.str) == value)
        })
        .map(|x| x.value[0])
        .sum()
}

/// `gostw stacks --pprof` on the stackgrowth workload, exact mode, every Go
/// of the matrix: `go tool pprof -top` lists main.deep19k first with as
/// many growths as goroutines ran it (the workload counts them), the
/// number the JSON summary of the same run gives; in sampled mode (newest
/// Go) it is first too.
#[test]
fn stacks_pprof_top_shows_the_deep_function_first() {
    require_root();
    let dir = out_dir("stacks");
    for go in go_matrix() {
        let bin = build_workload("stackgrowth", &go, "", &[]);
        let file = dir.join(format!("exact-{}.pb.gz", go.version));
        let (stdout, summary) = gostw_stacks(
            &["--mode", "exact", "--exact-always"],
            &file,
            &bin,
            &["-mode", "batch", "-tasks", "3000"],
        );
        let report: StackReport = parse_report(&stdout);
        assert_eq!(report.deep_goroutines, 3000);
        let top = pprof_tool(&go, &["-top", "-sample_index=growths"], &file);
        eprintln!("Go {} exact:\n{top}", go.version);
        let rows = top_rows(&top);
        assert_eq!(
            rows.first(),
            Some(&(report.deep_goroutines.to_string(), DEEP.to_owned())),
            "{top}"
        );
        assert_eq!(
            summary["top_sites"][0]["count"], report.deep_goroutines,
            "{summary}"
        );
        let build_id = GoBinary::open(&bin).unwrap().build_id().unwrap().to_owned();
        assert!(top.contains(&format!("Build ID: {build_id}")), "{top}");
        let p = pprof::decode(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(
            sample_types(&p),
            [
                ("growths".into(), "count".into()),
                ("bytes_copied".into(), "bytes".into())
            ]
        );
        // Every location has its address in the binary's mapping.
        assert!(
            p.location
                .iter()
                .all(|l| l.mapping_id == 1 && l.address != 0)
        );
    }
    let go = newest_go();
    let bin = build_workload("stackgrowth", &go, "", &[]);
    let file = dir.join("sampled.pb.gz");
    let (_, summary) = gostw_stacks(
        &["--sample-hz", "499"],
        &file,
        &bin,
        &["-mode", "batch", "-duration", "2s"],
    );
    let top = pprof_tool(&go, &["-top"], &file);
    eprintln!("sampled:\n{top}");
    assert!(top.contains("Type: copy_cpu"), "{top}");
    assert_eq!(top_rows(&top)[0].1, DEEP, "{top}");
    let p = pprof::decode(&std::fs::read(&file).unwrap()).unwrap();
    // The copy samples the summary counted are the profile's.
    let samples: i64 = p.sample.iter().map(|x| x.value[0]).sum();
    assert_eq!(
        samples as u64,
        summary["growths"].as_u64().unwrap(),
        "{summary}"
    );
}

/// Run `gostw stacks --json OPTS --pprof FILE -- BIN ARGS`: its standard
/// output (the workload's lines and gostw's JSON summary) and the summary.
fn gostw_stacks(opts: &[&str], file: &Path, bin: &Path, args: &[&str]) -> (String, Value) {
    let out = Command::new(GOSTW)
        .args(["stacks", "--json"])
        .args(opts)
        .arg("--pprof")
        .arg(file)
        .arg("--")
        .arg(bin)
        .args(args)
        .output()
        .expect("running gostw stacks");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "gostw stacks failed: {stderr}");
    assert!(
        stderr.contains(&format!("wrote {}", file.display())),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let summary = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON summary in {stdout}"));
    (stdout, summary)
}

/// `gostw attach --json --pprof --timeline` on the page-out scenario: the
/// fault profile's `go tool pprof -top` of in-pause faults lists runtime GC
/// frames and accounts for exactly the faults the summary puts in pauses;
/// the timeline holds exactly one complete event per pause record of the
/// JSON output, with its start and duration (us, to the ns) and the record
/// as its args, and one slice per fault of those records' counts.
#[test]
fn attach_outputs_match_its_json_on_the_pageout_scenario() {
    require_root();
    let _swap = SwapFile::create("outputs-attach", 1);
    let cgroup = MemCgroup::create("gostw-outputs-attach");
    let go = newest_go();
    let bin = build_workload("gcswap", &go, "", &[]);
    let dir = out_dir("attach");
    let (pprof_file, timeline) = (dir.join("out.pb.gz"), dir.join("out.json"));
    let mut workload = GcSwap::start(&bin, ARGS, ENV, |pid| cgroup.add(pid));
    let pid = workload.pid;
    let args = [
        "attach",
        "--json",
        "--pid",
        &pid.to_string(),
        "--pprof",
        pprof_file.to_str().unwrap(),
        "--timeline",
        timeline.to_str().unwrap(),
    ];
    let (gostw, stderr) = start_gostw(&args, "fault backend");
    workload.gc();
    workload.paged_gcs(&cgroup, ROUNDS);
    let _ = workload.quit();
    let (out, err) = finish_gostw(gostw, stderr);
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let pauses: Vec<&Value> = lines.iter().filter(|v| v["type"] == "pause").collect();
    let summary = lines.last().unwrap();
    assert_eq!(summary["type"], "summary");
    assert!(pauses.len() >= 2 * ROUNDS, "{} pauses", pauses.len());

    // The timeline: one complete pause event per record, same numbers.
    let t: Value = serde_json::from_slice(&std::fs::read(&timeline).unwrap())
        .expect("the timeline is one JSON object");
    let events = t["traceEvents"].as_array().unwrap();
    let mut complete: Vec<&Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "pause")
        .collect();
    assert_eq!(
        complete.len(),
        pauses.len(),
        "one complete event per pause record"
    );
    let ns = |us: &Value| (us.as_f64().unwrap() * 1000.0).round() as u64;
    complete.sort_by_key(|e| ns(&e["ts"]));
    let mut records = pauses.clone();
    records.sort_by_key(|p| p["start_mono_ns"].as_u64().unwrap());
    for (e, p) in complete.iter().zip(&records) {
        assert_eq!(ns(&e["ts"]), p["start_mono_ns"].as_u64().unwrap(), "{e}");
        assert_eq!(ns(&e["dur"]), p["duration_ns"].as_u64().unwrap(), "{e}");
        assert_eq!(e["pid"], pid);
        let mut record = (*p).clone();
        record.as_object_mut().unwrap().remove("type");
        assert_eq!(e["args"], record, "the pause's args are its record");
    }
    // Every fault of a record is a slice (or an instant, without a begin)
    // on its thread, marked in_pause.
    let in_records: u64 = pauses
        .iter()
        .map(|p| p["faults"]["all"]["faults"].as_u64().unwrap())
        .sum();
    let faults_in_pause = events
        .iter()
        .filter(|e| e["cat"] == "fault" && e["args"]["in_pause"] == true)
        .count() as u64;
    let late = summary["lost"]["correlator"]["late_faults"]
        .as_u64()
        .unwrap();
    assert_eq!(faults_in_pause, in_records + late);
    assert!(
        in_records > 0,
        "no fault in a pause: the page-out did not take"
    );

    // The fault profile: what the summary counts, in pprof's own words.
    let faults_file = dir.join("out.faults.pb.gz");
    assert!(dir.join("out.stackgrowth.pb.gz").is_file(), "{err}");
    let pauses_profile =
        tracer::formats::pprof::decode(&std::fs::read(dir.join("out.pauses.pb.gz")).unwrap())
            .expect("out.pauses.pb.gz is not a profile");
    let caller_ns: i64 = pauses_profile.sample.iter().map(|s| s.value[1]).sum();
    let with_caller: u64 = pauses
        .iter()
        .filter(|p| p["caller"].is_array())
        .map(|p| p["duration_ns"].as_u64().unwrap())
        .sum();
    assert_eq!(
        caller_ns as u64, with_caller,
        "the pause profile's caller time"
    );
    let proc = &summary["faults"]["processes"][0];
    let (inside, all) = (
        proc["in_pauses"]["faults"].as_u64().unwrap(),
        proc["all"]["faults"].as_u64().unwrap(),
    );
    let top = pprof_tool(
        &go,
        &[
            "-top",
            "-noinlines",
            "-nodefraction=0",
            "-sample_index=major_faults",
            "-tagfocus=in_pause=true",
        ],
        &faults_file,
    );
    eprintln!("{top}");
    assert!(
        top.contains(&format!("Showing nodes accounting for {inside}, "))
            && top.contains(&format!(" of {all} total")),
        "the summary says {inside} of {all} faults in pauses:\n{top}"
    );
    let rows = top_rows(&top);
    assert!(rows[0].1.starts_with("runtime."), "{top}");
    assert!(
        rows.iter().any(|(_, f)| GC_FRAMES.contains(&f.as_str())),
        "no runtime GC frame:\n{top}"
    );
    let build_id = GoBinary::open(&bin).unwrap().build_id().unwrap().to_owned();
    assert!(top.contains(&format!("Build ID: {build_id}")), "{top}");
    let p = pprof::decode(&std::fs::read(&faults_file).unwrap()).unwrap();
    assert_eq!(
        sample_types(&p),
        [
            ("major_faults".into(), "count".into()),
            ("fault_time".into(), "nanoseconds".into())
        ]
    );
    assert_eq!(with_label(&p, "in_pause", "true") as u64, inside);
    let stopper: u64 = pauses
        .iter()
        .map(|p| p["faults"]["stopper"]["faults"].as_u64().unwrap())
        .sum();
    assert!(with_label(&p, "thread", "stopper") as u64 >= stopper);
    assert!(with_label(&p, "reason", "gc_sweep_termination") > 0);
}

/// GET over loopback, the body as bytes: (status, body).
fn http_get_bytes(port: u16, path: &str, timeout: Duration) -> (u16, Vec<u8>) {
    gostw_scenario::loopback::http_get_bytes(port, path, timeout)
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// The agent's profiles: the cumulative fault profile of a paged-out
/// process, frozen, holds exactly the faults its metrics count (in pauses
/// and in all); a `seconds=N` window of stack growth of the stackgrowth
/// workload decodes with the sampled types and main.deep19k first; bad
/// parameters are a 400.
#[test]
fn agent_serves_fault_and_stack_growth_profiles() {
    require_root();
    let _swap = SwapFile::create("outputs-agent", 1);
    let cgroup = MemCgroup::create("gostw-outputs-agent");
    let go = newest_go();
    let gcswap = build_workload("gcswap", &go, "", &[]);
    let growth = build_workload("stackgrowth", &go, "", &[]);
    let mut procs = Procs::new("outputs-agent");
    let (gcswap, growth) = (procs.own(&gcswap), procs.own(&growth));
    let port = free_port();
    let path = |b: &PathBuf| regex::escape(&b.canonicalize().unwrap().display().to_string());
    let matching = format!("^({}|{})$", path(&gcswap), path(&growth));
    start_agent(&mut procs, port, &matching, &[]);
    let metrics = || {
        let (_, b) = http_get_bytes(port, "/metrics", Duration::from_secs(10));
        format!("{}\n", String::from_utf8_lossy(&b))
    };
    let exe = r#"executable="gcswap""#;
    let mut workload = GcSwap::start(&gcswap, ARGS, ENV, |pid| cgroup.add(pid));
    let pid = workload.pid;
    wait_until("gcswap to be traced", Duration::from_secs(30), || {
        (sum_series(&metrics(), "gostw_traced_processes", &[exe]) == 1.0).then_some(())
    });
    workload.paged_gcs(&cgroup, ROUNDS);
    // Frozen, and settled (the correlator decides within 2 s).
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) }, 0);
    std::thread::sleep(Duration::from_millis(2500));
    let body = metrics();
    let (status, gz) = http_get_bytes(
        port,
        "/debug/pprof/faults?executable=gcswap",
        Duration::from_secs(10),
    );
    assert_eq!(status, 200);
    let p = pprof::decode(&gz).expect("the fault profile decodes");
    assert_eq!(
        sample_types(&p),
        [
            ("major_faults".into(), "count".into()),
            ("fault_time".into(), "nanoseconds".into())
        ]
    );
    let total: i64 = p.sample.iter().map(|x| x.value[0]).sum();
    let in_pause = with_label(&p, "in_pause", "true");
    let m_total = sum_series(&body, "gostw_major_faults_total", &[exe]) as i64;
    let m_in = sum_series(
        &body,
        "gostw_major_faults_total",
        &[exe, r#"in_pause="true""#],
    ) as i64;
    eprintln!(
        "agent fault profile: {total} faults, {in_pause} in pauses; metrics {m_total}, {m_in}"
    );
    assert!(in_pause > 0, "no fault in a pause");
    assert_eq!((total, in_pause), (m_total, m_in));
    assert_eq!(with_label(&p, "executable", "gcswap"), total);
    let frames: Vec<String> = p
        .function
        .iter()
        .map(|f| s(&p, f.name).to_owned())
        .collect();
    assert!(
        GC_FRAMES.iter().any(|f| frames.iter().any(|g| g == f)),
        "no GC frame in {frames:?}"
    );
    // SAFETY: as above.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) };
    let _ = workload.quit();

    // A typo never selects everything; seconds are checked.
    for bad in [
        "/debug/pprof/faults?exectuable=gcswap",
        "/debug/pprof/stackgrowth?seconds=0",
    ] {
        let (status, body) = http_get_bytes(port, bad, Duration::from_secs(10));
        assert_eq!(status, 400, "{bad}: {}", String::from_utf8_lossy(&body));
    }

    // Stack growth over the next 3 s, while the workload grows stacks.
    let mut child = Command::new(&growth)
        .args(["-mode", "batch", "-duration", "6s"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until("stackgrowth to be traced", Duration::from_secs(30), || {
        (sum_series(
            &metrics(),
            "gostw_traced_processes",
            &[r#"executable="stackgrowth""#],
        ) == 1.0)
            .then_some(())
    });
    let (status, gz) = http_get_bytes(
        port,
        "/debug/pprof/stackgrowth?seconds=3&executable=stackgrowth",
        Duration::from_secs(20),
    );
    let _ = child.wait();
    assert_eq!(status, 200);
    let p = pprof::decode(&gz).expect("the stack-growth profile decodes");
    assert_eq!(
        sample_types(&p),
        [
            ("copy_samples".into(), "count".into()),
            ("copy_cpu".into(), "nanoseconds".into())
        ]
    );
    assert!(
        (3_000_000_000..4_000_000_000).contains(&p.duration_nanos),
        "window of {} ns",
        p.duration_nanos
    );
    let leaves = by_leaf(&p);
    eprintln!("agent stack-growth window: {leaves:?}");
    assert_eq!(
        leaves.first().map(|l| l.0.as_str()),
        Some(DEEP),
        "{leaves:?}"
    );
    // Only the selected executable.
    assert_eq!(
        with_label(&p, "executable", "stackgrowth"),
        p.sample.iter().map(|x| x.value[0]).sum::<i64>()
    );
}

/// A Go program that pauses often (a forced GC and more every 10 ms) for
/// `secs`.
fn start_pausing(secs: u32) -> std::process::Child {
    let bin = build_workload("stw", &newest_go(), "", &[]);
    Command::new(bin)
        .args(["-duration", &format!("{secs}s"), "-interval", "10ms"])
        .args(["-alloc-mb", "4", "-gc", "1"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("starting stw")
}

/// gostw's exit status, waiting at most `limit` (then it is killed and the
/// test fails).
fn exits_within(gostw: &mut std::process::Child, limit: Duration, what: &str) -> Duration {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(status) = gostw.try_wait().unwrap() {
            assert_eq!(
                status.code(),
                Some(0),
                "{what}: gostw ended with {status:?}"
            );
            return t0.elapsed();
        }
        if t0.elapsed() > limit {
            let _ = gostw.kill();
            let _ = gostw.wait();
            panic!("{what}: gostw still ran {limit:?} after its reader went away");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `attach --json | head -1`: once the reader of its standard output has
/// gone gostw stops tracing at once and ends cleanly (exit 0, the summary
/// on standard error), whether it notices by a failed write (pauses being
/// printed) or by the pipe alone (none printed: --slow-pause 1h).
#[test]
fn attach_ends_when_its_reader_goes() {
    use std::io::{BufRead as _, BufReader};

    require_root();
    let mut workload = start_pausing(60);
    let pid = workload.id().to_string();
    for (case, extra) in [("pauses printed", "0"), ("nothing printed", "1h")] {
        let (mut gostw, mut err) = start_gostw(
            &["attach", "--json", "--pid", &pid, "--slow-pause", extra],
            "tracing pid",
        );
        let stdout = gostw.stdout.take().unwrap();
        if extra == "0" {
            let mut first = String::new();
            BufReader::new(stdout).read_line(&mut first).unwrap();
            assert!(first.contains(r#""type":"pause""#), "{first}");
        } else {
            std::thread::sleep(Duration::from_millis(500));
            drop(stdout);
        }
        // The summary goes to standard error: read it as it comes.
        let rest = std::thread::spawn(move || {
            let mut rest = String::new();
            err.read_to_string(&mut rest).unwrap();
            rest
        });
        let took = exits_within(&mut gostw, Duration::from_secs(10), case);
        let rest = rest.join().unwrap();
        assert!(
            took < Duration::from_secs(3),
            "{case}: took {took:?}\n{rest}"
        );
        assert!(
            rest.contains("standard output was closed"),
            "{case}: {rest}"
        );
        assert!(rest.contains(r#""type":"summary""#), "{case}: {rest}");
        assert!(!rest.contains("Broken pipe"), "{case}: {rest}");
    }
    workload.kill().unwrap();
    workload.wait().unwrap();
}

/// SIGHUP (the terminal closed) ends `attach` as SIGTERM does: exit 0, the
/// summary written, the timeline complete JSON.
#[test]
fn attach_ends_cleanly_on_sighup() {
    require_root();
    let dir = out_dir("sighup");
    let timeline = dir.join("t.json");
    let mut workload = start_pausing(60);
    let pid = workload.id().to_string();
    let (gostw, _err) = start_gostw(
        &[
            "attach",
            "--json",
            "--slow-pause",
            "1h",
            "--pid",
            &pid,
            "--timeline",
            timeline.to_str().unwrap(),
        ],
        "tracing pid",
    );
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: signalling the gostw this test started.
    unsafe { libc::kill(gostw.id() as libc::pid_t, libc::SIGHUP) };
    let out = gostw.wait_with_output().unwrap();
    workload.kill().unwrap();
    workload.wait().unwrap();
    assert_eq!(out.status.code(), Some(0), "{:?}", out.status);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(r#""type":"summary""#), "{stdout}");
    let t: Value = serde_json::from_slice(&std::fs::read(&timeline).unwrap()).unwrap();
    assert!(
        t["traceEvents"].as_array().is_some_and(|e| !e.is_empty()),
        "{t}"
    );
}

/// A program that exits while gostw attaches to it ends the trace as an
/// exit does ("pid N exited", exit 0, a summary), never as a failure to
/// trace it or with raw log lines. The program is killed at moments spread
/// over the attach (measured first), reaped at once or left a zombie.
#[test]
fn attach_to_a_program_exiting_meanwhile_says_it_exited() {
    require_root();
    // How long attaching takes here.
    let mut workload = start_pausing(60);
    let t0 = std::time::Instant::now();
    let (gostw, _err) = start_gostw(
        &["attach", "--pid", &workload.id().to_string()],
        "tracing pid",
    );
    let attach = t0.elapsed();
    workload.kill().unwrap();
    workload.wait().unwrap();
    let _ = gostw.wait_with_output();
    eprintln!("attaching takes {attach:?}");
    const ATTEMPTS: u32 = 20;
    for i in 0..ATTEMPTS {
        let mut workload = start_pausing(60);
        let pid = workload.id();
        // Let the Go runtime start: gostw checks the program is Go.
        std::thread::sleep(Duration::from_millis(100));
        let gostw = Command::new(GOSTW)
            .args([
                "attach",
                "--json",
                "--slow-pause",
                "1h",
                "--pid",
                &pid.to_string(),
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // From a third of the attach time to a little past it.
        let at = attach.mul_f64(0.3 + 0.9 * f64::from(i) / f64::from(ATTEMPTS));
        std::thread::sleep(at);
        workload.kill().unwrap();
        if i % 2 == 0 {
            workload.wait().unwrap();
        }
        let out = gostw.wait_with_output().unwrap();
        workload.wait().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let what = format!("attempt {i}, killed after {at:?}:\n{err}");
        assert!(err.contains(&format!("gostw: pid {pid} exited")), "{what}");
        assert_eq!(out.status.code(), Some(0), "{what}");
        assert!(stdout.contains(r#""type":"summary""#), "{what}\n{stdout}");
        for bad in ["cannot trace", "No such file", "WARN", "tracer::"] {
            assert!(!err.contains(bad), "{what}");
        }
    }
}

fn tracefs_mounts() -> usize {
    std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(2) == Some("tracefs"))
        .count()
}

/// Puts tracefs back at /sys/kernel/tracing when the test ends, if it was
/// mounted there before.
struct RemountTracefs(bool);

impl Drop for RemountTracefs {
    fn drop(&mut self) {
        if self.0 && tracefs_mounts() == 0 {
            let ok = Command::new("mount")
                .args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "could not mount tracefs back at /sys/kernel/tracing");
        }
    }
}

/// gostw mounts tracefs when nothing has (to attach tracepoints) and
/// unmounts it when it ends: the system is left as it was found.
#[test]
fn attach_unmounts_the_tracefs_it_mounted() {
    require_root();
    let _restore = RemountTracefs(tracefs_mounts() > 0);
    // Lazily: tracefs files another program holds open stay valid.
    let c = std::ffi::CString::new("/sys/kernel/tracing").unwrap();
    while tracefs_mounts() > 0 {
        // SAFETY: a valid path.
        assert_eq!(
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) },
            0,
            "umount tracefs"
        );
    }
    assert!(
        !Path::new("/sys/kernel/debug/tracing/events").is_dir(),
        "debugfs provides tracefs here: gostw would not mount it, nothing to test"
    );
    let mut workload = start_pausing(60);
    let pid = workload.id().to_string();
    let (gostw, _err) = start_gostw(
        &["attach", "--pid", &pid, "--duration", "1s"],
        "tracing pid",
    );
    let mounted_while_tracing = tracefs_mounts();
    let out = gostw.wait_with_output().unwrap();
    workload.kill().unwrap();
    workload.wait().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    assert_eq!(mounted_while_tracing, 1, "gostw did not mount tracefs");
    assert_eq!(tracefs_mounts(), 0, "gostw left tracefs mounted");
}
