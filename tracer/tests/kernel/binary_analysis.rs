//! Go binary analysis checked against the Go toolchain's own answers, for
//! every Go version of the matrix and every way an SRE's binary may be built:
//! plain, PIE, without DWARF (`-w`), stripped (`-s -w`), cgo with external
//! linking (plain and stripped), and arm64 (cross-built, analysed statically).
//!
//! References: `go tool nm` (entries), `go tool objdump` (RET instructions),
//! `go tool addr2line` (symbolization), DWARF vs type descriptors vs the
//! version table (struct offsets), the Go runtime's own `CallersFrames`
//! (symbolization of a live process, PIE load bias and inlining included).
//! Stripped builds are compared with their unstripped twins. No root needed:
//! these tests live here for the Go matrix. Each variant is built once.

use std::{
    collections::{BTreeMap, HashMap},
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Mutex, OnceLock},
    time::Instant,
};

use proptest::prelude::*;
use serde::Deserialize;
use tracer::{
    binary::{
        Arch, COPYSTACK, FunctionSource, GoBinary, OffsetSource, PROBED_FUNCTIONS, START_THE_WORLD,
        STOP_THE_WORLD, offsets::struct_fields, running,
    },
    image::{ExeId, ExecutableImage, ProcessImage},
};

use crate::support::{GoToolchain, build_workload_env, go_matrix};

/// How one variant is built.
struct Spec {
    name: &'static str,
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
    /// Built from the same code as this variant, with symbols and DWARF.
    twin: Option<&'static str>,
    needs_gcc: bool,
}

const NO_CGO: &[(&str, &str)] = &[("CGO_ENABLED", "0")];
const CGO: &[(&str, &str)] = &[("CGO_ENABLED", "1")];
const ARM64: &[(&str, &str)] = &[("CGO_ENABLED", "0"), ("GOARCH", "arm64")];

const SPECS: &[Spec] = &[
    Spec {
        name: "exe",
        args: &[],
        env: NO_CGO,
        twin: None,
        needs_gcc: false,
    },
    Spec {
        name: "pie",
        args: &["-buildmode=pie"],
        env: NO_CGO,
        twin: None,
        needs_gcc: false,
    },
    Spec {
        name: "nodwarf",
        args: &["-ldflags=-w"],
        env: NO_CGO,
        twin: Some("exe"),
        needs_gcc: false,
    },
    Spec {
        name: "stripped",
        args: &["-ldflags=-s -w"],
        env: NO_CGO,
        twin: Some("exe"),
        needs_gcc: false,
    },
    Spec {
        name: "cgo",
        args: &["-ldflags=-linkmode=external"],
        env: CGO,
        twin: None,
        needs_gcc: true,
    },
    Spec {
        name: "cgo-stripped",
        args: &["-ldflags=-linkmode=external -s -w"],
        env: CGO,
        twin: Some("cgo"),
        needs_gcc: true,
    },
    Spec {
        name: "arm64",
        args: &[],
        env: ARM64,
        twin: None,
        needs_gcc: false,
    },
    Spec {
        name: "arm64-stripped",
        args: &["-ldflags=-s -w"],
        env: ARM64,
        twin: Some("arm64"),
        needs_gcc: false,
    },
];

/// One built variant.
struct Build {
    go: GoToolchain,
    spec: &'static Spec,
    path: PathBuf,
}

impl Build {
    fn label(&self) -> String {
        format!("Go {} {}", self.go.version, self.spec.name)
    }

    fn open(&self) -> GoBinary {
        GoBinary::open(&self.path).unwrap_or_else(|e| panic!("{}: {e}", self.label()))
    }

    fn is_arm64(&self) -> bool {
        self.spec.name.starts_with("arm64")
    }
}

fn have_gcc() -> bool {
    Command::new("gcc")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Every variant for every Go version, built once per test process.
fn builds() -> &'static [Build] {
    static BUILDS: OnceLock<Vec<Build>> = OnceLock::new();
    BUILDS.get_or_init(|| {
        let started = Instant::now();
        // The cgo variants are part of what must be shown: no gcc is a
        // failure (`cargo xtask setup` installs it), not a skip.
        assert!(
            have_gcc(),
            "gcc is needed for the cgo (externally linked) variants: run `cargo xtask setup`"
        );
        let mut out = Vec::new();
        for go in go_matrix() {
            for spec in SPECS.iter() {
                let path = build_workload_env(
                    "inspect",
                    &go,
                    &format!("-{}", spec.name),
                    spec.args,
                    spec.env,
                );
                out.push(Build {
                    go: go.clone(),
                    spec,
                    path,
                });
            }
        }
        eprintln!("built {} binaries in {:.1?}", out.len(), started.elapsed());
        out
    })
}

/// The build of the same Go version named `variant`.
fn sibling<'a>(b: &Build, variant: &str) -> &'a Build {
    builds()
        .iter()
        .find(|o| o.go.version == b.go.version && o.spec.name == variant)
        .unwrap_or_else(|| panic!("no {variant} build for Go {}", b.go.version))
}

/// The build whose symbols describe `b` (itself, or its unstripped twin).
fn reference(b: &Build) -> &Build {
    match b.spec.twin {
        Some(t) => sibling(b, t),
        None => b,
    }
}

fn go_tool(go: &GoToolchain, args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new(&go.go)
        .arg("tool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("go tool {args:?}: {e}"));
    let mut input = child.stdin.take().unwrap();
    let text = stdin.unwrap_or("").to_owned();
    let writer = std::thread::spawn(move || input.write_all(text.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(
        out.status.success(),
        "go tool {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `go tool nm`: symbol name -> address (run once per binary).
fn nm(b: &Build) -> HashMap<String, u64> {
    static CACHE: Mutex<BTreeMap<PathBuf, HashMap<String, u64>>> = Mutex::new(BTreeMap::new());
    if let Some(found) = CACHE.lock().unwrap().get(&b.path) {
        return found.clone();
    }
    let symbols: HashMap<String, u64> = go_tool(&b.go, &["nm", b.path.to_str().unwrap()], None)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let addr = u64::from_str_radix(f.next()?, 16).ok()?;
            let _kind = f.next()?;
            Some((f.next()?.to_owned(), addr))
        })
        .collect();
    CACHE
        .lock()
        .unwrap()
        .insert(b.path.clone(), symbols.clone());
    symbols
}

/// Functions whose RETs are checked against `go tool objdump`.
const RET_CHECKED: &[&str] = &[START_THE_WORLD, STOP_THE_WORLD, COPYSTACK];

/// `go tool objdump`: addresses of the RET instructions of each of
/// `RET_CHECKED` (one run per binary).
fn objdump_rets(b: &Build) -> HashMap<String, Vec<u64>> {
    let pattern = format!(
        "^({})$",
        RET_CHECKED
            .iter()
            .map(|n| n.replace('.', "\\."))
            .collect::<Vec<_>>()
            .join("|")
    );
    let mut out: HashMap<String, Vec<u64>> = HashMap::new();
    let mut current = String::new();
    for l in go_tool(
        &b.go,
        &["objdump", "-s", &pattern, b.path.to_str().unwrap()],
        None,
    )
    .lines()
    {
        if let Some(rest) = l.strip_prefix("TEXT ") {
            current = rest.split('(').next().unwrap().to_owned();
            out.entry(current.clone()).or_default();
            continue;
        }
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() >= 4 && f[3] == "RET" {
            let addr = u64::from_str_radix(f[1].trim_start_matches("0x"), 16).unwrap();
            out.entry(current.clone()).or_default().push(addr);
        }
    }
    out
}

#[test]
fn entries_and_rets_match_the_go_toolchain() {
    let started = Instant::now();
    let mut checked = 0;
    for b in builds() {
        let bin = b.open();
        let refb = reference(b);
        let symbols = nm(refb);
        assert_eq!(
            bin.arch,
            if b.is_arm64() {
                Arch::Arm64
            } else {
                Arch::Amd64
            }
        );
        assert_eq!(bin.pie, b.spec.name == "pie", "{}", b.label());
        assert_eq!(
            bin.has_symtab,
            b.spec.twin.is_none_or(|_| b.spec.name == "nodwarf")
        );
        assert_eq!(bin.has_dwarf, b.spec.twin.is_none(), "{}", b.label());
        assert!(bin.go_build_id.is_some(), "{}: no Go build id", b.label());
        assert_eq!(
            bin.version_string,
            format!("go{}", b.go.version),
            "{}",
            b.label()
        );
        let text = symbols["runtime.text"];
        assert_eq!(
            bin.pclntab().unwrap().text_start,
            text,
            "{}: text start",
            b.label()
        );
        for &name in PROBED_FUNCTIONS {
            let f = bin
                .function(name)
                .unwrap_or_else(|e| panic!("{}: {e}", b.label()));
            let want = symbols
                .get(name)
                .or_else(|| symbols.get(&format!("{name}.abi0")))
                .unwrap_or_else(|| panic!("{}: nm has no {name}", b.label()));
            assert_eq!(f.address, *want, "{}: {name} entry", b.label());
            assert_eq!(
                f.source,
                if bin.has_symtab {
                    FunctionSource::Symtab
                } else {
                    FunctionSource::Pclntab
                }
            );
            // pclntab must agree with the symbol table where both exist.
            let from_pclntab = bin.pclntab().unwrap().lookup(name);
            assert!(
                from_pclntab.iter().any(|&(entry, _)| entry == f.address),
                "{}: pclntab entries {from_pclntab:x?} for {name} miss {:#x}",
                b.label(),
                f.address
            );
            checked += 1;
        }
        let rets = if b.spec.twin.is_none() {
            objdump_rets(b)
        } else {
            HashMap::new()
        };
        for &name in RET_CHECKED.iter().filter(|_| b.spec.twin.is_none()) {
            let f = bin.function(name).unwrap();
            let want: Vec<u64> = rets[name]
                .iter()
                .copied()
                .map(|vaddr| bin.file_offset(vaddr).unwrap())
                .collect();
            assert!(
                !want.is_empty(),
                "{}: objdump found no RET in {name}",
                b.label()
            );
            assert_eq!(f.ret_file_offsets, want, "{}: {name} RETs", b.label());
            // The file really holds a RET there.
            let data = std::fs::read(&b.path).unwrap();
            for &off in &f.ret_file_offsets {
                let off = off as usize;
                match bin.arch {
                    Arch::Amd64 => assert_eq!(data[off], 0xc3),
                    Arch::Arm64 => assert_eq!(&data[off..off + 4], &0xd65f03c0u32.to_le_bytes()),
                }
            }
        }
        // Stripped builds must find what their twins find.
        if let Some(twin) = b.spec.twin {
            let twin = sibling(b, twin).open();
            for &name in PROBED_FUNCTIONS {
                let (a, t) = (bin.function(name).unwrap(), twin.function(name).unwrap());
                assert_eq!(
                    (a.address, &a.ret_file_offsets),
                    (t.address, &t.ret_file_offsets),
                    "{}: {name} differs from its unstripped twin",
                    b.label()
                );
            }
        }
    }
    eprintln!(
        "{checked} function entries in {} binaries match go tool nm/objdump ({:.1?})",
        builds().len(),
        started.elapsed()
    );
}

#[test]
fn struct_offsets_agree_across_dwarf_type_descriptors_and_table() {
    let started = Instant::now();
    for b in builds() {
        let bin = b.open();
        let dwarf = bin.offsets_from(OffsetSource::Dwarf);
        assert_eq!(
            dwarf.is_some(),
            bin.has_dwarf,
            "{}: DWARF offsets",
            b.label()
        );
        let types = bin
            .offsets_from(OffsetSource::TypeDescriptors)
            .unwrap_or_else(|| panic!("{}: no type-descriptor offsets", b.label()));
        let table = bin
            .offsets_from(OffsetSource::VersionTable)
            .unwrap_or_else(|| panic!("{}: not in the version table", b.label()));
        for field in struct_fields() {
            let t = table.get(field);
            assert!(t.is_some(), "{}: table lacks {field}", b.label());
            assert_eq!(
                types.get(field),
                t,
                "{}: {field} type descriptors vs table",
                b.label()
            );
            if let Some(d) = &dwarf {
                assert_eq!(d.get(field), t, "{}: {field} DWARF vs table", b.label());
            }
        }
        let merged = bin.struct_offsets().unwrap();
        let want_source = if bin.has_dwarf {
            OffsetSource::Dwarf
        } else {
            OffsetSource::TypeDescriptors
        };
        for field in struct_fields() {
            assert_eq!(
                merged.fields[field].source,
                want_source,
                "{}: {field}",
                b.label()
            );
        }
        if let Some(twin) = b.spec.twin {
            let twin = sibling(b, twin).open().struct_offsets().unwrap();
            let values = |o: &tracer::binary::StructOffsets| {
                o.fields
                    .iter()
                    .map(|(k, v)| (*k, v.value))
                    .collect::<BTreeMap<_, _>>()
            };
            assert_eq!(values(&merged), values(&twin), "{}: vs its twin", b.label());
        }
    }
    eprintln!(
        "struct offsets of {} binaries agree ({:.1?})",
        builds().len(),
        started.elapsed()
    );
}

/// PCs spread over the text: a third of the way into every `step`-th function.
fn sample_pcs(bin: &GoBinary, step: usize) -> Vec<u64> {
    bin.pclntab()
        .unwrap()
        .functions()
        .step_by(step)
        .map(|(_, entry, end)| entry + (end - entry) / 3)
        .collect()
}

#[test]
fn symbolization_matches_go_tool_addr2line() {
    let started = Instant::now();
    let mut compared = 0;
    let mut inlined = 0;
    for b in builds()
        .iter()
        .filter(|b| !b.is_arm64() && b.spec.name != "pie")
    {
        let bin = b.open();
        let pcs = sample_pcs(&bin, 7);
        let sym = ExecutableImage::new(ExeId::of(&b.path).unwrap(), bin);
        if let Some(twin) = b.spec.twin {
            // Stripped: the same frames as the twin's.
            let twin = sibling(b, twin);
            let twin_sym = ExecutableImage::new(ExeId::of(&twin.path).unwrap(), twin.open());
            for &pc in &pcs {
                assert_eq!(
                    sym.frames(pc),
                    twin_sym.frames(pc),
                    "{} pc {pc:#x}",
                    b.label()
                );
            }
            continue;
        }
        let input: String = pcs.iter().map(|pc| format!("{pc:#x}\n")).collect();
        let out = go_tool(
            &b.go,
            &["addr2line", b.path.to_str().unwrap()],
            Some(&input),
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines.len(),
            2 * pcs.len(),
            "{}: addr2line output",
            b.label()
        );
        for (pc, pair) in pcs.iter().zip(lines.chunks(2)) {
            let frames = sym.frames(*pc);
            assert!(!frames.is_empty(), "{}: nothing for {pc:#x}", b.label());
            let outer = frames.last().unwrap();
            let inner = &frames[0];
            assert_eq!(
                outer.function,
                pair[0],
                "{}: function at {pc:#x}",
                b.label()
            );
            // Both say "unknown" their own way where a function has no line table.
            let want = if pair[1] == ":-1" { "?:0" } else { pair[1] };
            assert_eq!(
                format!("{}:{}", inner.file, inner.line),
                want,
                "{}: position of {pc:#x} ({frames:?})",
                b.label()
            );
            compared += 1;
            if frames.len() > 1 {
                inlined += 1;
            }
        }
    }
    assert!(inlined > 0, "no sampled PC had inlined frames");
    eprintln!(
        "{compared} PCs match go tool addr2line ({inlined} with inlined frames) ({:.1?})",
        started.elapsed()
    );
}

/// What the inspect workload prints of itself.
#[derive(Debug, Deserialize)]
struct PcsReport {
    leaf: u64,
    main: u64,
    stack: Vec<u64>,
    frames: Vec<GoFrame>,
    cgo: i64,
}

#[derive(Debug, Deserialize, PartialEq)]
struct GoFrame {
    function: String,
    file: String,
    line: u32,
}

/// Start `path -wait` (through `wrapper` if given); return it and its report.
fn start_waiting(path: &Path, wrapper: &[&str]) -> (Child, PcsReport) {
    let mut cmd = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(path);
            c
        }
        None => Command::new(path),
    };
    let mut child = cmd
        .arg("-wait")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", path.display()));
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let json = line
        .strip_prefix("GOSTW_PCS ")
        .unwrap_or_else(|| panic!("{}: unexpected output {line:?}", path.display()));
    (child, serde_json::from_str(json).unwrap())
}

fn stop(mut child: Child) {
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
}

/// Check a live process's symbolization against what its runtime said.
fn check_live(label: &str, pid: u32, report: &PcsReport) -> ProcessImage {
    let ps = ProcessImage::of_pid(pid).unwrap_or_else(|e| panic!("{label}: {e}"));
    let name = |pc: u64| ps.frames(pc).last().map(|f| f.function.clone());
    assert_eq!(name(report.leaf).as_deref(), Some("main.leaf"), "{label}");
    assert_eq!(name(report.main).as_deref(), Some("main.main"), "{label}");
    assert_eq!(
        report.stack.len(),
        report.frames.len(),
        "{label}: {report:?}"
    );
    for (pc, want) in report.stack.iter().zip(&report.frames) {
        let got = ps.frames_of_return(*pc);
        let first = got
            .first()
            .unwrap_or_else(|| panic!("{label}: nothing at {pc:#x}"));
        assert_eq!(
            GoFrame {
                function: first.function.clone(),
                file: first.file.clone(),
                line: first.line,
            },
            *want,
            "{label}: frame at {pc:#x} ({got:?})"
        );
    }
    assert!(
        report
            .frames
            .iter()
            .any(|f| f.function == "main.inlinedInner"),
        "{label}: the workload's inlined frame is missing"
    );
    ps
}

#[test]
fn live_processes_symbolize_like_the_go_runtime() {
    let started = Instant::now();
    let mut processes = 0;
    for b in builds().iter().filter(|b| {
        matches!(
            b.spec.name,
            "exe" | "pie" | "stripped" | "cgo" | "cgo-stripped"
        )
    }) {
        let (child, report) = start_waiting(&b.path, &[]);
        let pid = child.id();
        let ps = check_live(&b.label(), pid, &report);
        assert_eq!(
            ps.bias().unwrap() != 0,
            b.spec.name == "pie",
            "{}: bias {:#x}",
            b.label(),
            ps.bias().unwrap()
        );
        assert_eq!(report.cgo >= 0, b.spec.needs_gcc, "{}", b.label());
        let inspected = tracer::inspect::inspect_pid(pid).unwrap();
        let process = inspected.process.unwrap();
        assert_eq!(process.exe.exe, b.path.canonicalize().unwrap());
        assert!(!process.exe.other_mount_namespace);
        assert_eq!(Some(process.load_bias), ps.bias());
        stop(child);
        processes += 1;
    }
    eprintln!(
        "{processes} live processes symbolize like runtime.CallersFrames ({:.1?})",
        started.elapsed()
    );
}

/// A process in its own mount namespace, started from a file the host cannot
/// see at that path: gostw must reach it through /proc/PID/root.
#[test]
fn container_process_is_reached_through_proc_root() {
    let b = builds()
        .iter()
        .rev()
        .find(|b| b.spec.name == "stripped")
        .unwrap();
    let dir = std::env::temp_dir().join(format!("gostw-container-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        "mount -t tmpfs gostw {dir} && cp {bin} {dir}/server && exec {dir}/server -wait",
        dir = dir.display(),
        bin = b.path.display()
    );
    let mut child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("unshare");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let report: PcsReport = serde_json::from_str(
        line.strip_prefix("GOSTW_PCS ")
            .unwrap_or_else(|| panic!("unexpected output {line:?} (unshare needs root)")),
    )
    .unwrap();
    let pid = child.id();
    let exe = running::process_exe(pid).unwrap();
    assert!(exe.other_mount_namespace, "{exe:?}");
    assert_eq!(exe.exe, dir.join("server"));
    assert!(
        !dir.join("server").exists(),
        "the host should not see the file"
    );
    assert_eq!(
        exe.host_path,
        PathBuf::from(format!("/proc/{pid}/root"))
            .join(dir.strip_prefix("/").unwrap().join("server"))
    );
    let bin = GoBinary::open_pid(pid).unwrap();
    assert_eq!(bin.path, exe.host_path);
    assert!(
        GoBinary::open(&bin.path).is_ok(),
        "host path is not readable"
    );
    check_live("container", pid, &report);
    stop(child);
    std::fs::remove_dir(&dir).unwrap();
}

/// Run `gostw inspect ARGS`; return (success, stdout, stderr).
fn gostw_inspect(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gostw"))
        .arg("inspect")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `gostw inspect ARGS` must fail with one clear line containing `expect`.
fn assert_clean_failure(args: &[&str], expect: &str) {
    let (ok, _, stderr) = gostw_inspect(args);
    assert!(!ok, "gostw inspect {args:?} succeeded");
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    assert!(
        stderr.contains(expect),
        "{args:?}: {stderr:?} lacks {expect:?}"
    );
}

#[test]
fn inspect_cli_reports_json_and_fails_cleanly_on_bad_input() {
    let newest = builds().last().unwrap();
    let exe = sibling(newest, "exe");
    let stripped = sibling(newest, "stripped");

    // JSON of a good binary carries the documented fields.
    let (ok, stdout, stderr) = gostw_inspect(&["--json", stripped.path.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    for key in [
        "path",
        "go_version",
        "arch",
        "pie",
        "has_symtab",
        "has_dwarf",
        "build_id",
        "functions",
        "struct_offsets",
        "fault_backend",
    ] {
        assert!(v.get(key).is_some(), "JSON lacks {key}: {v}");
    }
    let start = &v["functions"][START_THE_WORLD];
    assert!(start["address"].as_u64().unwrap() > 0);
    assert!(!start["ret_file_offsets"].as_array().unwrap().is_empty());
    assert_eq!(v["struct_offsets"]["g.goid"]["source"], "type_descriptors");
    assert!(matches!(
        v["fault_backend"]["backend"].as_str(),
        Some("kprobe" | "tracepoint" | "none")
    ));
    let (ok, human, _) = gostw_inspect(&[exe.path.to_str().unwrap()]);
    assert!(ok && human.contains(START_THE_WORLD) && human.contains("fault backend"));

    let tmp = std::env::temp_dir().join(format!("gostw-bad-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let write = |name: &str, data: &[u8]| {
        let p = tmp.join(name);
        std::fs::write(&p, data).unwrap();
        p.to_str().unwrap().to_owned()
    };
    let data = std::fs::read(&stripped.path).unwrap();

    assert_clean_failure(&[&write("text", b"just some text\n")], "not an ELF");
    assert_clean_failure(&[&write("empty", b"")], "not an ELF");
    assert_clean_failure(&["/bin/ls"], "not a Go program");
    assert_clean_failure(&[tmp.join("missing").to_str().unwrap()], "cannot read");
    for keep in [64, 4096, data.len() / 2, data.len() - 1000] {
        assert_clean_failure(
            &[&write(&format!("truncated-{keep}"), &data[..keep])],
            "corrupted",
        );
    }
    // No function table and no symbols: nothing to find functions with.
    let bin = GoBinary::open(&stripped.path).unwrap();
    let pclntab_at = bin.pclntab().unwrap().addr - bin.link_base();
    let mut broken = data.clone();
    broken[pclntab_at as usize..pclntab_at as usize + 64].fill(0xee);
    assert_clean_failure(&[&write("no-pclntab", &broken)], "pclntab");
    // A Go version outside the table, without DWARF, and type descriptors
    // that no longer name runtime.g's fields.
    let version = format!("go{}", newest.go.version);
    let future = version.replacen("go1.", "go9.", 1);
    let mut unknown = replace_all(&data, version.as_bytes(), future.as_bytes());
    unknown = replace_all(&unknown, b"stackguard0", b"stackguardX");
    unknown = replace_all(&unknown, b"morebuf", b"morebuX");
    assert_clean_failure(
        &[&write("future", &unknown)],
        "outside gostw's offset table",
    );

    assert_clean_failure(&["--pid", "999999999"], "no such process");
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    assert_clean_failure(&["--pid", &sleeper.id().to_string()], "not a Go program");
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    std::fs::remove_dir_all(&tmp).unwrap();
}

fn replace_all(data: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let mut out = data.to_vec();
    let mut i = 0;
    let mut found = false;
    while i + from.len() <= out.len() {
        if &out[i..i + from.len()] == from {
            out[i..i + from.len()].copy_from_slice(to);
            found = true;
            i += from.len();
        } else {
            i += 1;
        }
    }
    assert!(found, "{:?} not found", String::from_utf8_lossy(from));
    out
}

/// Exercise every parser on `data`; only a panic is a failure.
fn analyse_everything(data: Vec<u8>) {
    let Ok(bin) = GoBinary::from_bytes(Path::new("fuzzed"), data) else {
        return;
    };
    for &name in PROBED_FUNCTIONS {
        let _ = bin.function(name);
    }
    let _ = bin.struct_offsets();
    for source in [OffsetSource::Dwarf, OffsetSource::TypeDescriptors] {
        let _ = bin.offsets_from(source);
    }
    if let Ok(p) = bin.pclntab() {
        let funcs: Vec<(u64, u64)> = p
            .functions()
            .map(|(_, e, end)| (e, end))
            .take(4000)
            .collect();
        for (entry, end) in funcs.iter().step_by(97) {
            let _ = p.frames(*entry);
            let _ = p.frames(entry + (end.wrapping_sub(*entry)) / 2);
        }
        let _ = p.frames(0);
        let _ = p.frames(u64::MAX);
    }
}

/// Regions of a real binary worth corrupting: the headers, each section
/// the parsers read.
fn regions(path: &Path) -> Vec<(usize, usize)> {
    let bin = GoBinary::open(path).unwrap();
    let mut out = vec![(0, 0x1000)];
    let data = std::fs::read(path).unwrap();
    let base = bin.link_base();
    let mut add = |vaddr: u64, len: usize| {
        if let Some(start) = vaddr.checked_sub(base) {
            let start = start as usize;
            out.push((start, (start + len).min(data.len())));
        }
    };
    add(bin.pclntab().unwrap().addr, 0x4000);
    let f = bin.function(START_THE_WORLD).unwrap();
    add(f.address, f.size as usize);
    out.retain(|(s, e)| s < e);
    out
}

/// A binary's bytes and the regions to mutate.
type Sample = (Vec<u8>, Vec<(usize, usize)>);

#[test]
fn parsers_survive_mutated_real_binaries() {
    let started = Instant::now();
    let newest = builds().last().unwrap();
    let samples: Vec<Sample> = ["stripped", "arm64-stripped", "exe"]
        .iter()
        .map(|v| {
            let b = sibling(newest, v);
            (std::fs::read(&b.path).unwrap(), regions(&b.path))
        })
        .collect();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 150,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let strategy = (
        0..samples.len(),
        any::<prop::sample::Index>(),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..64),
        any::<prop::sample::Index>(),
        prop::bool::weighted(0.2),
    );
    runner
        .run(&strategy, |(which, region, writes, cut, truncate)| {
            let (data, regions) = &samples[which];
            let mut data = data.clone();
            let (start, end) = regions[region.index(regions.len())];
            for (at, byte) in writes {
                data[start + at.index(end - start)] = byte;
            }
            if truncate {
                data.truncate(cut.index(data.len()));
            }
            analyse_everything(data);
            Ok(())
        })
        .unwrap();
    eprintln!(
        "150 mutated binaries parsed without panic ({:.1?})",
        started.elapsed()
    );
}
