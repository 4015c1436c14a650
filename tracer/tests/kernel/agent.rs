//! `gostw agent` end to end: the real binary as a node agent, real Go
//! processes started after it, and a real Prometheus server scraping it
//! every second; plus the inputs a user gets wrong.

use std::{
    fs,
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tracer::{
    kernel::{Core, CoreOptions},
    model::observed::FailureReason,
    targets::tracker::{AttachError, Kernel as _},
};

pub use crate::loopback::{free_port, http_get, wait_showing, wait_until};
use crate::{
    faults::{ARGS, ENV, ROUNDS, auto_backend, majflt_agrees},
    scenario::{GcSwap, MemCgroup, SwapFile, majflt},
    support::{GoToolchain, build_workload, go_matrix, newest_go, patience, require_root},
};

const GOSTW: &str = env!("CARGO_BIN_EXE_gostw");

/// Every process a test started, killed and reaped on drop (also when the
/// test panics), and the scratch directory removed.
pub struct Procs {
    pub children: Vec<(String, Child)>,
    dir: PathBuf,
}

impl Procs {
    pub fn new(name: &str) -> Procs {
        let dir = std::env::temp_dir().join(format!("gostw-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Procs {
            children: Vec::new(),
            dir,
        }
    }

    pub fn spawn(&mut self, name: &str, cmd: &mut Command) -> u32 {
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let pid = child.id();
        self.children.push((name.to_owned(), child));
        pid
    }

    /// The scratch directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A copy of the workload binary `bin` in the scratch directory (its
    /// file name kept, for the labels): an agent that matches it traces this
    /// test's processes only, never another run of the same workload that
    /// happens to be on the host.
    pub fn own(&self, bin: &Path) -> PathBuf {
        let parent = bin.parent().and_then(Path::file_name).unwrap_or_default();
        let dir = self.dir.join("bin").join(parent);
        fs::create_dir_all(&dir).unwrap();
        let copy = dir.join(bin.file_name().unwrap());
        fs::copy(bin, &copy).unwrap();
        copy.canonicalize().unwrap()
    }

    /// Kill one process and wait for it.
    fn kill(&mut self, pid: u32) {
        let i = self
            .children
            .iter()
            .position(|(_, c)| c.id() == pid)
            .expect("not our child");
        let (_, mut child) = self.children.remove(i);
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Each thread of `pid`: name, state, CPU ticks (user, system) and where in
/// the kernel it waits.
fn threads_of(pid: u32) -> String {
    let mut out = String::new();
    let tasks = fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten();
    for task in tasks.flatten() {
        let dir = task.path();
        let read = |f: &str| fs::read_to_string(dir.join(f)).unwrap_or_default();
        let stat = read("stat");
        // Fields after the command's closing parenthesis: state is the
        // first, utime and stime the 12th and 13th.
        let after: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, r)| r.split_whitespace().collect())
            .unwrap_or_default();
        let field = |i: usize| after.get(i).copied().unwrap_or("?");
        out += &format!(
            "  {} {} state {} utime {} stime {} wchan {} syscall {}\n",
            task.file_name().to_string_lossy(),
            read("comm").trim(),
            field(0),
            field(11),
            field(12),
            read("wchan").trim(),
            read("syscall").trim()
        );
        for frame in read("stack").lines() {
            out += &format!("      {frame}\n");
        }
    }
    out
}

impl Drop for Procs {
    fn drop(&mut self) {
        // A failed test shows where the agent's threads were.
        if std::thread::panicking() {
            for (name, child) in &self.children {
                if name == "gostw agent" {
                    eprintln!("the agent's threads:\n{}", threads_of(child.id()));
                }
            }
        }
        for (name, child) in &mut self.children {
            if child.try_wait().ok().flatten().is_none() {
                let _ = child.kill();
            }
            if let Err(e) = child.wait() {
                eprintln!("reaping {name}: {e}");
            }
        }
        // A failed test shows what the agent said, before its log goes.
        if std::thread::panicking()
            && let Ok(log) = fs::read_to_string(self.dir.join("agent.log"))
        {
            let lines: Vec<&str> = log.lines().collect();
            eprintln!("the agent's log (last 40 lines):");
            for line in &lines[lines.len().saturating_sub(40)..] {
                eprintln!("  {line}");
            }
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

pub use tracer::cli::pauses::percent_encode as url_encode;

/// An instant PromQL query against the test's Prometheus: (labels, value).
fn query(prom_port: u16, promql: &str) -> Vec<(Value, f64)> {
    let Some((200, body)) = http_get(
        prom_port,
        &format!("/api/v1/query?query={}", url_encode(promql)),
    ) else {
        return Vec::new();
    };
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|r| {
            let value = r["value"][1].as_str().unwrap_or("nan").parse().unwrap();
            (r["metric"].clone(), value)
        })
        .collect()
}

/// A program that is not Go but carries a `.go.buildinfo` section: gostw
/// takes it for a Go program and cannot find the runtime in it.
fn fake_go_binary(dir: &Path) -> PathBuf {
    let src = dir.join("fake-go.c");
    let mut info = Vec::new();
    info.extend_from_slice(b"\xff Go buildinf:");
    info.extend_from_slice(&[8, 2]);
    info.resize(32, 0);
    info.push(9);
    info.extend_from_slice(b"go1.22.10");
    info.push(0);
    let bytes: Vec<String> = info.iter().map(|b| format!("{b:#04x}")).collect();
    fs::write(
        &src,
        format!(
            "#include <unistd.h>\n\
             __attribute__((section(\".go.buildinfo\"), used)) static const unsigned char info[] = {{{}}};\n\
             int main(void) {{ for (;;) pause(); }}\n",
            bytes.join(",")
        ),
    )
    .unwrap();
    let out = dir.join("fake-go");
    let status = Command::new("cc")
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .expect("running cc");
    assert!(status.success(), "building the fake Go binary");
    out
}

fn start_prometheus(procs: &mut Procs, agent_port: u16) -> u16 {
    start_prometheus_with(procs, agent_port, &[])
}

/// A Prometheus scraping the agent every second, with `extra` flags; its
/// port once it is ready.
pub fn start_prometheus_with(procs: &mut Procs, agent_port: u16, extra: &[&str]) -> u16 {
    let port = free_port();
    let config = procs.dir.join("prometheus.yml");
    fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: gostw\n    scrape_interval: 1s\n    scrape_timeout: 900ms\n\
             \x20   static_configs:\n      - targets: ['127.0.0.1:{agent_port}']\n"
        ),
    )
    .unwrap();
    let log = fs::File::create(procs.dir.join("prometheus.log")).unwrap();
    procs.spawn(
        "prometheus",
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                procs.dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log),
    );
    wait_until("prometheus to be ready", Duration::from_secs(30), || {
        http_get(port, "/-/ready").filter(|(s, _)| *s == 200)
    });
    port
}

/// `gostw agent` on 127.0.0.1:`port` for programs under `matching`, with
/// `extra` arguments; returns its log's path once /healthz answers.
pub fn start_agent(procs: &mut Procs, port: u16, matching: &str, extra: &[&str]) -> PathBuf {
    let log_path = procs.dir.join("agent.log");
    let log = fs::File::create(&log_path).unwrap();
    procs.spawn(
        "gostw agent",
        Command::new(GOSTW)
            .args(["agent", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--match", matching, "--poll-interval", "200ms"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log),
    );
    wait_until("the agent's /healthz", Duration::from_secs(30), || {
        http_get(port, "/healthz").filter(|(s, _)| *s == 200)
    });
    log_path
}

/// Two Go programs of two Go versions, started after the agent, show up in
/// Prometheus with their labels and pause counts; one that exits stops being
/// reported; a Go-looking binary gostw cannot analyse is counted and logged
/// once while the agent keeps serving; /metrics passes promtool.
#[test]
fn agent_exports_go_processes_to_prometheus() {
    require_root();
    let newest = newest_go();
    let older = go_matrix()
        .into_iter()
        .find(|g| g.major_minor() == (1, 22))
        .expect("Go 1.22 is in the matrix");
    let bins = [
        build_workload("stw", &newest, "", &[]),
        build_workload("stw", &older, "", &[]),
    ];
    let mut procs = Procs::new("agent");
    let bins = bins.map(|b| procs.own(&b));
    let fake = fake_go_binary(&procs.dir);
    let agent_port = free_port();
    // Only this test's programs: other processes on the host (other
    // checkouts' tests, the same workloads run by hand) are not traced.
    let matching = format!("^{}/", regex::escape(&procs.dir.display().to_string()));
    // Exposure read every second: the memory check compares it with VmRSS.
    let agent_log = start_agent(
        &mut procs,
        agent_port,
        &matching,
        &["--exposure-every", "1s"],
    );
    let prom_port = start_prometheus(&mut procs, agent_port);

    let args = [
        "-duration",
        "120s",
        "-gc",
        "2",
        "-alloc-mb",
        "8",
        "-readmemstats",
        "1",
    ];
    let new_pid = procs.spawn(
        "stw (newest Go)",
        Command::new(&bins[0]).args(args).stdout(Stdio::null()),
    );
    let _old_pid = procs.spawn(
        "stw (Go 1.22)",
        Command::new(&bins[1]).args(args).stdout(Stdio::null()),
    );
    for _ in 0..2 {
        procs.spawn("fake Go", Command::new(&fake).stdout(Stdio::null()));
    }

    for go in [&newest, &older] {
        let promql = format!(
            r#"gostw_stop_the_world_entries_total{{executable="stw",go_version="go{}"}}"#,
            go.version
        );
        let (labels, n) = wait_until(&promql, Duration::from_secs(60), || {
            query(prom_port, &promql)
                .into_iter()
                .find(|(_, n)| *n > 0.0)
        });
        eprintln!("{labels} {n}");
        assert_eq!(labels["job"], "gostw");
        // The pipeline's pause records: durations by reason. The workload
        // forces GCs, so both GC reasons are there.
        let promql = format!(
            r#"sum by (reason) (gostw_pause_duration_seconds_count{{executable="stw",go_version="go{}"}})"#,
            go.version
        );
        let reasons = wait_until(&promql, Duration::from_secs(30), || {
            let r = query(prom_port, &promql);
            (r.len() >= 2).then_some(r)
        });
        for (l, n) in &reasons {
            eprintln!("  pauses {l} {n}");
            assert!(*n > 0.0);
        }
        for reason in ["gc_mark_termination", "gc_sweep_termination"] {
            assert!(
                reasons.iter().any(|(l, _)| l["reason"] == reason),
                "no {reason} pauses: {reasons:?}"
            );
        }
        assert!(!labels["build_id"].as_str().unwrap().is_empty(), "{labels}");
        assert!(labels.get("pid").is_none(), "no per-pid label: {labels}");
    }
    wait_until("2 traced processes", Duration::from_secs(30), || {
        query(prom_port, "gostw_agent_processes_traced")
            .first()
            .filter(|(_, n)| *n == 2.0)
            .map(|_| ())
    });
    let failures = wait_until("the analysis failure", Duration::from_secs(30), || {
        query(
            prom_port,
            r#"gostw_agent_attach_failures_total{reason="analysis"}"#,
        )
        .first()
        .filter(|(_, n)| *n > 0.0)
        .map(|(_, n)| *n)
    });
    assert_eq!(failures, 1.0, "two processes of one bad binary count once");
    let log = fs::read_to_string(&agent_log).unwrap();
    assert_eq!(
        log.matches("cannot trace Go program").count(),
        1,
        "logged once:\n{log}"
    );

    // /metrics in the Prometheus text format passes promtool's checks.
    let (status, body) = http_get(agent_port, "/metrics").unwrap();
    assert_eq!(status, 200);
    promtool_check(&body);
    check_memory_series(agent_port, &newest, new_pid);

    // The newest Go's process exits: its series go stale, the gauge drops.
    procs.kill(new_pid);
    let gone = format!(
        r#"gostw_traced_processes{{go_version="go{}"}}"#,
        newest.version
    );
    wait_until(
        "the exited process's series to go",
        Duration::from_secs(30),
        || query(prom_port, &gone).is_empty().then_some(()),
    );
    wait_until("1 traced process", Duration::from_secs(30), || {
        query(prom_port, "gostw_agent_executables_attached")
            .first()
            .filter(|(_, n)| *n == 1.0)
            .map(|_| ())
    });
    let older_series = format!(
        r#"gostw_traced_processes{{go_version="go{}"}}"#,
        older.version
    );
    assert_eq!(query(prom_port, &older_series).len(), 1);
    assert_eq!(http_get(agent_port, "/healthz").map(|r| r.0), Some(200));

    // Every query of the Grafana dashboard parses and evaluates.
    let dashboard: Value = serde_json::from_str(
        &fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/gostw-dashboard.json"),
        )
        .unwrap(),
    )
    .unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$executable", ".*")
                .replace("$container", ".*")
                .replace("$__rate_interval", "1m");
            let (status, body) = http_get(
                prom_port,
                &format!("/api/v1/query?query={}", url_encode(&expr)),
            )
            .unwrap();
            assert_eq!(status, 200, "{expr}: {body}");
        }
    }
}

/// Sum of the values of `name` series whose labels contain every `filters`
/// entry (`key="value"`), in a Prometheus text exposition.
pub fn sum_series(body: &str, name: &str, filters: &[&str]) -> f64 {
    body.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix('{')?;
            let (labels, value) = rest.rsplit_once("} ")?;
            filters
                .iter()
                .all(|f| labels.split(',').any(|l| l == *f))
                .then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

/// A workload started with `-start-on-signal` (it prints `GOSTW_WAITING`
/// on `out` and waits for SIGUSR1): wait for that line and for the agent on
/// `port` to trace the `stw` executable, then let it go, so that every
/// pause it makes is traced.
pub fn release_once_traced(out: &mut impl std::io::BufRead, pid: u32, port: u16) {
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "GOSTW_WAITING", "the workload did not wait");
    wait_until("the workload to be traced", Duration::from_secs(30), || {
        let body = http_get(port, "/metrics").map(|(_, b)| b)?;
        (sum_series(&body, "gostw_traced_processes", &[r#"executable="stw""#]) == 1.0).then_some(())
    });
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGUSR1) }, 0);
}

/// The agent traces the page-out workload (its anonymous memory pushed to
/// swap before each GC, so the GC's stop-the-world pause faults it back):
/// /metrics shows swap-in major faults inside pauses, pauses with faults in
/// the per-pause histogram, own waits, and fault totals that agree with the
/// workload's /proc/PID/stat majflt since it was traced; /debug/pauses has a
/// record with faults for each pause the histogram counts with faults.
#[test]
fn agent_exports_major_faults_in_pauses() {
    require_root();
    let _swap = SwapFile::create("agent-faults", 1);
    let cgroup = MemCgroup::create("gostw-agent-faults");
    let bin = build_workload("gcswap", &newest_go(), "", &[]);
    let mut procs = Procs::new("agent-faults");
    let bin = procs.own(&bin);
    let port = free_port();
    let matching = format!(
        "^{}$",
        regex::escape(&bin.canonicalize().unwrap().display().to_string())
    );
    // Every pause gets a record (not only slow ones), so the records can be
    // held against the per-pause histogram one for one: a pause that met one
    // fast swap-in is under the default 1 ms but still in the histogram.
    let agent_log = start_agent(&mut procs, port, &matching, &["--slow-pause", "0"]);
    let metrics = || {
        http_get(port, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default()
    };
    let mut workload = GcSwap::start(&bin, ARGS, ENV, |pid| cgroup.add(pid));
    let pid = workload.pid;
    wait_until("gcswap to be traced", Duration::from_secs(30), || {
        (sum_series(
            &format!("{}\n", metrics()),
            "gostw_traced_processes",
            &[r#"executable="gcswap""#],
        ) == 1.0)
            .then_some(())
    });
    // The backend is attached with the first traced process, once.
    let backend = wait_until("the fault backend", Duration::from_secs(30), || {
        let body = metrics();
        ["kprobe", "tracepoint", "none"]
            .into_iter()
            .find(|b| body.contains(&format!("gostw_agent_fault_backend{{backend=\"{b}\"}} 1")))
    });
    assert_ne!(
        backend,
        "none",
        "no fault backend: {}",
        fs::read_to_string(&agent_log).unwrap()
    );
    assert!(
        fs::read_to_string(&agent_log)
            .unwrap()
            .contains(&format!("major faults: {backend} backend"))
    );

    // Idle until the first GC: faults from now on are the agent's to see.
    let majflt_traced = majflt(pid);
    let bytes = workload.paged_gcs(&cgroup, ROUNDS);
    assert!(bytes > 32 << 20, "paged out only {bytes} bytes");
    // Idle again: every fault is in majflt now, and the agent exports the
    // last ones once their pause membership is settled (a few seconds).
    let majflt_done = majflt(pid) - majflt_traced;
    let exe = r#"executable="gcswap""#;
    let total = |body: &str| sum_series(body, "gostw_major_faults_total", &[exe]) as u64;
    let body = wait_until(
        "the agent's fault total to settle",
        Duration::from_secs(20),
        || {
            let body = metrics();
            majflt_agrees(total(&body), majflt_done, auto_backend()).then_some(body)
        },
    );
    let in_pause_swap = sum_series(
        &body,
        "gostw_major_faults_total",
        &[exe, r#"in_pause="true""#, r#"backing="swap""#],
    );
    let out = sum_series(
        &body,
        "gostw_major_faults_total",
        &[exe, r#"in_pause="false""#],
    );
    let pauses = sum_series(&body, "gostw_pause_major_faults_count", &[exe]);
    let no_fault_pauses = sum_series(
        &body,
        "gostw_pause_major_faults_bucket",
        &[exe, r#"le="0.0""#],
    );
    let per_pause_sum = sum_series(&body, "gostw_pause_major_faults_sum", &[exe]);
    let own = sum_series(
        &body,
        "gostw_fault_wait_seconds_sum",
        &[exe, r#"waited_on="own""#],
    );
    let other = sum_series(
        &body,
        "gostw_fault_wait_seconds_sum",
        &[exe, r#"waited_on="other""#],
    );
    eprintln!(
        "agent: {} major faults (majflt {majflt_done}): {in_pause_swap} in pauses (swap), {out} outside; \
         {pauses} pauses, {} with faults, {per_pause_sum} faults counted per pause; wait own {own:.3} s, other {other:.3} s",
        total(&body),
        pauses - no_fault_pauses
    );
    assert!(in_pause_swap > 0.0, "no swap-in faults in pauses");
    assert!(
        pauses - no_fault_pauses >= ROUNDS as f64,
        "{} pauses with major faults in the histogram, expected at least {ROUNDS}",
        pauses - no_fault_pauses
    );
    // Per pause, every fault in its record (swap, file or of unknown kind).
    let in_pause_all = sum_series(
        &body,
        "gostw_major_faults_total",
        &[exe, r#"in_pause="true""#],
    );
    assert!(per_pause_sum > 0.0 && per_pause_sum <= in_pause_all + 0.5);
    assert!(own > 0.0, "no own waits");
    assert!(body.contains("gostw_agent_events_lost_total{stage=\"fault_queue_full\"} 0"));

    // The slow-pause records of those pauses carry their faults by phase
    // and name the runtime's GC metadata sites.
    let (status, records) = http_get(port, &format!("/debug/pauses?pid={pid}&limit=100000"))
        .expect("no answer from /debug/pauses");
    assert_eq!(status, 200, "{records}");
    let faulting: Vec<Value> = records
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["faults"]["all"]["faults"].as_u64().unwrap_or(0) > 0)
        .collect();
    let gc_sites = faulting
        .iter()
        .filter(|r| {
            let sites = r["faults"]["top_sites"].to_string();
            crate::faults::GC_FRAMES.iter().any(|f| sites.contains(f))
        })
        .count();
    eprintln!(
        "{} pause records with faults, {gc_sites} naming a GC metadata site",
        faulting.len()
    );
    // The records and the histogram are two views of the same pauses.
    assert_eq!(
        faulting.len() as f64,
        pauses - no_fault_pauses,
        "pause records with faults vs pauses with faults in the histogram"
    );
    let faults_in_records: u64 = faulting
        .iter()
        .map(|r| r["faults"]["all"]["faults"].as_u64().unwrap())
        .sum();
    assert_eq!(
        faults_in_records as f64, per_pause_sum,
        "faults in the records vs the histogram's sum"
    );
    for r in &faulting {
        let phases = &r["faults"]["by_phase"];
        let by_phase: u64 = ["stopping", "stopped", "restarting"]
            .iter()
            .map(|k| phases[*k]["faults"].as_u64().unwrap_or(0))
            .sum();
        assert_eq!(
            by_phase,
            r["faults"]["all"]["faults"].as_u64().unwrap(),
            "{r}"
        );
    }
    assert!(
        gc_sites * 2 >= faulting.len(),
        "GC sites in {gc_sites} of {}",
        faulting.len()
    );
    let _ = workload.quit();
}

/// With exec notifications from the kernel, a new Go process is traced long
/// before the next poll (60 s here).
#[test]
fn exec_notifications_trace_new_processes_before_the_next_poll() {
    require_root();
    let bin = build_workload("stw", &newest_go(), "", &[]);
    let mut procs = Procs::new("agent-exec");
    let bin = procs.own(&bin);
    let port = free_port();
    let matching = format!(
        "^{}$",
        regex::escape(&bin.canonicalize().unwrap().display().to_string())
    );
    let log = fs::File::create(procs.dir.join("agent.log")).unwrap();
    procs.spawn(
        "gostw agent",
        Command::new(GOSTW)
            .args(["agent", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--match", &matching, "--poll-interval"])
            .arg(format!("{}s", patience(Duration::from_secs(60)).as_secs()))
            .stdout(Stdio::null())
            .stderr(log),
    );
    let metric = |name: &str| -> Option<f64> {
        let (_, body) = http_get(port, "/metrics")?;
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    };
    wait_until("the agent's first poll", Duration::from_secs(30), || {
        metric("gostw_agent_last_poll_timestamp_seconds").filter(|t| *t > 0.0)
    });
    let started = Instant::now();
    procs.spawn(
        "stw",
        Command::new(&bin)
            .args(["-duration", "30s", "-gc", "1", "-alloc-mb", "4"])
            .stdout(Stdio::null()),
    );
    wait_until(
        "the new process to be traced",
        patience(Duration::from_secs(15)),
        || metric("gostw_agent_processes_traced").filter(|n| *n == 1.0),
    );
    eprintln!("traced {:?} after it started", started.elapsed());
    assert!(metric("gostw_agent_exec_notifications_total").unwrap() >= 1.0);
}

/// A process that is gone by the time its executable is attached is a
/// "process_gone" failure (not an analysis failure that would blacklist the
/// executable).
#[test]
fn a_process_gone_before_attach_is_not_held_against_its_executable() {
    require_root();
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let mut kernel = Core::load(CoreOptions::default()).unwrap();
    match kernel.attach(pid, Path::new(&format!("/proc/{pid}/exe"))) {
        Err(AttachError::Failed {
            reason: FailureReason::ProcessGone,
            ..
        }) => {}
        Err(other) => panic!("{other:?}"),
        Ok(_) => panic!("attached to an exited process"),
    }
}

fn agent_fails(args: &[&str]) -> String {
    let out = Command::new(GOSTW)
        .arg("agent")
        .args(args)
        .output()
        .expect("running gostw");
    assert!(!out.status.success(), "gostw agent {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn bad_agent_options_fail_with_a_clear_message() {
    let e = agent_fails(&["--poll-interval", "5x"]);
    assert!(e.contains("unknown unit"), "{e}");
    let e = agent_fails(&["--poll-interval", "1ms"]);
    assert!(e.contains("outside 10ms..1h"), "{e}");
    let e = agent_fails(&["--listen", "nowhere"]);
    assert!(e.contains("--listen"), "{e}");
    let e = agent_fails(&["--match", "(unclosed"]);
    assert!(e.contains("not a valid regular expression"), "{e}");
    let e = agent_fails(&["--max-executables", "0"]);
    assert!(e.contains("--max-executables"), "{e}");
}

#[test]
fn a_port_in_use_is_a_clear_error() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let e = agent_fails(&["--listen", &addr]);
    assert!(
        e.contains(&format!("cannot listen on {addr}")) && e.contains("--listen"),
        "{e}"
    );
}

/// The value of `metric` in a /metrics body for executable `exe`.
fn scraped(body: &str, metric: &str, exe: &str) -> Option<f64> {
    let exe = format!("executable=\"{exe}\"");
    body.lines().find_map(|l| {
        let rest = l.strip_prefix(metric)?.strip_prefix('{')?;
        if !rest.contains(&exe) {
            return None;
        }
        rest.rsplit(' ').next()?.parse().ok()
    })
}

/// Stack growth through the agent's one CPU sampler, per executable: two
/// copies of the stackgrowth workload started after the agent, one starting
/// a goroutine per task (each grows its 2 KB stack to 32 KB once) and one
/// running the same tasks on a worker pool (a worker's stack grows once),
/// are told apart by their executable labels; the first spends measurable
/// CPU time growing stacks, the second none or far less.
#[test]
fn agent_exports_stack_growth_per_executable() {
    require_root();
    let built = build_workload("stackgrowth", &newest_go(), "", &[]);
    let mut procs = Procs::new("agent-stack");
    let exes = ["sg-batch", "sg-pool"].map(|name| {
        let path = procs.dir.join(name);
        fs::copy(&built, &path).unwrap();
        path
    });
    let port = free_port();
    let matching = format!("^{}/", regex::escape(&procs.dir.display().to_string()));
    start_agent(&mut procs, port, &matching, &[]);
    for (mode, exe) in ["batch", "pool"].into_iter().zip(&exes) {
        procs.spawn(
            mode,
            Command::new(exe)
                .args(["-mode", mode, "-duration"])
                .arg(format!("{}s", patience(Duration::from_secs(60)).as_secs()))
                .stdout(Stdio::null()),
        );
    }
    let started = Instant::now();
    // The counts come from kernel maps read on the agent's tick, the sizes
    // from events read from the ring buffer after it: a scrape can fall
    // between the two, so both are waited for.
    let body = wait_until(
        "stack growth samples of both executables, with their stack sizes",
        patience(Duration::from_secs(90)),
        || {
            let (_, body) = http_get(port, "/metrics")?;
            let growth = scraped(&body, "gostw_stack_growth_samples_total", "sg-batch")?;
            let pool_cpu = scraped(&body, "gostw_cpu_samples_total", "sg-pool")?;
            let sized = scraped(&body, "gostw_stack_growth_old_size_bytes_count", "sg-batch")?;
            (growth >= 30.0 && pool_cpu >= 100.0 && sized > 0.0).then_some(body)
        },
    );
    let get = |metric: &str, exe: &str| {
        scraped(&body, metric, exe).unwrap_or_else(|| panic!("no {metric} of {exe} in\n{body}"))
    };
    let mut seen = Vec::new();
    for exe in ["sg-batch", "sg-pool"] {
        let cpu = get("gostw_cpu_samples_total", exe);
        let growth = get("gostw_stack_growth_samples_total", exe);
        let seconds = get("gostw_stack_growth_cpu_seconds_total", exe);
        eprintln!(
            "{exe} after {:?}: {cpu} CPU samples, {growth} growing stacks ({:.1}%), {seconds:.3} s of CPU",
            started.elapsed(),
            100.0 * growth / cpu
        );
        assert!(
            (seconds - growth / 99.0).abs() < 1e-6,
            "{seconds} s for {growth} samples at 99 Hz"
        );
        seen.push((cpu, growth));
    }
    let [(batch_cpu, batch), (pool_cpu, pool)] = seen[..] else {
        unreachable!()
    };
    // Batch spends >5% of its CPU growing stacks (stack_growth.rs); the pool
    // at most a few samples while its workers' stacks first grow.
    assert!(batch / batch_cpu > 0.02, "batch: {batch} of {batch_cpu}");
    assert!(
        pool / pool_cpu < batch / batch_cpu / 10.0,
        "pool {pool} of {pool_cpu} vs batch {batch} of {batch_cpu}"
    );
    // The samples' stack sizes: a 2 KB stack being copied (most samples),
    // or its 32 KB successor in the rest of the copy.
    let small: f64 = body
        .lines()
        .find(|l| {
            l.starts_with("gostw_stack_growth_old_size_bytes_bucket{le=\"2048.0\"")
                && l.contains("executable=\"sg-batch\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0);
    let count = get("gostw_stack_growth_old_size_bytes_count", "sg-batch");
    eprintln!("sg-batch: {count} samples with a stack size, {small} at 2 KB");
    for l in body.lines().filter(|l| {
        l.starts_with("gostw_stack_growth_old_size_bytes_bucket") && l.contains("sg-batch")
    }) {
        eprintln!("  {l}");
    }
    assert!(count > 0.0 && small > 0.0, "{body}");
    for l in body.lines().filter(|l| l.contains("stack_growth")) {
        assert!(!l.contains("pid="), "no per-pid label: {l}");
    }
}

/// The agent's series of `exe`: pauses per reason and major faults in and
/// outside pauses.
fn agent_counts(body: &str, exe: &str) -> (std::collections::BTreeMap<String, u64>, u64, u64) {
    let exe = format!("executable=\"{exe}\"");
    let mut by_reason = std::collections::BTreeMap::new();
    for line in body.lines() {
        let Some(rest) = line.strip_prefix("gostw_pause_duration_seconds_count{") else {
            continue;
        };
        if !rest.contains(&exe) {
            continue;
        }
        let reason = rest
            .split("reason=\"")
            .nth(1)
            .and_then(|r| r.split('"').next());
        let n: f64 = rest.rsplit(' ').next().unwrap().parse().unwrap();
        *by_reason.entry(reason.unwrap().to_owned()).or_default() += n as u64;
    }
    let faults = |in_pause: &str| {
        sum_series(
            body,
            "gostw_major_faults_total",
            &[&exe, &format!("in_pause=\"{in_pause}\"")],
        ) as u64
    };
    (by_reason, faults("true"), faults("false"))
}

/// One engine, two front ends: the agent and `gostw attach` watch the same
/// paged-out process over the same interval (the process is frozen at both
/// ends) and count the same pauses per reason and the same major faults in
/// and outside pauses.
#[test]
fn agent_and_attach_see_the_same_pauses_and_faults() {
    require_root();
    let _swap = SwapFile::create("agent-attach", 1);
    let cgroup = MemCgroup::create("gostw-agent-attach");
    let bin = build_workload("gcswap", &newest_go(), "", &[]);
    let mut procs = Procs::new("agent-attach");
    let bin = procs.own(&bin);
    let port = free_port();
    let matching = format!(
        "^{}$",
        regex::escape(&bin.canonicalize().unwrap().display().to_string())
    );
    start_agent(&mut procs, port, &matching, &[]);
    let metrics = || {
        http_get(port, "/metrics")
            .map(|(_, b)| format!("{b}\n"))
            .unwrap_or_default()
    };
    let mut workload = GcSwap::start(&bin, ARGS, ENV, |pid| cgroup.add(pid));
    let pid = workload.pid;
    wait_showing("gcswap to be traced", Duration::from_secs(30), || {
        let m = metrics();
        if sum_series(&m, "gostw_traced_processes", &[r#"executable="gcswap""#]) == 1.0 {
            return Ok(());
        }
        // What the agent says of its processes, when it is not.
        Err(m
            .lines()
            .filter(|l| l.starts_with("gostw_") && !l.contains("_bucket"))
            .filter(|l| l.contains("process") || l.contains("attach"))
            .collect::<Vec<_>>()
            .join("\n"))
    });
    let signal = |sig| {
        // SAFETY: signalling our own child.
        assert_eq!(unsafe { libc::kill(pid as libc::pid_t, sig) }, 0);
    };
    // Frozen: nothing happens in it until both watch.
    signal(libc::SIGSTOP);
    let (attach, _stderr) = crate::support::start_gostw(
        &["attach", "--json", "--pid", &pid.to_string()],
        "tracing pid",
    );
    // Everything before the freeze is settled in the agent (its correlator
    // decides a fault's pause within 2 s).
    std::thread::sleep(Duration::from_millis(2500));
    let before = agent_counts(&metrics(), "gcswap");
    signal(libc::SIGCONT);
    let bytes = workload.paged_gcs(&cgroup, ROUNDS);
    assert!(bytes > 32 << 20, "paged out only {bytes} bytes");
    signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(2500));
    let after = agent_counts(&metrics(), "gcswap");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(attach.id() as libc::pid_t, libc::SIGINT) };
    let out = attach.wait_with_output().unwrap();
    assert!(out.status.success(), "gostw attach failed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: Value = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["type"] == "summary")
        .expect("no summary from gostw attach");
    signal(libc::SIGCONT);
    let _ = workload.quit();

    let agent_reasons: std::collections::BTreeMap<String, u64> = after
        .0
        .iter()
        .map(|(r, n)| (r.clone(), n - before.0.get(r).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    let attach_reasons: std::collections::BTreeMap<String, u64> =
        summary["processes"][0]["by_reason"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["reason"].as_str().unwrap().to_owned(),
                    r["count"].as_u64().unwrap(),
                )
            })
            .collect();
    let proc = &summary["faults"]["processes"][0];
    let attach_faults = (
        proc["in_pauses"]["faults"].as_u64().unwrap(),
        proc["outside_pauses"]["faults"].as_u64().unwrap(),
    );
    let agent_faults = (after.1 - before.1, after.2 - before.2);
    eprintln!(
        "pauses per reason: agent {agent_reasons:?}, attach {attach_reasons:?}; \
         major faults (in, outside pauses): agent {agent_faults:?}, attach {attach_faults:?}"
    );
    assert!(
        attach_reasons.values().sum::<u64>() >= 2 * ROUNDS as u64,
        "too few pauses seen: {attach_reasons:?}"
    );
    assert!(
        attach_faults.0 > 0,
        "no fault inside a pause: the page-out did not take"
    );
    assert_eq!(agent_reasons, attach_reasons);
    assert_eq!(agent_faults, attach_faults);
}

/// The ids of the BPF programs process `pid` holds open (its fdinfo).
fn prog_ids(pid: u32) -> std::collections::HashSet<u64> {
    let mut ids = std::collections::HashSet::new();
    for entry in fs::read_dir(format!("/proc/{pid}/fdinfo")).unwrap() {
        let Ok(info) = fs::read_to_string(entry.unwrap().path()) else {
            continue;
        };
        ids.extend(
            info.lines()
                .filter_map(|l| l.strip_prefix("prog_id:"))
                .filter_map(|v| v.trim().parse::<u64>().ok()),
        );
    }
    ids
}

/// `bpftool prog show` run counts of the programs of process `pid` named
/// `names`, summed (other tools' programs on this host are not counted). A
/// name ending in `*` is a prefix; others are whole names (`stw_stop` is not
/// `stw_stopped`).
pub fn run_counts(pid: u32, names: &[&str]) -> u64 {
    let ids = prog_ids(pid);
    let out = Command::new("bpftool")
        .args(["prog", "show", "--json"])
        .output()
        .expect("running bpftool (cargo xtask setup installs it)");
    assert!(out.status.success(), "bpftool prog show failed");
    let progs: Value = serde_json::from_slice(&out.stdout).unwrap();
    progs
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["id"].as_u64().is_some_and(|id| ids.contains(&id)))
        .filter(|p| {
            p["name"].as_str().is_some_and(|n| {
                names.iter().any(|w| match w.strip_suffix('*') {
                    Some(prefix) => n.starts_with(prefix),
                    // The kernel keeps 15 bytes of a name.
                    None => n == &w[..w.len().min(15)],
                })
            })
        })
        .map(|p| p["run_cnt"].as_u64().unwrap_or(0))
        .sum()
}

/// With nothing to trace, the agent runs no program on the fault or
/// scheduler paths: it attaches them with its first traced process and
/// detaches them when the last one exits. First the control (a traced Go
/// process makes the agent's hooks run, so the count can rise), then
/// [`QUIET_FOR`] of host activity with nothing traced, during which it
/// must not.
/// As long as the control's Go process runs.
const QUIET_FOR: Duration = Duration::from_secs(5);

#[test]
fn a_quiet_agent_runs_nothing_on_fault_or_scheduler_paths() {
    require_root();
    // BPF_ENABLE_STATS (run time statistics while the fd is open): unlike
    // the sysctl, nobody else's write can turn it off under this test.
    const BPF_ENABLE_STATS: libc::c_long = 32;
    let attr: [u32; 2] = [0, 0]; // BPF_STATS_RUN_TIME
    // SAFETY: the bpf syscall reads `size_of_val(&attr)` bytes of `attr`.
    let stats_fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_ENABLE_STATS,
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    assert!(
        stats_fd >= 0,
        "BPF_ENABLE_STATS: {}",
        std::io::Error::last_os_error()
    );
    let hooks = [
        "fault_*",
        "stack_sample*",
        "explain_*",
        "switch_both",
        "laggard_sample",
    ];
    let bin = build_workload("stw", &newest_go(), "", &[]);
    let mut procs = Procs::new("agent-idle");
    let bin = procs.own(&bin);
    let port = free_port();
    let matching = format!(
        "^{}$",
        regex::escape(&bin.canonicalize().unwrap().display().to_string())
    );
    let log = start_agent(&mut procs, port, &matching, &[]);
    let agent = procs.children.last().unwrap().1.id();
    let traced = || {
        http_get(port, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("gostw_agent_processes_traced "))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    // The control: a Go process the agent traces; its hooks run.
    let mut go = Command::new(&bin)
        .args(["-duration", "5s"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let ran = wait_until("the hooks to run", Duration::from_secs(30), || {
        let n = run_counts(agent, &hooks);
        (n > 0).then_some(n)
    });
    assert!(go.wait().unwrap().success());
    wait_until("the agent to untrace it", Duration::from_secs(30), || {
        (traced() == Some(0.0)).then_some(())
    });
    // Nothing traced: page faults and context switches in other processes
    // of the host for as long as the control ran. Attached, these hooks run
    // on every context switch and fault of the host, thousands of times in
    // that time (the control's count shows they can rise).
    let base = run_counts(agent, &hooks);
    let busy = Instant::now();
    while busy.elapsed() < QUIET_FOR {
        let out = Command::new("sh")
            .args([
                "-c",
                "for i in 1 2 3 4 5 6 7 8; do head -c 4000000 /dev/zero | wc -c >/dev/null; done",
            ])
            .output()
            .unwrap();
        assert!(out.status.success());
    }
    let idle = run_counts(agent, &hooks) - base;
    // SAFETY: closing the statistics fd opened above.
    unsafe { libc::close(stats_fd as i32) };
    eprintln!(
        "fault/scheduler/sampler program runs: {ran} while a Go process was traced, {idle} in {QUIET_FOR:?} with nothing traced"
    );
    assert_eq!(
        idle,
        0,
        "an idle agent ran programs on the fault or scheduler paths; agent log:\n{}",
        fs::read_to_string(&log).unwrap_or_default()
    );
}

/// The exposure series of the newest Go's process (its label set holds it
/// alone): every class and state, and the resident classes within what its
/// resident set was (at most its peak, at least half of it now).
fn check_memory_series(agent_port: u16, go: &GoToolchain, pid: u32) {
    // The exposure is read every second and the resident set moves between
    // that read and ours (the workload allocates, the scavenger returns
    // memory): within a few fresh scrapes it is at most the peak and at
    // least half of what /proc says now.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, body) = http_get(agent_port, "/metrics").unwrap();
        let (resident, rss, peak, series) = memory_series(&body, go, pid);
        if resident * 2 >= rss && resident <= peak + peak / 10 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "resident classes {resident} vs VmRSS {rss}, VmHWM {peak}: {series:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The sum of `pid`'s resident memory classes in `body` (all 8 series
/// there, heap arenas non-zero), its VmRSS and VmHWM now, and the series.
fn memory_series(body: &str, go: &GoToolchain, pid: u32) -> (u64, u64, u64, Vec<(String, u64)>) {
    let prefix = format!(
        r#"gostw_process_memory_bytes{{executable="stw",go_version="go{}","#,
        go.version
    );
    let series: Vec<(String, u64)> = body
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .map(|l| {
            let (key, v) = l.rsplit_once(' ').unwrap();
            (key.to_string(), v.parse().unwrap())
        })
        .collect();
    assert_eq!(series.len(), 8, "{series:?}\n{body}");
    let resident: u64 = series
        .iter()
        .filter(|(k, _)| k.contains(r#"state="resident""#))
        .map(|(_, v)| v)
        .sum();
    let heap = series
        .iter()
        .find(|(k, _)| k.contains(r#"class="heap_arenas",state="resident""#))
        .unwrap()
        .1;
    assert!(heap > 0, "{series:?}");
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap()
            * 1024
    };
    (resident, kib("VmRSS:"), kib("VmHWM:"), series)
}

/// `promtool check metrics` passes on `body` (the Prometheus text format).
pub fn promtool_check(body: &str) {
    gostw_scenario::promtool_check(body).unwrap_or_else(|e| panic!("{e}"));
}
