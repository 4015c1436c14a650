//! `cargo xtask fuzz [--seconds N]`: the cargo-fuzz targets of gostw's
//! binary parsers (tracer/fuzz: ELF, buildinfo, pclntab, module data,
//! DWARF, type descriptors) for a bounded time (not in CI: too long).
//!
//! - `patched_binary` (the default): real Go binaries with bytes changed;
//!   the fuzz input is only the patch list, so the corpus stays small and
//!   every run goes deep (a whole-binary corpus outgrows memory in minutes).
//!   Its seeds are built here, reproducibly (seed_binaries).
//! - `analyse_binary`: arbitrary bytes, small inputs (shallow, fast).
//!
//! First every committed crasher (tracer/fuzz/crashers/<target>) runs once:
//! a crash found before must stay fixed. Then libFuzzer runs from a working
//! corpus kept between runs (target/fuzz-corpus/<target>). A new crash,
//! leak, out-of-memory or time-out is copied into the crasher corpus (for
//! patched_binary also the whole patched binary, into analyse_binary's,
//! which reproduces it without the seeds), to be committed with its fix,
//! and the run fails naming it.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail};

use crate::{
    cmd::{cargo_home, exec, step, succeeds, workspace_root},
    go,
};

/// cargo-fuzz from crates.io, when it is missing.
const CARGO_FUZZ_VERSION: &str = "0.13.1";

#[derive(clap::Args)]
pub struct Options {
    /// How long libFuzzer runs, in seconds.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// The fuzz target.
    #[arg(long, value_enum, default_value_t = Target::PatchedBinary)]
    pub target: Target,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// Real Go binaries with bytes changed.
    PatchedBinary,
    /// Arbitrary bytes.
    AnalyseBinary,
}

impl Target {
    /// libFuzzer's input length options. patched_binary: up to 8 patches
    /// from the start (its length control would keep it at one patch for
    /// many minutes); analyse_binary: libFuzzer's default, growing to 4 KiB.
    fn length_options(self) -> &'static [&'static str] {
        match self {
            Target::PatchedBinary => &["-max_len=41", "-len_control=0"],
            Target::AnalyseBinary => &[],
        }
    }

    fn name(self) -> &'static str {
        match self {
            Target::PatchedBinary => "patched_binary",
            Target::AnalyseBinary => "analyse_binary",
        }
    }
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    cargo_fuzz()?;
    let target = opts.target.name();
    let seeds = seed_binaries()?;
    step("build the fuzz targets (nightly, overflow checks)");
    exec(&mut cargo_fuzz_cmd("build", &seeds))?;

    for t in [Target::AnalyseBinary, Target::PatchedBinary] {
        let committed = files(&crashers(t))?;
        if committed.is_empty() {
            continue;
        }
        step(&format!(
            "the {} committed crashers of {} run once each",
            committed.len(),
            t.name()
        ));
        exec(
            cargo_fuzz_cmd("run", &seeds)
                .arg(t.name())
                .arg(crashers(t))
                .args(["--", "-runs=0"]),
        )
        .context("an input that failed before fails again")?;
    }

    let corpus = workspace_root().join("target/fuzz-corpus").join(target);
    fs::create_dir_all(&corpus)?;
    let artifacts = fuzz_dir().join("artifacts").join(target);
    let _ = fs::remove_dir_all(&artifacts);
    step(&format!(
        "fuzz {target} for {} s (working corpus {})",
        opts.seconds,
        corpus.display()
    ));
    let started = Instant::now();
    let result = exec(
        cargo_fuzz_cmd("run", &seeds)
            .arg(target)
            .arg(&corpus)
            .arg("--")
            .arg(format!("-max_total_time={}", opts.seconds))
            .args(opts.target.length_options())
            // A parse must not take seconds.
            .args(["-timeout=20", "-rss_limit_mb=2048", "-print_final_stats=1"]),
    );
    let elapsed = started.elapsed();
    let found = files(&artifacts)?;
    for f in &found {
        keep_crasher(opts.target, f, &seeds)?;
    }
    eprintln!(
        "\nfuzz: {target} ran {:.1} min; working corpus {} inputs; {} new failing inputs",
        elapsed.as_secs_f64() / 60.0,
        files(&corpus)?.len(),
        found.len()
    );
    if !found.is_empty() {
        bail!(
            "libFuzzer found {} failing inputs, now in {}: {}; fix the parser and commit them",
            found.len(),
            crashers(opts.target).display(),
            found
                .iter()
                .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    result
}

fn fuzz_dir() -> PathBuf {
    workspace_root().join("tracer/fuzz")
}

/// The committed crasher corpus of `target`.
fn crashers(target: Target) -> PathBuf {
    fuzz_dir().join("crashers").join(target.name())
}

/// Copy the failing input `f` into the crasher corpus; for patched_binary
/// also write the whole patched binary into analyse_binary's.
fn keep_crasher(target: Target, f: &Path, seeds: &Path) -> anyhow::Result<()> {
    let name = f.file_name().context("a file")?;
    fs::create_dir_all(crashers(target))?;
    fs::copy(f, crashers(target).join(name))?;
    if target == Target::PatchedBinary {
        let whole = crashers(Target::AnalyseBinary).join(name);
        fs::create_dir_all(crashers(Target::AnalyseBinary))?;
        // It fails again, after writing the binary: its status says nothing.
        let _ =
            Command::new(fuzz_dir().join("target/x86_64-unknown-linux-gnu/release/patched_binary"))
                .arg(f)
                .env("GOSTW_FUZZ_SEEDS", seeds)
                .env("GOSTW_FUZZ_WRITE", &whole)
                .status();
        if !whole.is_file() {
            bail!("could not write the whole binary of {}", f.display());
        }
    }
    Ok(())
}

/// `cargo +nightly fuzz <sub>` in tracer/, with no eBPF build (the parsers
/// do not need the kernel programs) and the seeds of patched_binary. No
/// sanitizer: the parsers are safe Rust, whose bugs are panics (overflow
/// checks on: cargo-fuzz's debug assertions), and AddressSanitizer made
/// patched_binary 2.5x slower (13 against 33 runs/s here) at 7x the memory.
fn cargo_fuzz_cmd(sub: &str, seeds: &Path) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(workspace_root().join("tracer"))
        .args(["+nightly", "fuzz", sub, "--sanitizer", "none"])
        .env("AYA_BUILD_SKIP", "1")
        .env("GOSTW_FUZZ_SEEDS", seeds);
    cmd
}

/// Install cargo-fuzz into CARGO_HOME/bin unless it runs.
fn cargo_fuzz() -> anyhow::Result<()> {
    if succeeds(Command::new("cargo").args(["fuzz", "--version"])) {
        return Ok(());
    }
    step(&format!("cargo-fuzz {CARGO_FUZZ_VERSION} (crates.io)"));
    exec(
        Command::new("cargo")
            .args(["install", "cargo-fuzz", "--locked", "--version"])
            .arg(CARGO_FUZZ_VERSION)
            .arg("--root")
            .arg(cargo_home()),
    )
}

/// The seed binaries of patched_binary, built into target/fuzz-seeds: the
/// `inspect` workload with the oldest and the default Go of the matrix (two
/// pclntab formats, struct layouts, 1.26's zero textStart), each plain,
/// stripped (`-s -w`: no symtab, no DWARF) and PIE. Reproducible (the same
/// bytes on every machine, so committed patch lists mean the same binary):
/// local toolchain, `-trimpath`, no VCS stamp, no cgo.
fn seed_binaries() -> anyhow::Result<PathBuf> {
    let dir = workspace_root().join("target/fuzz-seeds");
    fs::create_dir_all(&dir)?;
    let variants: &[(&str, &[&str])] = &[
        ("", &[]),
        ("-stripped", &["-ldflags=-s -w"]),
        ("-pie", &["-buildmode=pie"]),
    ];
    for version in [go::MATRIX[0].version, go::DEFAULT] {
        let t = go::toolchain(version).context("a Go of the matrix")?;
        for (suffix, args) in variants {
            let out = dir.join(format!("inspect-{version}{suffix}"));
            let args: Vec<&str> = ["-trimpath"].iter().chain(*args).copied().collect();
            exec(t.build("inspect", &args, &out).env("CGO_ENABLED", "0"))?;
        }
    }
    Ok(dir)
}

/// The regular files directly in `dir` (none when it is missing).
fn files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for e in fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_file() {
            out.push(e.path());
        }
    }
    out.sort();
    Ok(out)
}
