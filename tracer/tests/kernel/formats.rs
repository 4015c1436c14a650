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

use serde_json::json;
use tracer::{
    binary::{Frame, GoBinary},
    engine::{
        fault::{Fault, FaultKind},
        pause::PauseRecord,
    },
    formats::{
        pprof::{self, Location, MappingInfo},
        profiles::{
            self, Backing, FaultPause, FaultRecord, GrowthRecord, ProfileInfo, StackGrowthMode,
            faults_profile,
        },
        timeline::{TimelineWriter, Track},
    },
    image::ExecutableImage,
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

/// Writes `bytes` to target/formats-test/NAME, kept for a look afterwards.
pub fn write_output(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("target/formats-test");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
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

/// The page-out scenario's real pauses and faults (`faults::
/// pageout_pauses_fault_on_gc_metadata` calls this) as a timeline and a
/// fault profile: the timeline holds one complete event per pause record
/// with the record's start and duration, one slice per fault; `go tool
/// pprof -top` of the in-pause faults lists runtime GC frames. The files
/// stay in target/formats-test (the book's pictures are of them).
pub fn check_pageout_outputs(go: &GoToolchain, pid: u32, pauses: &[PauseRecord], faults: &[Fault]) {
    let pauses: Vec<&PauseRecord> = pauses.iter().filter(|p| p.pid == pid).collect();
    let faults: Vec<&Fault> = faults.iter().filter(|f| f.tgid == pid).collect();
    assert!(!pauses.is_empty() && !faults.is_empty(), "nothing traced");
    // A fault is in the pause it begins in (its end when the begin is unknown).
    let pause_of = |f: &Fault| {
        let at = if f.begin_ns == 0 {
            f.end_ns
        } else {
            f.begin_ns
        };
        pauses
            .iter()
            .find(|p| (p.start_mono_ns..p.start_mono_ns + p.duration_ns).contains(&at))
    };
    let backing = |f: &Fault| match f.kind {
        FaultKind::SwapIn => Backing::Swap,
        FaultKind::FileBacked => Backing::File,
        FaultKind::Unknown => Backing::Unknown,
    };

    let mut t = TimelineWriter::new(Vec::new()).unwrap();
    t.process(pid, "gcswap (page-out scenario)").unwrap();
    t.other_data("go_version", json!(go.version));
    for p in &pauses {
        let inside: Vec<&&Fault> = faults
            .iter()
            .filter(|f| pause_of(f).is_some_and(|q| std::ptr::eq(*q, *p)))
            .collect();
        let args = json!({
            "reason": p.reason,
            "duration_source": p.duration_source,
            "go_duration_ns": p.go_duration_ns,
            "window_ns": p.window_ns,
            "stopping_tid": p.tid,
            "major_faults": inside.len(),
            "fault_ns": inside.iter().map(|f| f.duration_ns()).sum::<u64>(),
            "stopper_faults": inside.iter().filter(|f| f.tid == p.tid).count(),
        });
        t.pause(
            pid,
            p.stw_reason().name(),
            p.start_mono_ns,
            p.duration_ns,
            &args,
        )
        .unwrap();
    }
    let timed: Vec<&&Fault> = faults.iter().filter(|f| f.begin_ns != 0).collect();
    for f in &timed {
        t.thread(pid, f.tid, &format!("thread {}", f.tid)).unwrap();
        let args = json!({
            "address": format!("{:#x}", f.address),
            "blocked_ns": f.blocked_ns,
            "wait_own_ns": f.wait_own_ns,
            "wait_other_ns": f.wait_other_ns,
            "in_pause": pause_of(f).is_some(),
            "site": f.site(),
            "stack": &*f.stack,
        });
        let name = format!("major fault ({})", backing(f).label());
        t.slice(
            Track::thread(pid, f.tid),
            "fault",
            &name,
            f.begin_ns,
            f.duration_ns(),
            &args,
        )
        .unwrap();
    }
    let json_bytes = t.finish().unwrap();
    write_output(
        &format!("pageout-{}.timeline.json", go.version),
        &json_bytes,
    );
    let v: serde_json::Value = serde_json::from_slice(&json_bytes).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let complete: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "pause")
        .collect();
    assert_eq!(
        complete.len(),
        pauses.len(),
        "one complete event per pause record"
    );
    let ns = |us: &serde_json::Value| (us.as_f64().unwrap() * 1000.0).round() as u64;
    for (e, p) in complete.iter().zip(&pauses) {
        assert_eq!(ns(&e["ts"]), p.start_mono_ns, "{e}");
        assert_eq!(ns(&e["dur"]), p.duration_ns, "{e}");
    }
    let slices = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "fault")
        .count();
    assert_eq!(slices, timed.len(), "one slice per fault with a begin");

    // The fault profile, as the --pprof sink and the agent build it.
    let info = ProfileInfo {
        // The main binary names the profile (its locations carry no
        // address: the fault stacks come as names today).
        main: Some(main_mapping(
            &GoBinary::open(&build_workload("gcswap", go, "", &[])).unwrap(),
        )),
        comment: Some(format!("gostw page-out scenario, Go {}", go.version)),
        ..ProfileInfo::default()
    };
    let stacks: Vec<Vec<Location>> = faults.iter().map(|f| locations_of(&f.stack)).collect();
    let records: Vec<FaultRecord> = faults
        .iter()
        .zip(&stacks)
        .map(|(f, stack)| FaultRecord {
            stack,
            duration_ns: f.duration_ns(),
            backing: backing(f),
            pause: pause_of(f).map(|p| FaultPause {
                reason: p.reason,
                by_stopper: p.tid == f.tid,
            }),
        })
        .collect();
    let file = write_output(
        &format!("pageout-{}.faults.pb.gz", go.version),
        &faults_profile(&info, &records),
    );
    let in_pause = faults.iter().filter(|f| pause_of(f).is_some()).count();
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
        &file,
    );
    eprintln!("{top}");
    // pprof's total stays the whole profile; the focused part is shown.
    let shown = format!("Showing nodes accounting for {in_pause}, ");
    let total = format!(" of {} total", faults.len());
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
    let top = pprof_tool(go, &["-top", "-sample_index=fault_time"], &file);
    assert!(top.contains("Type: fault_time"), "{top}");
}

/// Locations of a symbolized stack (innermost first, inlined frames
/// marked): each non-inlined frame closes a location holding the inlined
/// ones before it. The fault stacks carry no addresses.
fn locations_of(stack: &[Frame]) -> Vec<Location> {
    let mut out = Vec::new();
    let mut frames = Vec::new();
    for f in stack {
        frames.push(f.clone());
        if !f.inlined {
            out.push(Location {
                address: 0,
                frames: std::mem::take(&mut frames),
            });
        }
    }
    if !frames.is_empty() {
        out.push(Location { address: 0, frames });
    }
    out
}
