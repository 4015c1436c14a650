//! Shared harness for the kernel tests: root check, the Go toolchains of the
//! matrix (installed by `cargo xtask setup`, passed in GOSTW_GO_MATRIX),
//! building the Go workloads under scripts/workloads, and running them traced.
//!
//! Inside the VM (`cargo xtask vm-test`) there is no Go toolchain: the host
//! pre-builds the workloads and GOSTW_PREBUILT_WORKLOADS names their
//! directory; GOSTW_VM names the guest's kernel.
//!
//! Failures panic with context: a test that cannot run says why.

#![allow(dead_code, reason = "each test module uses a different part")]

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use serde::Deserialize;
use tracer::{
    binary::GoBinary,
    engine::Engine,
    kernel::{Core, CoreOptions, ExeProbes, traced_process},
    model::observed::Observed,
    sink::Sink,
    targets::{
        child::StoppedChild,
        tracker::{Kernel as _, Limits},
    },
};

/// CLOCK_MONOTONIC now, ns (the clock of pause records' `start_mono_ns`:
/// Go's nanotime), as the engine reads it.
pub use tracer::clock::monotonic_ns;

/// Panic unless running as root: every kernel test loads eBPF programs.
pub fn require_root() {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("kernel tests load eBPF programs and need root: run `sudo -E cargo xtask test`");
    }
}

/// One Go toolchain of the test matrix.
#[derive(Clone, Debug)]
pub struct GoToolchain {
    /// e.g. "1.22.10".
    pub version: String,
    pub go: PathBuf,
}

impl GoToolchain {
    /// (major, minor), e.g. (1, 22).
    pub fn major_minor(&self) -> (u32, u32) {
        let mut it = self.version.split('.').map(|p| p.parse().unwrap_or(0));
        (it.next().unwrap_or(0), it.next().unwrap_or(0))
    }
}

/// The Go toolchains the tests run against.
pub fn go_matrix() -> Vec<GoToolchain> {
    let spec = std::env::var("GOSTW_GO_MATRIX").unwrap_or_else(|_| {
        panic!("GOSTW_GO_MATRIX is not set: run the kernel tests through `cargo xtask test`, which installs the Go toolchains")
    });
    spec.split(',')
        .map(|entry| {
            let (version, go) = entry
                .split_once('=')
                .unwrap_or_else(|| panic!("bad GOSTW_GO_MATRIX entry {entry:?}"));
            let go = PathBuf::from(go);
            assert!(
                prebuilt_workloads().is_some() || go.is_file(),
                "Go {version}: {} is missing; run `cargo xtask setup`",
                go.display()
            );
            GoToolchain {
                version: version.to_owned(),
                go,
            }
        })
        .collect()
}

/// The directory of pre-built workloads (`GOSTW_PREBUILT_WORKLOADS`), laid
/// out as `<dir>/<go version>/<workload><variant>`; set in the VM.
pub fn prebuilt_workloads() -> Option<PathBuf> {
    std::env::var_os("GOSTW_PREBUILT_WORKLOADS").map(PathBuf::from)
}

/// The kernel the tests run on when inside the VM (`GOSTW_VM`, e.g.
/// "debian-6.1"); `None` on the host.
pub fn vm_kernel() -> Option<String> {
    std::env::var("GOSTW_VM").ok()
}

/// A wait that includes gostw loading its eBPF programs: ten times longer in
/// the VM, where the kernel's verifier runs emulated (the agent's first
/// attach spent more than 35 s in `bpf_check` in the arm64 guest; attaching
/// takes about 0.6 s on this host, as `outputs::attach_to_a_program_exiting_meanwhile_says_it_exited`
/// prints).
pub fn patience(wait: std::time::Duration) -> std::time::Duration {
    if vm_kernel().is_some() {
        wait * 10
    } else {
        wait
    }
}

/// The oldest and the newest toolchain of the matrix (one if they are the
/// same), for tests of code that moved between them.
pub fn oldest_and_newest_go() -> Vec<GoToolchain> {
    let oldest = go_matrix()
        .into_iter()
        .min_by_key(GoToolchain::major_minor)
        .expect("the Go matrix is empty");
    let newest = newest_go();
    if oldest.version == newest.version {
        vec![newest]
    } else {
        vec![oldest, newest]
    }
}

/// The newest toolchain of the matrix, for single-version tests.
pub fn newest_go() -> GoToolchain {
    go_matrix()
        .into_iter()
        .max_by_key(GoToolchain::major_minor)
        .expect("the Go matrix is empty")
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Build `scripts/workloads/<name>` with `go`, passing `build_args` to
/// `go build` (e.g. `-buildmode=pie`, `-ldflags=-s -w`); `variant` names the
/// output so variants do not overwrite each other. With pre-built workloads
/// (the VM), returns the one the host built instead.
pub fn build_workload(name: &str, go: &GoToolchain, variant: &str, build_args: &[&str]) -> PathBuf {
    build_workload_env(name, go, variant, build_args, &[])
}

/// `build_workload` with extra environment for `go build` (e.g.
/// `CGO_ENABLED=1`, `GOARCH=arm64`).
pub fn build_workload_env(
    name: &str,
    go: &GoToolchain,
    variant: &str,
    build_args: &[&str],
    env: &[(&str, &str)],
) -> PathBuf {
    if let Some(dir) = prebuilt_workloads() {
        let path = dir.join(&go.version).join(format!("{name}{variant}"));
        assert!(
            path.is_file(),
            "workload {name}{variant} ({build_args:?}) for Go {} was not pre-built at {}: \
             add the variant to WORKLOAD_VARIANTS in xtask/src/vm/payload.rs",
            go.version,
            path.display()
        );
        return path;
    }
    let out = workspace_root()
        .join("target/go-workloads")
        .join(&go.version)
        .join(format!("{name}{variant}"));
    let status = Command::new(&go.go)
        .current_dir(workspace_root().join("scripts/workloads").join(name))
        .arg("build")
        .args(build_args)
        .arg("-o")
        .arg(&out)
        .arg(".")
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-buildvcs=false")
        .env("GOPROXY", "off")
        .envs(env.iter().copied())
        .status()
        .unwrap_or_else(|e| panic!("running {}: {e}", go.go.display()));
    assert!(
        status.success(),
        "building workload {name} with Go {} failed",
        go.version
    );
    out
}

/// Arguments of the `stw` workload whose non-GC stops are known: 10 forced
/// GCs, 3 ReadMemStats (+1 in the report), 4 GOMAXPROCS changes (even, so the
/// final restore is a no-op that does not stop the world).
pub const STW_ARGS: &[&str] = &[
    "-gc",
    "10",
    "-readmemstats",
    "3",
    "-gomaxprocs",
    "4",
    "-alloc-mb",
    "64",
];
/// `ReadMemStats` stops `STW_ARGS` makes.
pub const STW_READ_MEM_STATS: u64 = 3 + 1;
/// `GOMAXPROCS` stops `STW_ARGS` makes.
pub const STW_GOMAXPROCS: u64 = 4;

/// What a workload says of itself at exit (the `GOSTW_REPORT` line of
/// scripts/workloads/stw). Counts are -1 where the Go version lacks the metric.
#[derive(Debug, Deserialize)]
pub struct StwReport {
    pub go_version: String,
    pub pid: u32,
    pub stw_gc: i64,
    pub stw_other: i64,
    pub gc_pauses: i64,
    pub num_gc: u64,
    pub num_forced_gc: u64,
    pub pause_total_ns: u64,
}

/// gostw's JSON records of type `kind` (`pause`, `summary`, ...) in its
/// stdout; other lines (the workload's own) are skipped.
pub fn json_records(stdout: &str, kind: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"))
        })
        .filter(|v| v["type"] == kind)
        .collect()
}

/// A JSON number of nanoseconds (0 when absent or null).
pub fn ns(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// Find and parse the `GOSTW_REPORT {json}` line of a workload's output.
pub fn parse_report<T: for<'de> Deserialize<'de>>(stdout: &str) -> T {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("GOSTW_REPORT "))
        .unwrap_or_else(|| panic!("workload printed no GOSTW_REPORT line; output:\n{stdout}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("bad report {line:?}: {e}"))
}

/// The tracing core with probes attached by hand: for the tests that look
/// at the kernel side alone (probe hits), without the engine.
pub struct Session {
    pub core: Core,
    probes: Vec<ExeProbes>,
}

impl Session {
    pub fn new() -> Session {
        Session {
            core: Core::load(CoreOptions::default()).expect("loading the eBPF programs"),
            probes: Vec::new(),
        }
    }

    /// Attach the pause probes to `binary`.
    pub fn attach_binary(&mut self, binary: &GoBinary) {
        let a = self
            .core
            .attach(0, &binary.path)
            .unwrap_or_else(|e| panic!("attaching to {}: {e:?}", binary.path.display()));
        self.probes.push(a.probes);
    }

    /// Add `pid` (running `binary`) to the traced set.
    pub fn trace_process(&mut self, pid: u32, binary: &GoBinary) {
        let traced = traced_process(binary, &binary.struct_offsets().unwrap());
        self.core.trace(pid, &traced).unwrap();
    }
}

/// Everything the engine observed, kept in order.
#[derive(Default)]
pub struct Recorded(pub Vec<Observed>);

impl Sink for Recorded {
    fn observe(&mut self, o: &Observed) {
        self.0.push(o.clone());
    }
}

/// A current-thread tokio runtime, entered: the engine's reader registers
/// with it.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// An engine tracing what `opts` asks for.
pub fn engine(opts: CoreOptions) -> Engine {
    Engine::new(opts, Limits::default()).expect("loading the engine")
}

/// Run `binary args` under `session`, traced from its first instruction;
/// returns its pid and standard output once it has exited.
pub fn run_traced(session: &mut Session, binary: &GoBinary, args: &[&str]) -> (u32, String) {
    let stopped = StoppedChild::spawn(
        binary.path.as_os_str(),
        &args.iter().map(|a| a.as_ref()).collect::<Vec<_>>(),
        |cmd| {
            cmd.stdout(Stdio::piped());
        },
    )
    .expect("spawning the workload");
    let pid = stopped.pid();
    session.trace_process(pid, binary);
    let child = stopped.resume().expect("resuming the workload");
    let out = child.wait_with_output().expect("waiting for the workload");
    assert!(
        out.status.success(),
        "workload {} failed: {:?}",
        binary.path.display(),
        out.status
    );
    (pid, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The probe events gostw process `pid` made in tracefs (its return
/// probes, `tracer::kernel::retprobe`) are gone within five seconds: after a
/// CLI run, its teardown child removes them once gostw has exited.
pub fn assert_probe_events_removed(pid: u32) {
    let ours = format!("gostw_{pid}/");
    let read = || std::fs::read_to_string("/sys/kernel/tracing/kprobe_events").unwrap_or_default();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while read().contains(&ours) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let events = read();
    assert!(
        !events.contains(&ours),
        "probe events of gostw pid {pid} left in tracefs:\n{events}"
    );
}

/// Start the real gostw with `args` (stdout piped) and wait until its
/// standard error says `ready`. The returned reader keeps stderr open, so
/// gostw's later messages do not hit a closed pipe (`finish_gostw` reads
/// the rest).
pub fn start_gostw(
    args: &[&str],
    ready: &str,
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStderr>,
) {
    use std::io::BufRead as _;

    let mut gostw = std::process::Command::new(env!("CARGO_BIN_EXE_gostw"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting gostw");
    let mut err = std::io::BufReader::new(gostw.stderr.take().unwrap());
    let mut line = String::new();
    while err.read_line(&mut line).unwrap() > 0 && !line.contains(ready) {
        line.clear();
    }
    assert!(line.contains(ready), "gostw {args:?} did not start");
    (gostw, err)
}

/// `gostw attach --json --stacks off` on `pid`, started (`start_gostw`).
pub fn attach_json(
    pid: u32,
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStderr>,
) {
    attach_json_with(pid, &[])
}

/// `attach_json` with `extra` arguments.
pub fn attach_json_with(
    pid: u32,
    extra: &[&str],
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStderr>,
) {
    let pid = pid.to_string();
    let mut args = vec!["attach", "--json", "--stacks", "off", "--pid", &pid];
    args.extend_from_slice(extra);
    start_gostw(&args, "tracing pid")
}

/// Wait for a gostw from `start_gostw` to end (by itself, or after a
/// signal the caller sent); its output and the rest of its standard error,
/// asserted successful (a failure shows that standard error).
pub fn finish_gostw(
    gostw: std::process::Child,
    mut stderr: std::io::BufReader<std::process::ChildStderr>,
) -> (std::process::Output, String) {
    use std::io::Read as _;

    // Standard error is read while gostw ends: unread, a full pipe would
    // block its last words and this wait with it.
    let rest = std::thread::spawn(move || {
        let mut err = String::new();
        let _ = stderr.read_to_string(&mut err);
        err
    });
    let out = gostw.wait_with_output().expect("waiting for gostw");
    let err = rest.join().expect("reading gostw's standard error");
    assert!(out.status.success(), "gostw failed ({}): {err}", out.status);
    (out, err)
}

/// Run a `gostw` command to its end with standard input closed; its
/// standard output, or a panic naming `what` with gostw's standard error
/// and output.
pub fn gostw_stdout(cmd: &mut std::process::Command, what: &str) -> String {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .expect("running gostw");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    // Shown with a test that fails later on what gostw printed.
    eprint!(
        "{what}: gostw's stderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what}: gostw failed ({}): {}\n{stdout}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The kernel's transparent huge page mode (`always`, `madvise`, `never`)
/// for as long as this lives; the mode before is put back.
pub struct ThpMode(String);

const THP: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

impl ThpMode {
    pub fn set(mode: &str) -> ThpMode {
        let now = std::fs::read_to_string(THP).unwrap_or_else(|e| panic!("{THP}: {e}"));
        let before = now
            .split_whitespace()
            .find(|w| w.starts_with('['))
            .unwrap_or_else(|| panic!("{THP} names no mode: {now}"))
            .trim_matches(['[', ']'])
            .to_owned();
        std::fs::write(THP, mode).unwrap_or_else(|e| panic!("{THP} = {mode}: {e}"));
        ThpMode(before)
    }
}

impl Drop for ThpMode {
    fn drop(&mut self) {
        let _ = std::fs::write(THP, &self.0);
    }
}
