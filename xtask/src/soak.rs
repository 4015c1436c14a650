//! `cargo xtask soak-agent`: run `gostw agent` for a while (not in CI) while
//! Go processes of two Go versions start and exit over and over, and SIGKILL
//! and restart the agent every minute; after each kill, check that the
//! kernel freed every program, link and map it held and that no uprobe is
//! left in a program it traced (leftovers.rs); require that no traced
//! program fails; sample the agent's RSS and CPU from /proc and judge
//! whether its memory grows.

mod leftovers;

use std::{
    fs,
    io::BufReader,
    path::{Path, PathBuf},
    process::{ChildStdin, ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use gostw_scenario::{
    GcSwapControl,
    loopback::{free_port, http_get, samples},
};

use crate::{
    cmd::{Reaped, step, workspace_root},
    go, setup,
};

#[derive(clap::Args)]
pub struct Options {
    /// How long to run.
    #[arg(long, default_value_t = 10.0)]
    pub minutes: f64,
    /// Seconds between samples.
    #[arg(long, default_value_t = 10)]
    pub sample_secs: u64,
    /// Go processes alive at once.
    #[arg(long, default_value_t = 6)]
    pub concurrent: usize,
    /// SIGKILL and restart the agent this often, in seconds (0: never).
    #[arg(long, default_value_t = 60)]
    pub kill_every: u64,
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    if !setup::is_root() {
        bail!("the agent loads eBPF programs and needs root: run `sudo -E cargo xtask soak-agent`");
    }
    let gostw = crate::build::gostw(crate::arch::Arch::Amd64)?;
    let mut bins = Vec::new();
    for version in [go::DEFAULT, "1.22.10"] {
        let t = go::toolchain(version).context("Go version not in the matrix")?;
        let out = crate::demo::build_stw_workload(t, version)?;
        bins.push(out);
    }
    let default_go = go::toolchain(go::DEFAULT).context("the default Go is in the matrix")?;
    let gcswap = crate::demo::build_workload(default_go, go::DEFAULT, "gcswap")?;
    let port = free_port()?;
    let mut agent = Agent::start(&gostw, port)?;
    step("discovery latency: Go process started -> traced (10 runs)");
    let mut latencies = Vec::new();
    for _ in 0..10 {
        let t0 = Instant::now();
        let probe = Reaped(
            Command::new(&bins[0])
                .args(["-duration", "3s", "-gc", "0", "-alloc-mb", "1"])
                .stdout(Stdio::null())
                .spawn()
                .context("starting a workload")?,
        );
        while !traced(port, |n| n == 1.0) {
            if t0.elapsed() > Duration::from_secs(10) {
                bail!("a new Go process was not traced within 10 s");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        latencies.push(t0.elapsed());
        drop(probe);
        while !traced(port, |n| n == 0.0) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    latencies.sort();
    let notified = metrics(port)
        .and_then(|m| metric_value(&m, "gostw_agent_exec_notifications_total"))
        .unwrap_or(0.0);
    println!(
        "discovery latency (poll interval 1s, exec notifications {}): min {:.0?}, median {:.0?}, max {:.0?}",
        if notified > 0.0 { "on" } else { "off" },
        latencies[0],
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1]
    );

    // One traced program lives through the whole soak, every agent kill
    // and restart included: gcswap, idle but for a GC a second.
    let mut anchor = Anchor::start(&gcswap)?;
    agent.wait_traced(port, anchor.pid, Duration::from_secs(10))?;
    let started = Instant::now();
    let kill_every = (opts.kill_every > 0).then(|| Duration::from_secs(opts.kill_every));
    step(&format!(
        "soak for {} min: Go processes start and exit while the agent runs{}",
        opts.minutes,
        match kill_every {
            Some(d) => format!(", SIGKILLed and restarted every {d:?}"),
            None => String::new(),
        }
    ));
    let total = Duration::from_secs_f64(opts.minutes * 60.0);
    let mut workloads: Vec<Reaped> = Vec::new();
    let mut started_count = 0u64;
    let mut crashed = Vec::new();
    let mut samples: Vec<(f64, u64)> = Vec::new();
    let mut kills: Vec<KillReport> = Vec::new();
    let ticks = clock_ticks();
    let mut cpu_before_restarts = 0u64;
    let mut last_cpu = (Instant::now(), cpu_ticks(agent.pid)?);
    let mut next_sample = Instant::now();
    let mut next_gc = Instant::now();
    print_header();
    while started.elapsed() < total {
        for Reaped(c) in &mut workloads {
            if let Some(status) = c.try_wait()?
                && !status.success()
            {
                crashed.push(format!("pid {}: {status}", c.id()));
            }
        }
        workloads.retain_mut(|Reaped(c)| c.try_wait().ok().flatten().is_none());
        while workloads.len() < opts.concurrent {
            let bin = &bins[(started_count % 2) as usize];
            // 1-4 s lives, so processes and executables come and go often.
            let secs = 1 + started_count % 4;
            workloads.push(Reaped(
                Command::new(bin)
                    .args([
                        "-duration",
                        &format!("{secs}s"),
                        "-gc",
                        "1",
                        "-alloc-mb",
                        "4",
                    ])
                    .args(["-readmemstats", "1", "-gomaxprocs", "2"])
                    .stdout(Stdio::null())
                    .spawn()
                    .context("starting a workload")?,
            ));
            started_count += 1;
        }
        if Instant::now() >= next_gc {
            anchor.gc()?;
            next_gc = Instant::now() + Duration::from_secs(1);
        }
        if Instant::now() >= next_sample {
            let rss = rss_kib(agent.pid)?;
            let cpu = cpu_ticks(agent.pid)?;
            let now = Instant::now();
            let pct = cpu.saturating_sub(last_cpu.1) as f64
                / ticks as f64
                / now.duration_since(last_cpu.0).as_secs_f64()
                * 100.0;
            last_cpu = (now, cpu);
            let m = metrics(port).unwrap_or_default();
            let get = |name: &str| metric_value(&m, name).unwrap_or(f64::NAN);
            let t = started.elapsed().as_secs_f64();
            println!(
                "{t:>7.0} {:>6} {rss:>9} {pct:>7.2} {started_count:>9} {:>7} {:>6} {:>9}",
                kills.len() + 1,
                get("gostw_agent_processes_traced"),
                get("gostw_agent_executables_attached"),
                sum_metric(&m, "gostw_agent_events_lost_total"),
            );
            // Warm samples only: RSS right after a restart is still growing
            // to its steady size.
            if agent.started.elapsed() >= Duration::from_secs(15) {
                samples.push((t, rss));
            }
            next_sample = now + Duration::from_secs(opts.sample_secs);
        }
        if agent.child.0.try_wait()?.is_some() {
            bail!("the agent exited during the soak (not killed by the soak)");
        }
        // (The last agent is killed at the end in any case.)
        if let Some(every) = kill_every
            && agent.started.elapsed() >= every
            && total.saturating_sub(started.elapsed()) > Duration::from_secs(15)
        {
            cpu_before_restarts += cpu_ticks(agent.pid)?;
            let report = kill_and_check(&mut agent, anchor.pid)?;
            println!("        {report}");
            agent = Agent::start(&gostw, port)?;
            let retraced = agent.wait_traced(port, anchor.pid, Duration::from_secs(10))?;
            kills.push(KillReport { retraced, ..report });
            last_cpu = (Instant::now(), cpu_ticks(agent.pid)?);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(workloads);
    let cpu_total = (cpu_before_restarts + cpu_ticks(agent.pid)?) as f64 / ticks as f64;
    // The last agent is killed and checked too.
    let last = kill_and_check(&mut agent, anchor.pid)?;
    println!("        {last}");
    kills.push(last);
    let anchor_gcs = anchor.quit()?;
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "\n{started_count} Go processes started, {} exited with an error; the traced gcswap ran \
         {anchor_gcs} GCs through {} agent kills and exited cleanly",
        crashed.len(),
        kills.len()
    );
    println!(
        "agent CPU {cpu_total:.1} s in {elapsed:.0} s ({:.2}% of one core)",
        cpu_total / elapsed * 100.0
    );
    if !kills.is_empty() {
        let max = |f: fn(&KillReport) -> Duration| kills.iter().map(f).max().unwrap_or_default();
        println!(
            "{} SIGKILLs: after each, every program, link and map the agent held was gone \
             (slowest {:.0?}), no perf event named one, no uprobe byte was left in the traced \
             program; restarted agents traced it again within {:.0?}",
            kills.len(),
            max(|k| k.freed_in),
            max(|k| k.retraced),
        );
    }
    println!("{}", verdict(&samples));
    if !crashed.is_empty() {
        bail!("traced Go programs failed: {}", crashed.join(", "));
    }
    Ok(())
}

fn print_header() {
    println!(
        "{:>7} {:>6} {:>9} {:>7} {:>9} {:>7} {:>6} {:>9}",
        "t(s)", "agent#", "rss(KiB)", "cpu%", "started", "traced", "exes", "lost"
    );
}

/// Whether the agent reports a number of traced processes `ok` accepts.
fn traced(port: u16, ok: impl Fn(f64) -> bool) -> bool {
    metrics(port)
        .and_then(|m| metric_value(&m, "gostw_agent_processes_traced"))
        .is_some_and(ok)
}

/// A running `gostw agent`, killed on drop.
struct Agent {
    child: Reaped,
    pid: u32,
    started: Instant,
}

impl Agent {
    /// Start the agent on `port`, tracing only this checkout's workloads
    /// (other checkouts' tests on the same host must not pay for uprobes),
    /// and wait until it serves /metrics.
    fn start(gostw: &Path, port: u16) -> anyhow::Result<Agent> {
        let workloads = workspace_root().join("target/go-workloads");
        let child = Command::new(gostw)
            .args(["agent", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--match")
            .arg(format!(
                "^{}/",
                gostw_scenario::regex_escape(&workloads.display().to_string())
            ))
            .args(["--poll-interval", "1s"])
            .stdout(Stdio::null())
            .spawn()
            .context("starting gostw agent")?;
        let agent = Agent {
            pid: child.id(),
            child: Reaped(child),
            started: Instant::now(),
        };
        while metrics(port).is_none() {
            if agent.started.elapsed() > Duration::from_secs(30) {
                bail!("the agent did not serve /metrics within 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(agent)
    }

    /// Wait until the agent traces `anchor` (its uprobes are in the
    /// anchor's text, and it counts a traced process); returns how long
    /// after the agent's start.
    fn wait_traced(&self, port: u16, anchor: u32, timeout: Duration) -> anyhow::Result<Duration> {
        let deadline = Instant::now() + timeout;
        while !(leftovers::patched_text_bytes(anchor)? > 0 && traced(port, |n| n >= 1.0)) {
            if Instant::now() > deadline {
                bail!("the agent did not trace pid {anchor} within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(self.started.elapsed())
    }
}

/// What one SIGKILL of the agent left behind (nothing, or the soak fails).
#[derive(Clone, Copy, Default)]
struct KillReport {
    progs: usize,
    links: usize,
    maps: usize,
    /// int3 bytes in the traced program's text just before the kill.
    patched_before: usize,
    /// From the kill (reaped) to the last object gone.
    freed_in: Duration,
    /// From the restart to the traced program being traced again.
    retraced: Duration,
}

impl std::fmt::Display for KillReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SIGKILL: {} programs, {} links, {} maps freed {:.0?} after; uprobe bytes in the \
             traced program {} -> 0",
            self.progs, self.links, self.maps, self.freed_in, self.patched_before
        )
    }
}

/// SIGKILL the agent; check that the kernel freed everything it held and
/// that its uprobes are gone from the traced program `anchor`.
fn kill_and_check(agent: &mut Agent, anchor: u32) -> anyhow::Result<KillReport> {
    let held = leftovers::held_by(agent.pid)?;
    let patched_before = leftovers::patched_text_bytes(anchor)?;
    if held.progs.is_empty() || patched_before == 0 {
        bail!(
            "before the kill the agent held {} programs and the traced program had {patched_before} \
             uprobe bytes: it was not tracing it, so the kill would prove nothing",
            held.progs.len()
        );
    }
    agent.child.0.kill()?;
    agent.child.0.wait()?;
    let freed_in = leftovers::wait_freed(&held, Duration::from_secs(10))?;
    let patched_after = leftovers::patched_text_bytes(anchor)?;
    if patched_after != 0 {
        bail!("{patched_after} uprobe bytes left in the traced program after the agent was killed");
    }
    Ok(KillReport {
        progs: held.progs.len(),
        links: held.links.len(),
        maps: held.maps.len(),
        patched_before,
        freed_in,
        retraced: Duration::ZERO,
    })
}

/// The traced program that lives through the soak: gcswap with a small
/// heap, one GC a second; it must exit cleanly at the end.
struct Anchor {
    child: Reaped,
    pid: u32,
    control: GcSwapControl<BufReader<ChildStdout>, ChildStdin>,
}

impl Anchor {
    fn start(gcswap: &Path) -> anyhow::Result<Anchor> {
        let mut child = Command::new(gcswap)
            .args(["-live-mb", "8", "-goroutines", "100", "-garbage-mb", "4"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting gcswap")?;
        let mut control = GcSwapControl::new(
            BufReader::new(child.stdout.take().expect("piped")),
            child.stdin.take().expect("piped"),
        );
        control.ready(&mut |_| {})?;
        Ok(Anchor {
            pid: child.id(),
            child: Reaped(child),
            control,
        })
    }

    fn gc(&mut self) -> anyhow::Result<()> {
        self.control
            .gc(&mut |_| {})
            .context("the traced gcswap stopped answering")?;
        Ok(())
    }

    /// Ask gcswap to exit; its GC count, once it exited with status 0.
    fn quit(&mut self) -> anyhow::Result<u64> {
        let report = self.control.quit(&mut |_| {})?;
        let status = self.child.0.wait()?;
        if !status.success() {
            bail!("the traced gcswap exited with {status}");
        }
        let v: serde_json::Value = serde_json::from_str(&report)?;
        v["gcs"].as_u64().context("gcswap's report has no gcs")
    }
}

/// Compare the mean RSS of the second quarter (after warm-up) with the last
/// quarter: growth under 10 % and under 2 MiB is "flat".
fn verdict(samples: &[(f64, u64)]) -> String {
    if samples.len() < 8 {
        return "verdict: too few samples to judge memory growth (run longer)".to_owned();
    }
    let q = samples.len() / 4;
    let mean = |s: &[(f64, u64)]| s.iter().map(|x| x.1 as f64).sum::<f64>() / s.len() as f64;
    let early = mean(&samples[q..2 * q]);
    let late = mean(&samples[samples.len() - q..]);
    let growth = late - early;
    let flat = growth < 2048.0 || growth / early < 0.10;
    format!(
        "verdict: RSS {early:.0} KiB -> {late:.0} KiB ({:+.1}%): {}",
        growth / early * 100.0,
        if flat {
            "no memory growth"
        } else {
            "MEMORY GROWS"
        }
    )
}

fn proc_file(pid: u32, file: &str) -> anyhow::Result<String> {
    let p: PathBuf = Path::new("/proc").join(pid.to_string()).join(file);
    fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
}

fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    proc_file(pid, "status")?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = proc_file(pid, "stat")?;
    let rest = &stat[stat.rfind(')').context("malformed stat")? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat are the 12th and 13th after the command name.
    Ok(f.get(11).context("short stat")?.parse::<u64>()?
        + f.get(12).context("short stat")?.parse::<u64>()?)
}

fn clock_ticks() -> u64 {
    let out = Command::new("getconf").arg("CLK_TCK").output();
    out.ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100)
}

fn metrics(port: u16) -> Option<String> {
    http_get(port, "/metrics").map(|(_, body)| body)
}

/// The value of the unlabelled series `name`.
fn metric_value(text: &str, name: &str) -> Option<f64> {
    samples(text, name)
        .into_iter()
        .find_map(|(labels, v)| labels.is_empty().then_some(v))
}

/// The sum of every series of `name`.
fn sum_metric(text: &str, name: &str) -> f64 {
    samples(text, name).into_iter().map(|(_, v)| v).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_and_growing_memory() {
        let flat: Vec<_> = (0..12).map(|i| (i as f64, 10_000 + i % 2)).collect();
        assert!(verdict(&flat).contains("no memory growth"));
        let grows: Vec<_> = (0..12).map(|i| (i as f64, 10_000 + i * 2_000)).collect();
        assert!(verdict(&grows).contains("MEMORY GROWS"));
        assert!(verdict(&flat[..3]).contains("too few"));
    }

    #[test]
    fn reads_metric_values() {
        let t = "# HELP x\nx_total 3\nx_total_other 9\nlost{stage=\"a\"} 1\nlost{stage=\"b\"} 2\n";
        assert_eq!(metric_value(t, "x_total"), Some(3.0));
        assert_eq!(sum_metric(t, "lost"), 3.0);
    }
}
