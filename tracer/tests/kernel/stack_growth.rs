//! Stack growth, checked against what the `stackgrowth` workload knows of
//! itself. Its GC is off in batch and pool modes, so every goroutine starts
//! with a 2 KB stack and the first deep19k call (a ~19 KB frame) grows it
//! exactly once, straight to 32 KB; the workload counts those goroutines
//! (`deep_goroutines`). The exact mode must count exactly that many growths
//! at main.deep19k, on every Go version of the matrix.

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use serde::Deserialize;
use tracer::{
    binary::{AllglenSource, GoBinary},
    kernel::{
        CoreOptions,
        stacks::{DutyCycle, StackGrowthOptions},
    },
    sink::report::{Output, ReportSink, View},
    stackgrowth::{Mode, StackGrowthSummary, goroutines},
    targets::child::StoppedChild,
};

use crate::support::{
    GoToolchain, build_workload, engine, go_matrix, gostw_stdout, newest_go, parse_report,
    require_root, runtime,
};

/// Run `path args` traced for stack growth with `opts`, pumping the engine
/// while it runs; returns its standard output and the report sink.
fn run_stacks(
    path: &std::path::Path,
    args: &[&str],
    opts: StackGrowthOptions,
) -> (String, ReportSink) {
    let rt = runtime();
    let _guard = rt.enter();
    let mut engine = engine(CoreOptions {
        faults: None,
        stacks: Some(opts),
        ..CoreOptions::default()
    });
    let mut sink = ReportSink::new(
        View::Stacks,
        Output::new(
            Box::new(std::io::sink()),
            true,
            tracer::model::pause::SlowThreshold::NONE,
        ),
        false,
        Some(opts.mode),
    );
    let stopped = StoppedChild::spawn(
        path.as_os_str(),
        &args.iter().map(std::ffi::OsStr::new).collect::<Vec<_>>(),
        |cmd| {
            cmd.stdout(Stdio::piped());
        },
    )
    .unwrap();
    let pid = stopped.pid();
    engine.trace_process(pid, path, &mut sink).unwrap();
    let mut child = stopped.resume().unwrap();
    while child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(20));
        engine.pump(&mut sink);
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "workload failed: {:?}", out.status);
    engine.process_exited(pid, &mut sink);
    // The kernel's per-site rows of a finished process are dropped.
    assert!(engine.core().stack_sites(pid).unwrap().is_empty());
    engine.finish(&mut sink);
    (String::from_utf8_lossy(&out.stdout).into_owned(), sink)
}

/// The `GOSTW_REPORT` line of scripts/workloads/stackgrowth.
#[derive(Debug, Deserialize)]
struct StackReport {
    deep_calls: u64,
    deep_goroutines: u64,
    elapsed_ns: u64,
    peak_goroutines: u64,
    num_gc: u64,
}

const DEEP: &str = "main.deep19k";

/// How much slower the batch workload grows stacks while the exact probe is
/// attached, at most: 3.1 in the fresh-clone run of 6f73438 (135 975
/// growths a second given against 421 566 by the workload's own count).
const PROBED_SLOWDOWN: f64 = 4.0;
const CALLER: &str = "main.task";

/// Run the workload with `args` under the stack-growth probes of `mode`.
fn trace(
    go: &GoToolchain,
    mode: Mode,
    sample_hz: u64,
    args: &[&str],
) -> (StackGrowthSummary, StackReport) {
    let path = build_workload("stackgrowth", go, "", &[]);
    let opts = StackGrowthOptions {
        mode,
        sample_hz,
        duty: DutyCycle::ALWAYS,
        exact_event_every: 16,
    };
    let (stdout, mut sink) = run_stacks(&path, args, opts);
    let report: StackReport = parse_report(&stdout);
    sink.goroutines = Some(report.peak_goroutines);
    let summary = sink.stack_summary().expect("stack growth is traced");
    eprintln!(
        "Go {} {mode:?} {args:?}: {report:?}\n{}",
        go.version,
        summary.render_text()
    );
    (summary, report)
}

/// Growths (exact) or samples (sampled) whose site is `function`.
fn at(summary: &StackGrowthSummary, function: &str) -> u64 {
    summary
        .top_sites
        .iter()
        .filter(|s| s.site.function == function)
        .map(|s| s.count)
        .sum()
}

#[test]
fn deep_function_is_the_top_site_and_32k_is_recommended() {
    require_root();
    let go = newest_go();
    let (s, report) = trace(&go, Mode::Exact, 0, &["-mode", "batch", "-tasks", "20000"]);
    assert!(s.growths > 0, "no growth counted");
    let top = &s.top_sites[0];
    assert_eq!(top.site.function, DEEP, "{s:#?}");
    assert_eq!(top.caller.function, CALLER);
    // Sites come with file:line from pclntab.
    let file = &top.site.file;
    assert!(file.ends_with("stackgrowth/main.go"), "{:?}", top.site);
    assert!(top.site.line > 0 && top.caller.line > 0);
    // One growth per goroutine that ran deep19k, 2 KB -> 32 KB in one step.
    assert_eq!(top.count, report.deep_goroutines);
    assert_eq!(top.old_sizes.get(&2048), Some(&report.deep_goroutines));
    assert_eq!(top.new_sizes.get(&32768), Some(&report.deep_goroutines));
    // A sampled goroutine stack through the site, walked by frame pointers.
    let stack: Vec<&str> = top
        .example_stack
        .iter()
        .map(|f| f.function.as_str())
        .collect();
    assert_eq!(
        stack[..3],
        [DEEP, CALLER, "main.runBatch.func1"],
        "{stack:?}"
    );
    assert!(s.events > 0);
    assert_eq!(s.recommendation.starting_stack_bytes, Some(32 * 1024));
    assert!(!s.recommendation.negligible);
    assert!(s.copied_bytes > 0 && s.growths_per_sec.unwrap() > 0.0);
}

#[test]
fn counts_equal_the_workload_on_every_go_version() {
    require_root();
    for go in go_matrix() {
        let (s, report) = trace(&go, Mode::Exact, 0, &["-mode", "batch", "-tasks", "3000"]);
        assert_eq!(report.deep_goroutines, 3000);
        assert_eq!(
            at(&s, DEEP),
            report.deep_goroutines,
            "Go {}: growths at {DEEP}",
            go.version
        );
        assert_eq!(s.top_sites[0].caller.function, CALLER, "Go {}", go.version);
        assert_eq!(s.recommendation.starting_stack_bytes, Some(32 * 1024));
        let (s, report) = trace(
            &go,
            Mode::Exact,
            0,
            &["-mode", "pool", "-tasks", "3000", "-workers", "4"],
        );
        assert_eq!(report.deep_calls, 3000);
        assert_eq!(at(&s, DEEP), report.deep_goroutines, "Go {}", go.version);
        // However many of the 4 workers got a task.
        assert!((1..=4).contains(&report.deep_goroutines), "{report:?}");
        // The sampled mode reads g.atomicstatus, whose offset moves too.
        let (s, _) = trace(
            &go,
            Mode::Sampled,
            499,
            &["-mode", "batch", "-duration", "1s"],
        );
        assert_eq!(s.top_sites[0].site.function, DEEP, "Go {}", go.version);
    }
}

#[test]
fn goroutine_per_batch_grows_a_worker_pool_does_not() {
    require_root();
    let go = newest_go();
    let batch = ["-mode", "batch", "-tasks", "20000", "-duration", "2s"];
    let pool = ["-mode", "pool", "-tasks", "20000", "-duration", "2s"];
    // Default (sampled) mode: share of CPU time spent copying stacks.
    let (sb, rb) = trace(&go, Mode::Sampled, 499, &batch);
    let (sp, rp) = trace(&go, Mode::Sampled, 499, &pool);
    assert_eq!(rb.deep_calls % 20000, 0);
    assert!(rp.deep_calls >= rb.deep_calls / 4, "{rp:?}");
    let (share_b, share_p) = (sb.cpu_share.unwrap(), sp.cpu_share.unwrap());
    assert!(share_b > 0.05, "batch: {:.3}", share_b);
    assert!(share_p < 0.01, "pool: {:.3}", share_p);
    assert_eq!(sb.top_sites[0].site.function, DEEP);
    assert!(!sb.recommendation.negligible);
    assert!(sp.recommendation.negligible, "{:?}", sp.recommendation);
    // Exact mode: one growth per task against one per worker.
    let (eb, rb) = trace(&go, Mode::Exact, 0, &["-mode", "batch", "-tasks", "10000"]);
    let (ep, rp) = trace(&go, Mode::Exact, 0, &["-mode", "pool", "-tasks", "10000"]);
    assert_eq!(at(&eb, DEEP), 10000);
    assert_eq!(at(&ep, DEEP), rp.deep_goroutines);
    assert!(at(&ep, DEEP) <= 4, "{rb:?} {rp:?}");
}

#[test]
fn preemption_is_not_growth() {
    require_root();
    let go = newest_go();
    // Eight CPU-bound goroutines with tiny frames on two CPUs, preempted by
    // the scheduler every 10 ms and by every GC's stop-the-world: each
    // preemption enters runtime.newstack (stackguard0 = stackPreempt).
    let args = ["-mode", "preempt", "-duration", "2s"];
    let (s, r) = trace(&go, Mode::Exact, 0, &args);
    assert!(r.num_gc >= 3, "{r:?}");
    assert_eq!(at(&s, "main.shallow"), 0);
    assert!(s.growths < 20, "{} growths", s.growths);
    assert!(s.recommendation.negligible);
    let (s, _) = trace(&go, Mode::Sampled, 499, &args);
    assert!(s.cpu_samples > 100, "{} samples", s.cpu_samples);
    assert!(s.cpu_share.unwrap() < 0.01, "{:?}", s.cpu_share);
    assert!(s.recommendation.negligible);
}

#[test]
fn sampled_and_exact_agree_on_the_top_site() {
    require_root();
    let go = newest_go();
    let (exact, _) = trace(&go, Mode::Exact, 0, &["-mode", "batch", "-tasks", "10000"]);
    // The sampled side through the command line, as an SRE runs it.
    let path = build_workload("stackgrowth", &go, "", &[]);
    let stdout = gostw_stdout(
        Command::new(env!("CARGO_BIN_EXE_gostw"))
            .args(["stacks", "--json", "--sample-hz", "499", "--"])
            .arg(&path)
            .args(["-mode", "batch", "-duration", "3s"]),
        "gostw stacks",
    );
    let (report, sampled) = report_and_summary(&stdout);
    eprintln!("{sampled:#}");
    assert_eq!(sampled["mode"], "sampled");
    assert_eq!(sampled["top_sites"][0]["site"]["function"], DEEP);
    assert_eq!(exact.top_sites[0].site.function, DEEP);
    assert_eq!(
        sampled["top_sites"][0]["caller"]["function"],
        exact.top_sites[0].caller.function.as_str()
    );
    assert_eq!(sampled["recommendation"]["starting_stack_bytes"], 32768);
    // The memory estimate is for the peak goroutine count, not for all
    // goroutines started (10 000 here): never below the most the program
    // itself saw at once (runtime.NumGoroutine just after starting a batch
    // of 64, without the runtime's own goroutines, which gostw counts), even
    // when a batch lives for less than the pause between two walks.
    let rec = &sampled["recommendation"];
    assert_eq!(rec["goroutines_source"], "runtime.allglen: peak goroutines");
    let n = rec["goroutines"].as_u64().unwrap();
    assert!(
        n >= report.peak_goroutines && n < 1000,
        "{n} goroutines, the program saw {} at once",
        report.peak_goroutines
    );
}

#[test]
fn pie_and_stripped_binaries_are_probed_and_symbolized() {
    require_root();
    let go = newest_go();
    let variants: [(&str, &[&str]); 2] = [
        ("-pie", &["-buildmode=pie"]),
        // No .symtab: copystack and the sites come from pclntab.
        ("-stripped", &["-ldflags=-s -w"]),
    ];
    for (variant, build_args) in variants {
        let path = build_workload("stackgrowth", &go, variant, build_args);
        for mode in ["exact", "sampled"] {
            let stdout = gostw_stdout(
                Command::new(env!("CARGO_BIN_EXE_gostw"))
                    .args(["stacks", "--json", "--exact-always", "--sample-hz", "499"])
                    .args(["--mode", mode, "--"])
                    .arg(&path)
                    .args(["-mode", "batch", "-duration", "1s"]),
                &format!("{variant} {mode}"),
            );
            let json = stdout.lines().find(|l| l.starts_with('{')).unwrap();
            let s: serde_json::Value = serde_json::from_str(json).unwrap();
            let site = &s["top_sites"][0]["site"];
            assert_eq!(site["function"], DEEP, "{variant} {mode}: {s:#}");
            assert!(
                site["file"].as_str().unwrap().ends_with("main.go"),
                "{site}"
            );
            assert_eq!(
                s["recommendation"]["starting_stack_bytes"], 32768,
                "{variant} {mode}"
            );
        }
    }
}

#[test]
fn exact_mode_duty_cycle_reports_the_attached_share() {
    require_root();
    let go = newest_go();
    let path = build_workload("stackgrowth", &go, "", &[]);
    let opts = StackGrowthOptions {
        mode: Mode::Exact,
        duty: DutyCycle {
            on: Duration::from_millis(300),
            period: Duration::from_secs(2),
            max_events: u64::MAX,
        },
        ..Default::default()
    };
    let (stdout, sink) = run_stacks(&path, &["-mode", "batch", "-duration", "4s"], opts);
    let report: StackReport = parse_report(&stdout);
    let s = sink.stack_summary().unwrap();
    eprintln!("{report:?}\n{}", s.render_text());
    // 300 ms out of every 2 s, over a ~4 s run; detaching a uprobe takes
    // 100 ms or more here (more under load), and that time counts as
    // attached.
    assert!(
        (0.05..0.6).contains(&s.attached_fraction),
        "attached {:.2} of the time",
        s.attached_fraction
    );
    // Only the growths of the attached windows were seen, all at deep19k.
    let seen = at(&s, DEEP);
    assert!(
        seen > 0 && seen < report.deep_goroutines,
        "{seen} of {report:?}"
    );
    // Rates are per attached second, not diluted by the detached time, and
    // they are the rate under the probe: each growth traps into the kernel
    // while attached, which slows the program then (the reason exact mode is
    // duty-cycled). So against the workload's own count over the whole run
    // (each fresh goroutine grows once, at deep19k) the rate given is at
    // most the unprobed rate and at least a fraction of it; the diluted
    // rate over all the run is well below it.
    let truth = report.deep_goroutines as f64 / (report.elapsed_ns as f64 / 1e9);
    let given = s.growths_per_sec.expect("a growth rate in exact mode");
    let diluted = s.growths as f64 / s.elapsed_secs;
    eprintln!(
        "growths: {given:.0}/s given, {truth:.0}/s by the workload's count, {diluted:.0}/s over all the run"
    );
    assert!(
        given <= truth * 1.05 && given * PROBED_SLOWDOWN >= truth,
        "{given:.0} growths a second given, {truth:.0} counted by the workload"
    );
    assert!(
        given > 1.5 * diluted,
        "{given:.0}/s given, {diluted:.0}/s diluted"
    );
}

/// The `GOSTW_REPORT` line and gostw's JSON summary in one output.
fn report_and_summary(stdout: &str) -> (StackReport, serde_json::Value) {
    let report: StackReport = parse_report(stdout);
    let json = stdout
        .lines()
        .rfind(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON summary in {stdout}"));
    (report, serde_json::from_str(json).unwrap())
}

/// On a stripped server (no symbol table: runtime.allglen and allgs are
/// found from runtime.allgadd's code) the memory estimate names a goroutine
/// count never below the program's own peak runtime.NumGoroutine, and the
/// watch's peak is never above `runtime.allglen`, through
/// `gostw stacks` and through `gostw run`'s summary, for a small server and
/// a busier one (a goroutine per connection, clients in the same process).
#[test]
fn stripped_server_goroutine_count_is_never_below_num_goroutine() {
    require_root();
    let go = newest_go();
    let path = build_workload("stackgrowth", &go, "-stripped", &["-ldflags=-s -w"]);
    let binary = GoBinary::open(&path).unwrap();
    assert!(!binary.has_symtab);
    let allglen = binary
        .allglen()
        .expect("runtime.allglen of a stripped binary");
    assert_eq!(allglen.source, AllglenSource::AllgaddCode);
    let check = |what: &str, report: &StackReport, rec: &serde_json::Value| {
        let n = rec["goroutines"]
            .as_u64()
            .unwrap_or_else(|| panic!("{what}: no goroutine count in {rec}"));
        let peak = report.peak_goroutines;
        eprintln!("{what}: gostw counts {n} goroutines, NumGoroutine peaked at {peak}");
        assert_eq!(rec["goroutines_source"], goroutines::SOURCE, "{what}");
        // Never below what the program saw at once (gostw counts the
        // runtime's own goroutines too, and every goroutine in use within one
        // walk's window: a server that makes three per connection can show
        // three times NumGoroutine; the watch below checks the upper bound).
        assert!(
            n >= peak,
            "{what}: {n} goroutines against NumGoroutine {peak}"
        );
    };
    // The watch itself, on the busier server: its peak is bounded by the
    // runtime's own count of goroutine structures (runtime.allglen).
    let server = Command::new(&path)
        .args(["-mode", "server", "-duration", "3s", "-clients", "32"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the server workload");
    let pid = server.id();
    std::thread::sleep(Duration::from_millis(500));
    let image = tracer::image::ExecutableImage::of_pid(pid).unwrap();
    let watch = goroutines::GoroutineWatch::start(&tracer::image::ProcessImage::new(pid, image))
        .unwrap_or_else(|e| panic!("watching the server's goroutines: {e}"));
    std::thread::sleep(Duration::from_secs(2));
    let (peak, structs) = (watch.peak().unwrap(), watch.structs().unwrap());
    let out = server.wait_with_output().unwrap();
    let report: StackReport = parse_report(&String::from_utf8_lossy(&out.stdout));
    eprintln!(
        "watch: peak {peak}, goroutine structs {structs}, NumGoroutine peak {}",
        report.peak_goroutines
    );
    assert!(peak <= structs, "peak {peak} above allglen {structs}");
    assert!(peak > 32, "peak {peak}: the 32 clients alone are more");
    for clients in ["4", "32"] {
        let stdout = gostw_stdout(
            Command::new(env!("CARGO_BIN_EXE_gostw"))
                .args(["stacks", "--json", "--sample-hz", "499", "--"])
                .arg(&path)
                .args(["-mode", "server", "-duration", "3s", "-clients", clients]),
            "gostw stacks",
        );
        let (report, s) = report_and_summary(&stdout);
        check(
            &format!("gostw stacks, {clients} clients"),
            &report,
            &s["recommendation"],
        );
    }
    let stdout = gostw_stdout(
        Command::new(env!("CARGO_BIN_EXE_gostw"))
            .args(["run", "--json", "--"])
            .arg(&path)
            .args(["-mode", "server", "-duration", "3s", "-clients", "8"]),
        "gostw run",
    );
    let (report, s) = report_and_summary(&stdout);
    assert_eq!(s["type"], "summary");
    check(
        "gostw run, 8 clients",
        &report,
        &s["stack_growth"]["recommendation"],
    );
}

#[test]
fn goroutine_watch_starts_only_after_the_exec() {
    require_root();
    let go = newest_go();
    let path = build_workload("stackgrowth", &go, "", &[]);
    let image = tracer::image::ExecutableImage::open(&path).unwrap();
    // Held before its exec, as `gostw run` and `gostw stacks --` hold a
    // program while they attach: the pid is still the shell's. A watch
    // opened now would read the shell's memory for as long as it lived (the
    // files stay bound to it), and never find a goroutine.
    let stopped = StoppedChild::spawn(
        path.as_os_str(),
        &["-mode", "batch", "-duration", "2s"].map(std::ffi::OsStr::new),
        |c| {
            c.stdout(Stdio::null());
        },
    )
    .unwrap();
    let process = tracer::image::ProcessImage::new(stopped.pid(), image);
    let early = goroutines::GoroutineWatch::start(&process);
    let mut child = stopped.resume().unwrap();
    let why = early.expect_err("a watch started before the exec");
    assert!(why.contains("before its exec"), "{why}");
    // Once the program runs, the same start succeeds and counts.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let watch = loop {
        match goroutines::GoroutineWatch::start(&process) {
            Ok(w) => break w,
            Err(e) if std::time::Instant::now() > deadline => panic!("no watch: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    std::thread::sleep(Duration::from_millis(200));
    let peak = watch.peak();
    child.wait().unwrap();
    assert!(peak.is_some_and(|n| n >= 2), "peak {peak:?}");
}
