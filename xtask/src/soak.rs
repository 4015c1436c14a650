//! `cargo xtask soak-agent`: run `gostw agent` for a while (not in CI) while
//! Go processes of two Go versions start and exit over and over; sample the
//! agent's RSS and CPU from /proc and judge whether its memory grows.

use std::{
    fs,
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{
    cmd::{step, workspace_root},
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
}

/// Children killed and reaped on drop, whatever happens.
#[derive(Default)]
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    if !setup::is_root() {
        bail!("the agent loads eBPF programs and needs root: run `sudo -E cargo xtask soak-agent`");
    }
    let gostw = crate::demo::build_gostw_release()?;
    let mut bins = Vec::new();
    for version in [go::DEFAULT, "1.22.10"] {
        let t = go::toolchain(version).context("Go version not in the matrix")?;
        let out = crate::demo::build_stw_workload(t, version)?;
        bins.push(out);
    }
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut agent = Children::default();
    agent.0.push(
        Command::new(&gostw)
            .args(["agent", "--listen", &format!("127.0.0.1:{port}")])
            // Only this checkout's workloads: other checkouts' tests on the
            // same host must not pay for uprobes.
            .arg("--match")
            .arg(format!(
                "^{}/",
                regex_escape(
                    &workspace_root()
                        .join("target/go-workloads")
                        .display()
                        .to_string()
                )
            ))
            .args(["--poll-interval", "1s"])
            .stdout(Stdio::null())
            .spawn()
            .context("starting gostw agent")?,
    );
    let agent_pid = agent.0[0].id();
    let started = Instant::now();
    while metrics(port).is_none() {
        if started.elapsed() > Duration::from_secs(30) {
            bail!("the agent did not serve /metrics within 30 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    step("discovery latency: Go process started -> traced (10 runs)");
    let mut latencies = Vec::new();
    for _ in 0..10 {
        let mut probe = Children::default();
        let t0 = Instant::now();
        probe.0.push(
            Command::new(&bins[0])
                .args(["-duration", "3s", "-gc", "0", "-alloc-mb", "1"])
                .stdout(Stdio::null())
                .spawn()
                .context("starting a workload")?,
        );
        let traced = |n: f64| {
            metrics(port)
                .and_then(|m| metric_value(&m, "gostw_agent_processes_traced"))
                .is_some_and(|v| v == n)
        };
        while !traced(1.0) {
            if t0.elapsed() > Duration::from_secs(10) {
                bail!("a new Go process was not traced within 10 s");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        latencies.push(t0.elapsed());
        drop(probe);
        while !traced(0.0) {
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
    let started = Instant::now();
    step(&format!(
        "soak for {} min: Go processes start and exit while the agent runs (pid {agent_pid})",
        opts.minutes
    ));
    let total = Duration::from_secs_f64(opts.minutes * 60.0);
    let mut workloads = Children::default();
    let mut started_count = 0u64;
    let mut samples: Vec<(f64, u64)> = Vec::new();
    let ticks = clock_ticks();
    let mut last_cpu = (Instant::now(), cpu_ticks(agent_pid)?);
    let mut next_sample = Instant::now();
    println!(
        "{:>7} {:>9} {:>7} {:>9} {:>7} {:>6} {:>9}",
        "t(s)", "rss(KiB)", "cpu%", "started", "traced", "exes", "lost"
    );
    while started.elapsed() < total {
        workloads
            .0
            .retain_mut(|c| c.try_wait().ok().flatten().is_none());
        while workloads.0.len() < opts.concurrent {
            let bin = &bins[(started_count % 2) as usize];
            // 1-4 s lives, so processes and executables come and go often.
            let secs = 1 + started_count % 4;
            workloads.0.push(
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
            );
            started_count += 1;
        }
        if Instant::now() >= next_sample {
            let rss = rss_kib(agent_pid)?;
            let cpu = cpu_ticks(agent_pid)?;
            let now = Instant::now();
            let pct = (cpu - last_cpu.1) as f64
                / ticks as f64
                / now.duration_since(last_cpu.0).as_secs_f64()
                * 100.0;
            last_cpu = (now, cpu);
            let m = metrics(port).unwrap_or_default();
            let get = |name: &str| metric_value(&m, name).unwrap_or(f64::NAN);
            let t = started.elapsed().as_secs_f64();
            println!(
                "{t:>7.0} {rss:>9} {pct:>7.2} {started_count:>9} {:>7} {:>6} {:>9}",
                get("gostw_agent_processes_traced"),
                get("gostw_agent_executables_attached"),
                sum_metric(&m, "gostw_agent_events_lost_total"),
            );
            samples.push((t, rss));
            next_sample = now + Duration::from_secs(opts.sample_secs);
        }
        if agent.0[0].try_wait()?.is_some() {
            bail!("the agent exited during the soak");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(workloads);
    let cpu_total = cpu_ticks(agent_pid)? as f64 / ticks as f64;
    println!(
        "\n{started_count} Go processes started; agent CPU {cpu_total:.1} s in {:.0} s ({:.2}% of one core)",
        started.elapsed().as_secs_f64(),
        cpu_total / started.elapsed().as_secs_f64() * 100.0
    );
    println!("{}", verdict(&samples));
    Ok(())
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

/// `s` with the regular expression metacharacters escaped.
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
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
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body.split_once("\r\n\r\n")?.1.to_owned())
}

fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

fn sum_metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
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
