//! The output formats opened by the real tools: a stack-growth profile of
//! real symbolized frames of the `stackgrowth` workload, read back by the Go
//! toolchain's own `go tool pprof`. No eBPF in the two tests here: they live
//! with the kernel tests because those carry the Go matrix (GOSTW_GO_MATRIX)
//! and the workload builder, and fail rather than skip without them. The
//! page-out scenario (faults.rs) hands its real pauses and faults to
//! `check_pageout_outputs`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use tracer::{
    binary::{Frame, GoBinary},
    formats::{
        pprof::{self, Location, MappingInfo},
        profiles::{self, GrowthRecord, ProfileInfo, ProfileKind, StackGrowthMode},
    },
    image::ExecutableImage,
    model::{
        fault::Fault,
        observed::{Membership, Observed, ObservedPause},
        pause::PauseRecord,
    },
    sink::{Sink as _, profile::ProfileFiles, timeline::TimelineSink},
    stackgrowth::Mode,
};

use crate::{
    faults::GC_FRAMES,
    support::{GoToolchain, build_workload, go_matrix},
};

/// Growths at the deep site and at the shallow one.
const DEEP_GROWTHS: i64 = 1000;
const SHALLOW_GROWTHS: i64 = 10;
/// Each growth copies the 2 KB starting stack.
const OLD_STACK: i64 = 2048;

/// `go tool pprof ARGS PROFILE`, its standard output; panics with stderr.
pub fn pprof_tool(go: &GoToolchain, args: &[&str], profile: &Path) -> String {
    let out = Command::new(&go.go)
        .args(["tool", "pprof"])
        .args(args)
        .arg(profile)
        .env("GOTOOLCHAIN", "local")
        // pprof keeps fetched profiles here; keep it out of $HOME.
        .env("PPROF_TMPDIR", profile.parent().unwrap())
        .output()
        .unwrap_or_else(|e| panic!("running {} tool pprof: {e}", go.go.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "go tool pprof {args:?} failed:\n{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A PC inside `name` whose frames satisfy `want`, and those frames'
/// location.
fn location_in(
    binary: &GoBinary,
    sym: &ExecutableImage,
    name: &str,
    want: impl Fn(&[Frame]) -> bool,
) -> Location {
    let f = binary
        .function(name)
        .unwrap_or_else(|e| panic!("{name} is not in {}: {e}", binary.path.display()));
    (f.address..f.address + f.size)
        .map(|pc| Location {
            address: pc,
            frames: sym.frames(pc),
        })
        .find(|l| want(&l.frames))
        .unwrap_or_else(|| panic!("no PC of {name} has the frames looked for"))
}

/// The one function (of the main package, by prefix) named `prefix*`.
fn closure_of(binary: &GoBinary, prefix: &str) -> String {
    let table = binary.pclntab().unwrap();
    let mut names: Vec<&str> = table
        .functions()
        .map(|(n, _, _)| n)
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    names.dedup();
    assert!(!names.is_empty(), "no function {prefix}* in the workload");
    names[0].to_owned()
}

/// A stack-growth profile of real frames of `binary`: the deep site
/// (main.deep19k <- main.task, whose location also holds an inlined call,
/// <- the batch goroutine) and the shallow one.
fn stack_growth_profile(binary: &GoBinary) -> (Vec<u8>, Location) {
    let sym = ExecutableImage::open(&binary.path).unwrap();
    let single = |name: &'static str| move |f: &[Frame]| f.len() == 1 && f[0].function == name;
    let deep = location_in(binary, &sym, "main.deep19k", single("main.deep19k"));
    // A PC of main.task where the compiler inlined a call (the atomic add).
    let task = location_in(binary, &sym, "main.task", |f| {
        f.len() >= 2 && f[0].inlined && f.last().unwrap().function == "main.task"
    });
    let batch_fn = closure_of(binary, "main.runBatch.");
    let batch = location_in(binary, &sym, &batch_fn, |f| {
        f.last().is_some_and(|l| l.function == batch_fn)
    });
    let preempt_fn = closure_of(binary, "main.runPreempt.");
    let shallow = location_in(binary, &sym, "main.shallow", single("main.shallow"));
    let preempt = location_in(binary, &sym, &preempt_fn, |f| {
        f.last().is_some_and(|l| l.function == preempt_fn)
    });
    let deep_stack = [deep, task.clone(), batch];
    let shallow_stack = [shallow, preempt];
    let site = |stack, events: i64| GrowthRecord {
        stack,
        old_stack: OLD_STACK as u64,
        new_stack: 32768,
        events: events as u64,
        bytes_copied: (events * OLD_STACK) as u64,
    };
    let info = ProfileInfo {
        main: Some(main_mapping(binary)),
        ..ProfileInfo::default()
    };
    let records = [
        site(&deep_stack, DEEP_GROWTHS),
        site(&shallow_stack, SHALLOW_GROWTHS),
    ];
    let gz = profiles::stack_growth_profile(&info, StackGrowthMode::Exact, &records);
    (gz, task)
}

/// The mapping of `binary`'s code (link-time addresses, as symbolized).
fn main_mapping(binary: &GoBinary) -> MappingInfo {
    let text = binary
        .load_segments()
        .iter()
        .find(|s| s.flags & 1 != 0)
        .expect("a Go binary has an executable segment");
    MappingInfo {
        start: text.vaddr,
        limit: text.vaddr + text.memsz,
        offset: text.offset,
        file: binary.path.display().to_string(),
        build_id: binary.build_id().unwrap_or_default().to_owned(),
    }
}

/// The rows of `-top` output: (flat, function), in order.
pub fn top_rows(top: &str) -> Vec<(String, String)> {
    top.lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.len() >= 6).then(|| (cols[0].to_owned(), cols[5..].join(" ")))
        })
        .collect()
}

/// target/formats-test/NAME, where outputs are kept for a look afterwards.
fn output_path(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("target/formats-test");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Writes `bytes` to target/formats-test/NAME.
pub fn write_output(name: &str, bytes: &[u8]) -> PathBuf {
    let path = output_path(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn go_tool_pprof_top_shows_the_deep_function_first_with_counts_and_bytes() {
    for go in go_matrix() {
        top_shows_the_deep_function_first(&go);
    }
}

#[test]
fn go_tool_pprof_shows_inlined_frames_and_the_build_id() {
    for go in go_matrix() {
        inlined_frames_and_build_id(&go);
    }
}

/// Each Go version's binary, symbolized, read by that version's pprof.
fn top_shows_the_deep_function_first(go: &GoToolchain) {
    eprintln!("Go {}: go tool pprof -top", go.version);
    let path = build_workload("stackgrowth", go, "", &[]);
    let binary = GoBinary::open(&path).unwrap();
    let (gz, _) = stack_growth_profile(&binary);
    // The protobuf crate's decoder gives the same profile back.
    let decoded = pprof::decode(&gz).unwrap();
    assert_eq!(decoded.sample.len(), 2);
    assert_eq!(decoded.location.len(), 5);
    let file = write_output(&format!("stackgrowth-{}.pb.gz", go.version), &gz);

    let top = pprof_tool(go, &["-top", "-sample_index=growths"], &file);
    assert!(top.contains("Type: growths"), "{top}");
    assert!(
        top.contains(&format!("of {} total", DEEP_GROWTHS + SHALLOW_GROWTHS)),
        "{top}"
    );
    let rows = top_rows(&top);
    assert_eq!(
        rows.first(),
        Some(&(DEEP_GROWTHS.to_string(), "main.deep19k".to_owned())),
        "{top}"
    );
    assert_eq!(
        rows.get(1),
        Some(&(SHALLOW_GROWTHS.to_string(), "main.shallow".to_owned())),
        "{top}"
    );

    // Bytes: pprof scales them to one unit (2048000 B = 1.95MB, 20480 B =
    // 0.02MB) because the unit is bytes.
    let top = pprof_tool(go, &["-top", "-sample_index=bytes_copied"], &file);
    assert!(top.contains("Type: bytes_copied"), "{top}");
    let rows = top_rows(&top);
    assert_eq!(rows[0].1, "main.deep19k", "{top}");
    assert_eq!(rows[0].0, "1.95MB", "{top}");
    assert_eq!(
        rows[1],
        ("0.02MB".to_owned(), "main.shallow".to_owned()),
        "{top}"
    );

    // Labels: numeric ones with their unit.
    let tags = pprof_tool(go, &["-tags", "-sample_index=growths"], &file);
    // Newer pprof prints "Total 1010 of 1010", Go 1.19's "Total 1010.0".
    let compact = tags.split_whitespace().collect::<Vec<_>>().join(" ");
    let total = DEEP_GROWTHS + SHALLOW_GROWTHS;
    let has = |value: &str| {
        [
            format!("{total} ( 100%): {value}"),
            format!("{total}.0 ( 100%): {value}"),
        ]
        .iter()
        .any(|w| compact.contains(w.as_str()))
    };
    assert!(compact.contains("old_stack: Total"), "{tags}");
    assert!(has("2kB") && has("32kB"), "{tags}");
}

fn inlined_frames_and_build_id(go: &GoToolchain) {
    eprintln!("Go {}: go tool pprof -raw, -traces", go.version);
    let path = build_workload("stackgrowth", go, "", &[]);
    let binary = GoBinary::open(&path).unwrap();
    let (gz, task) = stack_growth_profile(&binary);
    let file = write_output(&format!("stackgrowth-inline-{}.pb.gz", go.version), &gz);
    let inlined = &task.frames[0].function;

    let raw = pprof_tool(go, &["-raw"], &file);
    // "growths/count[dflt] bytes_copied/bytes": growths is the default.
    assert!(
        raw.contains("growths/count[dflt] bytes_copied/bytes"),
        "{raw}"
    );
    // The deep sample: both values exact, then its locations and labels.
    let deep_values = [
        DEEP_GROWTHS.to_string(),
        format!("{}:", DEEP_GROWTHS * OLD_STACK),
    ];
    assert!(
        raw.lines().any(|l| l
            .split_whitespace()
            .take(2)
            .eq(deep_values.iter().map(String::as_str))),
        "no sample {deep_values:?}:\n{raw}"
    );
    assert!(raw.contains("old_stack:[2048 bytes]"), "{raw}");
    let build_id = binary.build_id().expect("Go binaries carry a build id");
    assert!(
        raw.contains(build_id),
        "mapping without the build id:\n{raw}"
    );
    // The inlined call and the function it was inlined into: one location,
    // two lines, the inlined one first.
    let lines: Vec<&str> = raw.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains(&format!("{:#x}", task.address)))
        .unwrap_or_else(|| panic!("no location {:#x}:\n{raw}", task.address));
    assert!(lines[at].contains(inlined.as_str()), "{raw}");
    assert!(lines[at + 1].contains("main.task"), "{raw}");

    let traces = pprof_tool(go, &["-traces"], &file);
    let stack: Vec<&str> = traces
        .lines()
        .skip_while(|l| !l.contains("main.deep19k"))
        .take(4)
        .map(str::trim)
        .collect();
    assert!(stack[0].ends_with("main.deep19k"), "{traces}");
    assert_eq!(stack[1], format!("{inlined} (inline)"), "{traces}");
    assert_eq!(stack[2], "main.task", "{traces}");
    assert!(stack[3].starts_with("main.runBatch."), "{traces}");
}

/// The page-out scenario's engine stream (`faults::
/// pageout_pauses_fault_on_gc_metadata` calls this) replayed into the
/// `--timeline` and `--pprof` sinks. First the engine's pause membership is
/// checked against its rule, from the records' own times: a fault is in the
/// pause its begin (its end when the begin is unknown) falls in. Then the
/// sinks against the engine: one complete event per pause record with the
/// record's start and duration, one event per fault marked `in_pause` as the
/// engine decided; `go tool pprof` of the fault profile counts in pauses
/// exactly the faults the engine put in pauses, with runtime GC frames on
/// top. The files stay in target/formats-test (the book's pictures are of
/// them).
pub fn check_pageout_outputs(go: &GoToolchain, pid: u32, observed: &[Observed]) {
    let pauses: Vec<&ObservedPause> = observed
        .iter()
        .filter_map(|o| match o {
            Observed::Pause(p) if p.record.pid == pid => Some(&**p),
            _ => None,
        })
        .collect();
    let others: Vec<(&Fault, Membership)> = observed
        .iter()
        .filter_map(|o| match o {
            Observed::Fault(f, m) if f.tgid == pid => Some((f, *m)),
            _ => None,
        })
        .collect();
    let recorded: usize = pauses.iter().map(|p| p.faults.len()).sum();
    let late = others
        .iter()
        .filter(|(_, m)| *m == Membership::LateInPause)
        .count();
    let (in_pause, total) = (recorded + late, recorded + others.len());
    assert!(
        !pauses.is_empty() && in_pause > 0,
        "nothing traced in pauses"
    );
    let window = |p: &PauseRecord| p.start_mono_ns..p.start_mono_ns + p.duration_ns;
    for p in &pauses {
        for f in &p.faults {
            assert!(
                window(&p.record).contains(&f.at_ns()),
                "a fault in the record of a pause it did not begin in: {f:?} {:?}",
                p.record
            );
        }
    }
    for (f, m) in &others {
        let inside = pauses
            .iter()
            .any(|p| window(&p.record).contains(&f.at_ns()));
        assert_eq!(
            inside,
            *m == Membership::LateInPause,
            "membership {m:?} of a fault that began {} a pause: {f:?}",
            if inside { "inside" } else { "outside" }
        );
    }

    let timeline_path = output_path(&format!("pageout-{}.timeline.json", go.version));
    let file = std::fs::File::create(&timeline_path).unwrap();
    let mut timeline = TimelineSink::new(Box::new(std::io::BufWriter::new(file))).unwrap();
    let faults_path = output_path(&format!("pageout-{}.faults.pb.gz", go.version));
    let mut profiles = ProfileFiles::create(
        vec![(ProfileKind::Faults, faults_path.clone())],
        Mode::Sampled,
        99,
        format!("gostw page-out scenario, Go {}", go.version),
    )
    .unwrap();
    for o in observed {
        timeline.observe(o);
        profiles.observe(o);
    }
    timeline.finish().unwrap();
    profiles.finish().unwrap();

    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&timeline_path).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let complete: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "pause" && e["pid"] == pid)
        .collect();
    assert_eq!(
        complete.len(),
        pauses.len(),
        "one complete event per pause record"
    );
    let ns = |us: &serde_json::Value| (us.as_f64().unwrap() * 1000.0).round() as u64;
    for (e, p) in complete.iter().zip(&pauses) {
        assert_eq!(ns(&e["ts"]), p.record.start_mono_ns, "{e}");
        assert_eq!(ns(&e["dur"]), p.record.duration_ns, "{e}");
    }
    let fault_events: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["cat"] == "fault" && e["pid"] == pid)
        .collect();
    assert_eq!(fault_events.len(), total, "one event per fault");
    let marked = fault_events
        .iter()
        .filter(|e| e["args"]["in_pause"] == true)
        .count();
    assert_eq!(marked, in_pause, "faults marked in a pause");

    // -noinlines: charge inlined helpers (atomic loads) to the runtime
    // function they were inlined into, as the text report does;
    // -nodefraction=0: the focused faults are <1% of all, keep every node.
    let top = pprof_tool(
        go,
        &[
            "-top",
            "-noinlines",
            "-nodefraction=0",
            "-sample_index=major_faults",
            "-tagfocus=in_pause=true",
        ],
        &faults_path,
    );
    eprintln!("{top}");
    // pprof's total stays the whole profile; the focused part is shown.
    let shown = format!("Showing nodes accounting for {in_pause}, ");
    let total = format!(" of {total} total");
    assert!(
        top.contains(&shown) && top.contains(&total),
        "wanted {shown:?} and {total:?}:\n{top}"
    );
    let rows = top_rows(&top);
    assert!(rows[0].1.starts_with("runtime."), "{top}");
    assert!(
        rows.iter().any(|(_, f)| GC_FRAMES.contains(&f.as_str())),
        "no runtime GC frame in the in-pause fault profile:\n{top}"
    );
    let top = pprof_tool(go, &["-top", "-sample_index=fault_time"], &faults_path);
    assert!(top.contains("Type: fault_time"), "{top}");
}
