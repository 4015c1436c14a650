//! `cargo xtask bench storm`: what gostw keeps under a page-out storm. Several
//! gcswap processes (128 MiB live each) are pushed to swap before each of
//! their GCs, all at once, beside a pause storm (the stw workload collecting
//! every few milliseconds); first `gostw attach` traces one gcswap, then
//! `gostw agent` traces them all. Printed per run: the major faults per
//! second the storm made, how many fault events were sent and shed, and the
//! pauses reported against the kernel's count of stops and against what Go
//! itself counted (two per GC the workload asked for).

use std::{
    io::{BufReader, Read as _},
    path::Path,
    process::{ChildStdin, ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use gostw_scenario::{GcSwapControl, MemCgroup, SwapFile, majflt, swap_out};

use crate::{
    cmd::{Reaped, step},
    demo, go, setup,
};

/// gcswap's arguments: twice the page-out scenario's heap per process.
const GCSWAP_ARGS: &[&str] = &["-live-mb", "128", "-goroutines", "4000", "-walkers", "8"];
const PORT: u16 = 19477;

struct GcSwap {
    pid: u32,
    control: GcSwapControl<BufReader<ChildStdout>, ChildStdin>,
    _child: Reaped,
}

impl GcSwap {
    fn start(path: &Path, cgroup: &MemCgroup) -> anyhow::Result<GcSwap> {
        let mut child = Command::new(path)
            .args(GCSWAP_ARGS)
            .env("GOMAXPROCS", "8")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting gcswap")?;
        let pid = child.id();
        cgroup.add(pid)?;
        let mut control = GcSwapControl::new(
            BufReader::new(child.stdout.take().context("gcswap's stdout")?),
            child.stdin.take().context("gcswap's stdin")?,
        );
        control.ready(&mut |_| {})?;
        Ok(GcSwap {
            pid,
            control,
            _child: Reaped(child),
        })
    }
}

/// What one storm run saw.
struct Storm {
    seconds: f64,
    majflt: u64,
    gcs: u64,
}

pub fn run(processes: u32, rounds: u32, version: &str) -> anyhow::Result<()> {
    let Some(toolchain) = go::toolchain(version) else {
        bail!("Go {version} is not in the matrix");
    };
    if !setup::is_root() {
        bail!("the storm needs root (eBPF, swap, cgroups): run `sudo -E cargo xtask bench storm`");
    }
    let gostw = crate::build::gostw(crate::arch::Arch::Amd64)?;
    let gcswap = demo::build_workload(toolchain, version, "gcswap")?;
    let stw = demo::build_stw_workload(toolchain, version)?;
    let _swap = SwapFile::create("bench-storm", 2).context("setting up swap")?;
    let cgroup = MemCgroup::create("gostw-bench-storm")?;

    step(&format!(
        "attach: {processes} gcswap paged out {rounds} times beside a pause storm; gostw traces one"
    ));
    let mut procs = start_all(&gcswap, &cgroup, processes)?;
    let pauses = pause_storm(&stw)?;
    let mut attach = Reaped(
        Command::new(&gostw)
            .args(["attach", "--json", "--pid", &procs[0].pid.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?,
    );
    std::thread::sleep(Duration::from_secs(2));
    let seen = storm(&mut procs, &cgroup, rounds)?;
    signal(attach.0.id(), libc::SIGINT);
    let mut out = String::new();
    attach
        .0
        .stdout
        .take()
        .context("gostw's stdout")?
        .read_to_string(&mut out)?;
    let summary: serde_json::Value = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["type"] == "summary")
        .context("no summary from gostw attach")?;
    let p = &summary["processes"][0];
    let f = &summary["faults"]["processes"][0];
    println!(
        "attach: storm {:.0} major faults/s ({} in {:.1} s, all processes); traced process: \
         {} faults counted ({} sent with stacks, {} shed); pauses {} reported, {} stops counted, \
         {} pauses lost; events lost {}",
        seen.majflt as f64 / seen.seconds,
        seen.majflt,
        seen.seconds,
        f["all"]["faults"],
        n(&f["in_pauses"]["faults"]) + n(&f["outside_pauses_sent"]),
        f["shed"],
        p["pauses"],
        p["stops_counted"],
        p["pauses_lost"],
        summary["lost"]["total"],
    );
    drop((procs, pauses));

    step(&format!(
        "agent: {processes} gcswap paged out {rounds} times beside a pause storm; the agent traces them all"
    ));
    let dir = std::env::temp_dir().join("gostw-bench-storm");
    std::fs::create_dir_all(&dir)?;
    let matching = format!(
        "^({}|{})$",
        gostw_scenario::regex_escape(&gcswap.canonicalize()?.display().to_string()),
        gostw_scenario::regex_escape(&stw.canonicalize()?.display().to_string())
    );
    let _agent = Reaped(
        Command::new(&gostw)
            .args(["agent", "--listen", &format!("127.0.0.1:{PORT}")])
            .args(["--match", &matching])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let mut procs = start_all(&gcswap, &cgroup, processes)?;
    let pauses = pause_storm(&stw)?;
    std::thread::sleep(Duration::from_secs(3));
    // The agent reads the kernel's stop counts once a second: each reading
    // is taken with the pause storm held (SIGSTOP) long enough for both
    // series to settle.
    let settled = || -> anyhow::Result<String> {
        signal(pauses.0.id(), libc::SIGSTOP);
        std::thread::sleep(Duration::from_secs(3));
        let m = metrics();
        signal(pauses.0.id(), libc::SIGCONT);
        m
    };
    let before = settled()?;
    let seen = storm(&mut procs, &cgroup, rounds)?;
    let after = settled()?;
    let delta = |name: &str, filter: &str| sum(&after, name, filter) - sum(&before, name, filter);
    let gcswap_exe = "executable=\"gcswap\"";
    println!(
        "agent: storm {:.0} major faults/s ({} in {:.1} s); gcswap: {} faults counted ({} shed); \
         gcswap pauses {} reported, {} stops counted, Go ran {} GCs (x2 = {}); all traced: {} \
         pauses reported, {} stops counted; events lost {}",
        seen.majflt as f64 / seen.seconds,
        seen.majflt,
        seen.seconds,
        delta("gostw_major_faults_total", gcswap_exe),
        delta("gostw_agent_bpf_errors_total", "counter=\"fault_shed\""),
        delta("gostw_pause_duration_seconds_count", gcswap_exe),
        delta("gostw_stop_the_world_entries_total", gcswap_exe),
        seen.gcs,
        2 * seen.gcs,
        delta("gostw_pause_duration_seconds_count", ""),
        delta("gostw_stop_the_world_entries_total", ""),
        delta("gostw_agent_events_lost_total", ""),
    );
    Ok(())
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

fn start_all(path: &Path, cgroup: &MemCgroup, n: u32) -> anyhow::Result<Vec<GcSwap>> {
    (0..n).map(|_| GcSwap::start(path, cgroup)).collect()
}

/// The stw workload collecting every few milliseconds until dropped.
fn pause_storm(stw: &Path) -> anyhow::Result<Reaped> {
    Ok(Reaped(
        Command::new(stw)
            .args(["-duration", "600s", "-gc", "0", "-readmemstats", "0"])
            .args(["-gomaxprocs", "0", "-live-mb", "4", "-alloc-mb", "32"])
            .stdout(Stdio::null())
            .spawn()
            .context("starting the pause storm")?,
    ))
}

/// Page every process out, then run a GC in each, `rounds` times.
fn storm(procs: &mut [GcSwap], cgroup: &MemCgroup, rounds: u32) -> anyhow::Result<Storm> {
    let base: u64 = procs.iter().map(|p| majflt(p.pid).unwrap_or(0)).sum();
    let started = Instant::now();
    for _ in 0..rounds {
        for p in procs.iter() {
            swap_out(p.pid, cgroup)?;
        }
        for p in procs.iter_mut() {
            p.control.gc(&mut |_| {})?;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let now: u64 = procs.iter().map(|p| majflt(p.pid).unwrap_or(0)).sum();
    Ok(Storm {
        seconds,
        majflt: now - base,
        gcs: u64::from(rounds) * procs.len() as u64,
    })
}

fn metrics() -> anyhow::Result<String> {
    gostw_scenario::loopback::http_get(PORT, "/metrics")
        .map(|(_, body)| body)
        .context("no answer from the agent's /metrics")
}

/// The sum of the series `name` whose labels contain `filter`.
fn sum(text: &str, name: &str, filter: &str) -> u64 {
    gostw_scenario::loopback::samples(text, name)
        .into_iter()
        .filter(|(labels, _)| labels.contains(filter))
        .map(|(_, v)| v)
        .sum::<f64>() as u64
}

fn n(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_series_by_label() {
        let t = "gostw_x_total{executable=\"gcswap\",a=\"1\"} 3\n\
                 gostw_x_total{executable=\"stw\"} 4\ngostw_x_totally 9\n";
        assert_eq!(sum(t, "gostw_x_total", "executable=\"gcswap\""), 3);
        assert_eq!(sum(t, "gostw_x_total", ""), 7);
    }
}
