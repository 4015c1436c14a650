//! One run of one workload under one tracer, its work window marked and the
//! tracer's BPF programs read at both marks; and the uprobe trap cost.

use std::{
    collections::HashMap,
    io::{BufRead as _, BufReader, Read as _},
    path::{Path, PathBuf},
    process::{Child, ChildStdout, Command, Stdio},
};

use anyhow::{Context as _, bail};

use super::OverheadOptions;
use crate::bench::bpf::{self, ProgStat, Reader};

/// A workload of the benchmark.
pub struct Workload {
    pub name: &'static str,
    /// The command line, for the report.
    pub what: String,
    kind: Kind,
}

enum Kind {
    /// A Go program, traced itself.
    Go { bin: PathBuf, args: Vec<String> },
    /// The fault worker (not Go, never traced) while the tracer traces an
    /// idle Go process (`alloc -idle`).
    Faults {
        idle_go: PathBuf,
        anon_mb: usize,
        file: PathBuf,
    },
}

impl Workload {
    pub fn go(name: &'static str, bin: &Path, args: &[&str]) -> Workload {
        let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let what = format!(
            "{} {}",
            bin.file_name().unwrap_or_default().to_string_lossy(),
            args.join(" ")
        );
        args.push("-marks".into());
        Workload {
            name,
            what,
            kind: Kind::Go {
                bin: bin.to_owned(),
                args,
            },
        }
    }

    pub fn faults(idle_go: &Path, anon_mb: usize, file: &Path) -> Workload {
        Workload {
            name: "page faults, untraced",
            what: format!(
                "fault worker: {anon_mb} MiB fresh anonymous memory, then an evicted file read \
                 through page faults; the tracer traces an idle Go process"
            ),
            kind: Kind::Faults {
                idle_go: idle_go.to_owned(),
                anon_mb,
                file: file.to_owned(),
            },
        }
    }

    pub fn is_go(&self) -> bool {
        matches!(self.kind, Kind::Go { .. })
    }
}

/// What observes the workload.
pub enum Tracer {
    None,
    /// `gostw run` with these extra options and environment.
    Gostw(
        PathBuf,
        &'static [&'static str],
        &'static [(&'static str, &'static str)],
    ),
    /// `bpftrace` with [`bpftrace_script`].
    Bpftrace,
}

pub struct Config {
    pub name: &'static str,
    pub tracer: Tracer,
}

/// One (workload, configuration) pair and its runs.
pub struct Cell {
    pub workload: usize,
    pub config: Config,
    pub runs: Vec<RunResult>,
}

/// What one run measured.
pub struct RunResult {
    /// The work's wall-clock and CPU time, as the workload timed itself.
    pub wall_s: f64,
    pub cpu_s: f64,
    /// The tracer's BPF programs in the work window.
    pub progs: Vec<ProgStat>,
    /// CPU time of the tracer's own process in the work window.
    pub tracer_cpu_s: Option<f64>,
    /// Stop-the-world pauses the Go runtime counted in the whole run, and
    /// those the tracer reported.
    pub go_pauses: Option<u64>,
    pub seen_pauses: Option<u64>,
    /// Events gostw dropped (ring buffer full, stack events shed) or could
    /// not decode.
    pub dropped: Option<u64>,
}

/// The bpftrace equivalent of gostw's probes on Go binary `bin`: the
/// stop/start uprobes timing pauses per process, major faults of the traced
/// process counted by user stack, `runtime.newstack` counted.
pub fn bpftrace_script(bin: &Path) -> String {
    let b = bin.display();
    format!(
        "uprobe:{b}:runtime.stopTheWorldWithSema {{ @stop[pid] = nsecs; }}\n\
         uprobe:{b}:runtime.startTheWorldWithSema /@stop[pid]/ {{ \
         @pause_ns = hist(nsecs - @stop[pid]); delete(@stop[pid]); @pauses = count(); }}\n\
         software:major-faults:1 /pid == cpid/ {{ @major_faults[ustack] = count(); }}\n\
         uprobe:{b}:runtime.newstack {{ @newstack = count(); }}\n"
    )
}

/// Readings of the tracer at the work marks.
#[derive(Default)]
struct Window {
    lines: Vec<String>,
    before: Option<(HashMap<u32, ProgStat>, Option<f64>)>,
    after: Option<(HashMap<u32, ProgStat>, Option<f64>)>,
}

/// Read `out` to its end; at each `GOSTW_WORK` mark, read the programs of
/// `tracer` (and its CPU time).
fn watch(out: ChildStdout, tracer: Option<u32>, reader: &mut Reader) -> anyhow::Result<Window> {
    let mut w = Window::default();
    for line in BufReader::new(out).lines() {
        let line = line?;
        let mut reading = || match tracer {
            Some(pid) => (reader.programs_of(pid), bpf::process_cpu_s(pid)),
            None => (HashMap::new(), None),
        };
        match line.as_str() {
            "GOSTW_WORK begin" => w.before = Some(reading()),
            "GOSTW_WORK end" => w.after = Some(reading()),
            _ => {}
        }
        w.lines.push(line);
    }
    Ok(w)
}

impl Window {
    /// Programs and tracer CPU time between the marks.
    fn costs(&self) -> anyhow::Result<(Vec<ProgStat>, Option<f64>)> {
        let (Some((b, bc)), Some((a, ac))) = (&self.before, &self.after) else {
            bail!("the workload printed no GOSTW_WORK begin/end marks");
        };
        let cpu = bc.zip(*ac).map(|(b, a)| a - b);
        Ok((bpf::window(b, a), cpu))
    }

    /// The JSON of the `GOSTW_REPORT` line.
    fn report(&self) -> anyhow::Result<serde_json::Value> {
        let line = self
            .lines
            .iter()
            .find_map(|l| l.strip_prefix("GOSTW_REPORT "))
            .context("the workload printed no GOSTW_REPORT line")?;
        Ok(serde_json::from_str(line)?)
    }
}

/// Spawn `cmd` with stdout piped and stderr collected by a thread.
fn spawn(cmd: &mut Command) -> anyhow::Result<(Child, std::thread::JoinHandle<String>)> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    let mut err = child.stderr.take().expect("piped");
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    Ok((child, stderr))
}

/// Wait for `child`; fail with the end of its stderr.
fn finish(
    mut child: Child,
    stderr: std::thread::JoinHandle<String>,
    what: &str,
) -> anyhow::Result<()> {
    let status = child.wait()?;
    let err = stderr.join().unwrap_or_default();
    if !status.success() {
        let tail: Vec<&str> = err.lines().rev().take(8).collect();
        bail!(
            "{what} failed ({status}): {}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    Ok(())
}

/// Where `gostw run --json` writes its records in a run.
fn trace_file() -> PathBuf {
    PathBuf::from(format!(
        "/var/tmp/gostw-bench-overhead-{}.jsonl",
        std::process::id()
    ))
}

/// The tracer command around `program args`.
fn traced(tracer: &Tracer, program: &Path, args: &[String]) -> Command {
    match tracer {
        Tracer::None => {
            let mut c = Command::new(program);
            c.args(args);
            c
        }
        Tracer::Gostw(gostw, extra, env) => {
            let mut c = Command::new(gostw);
            c.envs(env.iter().copied())
                .args(["run", "--json", "--output"])
                .arg(trace_file())
                .args(*extra)
                .arg("--")
                .arg(program)
                .args(args);
            c
        }
        Tracer::Bpftrace => {
            let mut c = Command::new("bpftrace");
            // -c takes the command line as one argument (no spaces in paths).
            c.arg("-e")
                .arg(bpftrace_script(program))
                .arg("-c")
                .arg(format!("{} {}", program.display(), args.join(" ")));
            c
        }
    }
}

/// Run `workload` once under `config`.
pub fn run_once(
    workload: &Workload,
    config: &Config,
    o: &OverheadOptions,
    reader: &mut Reader,
) -> anyhow::Result<RunResult> {
    let what = format!("{} under {}", workload.name, config.name);
    let mut r = match &workload.kind {
        Kind::Go { bin, args } => run_go(bin, args, config, o, reader),
        Kind::Faults {
            idle_go,
            anon_mb,
            file,
        } => run_faults(idle_go, *anon_mb, file, config, o, reader),
    }
    .context(what)?;
    if matches!(config.tracer, Tracer::Gostw(..)) {
        read_gostw_summary(&mut r)?;
    }
    Ok(r)
}

fn run_go(
    bin: &Path,
    args: &[String],
    config: &Config,
    o: &OverheadOptions,
    reader: &mut Reader,
) -> anyhow::Result<RunResult> {
    let mut cmd = traced(&config.tracer, bin, args);
    cmd.env("GOMAXPROCS", o.gomaxprocs.to_string())
        .stdin(Stdio::null());
    let (mut child, stderr) = spawn(&mut cmd)?;
    let tracer = (!matches!(config.tracer, Tracer::None)).then(|| child.id());
    let w = watch(child.stdout.take().expect("piped"), tracer, reader)?;
    finish(child, stderr, config.name)?;
    let (progs, tracer_cpu_s) = w.costs()?;
    let report = w.report()?;
    let num = |k: &str| report[k].as_f64();
    let wall_ns = num("work_ns")
        .or_else(|| num("elapsed_ns"))
        .context("no work time in the report")?;
    let go_pauses = match (num("stw_gc"), num("stw_other")) {
        (Some(gc), Some(other)) if gc >= 0.0 && other >= 0.0 => Some((gc + other) as u64),
        _ => None,
    };
    Ok(RunResult {
        wall_s: wall_ns / 1e9,
        cpu_s: num("work_cpu_ns").context("no work_cpu_ns in the report")? / 1e9,
        progs,
        tracer_cpu_s,
        go_pauses,
        seen_pauses: bpftrace_pauses(&config.tracer, &w.lines),
        dropped: None,
    })
}

/// `@pauses: N` of bpftrace's map dump (absent: none seen).
fn bpftrace_pauses(tracer: &Tracer, lines: &[String]) -> Option<u64> {
    if !matches!(tracer, Tracer::Bpftrace) {
        return None;
    }
    Some(
        lines
            .iter()
            .find_map(|l| l.strip_prefix("@pauses: ")?.trim().parse().ok())
            .unwrap_or(0),
    )
}

fn run_faults(
    idle_go: &Path,
    anon_mb: usize,
    file: &Path,
    config: &Config,
    o: &OverheadOptions,
    reader: &mut Reader,
) -> anyhow::Result<RunResult> {
    // The tracer and the idle Go process it traces, started first.
    let mut tracer = match config.tracer {
        Tracer::None => None,
        _ => {
            let mut cmd = traced(&config.tracer, idle_go, &["-idle".to_owned()]);
            cmd.env("GOMAXPROCS", o.gomaxprocs.to_string())
                .stdin(Stdio::piped());
            let (mut child, stderr) = spawn(&mut cmd)?;
            let mut out = BufReader::new(child.stdout.take().expect("piped"));
            let mut line = String::new();
            while !line.starts_with("GOSTW_IDLE ready") {
                line.clear();
                if out.read_line(&mut line)? == 0 {
                    let _ = child.kill();
                    finish(child, stderr, config.name)?;
                    bail!("the tracer exited before its idle Go process was ready");
                }
            }
            Some((child, stderr, out))
        }
    };
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["bench-fault-worker", "--marks", "--anon-mb"])
        .arg(anon_mb.to_string())
        .arg("--file")
        .arg(file)
        .stdin(Stdio::null());
    let (mut worker, worker_err) = spawn(&mut cmd)?;
    let pid = tracer.as_ref().map(|t| t.0.id());
    let w = watch(worker.stdout.take().expect("piped"), pid, reader)?;
    finish(worker, worker_err, "the fault worker")?;
    let mut lines = Vec::new();
    if let Some((mut child, stderr, out)) = tracer.take() {
        // EOF on its standard input ends the idle process, then the tracer.
        drop(child.stdin.take());
        lines = out.lines().collect::<Result<_, _>>()?;
        finish(child, stderr, config.name)?;
    }
    let (progs, tracer_cpu_s) = w.costs()?;
    let v: Vec<f64> = w
        .lines
        .iter()
        .rev()
        .find(|l| !l.starts_with("GOSTW_WORK"))
        .context("the fault worker printed nothing")?
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(f64::NAN))
        .collect();
    if v.len() < 4 || v.iter().take(4).any(|x| x.is_nan()) {
        bail!("unexpected fault worker output {:?}", w.lines.last());
    }
    Ok(RunResult {
        wall_s: v[0] + v[2],
        cpu_s: v[1] + v[3],
        progs,
        tracer_cpu_s,
        go_pauses: None,
        seen_pauses: bpftrace_pauses(&config.tracer, &lines),
        dropped: None,
    })
}

/// Pauses gostw reported and the events it lost, from its JSON summary.
fn read_gostw_summary(r: &mut RunResult) -> anyhow::Result<()> {
    let path = trace_file();
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    let _ = std::fs::remove_file(&path);
    let summary: serde_json::Value = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["type"] == "summary")
        .context("gostw wrote no summary record")?;
    r.seen_pauses = summary["processes"][0]["pauses"].as_u64();
    let kernel = &summary["lost"]["kernel"];
    let user = &summary["lost"]["user"];
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or(0);
    r.dropped = Some(
        n(kernel, "ringbuf_full")
            + n(kernel, "stack_growth_shed")
            + n(user, "malformed")
            + n(user, "unknown_kind")
            + n(user, "unhandled"),
    );
    Ok(())
}

/// The cost of one uprobe hit beyond its BPF program, with warm caches (a
/// tight loop of calls) and cold ones (each call after a sweep over a
/// buffer larger than L2, as a probe that fires every few milliseconds in a
/// busy program finds them); for a probed instruction the kernel
/// single-steps (most: a function's first instruction, a RET) and for one
/// it emulates (a branch, as gostw's entry probes use).
pub struct Trap {
    pub stepped: TrapCost,
    pub emulated: TrapCost,
}

/// One kind of uprobe hit, beyond its program.
pub struct TrapCost {
    pub hot_ns: f64,
    pub cold_ns: f64,
    /// The (empty) program's own time per hit, hot and cold.
    pub hot_prog_ns: f64,
    pub cold_prog_ns: f64,
    pub runs: usize,
}

/// gostw's programs that sit on an instruction the kernel emulates on
/// amd64 for the bench's Go version (1.22+): a Go prologue's stack-check
/// branch (a JBE: the entry probes) or a direct CALL (the stopping and end
/// probes, on `timeHistogram.record`); bpftrace's function entries are
/// single-stepped. gostw's binary analysis test checks those offsets in
/// every build of the matrix.
const ON_BRANCH: &[&str] = &["stw_stop", "stw_stopped", "stw_start_ret", "stack_copy"];

impl Trap {
    /// The figure cost estimates use for a hit of program `name`: the cold
    /// one (gostw's uprobes fire at most a few hundred times a second).
    pub fn ns(&self, name: &str) -> f64 {
        if ON_BRANCH.contains(&name) {
            self.emulated.cold_ns
        } else {
            self.stepped.cold_ns
        }
    }
}

#[derive(clap::Args)]
pub struct TrapWorkerOptions {
    #[arg(long)]
    pub calls: u32,
    /// KiB of memory to write through before each call (0: none).
    #[arg(long, default_value_t = 0)]
    pub sweep_kib: usize,
    /// Print `GOSTW_WORK begin` / `GOSTW_WORK end` lines around the calls.
    #[arg(long)]
    pub marks: bool,
    /// Call the target whose first instruction is a branch (emulated under
    /// a uprobe) instead of the one the kernel single-steps.
    #[arg(long)]
    pub branch: bool,
}

/// The function the trap measurement puts a single-stepped uprobe on.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gostw_bench_uprobe_target(x: u64) -> u64 {
    std::hint::black_box(x.wrapping_mul(3).wrapping_add(1))
}

// The target of an emulated uprobe: its first instruction is a JBE, as the
// stack check of a Go prologue ends (both ways lead to the same code, so
// the caller's flags do not matter).
core::arch::global_asm!(
    ".globl gostw_bench_uprobe_branch",
    ".type gostw_bench_uprobe_branch, @function",
    "gostw_bench_uprobe_branch:",
    "jbe 2f",
    "2:",
    "lea rax, [rdi + 2 * rdi + 1]",
    "ret",
    ".size gostw_bench_uprobe_branch, . - gostw_bench_uprobe_branch",
);

unsafe extern "C" {
    fn gostw_bench_uprobe_branch(x: u64) -> u64;
}

fn call_target(branch: bool, x: u64) -> u64 {
    if branch {
        // SAFETY: the assembly above reads RDI, writes RAX, and returns.
        unsafe { gostw_bench_uprobe_branch(x) }
    } else {
        gostw_bench_uprobe_target(x)
    }
}

/// Call the uprobe target `calls` times, each call timed alone; print the
/// median call in ns.
pub fn trap_worker(o: &TrapWorkerOptions) -> anyhow::Result<()> {
    let mut sweep = vec![0u8; o.sweep_kib << 10];
    let mut took = Vec::with_capacity(o.calls as usize);
    if o.marks {
        println!("GOSTW_WORK begin");
    }
    let mut x = 0;
    for i in 0..o.calls {
        for b in sweep.iter_mut().step_by(64) {
            *b = b.wrapping_add(i as u8);
        }
        let t = std::time::Instant::now();
        x = call_target(o.branch, std::hint::black_box(x));
        took.push(t.elapsed().as_nanos() as f64);
    }
    if o.marks {
        println!("GOSTW_WORK end");
    }
    std::hint::black_box(&sweep);
    println!("{:.1} {x}", super::median(&took));
    Ok(())
}

/// Median call time of the uprobe target, untraced and under an empty
/// bpftrace uprobe, five times each, interleaved; (call ns, program ns).
fn trap_runs(
    calls: u32,
    sweep_kib: usize,
    branch: bool,
    reader: &mut Reader,
) -> anyhow::Result<[Vec<f64>; 3]> {
    let exe = std::env::current_exe()?;
    let mut args = vec![
        "bench-trap-worker".to_owned(),
        "--marks".to_owned(),
        format!("--calls={calls}"),
        format!("--sweep-kib={sweep_kib}"),
    ];
    if branch {
        args.push("--branch".to_owned());
    }
    let target = if branch {
        "gostw_bench_uprobe_branch"
    } else {
        "gostw_bench_uprobe_target"
    };
    let (mut plain, mut probed, mut prog) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..5 {
        for traced in [false, true] {
            let mut cmd = if traced {
                let mut c = Command::new("bpftrace");
                c.arg("-e")
                    .arg(format!("uprobe:{}:{target} {{ }}", exe.display()))
                    .arg("-c")
                    .arg(format!("{} {}", exe.display(), args.join(" ")));
                c
            } else {
                let mut c = Command::new(&exe);
                c.args(&args);
                c
            };
            cmd.stdin(Stdio::null());
            let (mut child, stderr) = spawn(&mut cmd)?;
            let pid = traced.then(|| child.id());
            let w = watch(child.stdout.take().expect("piped"), pid, reader)?;
            finish(child, stderr, "the trap worker")?;
            let call_ns: f64 = w
                .lines
                .iter()
                .find_map(|l| l.split_whitespace().next()?.parse().ok())
                .context("the trap worker printed no call time")?;
            if !traced {
                plain.push(call_ns);
                continue;
            }
            let (progs, _) = w.costs()?;
            let (runs, ns) = progs
                .iter()
                .filter(|p| p.prog_type == bpf::PROG_TYPE_KPROBE)
                .fold((0, 0), |(r, n), p| (r + p.runs, n + p.run_ns));
            // The marks are read a little late (the calls go on
            // meanwhile), so the window holds nearly, not exactly, all.
            if runs < u64::from(calls) / 2 {
                bail!("the uprobe ran {runs} times for {calls} calls");
            }
            prog.push(ns as f64 / runs as f64);
            probed.push(call_ns);
        }
    }
    Ok([plain, probed, prog])
}

/// Measure the uprobe trap, hot and cold, single-stepped and emulated.
pub fn measure_trap(calls: u32) -> anyhow::Result<Trap> {
    crate::cmd::step(&format!(
        "uprobe trap cost: one call at a time, untraced and under an empty bpftrace uprobe, \
         5 times each; {calls} calls in a loop, then {} calls each after a 4 MiB sweep; \
         on a single-stepped first instruction and on an emulated branch",
        calls / 10
    ));
    let mut reader = Reader::default();
    Ok(Trap {
        stepped: trap_cost(calls, false, &mut reader)?,
        emulated: trap_cost(calls, true, &mut reader)?,
    })
}

fn trap_cost(calls: u32, branch: bool, reader: &mut Reader) -> anyhow::Result<TrapCost> {
    let m = super::median;
    let [plain, probed, prog] = trap_runs(calls, 0, branch, reader)?;
    let hot = (m(&probed) - m(&plain) - m(&prog), m(&prog));
    let [cplain, cprobed, cprog] = trap_runs(calls / 10, 4096, branch, reader)?;
    let cold = (m(&cprobed) - m(&cplain) - m(&cprog), m(&cprog));
    eprintln!(
        "  {}: median call: hot {:.0} ns untraced, {:.0} ns probed ({:.0} ns in the program); \
         cold {:.0} ns untraced, {:.0} ns probed ({:.0} ns in the program)",
        if branch { "emulated" } else { "single-stepped" },
        m(&plain),
        m(&probed),
        hot.1,
        m(&cplain),
        m(&cprobed),
        cold.1
    );
    Ok(TrapCost {
        hot_ns: hot.0,
        cold_ns: cold.0,
        hot_prog_ns: hot.1,
        cold_prog_ns: cold.1,
        runs: probed.len(),
    })
}
