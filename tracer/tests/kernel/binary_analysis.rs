//! Go binary analysis checked against the Go toolchain's own answers, for
//! every Go version of the matrix and every way an SRE's binary may be built:
//! plain, PIE, without DWARF (`-w`), stripped (`-s -w`), cgo with external
//! linking (plain and stripped), arm64 (cross-built, analysed statically),
//! and without `.go.buildinfo` (`objcopy --remove-section .go.buildinfo` of
//! plain, stripped, stripped PIE and stripped arm64 builds).
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
        AllglenSource, Arch, COPYSTACK, FunctionSource, GoBinary, OffsetSource, PROBED_FUNCTIONS,
        START_THE_WORLD, STOP_THE_WORLD, TIME_HISTOGRAM_RECORD, VersionSource,
        offsets::struct_fields, running,
    },
    image::{ExeId, ExecutableImage, ProcessImage},
    model::pause::StwReason,
};

use crate::{
    loopback::{free_port, http_get},
    scenario::MemCgroup,
    support::{
        GoToolchain, STW_ARGS, STW_GOMAXPROCS, STW_READ_MEM_STATS, StwReport, build_workload,
        build_workload_env, go_matrix, gostw_stdout, newest_go, parse_report, require_root,
    },
};

/// How one variant is built.
struct Spec {
    name: &'static str,
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
    /// Built from the same code as this variant, with symbols and DWARF.
    twin: Option<&'static str>,
    needs_gcc: bool,
    /// `objcopy --remove-section .go.buildinfo` after the build.
    without_buildinfo: bool,
}

const NO_CGO: &[(&str, &str)] = &[("CGO_ENABLED", "0")];
const CGO: &[(&str, &str)] = &[("CGO_ENABLED", "1")];
const ARM64: &[(&str, &str)] = &[("CGO_ENABLED", "0"), ("GOARCH", "arm64")];
/// Cross-built with Debian's aarch64 gcc (gcc-aarch64-linux-gnu).
const ARM64_CGO: &[(&str, &str)] = &[
    ("CGO_ENABLED", "1"),
    ("GOARCH", "arm64"),
    ("CC", "aarch64-linux-gnu-gcc"),
];

const SPECS: &[Spec] = &[
    Spec {
        name: "exe",
        args: &[],
        env: NO_CGO,
        twin: None,
        needs_gcc: false,
        without_buildinfo: false,
    },
    Spec {
        name: "pie",
        args: &["-buildmode=pie"],
        env: NO_CGO,
        twin: None,
        needs_gcc: false,
        without_buildinfo: false,
    },
    Spec {
        name: "nodwarf",
        args: &["-ldflags=-w"],
        env: NO_CGO,
        twin: Some("exe"),
        needs_gcc: false,
        without_buildinfo: false,
    },
    Spec {
        name: "stripped",
        args: &["-ldflags=-s -w"],
        env: NO_CGO,
        twin: Some("exe"),
        needs_gcc: false,
        without_buildinfo: false,
    },
    Spec {
        name: "cgo",
        args: &["-ldflags=-linkmode=external"],
        env: CGO,
        twin: None,
        needs_gcc: true,
        without_buildinfo: false,
    },
    Spec {
        name: "cgo-stripped",
        args: &["-ldflags=-linkmode=external -s -w"],
        env: CGO,
        twin: Some("cgo"),
        needs_gcc: true,
        without_buildinfo: false,
    },
    Spec {
        name: "arm64",
        args: &[],
        env: ARM64,
        twin: None,
        needs_gcc: false,
        without_buildinfo: false,
    },
    Spec {
        name: "arm64-stripped",
        args: &["-ldflags=-s -w"],
        env: ARM64,
        twin: Some("arm64"),
        needs_gcc: false,
        without_buildinfo: false,
    },
    Spec {
        name: "arm64-pie",
        args: &["-buildmode=pie"],
        env: ARM64,
        twin: None,
        needs_gcc: false,
        without_buildinfo: false,
    },
    Spec {
        name: "arm64-cgo",
        args: &["-ldflags=-linkmode=external"],
        env: ARM64_CGO,
        twin: None,
        needs_gcc: true,
        without_buildinfo: false,
    },
    // The version then comes from runtime.buildVersion: by its symbol...
    Spec {
        name: "nobuildinfo",
        args: &[],
        env: NO_CGO,
        twin: None,
        needs_gcc: false,
        without_buildinfo: true,
    },
    // ...or, stripped, as the string runtime.schedinit's code checks.
    Spec {
        name: "nobuildinfo-stripped",
        args: &["-ldflags=-s -w"],
        env: NO_CGO,
        twin: Some("exe"),
        needs_gcc: false,
        without_buildinfo: true,
    },
    Spec {
        name: "pie-nobuildinfo-stripped",
        args: &["-buildmode=pie", "-ldflags=-s -w"],
        env: NO_CGO,
        twin: Some("pie"),
        needs_gcc: false,
        without_buildinfo: true,
    },
    Spec {
        name: "arm64-nobuildinfo-stripped",
        args: &["-ldflags=-s -w"],
        env: ARM64,
        twin: Some("arm64"),
        needs_gcc: false,
        without_buildinfo: true,
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

    fn is_pie(&self) -> bool {
        self.spec.args.contains(&"-buildmode=pie")
    }

    /// Where the version must come from.
    fn version_source(&self) -> VersionSource {
        match (self.spec.without_buildinfo, self.spec.twin) {
            (false, _) => VersionSource::Buildinfo,
            (true, None) => VersionSource::BuildVersionSymbol,
            (true, Some(_)) => VersionSource::BuildVersionCode,
        }
    }
}

/// `objcopy --remove-section .go.buildinfo` of `path`, in place, with the
/// binutils of the file's architecture.
pub fn remove_buildinfo(path: &Path, arm64: bool) {
    let objcopy = if arm64 {
        "aarch64-linux-gnu-objcopy"
    } else {
        "objcopy"
    };
    let status = Command::new(objcopy)
        .args(["--remove-section", ".go.buildinfo"])
        .arg(path)
        .status()
        .unwrap_or_else(|e| {
            panic!("{objcopy}: {e} (binutils, binutils-aarch64-linux-gnu: run `cargo xtask setup`)")
        });
    assert!(status.success(), "{objcopy} failed on {}", path.display());
}

fn have_gcc(gcc: &str) -> bool {
    Command::new(gcc)
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
        for gcc in ["gcc", "aarch64-linux-gnu-gcc"] {
            assert!(
                have_gcc(gcc),
                "{gcc} is needed for the cgo (externally linked) variants: run `cargo xtask setup`"
            );
        }
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
                if spec.without_buildinfo {
                    remove_buildinfo(&path, spec.name.starts_with("arm64"));
                }
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

/// What `go tool objdump` shows of one function: its RETs, and the branch
/// that ends its prologue's stack check (amd64's JBE, arm64's BLS), if one
/// of its first four instructions is one.
#[derive(Default)]
struct Disassembled {
    rets: Vec<u64>,
    prologue_branch: Option<u64>,
    /// Its calls of `timeHistogram.record`.
    record_calls: Vec<u64>,
    /// How far its prologue moves SP down, as objdump shows the prologue.
    frame_drop: Option<u64>,
    /// The prologue read so far: (bytes pushed (amd64's BP), a pending
    /// arm64 `SUB $n, RSP, Rd` as (Rd, n)).
    pushed: u64,
    pending_sub: Option<(String, u64)>,
    seen: usize,
}

impl Disassembled {
    /// Follow the prologue's SP adjustments in instruction `f` (objdump's
    /// fields: mnemonic at 3, operands after).
    fn prologue(&mut self, f: &[&str]) {
        if self.frame_drop.is_some() || self.seen > 10 {
            return;
        }
        let op = |i: usize| f.get(i).copied().unwrap_or("");
        let imm = |s: &str| {
            let s = s.trim_start_matches('$').trim_end_matches(',');
            match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16).ok(),
                None => s.parse().ok(),
            }
        };
        match op(3) {
            "PUSHQ" if op(4) == "BP" => self.pushed += 8,
            "SUBQ" if op(5) == "SP" => self.frame_drop = imm(op(4)).map(|n| n + self.pushed),
            "MOVD.W" if op(4) == "R30," => {
                self.frame_drop = op(5)
                    .strip_suffix("(RSP)")
                    .and_then(|n| n.strip_prefix('-'))
                    .and_then(|n| n.parse().ok());
            }
            "SUB" if op(5) == "RSP," && op(6) != "R17" => {
                self.pending_sub = imm(op(4)).map(|n| (op(6).to_owned(), n));
            }
            "MOVD" if op(5) == "RSP" => {
                if let Some((reg, n)) = &self.pending_sub
                    && op(4).trim_end_matches(',') == reg
                {
                    self.frame_drop = Some(*n);
                }
            }
            _ => {}
        }
    }
}

/// `go tool objdump` of each of `RET_CHECKED` (one run per binary).
fn objdump_rets(b: &Build) -> HashMap<String, Disassembled> {
    let pattern = format!(
        "^({})$",
        RET_CHECKED
            .iter()
            .map(|n| n.replace('.', "\\."))
            .collect::<Vec<_>>()
            .join("|")
    );
    let mut out: HashMap<String, Disassembled> = HashMap::new();
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
        if f.len() >= 4 && f[1].starts_with("0x") {
            let addr = u64::from_str_radix(f[1].trim_start_matches("0x"), 16).unwrap();
            let d = out.entry(current.clone()).or_default();
            d.seen += 1;
            d.prologue(&f);
            if f[3] == "RET" {
                d.rets.push(addr);
            }
            if f[3] == "CALL" && f.get(4) == Some(&"runtime.(*timeHistogram).record(SB)") {
                d.record_calls.push(addr);
            }
            if matches!(f[3], "JBE" | "JLS" | "BLS") && d.seen <= 4 && d.prologue_branch.is_none() {
                d.prologue_branch = Some(addr);
            }
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
        assert_eq!(bin.pie, b.is_pie(), "{}", b.label());
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
        assert_eq!(bin.version_source, b.version_source(), "{}", b.label());
        // runtime.allglen: by name, else from runtime.allgadd's code.
        // Data addresses move a little between builds with and without
        // -s/-w (text does not), so a stripped build is checked against its
        // twin's distance from allglen to allgs, which both give.
        let allglen = bin.allglen();
        {
            let a = allglen.unwrap_or_else(|| panic!("{}: no runtime.allglen", b.label()));
            let allgs = a.allgs_len.expect("len(allgs) found with allglen") - 8;
            if bin.has_symtab {
                let own = nm(b);
                assert_eq!(a.address, own["runtime.allglen"], "{}", b.label());
                assert_eq!(allgs, own["runtime.allgs"], "{}", b.label());
                assert_eq!(a.source, AllglenSource::Symtab, "{}", b.label());
            } else {
                assert_eq!(
                    a.address - allgs,
                    symbols["runtime.allglen"] - symbols["runtime.allgs"],
                    "{}: allglen {:#x}, allgs {allgs:#x}",
                    b.label(),
                    a.address
                );
                assert_eq!(a.source, AllglenSource::AllgaddCode, "{}", b.label());
            }
        }
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
        // Stack growth's frame sizes read the same prologues (its own amd64
        // reader, the probe points' on arm64).
        let image = ExecutableImage::new(ExeId::of(&b.path).unwrap(), b.open());
        for &name in RET_CHECKED.iter().filter(|_| b.spec.twin.is_none()) {
            let f = bin.function(name).unwrap();
            let want: Vec<u64> = rets[name]
                .rets
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
            // The entry probe sits on the prologue's stack-check branch
            // (emulated by the kernel: one trap).
            let branch = rets[name].prologue_branch.unwrap_or_else(|| {
                panic!("{}: no stack-check branch in {name}'s prologue", b.label())
            });
            let want_probe = bin.file_offset(branch).unwrap();
            assert_eq!(
                f.entry_probe_offset,
                want_probe,
                "{}: {name} entry probe",
                b.label()
            );
            // The prologue's drop (the end probes' stack slot is found
            // from it).
            let want_drop = rets[name].frame_drop.unwrap_or_else(|| {
                panic!("{}: objdump shows no frame set-up in {name}", b.label())
            });
            assert_eq!(
                bin.frame_drop(name).unwrap(),
                Some(want_drop),
                "{}: {name}'s frame drop",
                b.label()
            );
            assert_eq!(
                image.max_frame(f.address),
                Some(want_drop),
                "{}: {name}'s frame size for stack growth",
                b.label()
            );
            // The stopping and end probes' calls (Go 1.22+ records its
            // stopping and total times in two histograms each, GC and
            // other).
            let recorded = name == STOP_THE_WORLD || name == START_THE_WORLD;
            if recorded && bin.version.code() >= 122 {
                let want: Vec<u64> = rets[name]
                    .record_calls
                    .iter()
                    .map(|&vaddr| bin.file_offset(vaddr).unwrap())
                    .collect();
                assert_eq!(want.len(), 2, "{}: objdump's record calls", b.label());
                assert_eq!(
                    bin.calls(name, TIME_HISTOGRAM_RECORD).unwrap(),
                    want,
                    "{}: {name}'s record calls",
                    b.label()
                );
            }
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
            "exe"
                | "pie"
                | "stripped"
                | "cgo"
                | "cgo-stripped"
                | "nobuildinfo-stripped"
                | "pie-nobuildinfo-stripped"
        )
    }) {
        let (child, report) = start_waiting(&b.path, &[]);
        let pid = child.id();
        let ps = check_live(&b.label(), pid, &report);
        assert_eq!(
            ps.bias().unwrap() != 0,
            b.is_pie(),
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
        assert_eq!(inspected.go_version, format!("go{}", b.go.version));
        assert_eq!(inspected.version_source, b.version_source());
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
        "version_source",
        "allglen",
    ] {
        assert!(v.get(key).is_some(), "JSON lacks {key}: {v}");
    }
    assert_eq!(v["version_source"], "buildinfo");
    assert_eq!(v["allglen"]["source"], "allgadd_code");
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
    // Words for people, not Rust enum names.
    for word in [
        "version from .go.buildinfo",
        "Go 1.20+ format",
        "  DWARF\n",
        "symtab\n",
    ] {
        assert!(human.contains(word), "{word:?} missing from:\n{human}");
    }
    let (ok, human, _) = gostw_inspect(&[sibling(newest, "nobuildinfo-stripped")
        .path
        .to_str()
        .unwrap()]);
    assert!(ok, "{human}");
    for word in [
        "version from runtime.buildVersion (the string runtime.schedinit checks)",
        "runtime type descriptors\n",
        "version table\n",
        "pclntab\n",
        "from runtime.allgadd's code",
    ] {
        assert!(human.contains(word), "{word:?} missing from:\n{human}");
    }
    for enum_name in [
        "Pclntab",
        "Symtab",
        "TypeDescriptors",
        "VersionTable",
        "Dwarf",
        "Tracepoint",
        "Kprobe",
        "Go120",
    ] {
        assert!(!human.contains(enum_name), "{enum_name} in:\n{human}");
    }
    assert!(
        human.contains("fault backend: tracepoints + perf events")
            || human.contains("fault backend: kprobes")
            || human.contains("fault backend: none"),
        "{human}"
    );

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

const GOSTW: &str = env!("CARGO_BIN_EXE_gostw");

/// One line of `gostw run --json` / `attach --json` output, sorted.
#[derive(Default)]
struct TracedRun {
    pauses: Vec<serde_json::Value>,
    summary: Option<serde_json::Value>,
}

fn parse_traced(stdout: &str) -> TracedRun {
    let mut t = TracedRun::default();
    for line in stdout.lines().filter(|l| l.starts_with('{')) {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("gostw printed bad JSON {line:?}: {e}"));
        match v["type"].as_str() {
            Some("pause") => t.pauses.push(v),
            Some("summary") => t.summary = Some(v),
            other => panic!("unknown record type {other:?}"),
        }
    }
    t
}

/// `gostw run` and `gostw attach` trace a stripped binary without
/// `.go.buildinfo` (its version from the string runtime.schedinit checks)
/// on every Go version of the matrix, and see every pause Go counts, as
/// `pauses::run_reports_every_pause_as_go_counts_it` checks for ordinary
/// builds: reasons, counts, and (1.22+) Go's own durations to the ns.
#[test]
fn run_and_attach_trace_binaries_without_buildinfo() {
    require_root();
    let matrix = go_matrix();
    for go in &matrix {
        let v = &go.version;
        let path = build_workload("stw", go, "-nobuildinfo-stripped", &["-ldflags=-s -w"]);
        remove_buildinfo(&path, false);
        let bin = GoBinary::open(&path).unwrap();
        assert_eq!(bin.version_source, VersionSource::BuildVersionCode);
        assert_eq!(bin.version_string, format!("go{v}"));
        let stdout = gostw_stdout(
            Command::new(GOSTW)
                .args(["run", "--json", "--"])
                .arg(&path)
                .args(STW_ARGS),
            &format!("Go {v}: gostw run"),
        );
        let t = parse_traced(&stdout);
        let report: StwReport = parse_report(&stdout);
        let count = |reason: &str| t.pauses.iter().filter(|p| p["reason"] == reason).count();
        let is_gc =
            |p: &&serde_json::Value| StwReason(p["reason_code"].as_u64().unwrap() as u32).is_gc();
        let gc: Vec<&serde_json::Value> = t.pauses.iter().filter(is_gc).collect();
        let other = t.pauses.len() - gc.len();
        eprintln!(
            "Go {v} without .go.buildinfo: {} GC pauses, {other} other; {report:?}",
            gc.len()
        );
        assert!(t.pauses.iter().all(|p| p["pid"] == report.pid));
        assert_eq!(
            count("read_mem_stats"),
            STW_READ_MEM_STATS as usize,
            "Go {v}"
        );
        assert_eq!(count("gomaxprocs"), STW_GOMAXPROCS as usize, "Go {v}");
        assert_eq!(count("unknown"), 0, "Go {v}");
        if go.major_minor() >= (1, 22) {
            assert_eq!(gc.len() as i64, report.stw_gc, "Go {v}: GC pauses");
            assert_eq!(other as i64, report.stw_other, "Go {v}: other pauses");
            let gc_ns: u64 = gc.iter().map(|p| p["duration_ns"].as_u64().unwrap()).sum();
            assert_eq!(gc_ns, report.pause_total_ns, "Go {v}: GC pause time");
        } else {
            assert_eq!(gc.len() as u64, 2 * report.num_gc, "Go {v}: 2 x NumGC");
            assert_eq!(
                other as u64,
                STW_READ_MEM_STATS + STW_GOMAXPROCS,
                "Go {v}: other pauses"
            );
        }
        let summary = t.summary.as_ref().expect("gostw printed no summary");
        assert_eq!(summary["processes"][0]["pauses"], t.pauses.len());
        assert_eq!(summary["lost"]["total"], 0, "{summary}");
    }

    // attach --pid to one running, as an SRE would.
    let go = matrix.iter().max_by_key(|g| g.major_minor()).unwrap();
    let path = build_workload("stw", go, "-nobuildinfo-stripped", &["-ldflags=-s -w"]);
    remove_buildinfo(&path, false);
    let workload = Command::new(&path)
        .args(["-duration", "4s", "-alloc-mb", "32", "-gc", "2"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = workload.id();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = Command::new(GOSTW)
        .args(["attach", "--pid", &pid.to_string(), "--json"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gostw attach failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let w = workload.wait_with_output().unwrap();
    assert!(w.status.success());
    let report: StwReport = parse_report(&String::from_utf8_lossy(&w.stdout));
    let t = parse_traced(&String::from_utf8_lossy(&out.stdout));
    let go_count = (report.stw_gc + report.stw_other) as usize;
    eprintln!("attach: {} pauses of {go_count} Go counted", t.pauses.len());
    assert!(t.pauses.iter().all(|p| p["pid"] == pid));
    assert!(t.pauses.len() >= 10, "too few pauses: {}", t.pauses.len());
    assert!(t.pauses.len() <= go_count);
}

/// Write a Go program embedding `mb` MB of data (an executable of that size
/// plus ~2 MB, like services that embed their web assets) and build it with
/// `build_args`; with `-wait` it blocks until its standard input closes.
/// Its sources and the blob stay under the build's own directory, shared by
/// the two tests that use them, and go with `target/`.
fn large_go_binary(go: &GoToolchain, mb: usize, variant: &str, build_args: &[&str]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("gostw-large-{mb}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("go.mod"), "module large\n\ngo 1.19\n").unwrap();
    std::fs::write(
        dir.join("main.go"),
        r#"// Command large is a Go program of a given size: it embeds blob.bin.
package main

import (
	_ "embed"
	"fmt"
	"io"
	"os"
)

//go:embed blob.bin
var blob []byte

func main() {
	fmt.Println(len(blob), blob[len(blob)/3])
	if len(os.Args) > 1 && os.Args[1] == "-wait" {
		io.Copy(io.Discard, os.Stdin)
	}
}
"#,
    )
    .unwrap();
    let blob = dir.join("blob.bin");
    if std::fs::metadata(&blob).map(|m| m.len()).ok() != Some((mb << 20) as u64) {
        // Incompressible bytes (xorshift), written in pieces.
        let mut f = std::io::BufWriter::new(std::fs::File::create(&blob).unwrap());
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut chunk = vec![0u8; 1 << 20];
        for _ in 0..mb {
            for w in chunk.chunks_exact_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                w.copy_from_slice(&x.to_le_bytes());
            }
            f.write_all(&chunk).unwrap();
        }
        f.flush().unwrap();
    }
    let out = dir.join(format!("gostw-large{variant}"));
    let status = Command::new(&go.go)
        .current_dir(&dir)
        .arg("build")
        .args(build_args)
        .arg("-o")
        .arg(&out)
        .arg(".")
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-buildvcs=false")
        .env("GOPROXY", "off")
        .env("CGO_ENABLED", "0")
        .status()
        .unwrap();
    assert!(status.success(), "building the large Go program failed");
    out
}

/// Size of the large binary the memory tests build (MB of embedded data);
/// `GOSTW_LARGE_BINARY_MB` overrides it (the 500 MB figure of docs/guide/deployment.md).
fn large_mb() -> usize {
    std::env::var("GOSTW_LARGE_BINARY_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(110)
}

/// `Name:  N kB` lines of /proc/PID/status, in KB.
fn status_kb(pid: u32) -> BTreeMap<String, u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let kb = v.trim().strip_suffix(" kB")?.parse().ok()?;
            Some((k.to_owned(), kb))
        })
        .collect()
}

/// Analysing an executable does not read it into memory: in this process,
/// everything the agent and `gostw run` do with a >= 100 MB Go binary
/// (unstripped: symbol table and DWARF read; stripped without
/// .go.buildinfo: the version and allglen decoded from code) — open it,
/// struct offsets, the probed functions and their RETs, allglen, a
/// symbolizer and the stack-growth symbols, symbolizing PCs all over its
/// code — adds under 64 MB to the peak resident set (VmHWM, file pages
/// included), against a baseline taken after resetting the peak.
#[test]
fn analysing_a_large_binary_keeps_memory_small() {
    let go = newest_go();
    let mb = large_mb();
    let plain = large_go_binary(&go, mb, "", &[]);
    let stripped = large_go_binary(&go, mb, "-nobuildinfo-stripped", &["-ldflags=-s -w"]);
    remove_buildinfo(&stripped, false);
    let me = std::process::id();
    for path in [&plain, &stripped] {
        let size = std::fs::metadata(path).unwrap().len();
        assert!(
            size >= (mb as u64) << 20,
            "{} is {size} bytes",
            path.display()
        );
        // Writing 5 resets VmHWM to the current resident set.
        std::fs::write("/proc/self/clear_refs", "5").unwrap();
        let before = status_kb(me);
        let bin = GoBinary::open(path).unwrap();
        let offsets = bin.struct_offsets().unwrap();
        for &name in PROBED_FUNCTIONS {
            bin.function(name).unwrap();
        }
        let allglen = bin.allglen();
        let pcs = sample_pcs(&bin, 13);
        // The one analysis symbolization and stack growth use (it opens the
        // file again, as the tracer does).
        let sym = ExecutableImage::open(path).unwrap();
        let named = pcs.iter().filter(|&&pc| !sym.frames(pc).is_empty()).count();
        let frame = pcs.iter().filter_map(|&pc| sym.max_frame(pc)).count();
        let after = status_kb(me);
        let added = |k: &str| after[k] as i64 - before[k] as i64;
        let peak_added = after["VmHWM"] as i64 - before["VmRSS"] as i64;
        eprintln!(
            "analysing {} ({} MB, {}): peak +{} MB (VmHWM {} MB from VmRSS {} MB); now \
             RssAnon {:+} MB, RssFile {:+} MB",
            path.display(),
            size >> 20,
            if bin.has_symtab {
                "unstripped"
            } else {
                "stripped, no .go.buildinfo"
            },
            peak_added >> 10,
            after["VmHWM"] >> 10,
            before["VmRSS"] >> 10,
            added("RssAnon") >> 10,
            added("RssFile") >> 10,
        );
        assert!(peak_added < 64 << 10, "peak grew by {peak_added} KB");
        // And the analysis is complete and right.
        assert_eq!(bin.version_string, format!("go{}", go.version));
        assert_eq!(
            offsets.fields["g.goid"].source,
            if bin.has_dwarf {
                OffsetSource::Dwarf
            } else {
                OffsetSource::TypeDescriptors
            }
        );
        assert!(allglen.is_some() && sym.binary.allglen() == allglen);
        assert_eq!(named, pcs.len(), "every sampled PC is in a function");
        assert!(frame > 0, "no frame size read from a prologue");
    }
}

/// The agent's own memory while it traces a process of a >= 100 MB Go
/// binary: the peak (VmHWM) stays under 64 MB; RssAnon and RssFile are
/// printed (mapped file pages are page cache the kernel can reclaim).
#[test]
fn agent_tracing_a_large_binary_keeps_memory_small() {
    require_root();
    let go = newest_go();
    let mb = large_mb();
    let path = large_go_binary(&go, mb, "", &[]);
    let size = std::fs::metadata(&path).unwrap().len();
    // The control: the same agent and program, the program not traced.
    let (_, control_peak) = agent_memory_in_a_cgroup(&path, false);
    let (status, peak) = agent_memory_in_a_cgroup(&path, true);
    eprintln!(
        "gostw agent tracing {} ({} MB): VmHWM {} MB, VmRSS {} MB, RssAnon {} MB, RssFile {} MB; \
         its memory cgroup's peak {} MB (not tracing it: {} MB)",
        path.display(),
        size >> 20,
        status["VmHWM"] >> 10,
        status["VmRSS"] >> 10,
        status["RssAnon"] >> 10,
        status["RssFile"] >> 10,
        peak >> 20,
        control_peak >> 20,
    );
    assert!(status["VmHWM"] < 64 << 10, "{status:?}");
    // Mapped, not read: the binary's size does not show in the group's
    // peak (BPF maps and page cache are charged to it either way).
    assert!(
        peak < control_peak + (16 << 20),
        "peak {peak} B tracing the binary, {control_peak} B not"
    );
}

/// Run the agent alone in a memory cgroup (256 MiB, as `MemoryMax=256M`)
/// beside the program at `path`, which it traces if `trace`; its
/// /proc/PID/status once it traces it (or after 3 s), and the group's peak.
fn agent_memory_in_a_cgroup(path: &Path, trace: bool) -> (BTreeMap<String, u64>, u64) {
    let cgroup = MemCgroup::create("gostw-agent-large");
    let (limit, peak_file) = if cgroup.is_v1() {
        ("memory.limit_in_bytes", "memory.max_usage_in_bytes")
    } else {
        ("memory.max", "memory.peak")
    };
    cgroup.write(limit, &(256u64 << 20).to_string());
    let dir = path.parent().unwrap().to_owned();
    let matching = if trace {
        format!("^{}/", regex::escape(&dir.display().to_string()))
    } else {
        "^/nothing-traced$".to_owned()
    };
    let port = free_port();
    // Into the group before it runs, so everything it charges is counted.
    let procs = cgroup.path.join("cgroup.procs");
    let mut agent = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {} && exec {GOSTW} agent --listen 127.0.0.1:{port} --match '{matching}' \
             --poll-interval 200ms",
            procs.display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut program = Command::new(path)
        .arg("-wait")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let exe_label = format!(
        "executable=\"{}\"",
        path.file_name().unwrap().to_str().unwrap()
    );
    let deadline = Instant::now() + std::time::Duration::from_secs(if trace { 60 } else { 3 });
    let traced = loop {
        let body = http_get(port, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default();
        if body
            .lines()
            .any(|l| l.starts_with("gostw_traced_processes{") && l.contains(&exe_label))
        {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    };
    let status = status_kb(agent.id());
    let peak: u64 = std::fs::read_to_string(cgroup.path.join(peak_file))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    drop(program.stdin.take());
    let _ = program.wait();
    let _ = agent.kill();
    let _ = agent.wait();
    assert_eq!(
        traced,
        trace,
        "the agent traced {}: {traced}",
        path.display()
    );
    (status, peak)
}

/// Every key `gostw inspect --json` prints, at every depth (function and
/// struct-offset names included), is documented in the book's inspect schema
/// (docs/reference/json.md, "gostw inspect"):
/// for a plain, a stripped, a stripped buildinfo-less and an arm64 binary,
/// and for a running process (`--pid`).
#[test]
fn inspect_json_keys_are_documented_in_the_book() {
    let page = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference/json.md"),
    )
    .unwrap();
    let start = page
        .find("\n## gostw inspect\n")
        .expect("docs/reference/json.md has the inspect JSON schema");
    let section = &page[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    // Words inside backticks: `key`, `{address, size}`, `"value"`.
    let documented: std::collections::BTreeSet<String> = section
        .split('`')
        .skip(1)
        .step_by(2)
        .flat_map(|code| {
            code.split(|c: char| !(c.is_alphanumeric() || "._".contains(c)))
                .filter(|w| !w.is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    fn keys(v: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    out.push(format!("{path}{k}"));
                    keys(v, &format!("{path}{k}/"), out);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| keys(v, path, out)),
            _ => {}
        }
    }
    let newest = builds().last().unwrap();
    let mut seen = Vec::new();
    for variant in ["exe", "stripped", "nobuildinfo-stripped", "arm64-stripped"] {
        let b = sibling(newest, variant);
        let (ok, stdout, stderr) = gostw_inspect(&["--json", b.path.to_str().unwrap()]);
        assert!(ok, "{}: {stderr}", b.label());
        keys(&serde_json::from_str(&stdout).unwrap(), "", &mut seen);
    }
    let exe = sibling(newest, "exe");
    let (child, _) = start_waiting(&exe.path, &[]);
    let (ok, stdout, stderr) = gostw_inspect(&["--json", "--pid", &child.id().to_string()]);
    stop(child);
    assert!(ok, "--pid: {stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert!(v["process"].is_object(), "{v}");
    keys(&v, "", &mut seen);
    seen.sort();
    seen.dedup();
    let missing: Vec<&String> = seen
        .iter()
        .filter(|path| !documented.contains(path.rsplit('/').next().unwrap()))
        .collect();
    assert!(
        missing.is_empty(),
        "keys of gostw inspect --json missing from docs/reference/json.md: {missing:?}"
    );
    eprintln!("{} JSON keys of gostw inspect are documented", seen.len());
}

/// Root in a user namespace (`unshare -r`, as in rootless containers) is
/// refused both another process's executable and bpf(): gostw says which
/// check refused it instead of asking for root it already has.
#[test]
fn refusals_say_which_check_failed() {
    require_root();
    let newest = builds().last().unwrap();
    let exe = sibling(newest, "exe");
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = sleeper.id().to_string();
    let in_userns = |args: &[&str]| {
        let out = Command::new("unshare")
            .args(["-r", GOSTW])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("unshare");
        assert!(!out.status.success(), "gostw {args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    for args in [
        &["inspect", "--pid", &pid][..],
        &["attach", "--pid", &pid, "--duration", "1s"][..],
    ] {
        let stderr = in_userns(args);
        eprintln!("gostw {args:?}: {stderr}");
        assert!(
            stderr.contains("gostw runs in a user namespace (uid_map 0 0 1)"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("needs root"), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    let stderr = in_userns(&["run", "--", exe.path.to_str().unwrap()]);
    eprintln!("gostw run: {stderr}");
    assert!(
        stderr.contains("the kernel refused bpf(): gostw runs in a user namespace"),
        "{stderr}"
    );
    assert!(stderr.contains("Operation not permitted"), "{stderr}");
}
