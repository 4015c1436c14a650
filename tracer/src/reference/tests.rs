//! The reference pages against the code: the CLI page is what clap renders,
//! every metric and JSON field is named on its page, and every measured
//! figure in the book names a test, bench or commit that is there.

use std::{collections::BTreeSet, path::PathBuf, sync::Arc};

use prometheus_client::encoding::text::encode;

use super::{figures::*, *};
use crate::{
    image::Frame,
    memory::{
        HostSwap,
        advice::tests::exposure,
        watch::{ExposureReading, ReadAt},
    },
    model::labels::ProcessLabels,
    model::pause::tests_support::record,
    model::throttling::{CpuThrottling, ThrottleCounts},
    model::{
        backend::Degraded,
        breakdown::Breakdown,
        fault::{Fault, FaultKind, FaultTotals, PauseFaultStats, PhaseFaults},
        kernel_wait::{KernelWaitRecord, Phase, Sleeper, WaitKind},
        laggard::{FramesFrom, LaggardKernel, LaggardRecord, LaggardStateName},
        observed::{CpuSamples, Observed, ObservedPause, ProcessInfo},
    },
    sink::{
        Sink as _,
        metrics::{
            Metrics,
            observe::{FaultObservation, PauseObservation, StackGrowthObservation, WaitedOn},
        },
        report::{Output, ReportSink, View},
    },
    stackgrowth::Mode,
};

/// A page of the book, from the workspace root's `docs/`.
fn page(name: &str) -> (PathBuf, String) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/reference")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    (path, text)
}

/// `cargo xtask book` runs these tests with this set: the generated pages
/// are written, not compared.
fn writing() -> bool {
    std::env::var_os("GOSTW_WRITE_BOOK").is_some()
}

/// The CLI page differs from `rendered`: what to say.
fn cli_drift(checked_in: &str, rendered: &str) -> Option<String> {
    (checked_in != rendered).then(|| {
        let line = checked_in
            .lines()
            .zip(rendered.lines())
            .position(|(a, b)| a != b)
            .map_or(
                checked_in.lines().count().min(rendered.lines().count()),
                |i| i,
            )
            + 1;
        format!(
            "docs/reference/cli.md differs from gostw's clap definitions (first at line {line}): \
             run `cargo xtask book`"
        )
    })
}

#[test]
fn cli_reference_is_rendered_from_clap() {
    let rendered = cli_markdown();
    let (path, checked_in) = page("cli.md");
    if writing() {
        std::fs::write(&path, &rendered).unwrap();
        return;
    }
    if let Some(why) = cli_drift(&checked_in, &rendered) {
        panic!("{why}");
    }
}

fn labels() -> ProcessLabels {
    ProcessLabels {
        executable: "api".into(),
        go_version: "go1.26.6".into(),
        build_id: "abc".into(),
        container: String::new(),
        namespace: String::new(),
        pod: String::new(),
    }
}

/// The agent's exposition with a series in each family that takes
/// observations (families without series are declared all the same).
fn exposition() -> String {
    let m = Metrics::new();
    let l = labels();
    m.process_started(&l);
    m.pause(
        &l,
        &PauseObservation {
            reason: "gc_mark_termination",
            duration_ns: 40_000,
            major_faults: 1,
            record_id: None,
        },
    );
    m.fault(
        &l,
        &FaultObservation {
            in_pause: true,
            backing: FaultKind::SwapIn,
            wait_ns: 1_000,
            waited_on: WaitedOn::Own,
        },
    );
    m.stack_growth(
        &l,
        &StackGrowthObservation {
            old_size: 2048,
            live_bytes: 1000,
        },
    );
    m.cpu_samples(
        &l,
        CpuSamples {
            all: 10,
            stack_growth: 1,
        },
        99,
    );
    m.degraded(&[degraded()]);
    let mut s = String::new();
    encode(&mut s, m.registry()).unwrap();
    s
}

fn degraded() -> Degraded {
    Degraded {
        feature: "kernel waits",
        why: "page faults are not counted".into(),
    }
}

#[test]
fn every_metric_is_in_the_metrics_reference() {
    let names = metric_names(&exposition());
    assert!(names.len() > 20, "{names:?}");
    assert!(names.contains("gostw_pause_duration_seconds"), "{names:?}");
    assert!(names.contains("gostw_major_faults_total"), "{names:?}");
    let (_, doc) = page("metrics.md");
    let gone = missing(&doc, &names);
    assert!(
        gone.is_empty(),
        "docs/reference/metrics.md does not name these metrics: {gone:?}"
    );
}

fn frame(function: &str) -> Frame {
    Frame {
        function: function.into(),
        file: "/src/main.go".into(),
        line: 7,
        inlined: false,
        start_line: 3,
    }
}

/// A pause record with every optional part filled in.
fn full_pause(pid: u32) -> ObservedPause {
    let mut r = record(pid, 1_000_000, 2_000_000);
    r.reason_text = Some("gcing".into());
    r.stopping_ns = Some(100);
    r.restarting_ns = Some(50);
    r.caller = Some(vec![frame("runtime.GC"), frame("main.main")]);
    r.laggards = Some(vec![LaggardRecord {
        tid: 8,
        state: LaggardStateName::OnCpu,
        ns: 10,
        on_cpu_ns: 10,
        fault_ns: 0,
        runnable_ns: 0,
        blocked_ns: 0,
        running_goroutine: true,
        goid: Some(12),
        frames: vec![frame("main.spinLoop")],
        frames_from: FramesFrom::Sample,
        held_samples: 4,
        page_faults: 12,
        kernel: Some(LaggardKernel {
            kind: WaitKind::MmapLock,
            ns: 5,
        }),
        stopped_at: vec![frame("main.spinner")],
    }]);
    r.kernel_waits = Some(vec![KernelWaitRecord {
        tid: 8,
        thread: Sleeper::Laggard,
        phase: Phase::Stopping,
        kind: WaitKind::MmapLock,
        on_cpu: false,
        ns: 5,
        count: 1,
        frames: vec!["rwsem_down_read_slowpath".into()],
    }]);
    r.stopper_page_faults = Some(40);
    r.kernel_waits_dropped_ns = Some(1_000);
    r.breakdown = Some(Box::new(Breakdown::default()));
    let swap = FaultTotals {
        faults: 1,
        swap_in: 1,
        fault_ns: 1_000,
        ..FaultTotals::default()
    };
    r.faults = Some(PauseFaultStats {
        all: swap,
        stopper: swap,
        top_sites: vec![("runtime.gcStart".into(), 1)],
        by_phase: Some(Box::new(PhaseFaults {
            stopped: swap,
            ..PhaseFaults::default()
        })),
        ..PauseFaultStats::default()
    });
    let fault = Fault {
        tgid: pid,
        tid: pid,
        begin_ns: 1_000_100,
        end_ns: 1_001_100,
        address: 0x1000,
        kind: FaultKind::SwapIn,
        blocked_ns: 900,
        wait_own_ns: 900,
        wait_other_ns: 0,
        stack: Arc::from(vec![frame("runtime.gcStart")]),
        pcs: Arc::from([]),
    };
    ObservedPause {
        record: r,
        faults: vec![fault],
    }
}

/// A writer whose bytes the test reads back.
#[derive(Clone, Default)]
struct Buf(std::rc::Rc<std::cell::RefCell<Vec<u8>>>);
impl std::io::Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The host's swap traffic over a 2 s trace.
fn host_swap() -> crate::memory::HostSwapDelta {
    HostSwap::delta(
        &HostSwap::default(),
        &HostSwap {
            at_ns: 2_000_000_000,
            pswpin: 900,
            pswpout: 4000,
            ..HostSwap::default()
        },
    )
}

/// Every JSON record `attach`/`run --json` prints, as values: a pause with
/// every part, then the summary with faults, stack growth, exposure and
/// advice.
fn records() -> Vec<serde_json::Value> {
    let out = Buf::default();
    let mut s = ReportSink::new(
        View::Trace,
        Output::new(
            Box::new(out.clone()),
            true,
            crate::model::pause::SlowThreshold::ALL,
        ),
        true,
        Some(Mode::Sampled),
    );
    s.observe(&Observed::Started(Arc::new(ProcessInfo {
        pid: 42,
        exe: "/srv/api".into(),
        labels: labels(),
        go_version: "go1.26.6".into(),
        image: None,
    })));
    let host_swap = host_swap();
    for (at, h) in [(ReadAt::Start, None), (ReadAt::End, Some(host_swap))] {
        s.observe(&Observed::Exposure(Arc::new(ExposureReading {
            pid: 42,
            at,
            exposure: Ok(exposure(4 << 20, 0, None)),
            read_ns: 1_000_000,
            host_swap: h,
        })));
    }
    s.observe(&Observed::Pause(Box::new(full_pause(42))));
    s.observe(&Observed::CpuThrottling {
        pid: 42,
        throttling: CpuThrottling {
            cgroup: "/capped".into(),
            while_traced: ThrottleCounts {
                nr_throttled: 3,
                throttled_ns: 9_000_000,
            },
        },
    });
    s.observe(&Observed::Degraded(vec![degraded()]));
    s.observe(&Observed::Cost(Arc::new(crate::bpf_stats::CostReading {
        stats_enabled: true,
        programs: vec![crate::bpf_stats::ProgramCost {
            name: "stw_stop".into(),
            runs: 2,
            run_ns: 4_000,
        }],
        usage: Some(crate::bpf_stats::SelfUsage {
            cpu_seconds: 0.1,
            rss_bytes: 20 << 20,
            peak_rss_bytes: 24 << 20,
        }),
    })));
    s.observe(&Observed::ExitStatus { pid: 42, code: 0 });
    s.observe(&Observed::KernelCounters(
        tracer_common::counters::Counter::ALL
            .iter()
            .map(|&c| (c, 1))
            .collect(),
    ));
    s.finish(3_000_000_000).unwrap();
    let text = String::from_utf8(out.0.borrow().clone()).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `gostw memory --json`, `gostw check --json` and an agent's slow-pause
/// record, as values: every part of each (advice, a degraded feature with
/// its why, labels).
fn command_records() -> [serde_json::Value; 3] {
    use crate::{
        check::{CheckReport, Feature, Status},
        memory::MemoryReport,
        model::backend::{BackendChoice, FaultBackend, Support},
    };
    let exposure = exposure(4 << 20, 0, None);
    let host_swap = Some(host_swap());
    let memory = MemoryReport::new(exposure, host_swap);
    assert!(!memory.advice.is_empty());
    let support = |available| Support {
        available,
        detail: "evidence".into(),
    };
    let feature = |name, status| Feature {
        name,
        status,
        programs: vec!["stw_stop".into()],
        variants: vec!["stw_stop_compat".into()],
    };
    let check = CheckReport {
        kernel: "6.1.0-50-cloud-amd64".into(),
        btf: true,
        root: true,
        families: vec![("kprobes", true, "loads".into())],
        fault_backend: BackendChoice {
            backend: FaultBackend::Kprobe,
            reason: "kprobes work".into(),
            kprobes: support(true),
            tracepoints: support(true),
            file_faults_seen: true,
        },
        optional_tracepoints: vec![("sched:sched_waking", true)],
        features: vec![
            feature("pauses", Status::Works),
            feature("kernel waits", Status::Degraded("what is lost".into())),
        ],
        exit_code: 1,
    };
    let slow = crate::sink::slow_pauses::SlowPause::new(&labels(), full_pause(42).record);
    [
        serde_json::to_value(memory).unwrap(),
        serde_json::to_value(check).unwrap(),
        serde_json::to_value(slow).unwrap(),
    ]
}

#[test]
fn every_json_field_is_in_the_json_reference() {
    let records = records();
    let mut keys = BTreeSet::new();
    for r in records.iter().chain(&command_records()) {
        json_keys(r, &mut keys);
    }
    let types: Vec<_> = records.iter().map(|r| r["type"].clone()).collect();
    assert_eq!(types, ["pause", "summary"], "{records:?}");
    for must in [
        "laggards",
        "by_phase",
        "exposure",
        "advice",
        "stack_growth",
        "stops_counted",
        "gc_metadata_reads",
        "optional_tracepoints",
        "why",
    ] {
        assert!(keys.contains(must), "{must} not in {keys:?}");
    }
    let (_, doc) = page("json.md");
    let gone = missing(&doc, &keys);
    assert!(
        gone.is_empty(),
        "docs/reference/json.md does not name these JSON fields: {gone:?}"
    );
}

/// Each checker reports a name taken out of its page, and the CLI check a
/// page that differs from clap's.
#[test]
fn each_check_fails_when_its_page_drops_a_name() {
    let rendered = cli_markdown();
    assert!(cli_drift(&rendered, &rendered).is_none());
    let edited = rendered.replacen("--threshold", "--thresold", 1);
    let why = cli_drift(&edited, &rendered).expect("an edited page is caught");
    assert!(why.contains("cargo xtask book"), "{why}");

    let names = metric_names(&exposition());
    let (_, doc) = page("metrics.md");
    assert!(missing(&doc, &names).is_empty());
    let dropped = "gostw_pause_major_faults";
    let doc = doc.replace(&format!("`{dropped}`"), "");
    assert_eq!(missing(&doc, &names), [dropped]);

    let mut keys = BTreeSet::new();
    records().iter().for_each(|r| json_keys(r, &mut keys));
    let (_, doc) = page("json.md");
    assert!(missing(&doc, &keys).is_empty());
    let doc = doc.replace("stops_counted", "");
    assert_eq!(missing(&doc, &keys), ["stops_counted"]);
    // The commands' records are checked too.
    command_records()
        .iter()
        .for_each(|r| json_keys(r, &mut keys));
    let (_, doc) = page("json.md");
    let doc = doc.replace("`optional_tracepoints`", "");
    assert_eq!(missing(&doc, &keys), ["optional_tracepoints"]);
}

/// Every measured figure in the book names a source that is in the tree
/// (the rule: `figures`' doc comment).
#[test]
fn every_figure_in_the_book_names_its_source() {
    let tree = Tree::workspace();
    let pages = checked_pages(&tree);
    for must in [
        "README.md",
        "docs/cost-and-accuracy/cost.md",
        "docs/guide/why-slow.md",
    ] {
        assert!(pages.iter().any(|p| p == must), "{must} not in {pages:?}");
    }
    let problems: Vec<String> = pages
        .iter()
        .flat_map(|p| check(p, &read_page(&tree, p), &tree))
        .collect();
    assert!(
        problems.is_empty(),
        "figures without a source that resolves ({}):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The lists of pages left out name pages that exist, so an entry does not
/// outlive its page.
#[test]
fn pages_left_out_of_the_figure_check_exist() {
    let tree = Tree::workspace();
    for (page, why) in EXEMPT.iter().chain(NOT_YET_CHECKED) {
        assert!(!why.is_empty(), "{page}");
        assert!(!read_page(&tree, page).is_empty(), "{page} does not exist");
    }
}

/// The figure check fails on a figure with no source, on sources that name
/// a test, a bench or a commit that is not there, and on a real page once
/// the bench it names is removed from the tree.
#[test]
fn the_figure_check_fails_on_a_figure_without_a_source_that_resolves() {
    let tree = Tree::workspace();
    let fails = |page: &str| !check("t.md", page, &tree).is_empty();

    // A figure, no source.
    assert!(fails("The stop took 2.5 ms here.\n"));
    assert!(fails("| workload | 2.5 ms |\n"));
    assert!(fails("- a pause of 12 us\n"));
    assert!(fails("Go's own median: 9.2 us.\n<!-- settings: -->\n"));
    // No figure: code blocks, code spans and counts are not figures.
    assert!(!fails("```text\npause 2.5 ms\n```\n"));
    assert!(!fails(
        "Run it with `--threshold 5ms`: 2 000 pauses, 3 runs.\n"
    ));
    // Settings, said so.
    assert!(!fails(
        "`--slow-pause` (1 ms) <!-- settings: --slow-pause's default -->\n"
    ));
    // ... in a comment, not in a code span that shows one.
    assert!(fails("Write `<!-- settings: x -->`: 5 ms.\n"));

    // Sources that resolve, and the same sources gone.
    let bench = "`cargo xtask bench overhead` measured 0.49%.\n";
    assert!(!fails(bench));
    assert!(fails(&bench.replace("overhead", "overheads")));
    let kernel = "`agent_pauses::a_storm_of_slow_pauses_stays_bounded_and_counted`: 41 MB.\n";
    assert!(!fails(kernel));
    assert!(fails(&kernel.replace("bounded", "unbounded")));
    let unit = "`reference::tests::every_metric_is_in_the_metrics_reference`: 20 MB.\n";
    assert!(!fails(unit));
    assert!(fails(&unit.replace("every_metric", "each_metric")));
    assert!(!fails("`cargo xtask soak-agent` measured 0.15 s.\n"));
    assert!(fails("`cargo xtask soak-forever` measured 0.15 s.\n"));
    // A source that does not resolve fails even beside one that does.
    assert!(fails(&format!("{} `cargo xtask bench gone`", bench.trim())));
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=10", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    if let Some(head) = head {
        assert!(!fails(&format!("Took 5.88 ms (history, commit {head}).\n")));
        assert!(fails("Took 5.88 ms (history, commit 0123456789abcdef).\n"));
    }

    // A real page, its bench removed from a copy of the tree: the page,
    // unchanged, now fails where it names that bench.
    let (name, bench) = ("docs/cost-and-accuracy/cost.md", "overhead");
    let page_text = read_page(&tree, name);
    assert!(check(name, &page_text, &tree).is_empty());
    let root = std::env::temp_dir().join(format!("gostw-figures-{}", std::process::id()));
    std::fs::create_dir_all(root.join("xtask/src")).unwrap();
    let benches = read_page(&tree, "xtask/src/bench.rs");
    let arm = format!("\"{bench}\" =>");
    assert!(benches.contains(&arm));
    std::fs::write(
        root.join("xtask/src/bench.rs"),
        benches.replace(&arm, "\"retired\" =>"),
    )
    .unwrap();
    let removed = check(name, &page_text, &Tree::at(root.clone()));
    std::fs::remove_dir_all(&root).unwrap();
    assert!(
        removed
            .iter()
            .any(|p| p.contains(&format!("`cargo xtask bench {bench}`: no such bench"))),
        "{removed:?}"
    );
}
