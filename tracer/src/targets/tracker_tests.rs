//! Unit tests of the tracker, with a kernel that records what it was asked.
use std::path::PathBuf;

use super::*;
use crate::sink::{
    Sink as _,
    metrics::{Metrics, MetricsSink},
};

/// Records what the tracker asked of the kernel.
#[derive(Default)]
pub struct FakeKernel {
    pub attaches: Vec<PathBuf>,
    pub detaches: Vec<u32>,
    pub traced: HashSet<u32>,
    pub untraced: Vec<u32>,
    pub entries: HashMap<u32, u64>,
    pub samples: HashMap<u32, CpuSamples>,
    pub next_probe: u32,
    pub fail_trace: bool,
    /// Attaches still to fail transiently.
    pub transient_failures: u32,
}

impl Kernel for FakeKernel {
    type Probes = u32;
    fn attach(&mut self, _pid: u32, path: &Path) -> Result<Attached<u32>, AttachError> {
        self.attaches.push(path.to_owned());
        let name = path.to_string_lossy();
        if name.contains("bash") {
            return Err(AttachError::NotGo);
        }
        if name.contains("stripped") {
            return Err(AttachError::Failed {
                reason: FailureReason::Analysis,
                message: "runtime.stopTheWorldWithSema not found".into(),
            });
        }
        if self.transient_failures > 0 {
            self.transient_failures -= 1;
            return Err(AttachError::Transient {
                reason: FailureReason::Attach,
                message: "perf_event_open failed: EMFILE".into(),
            });
        }
        if name.contains("gone") {
            return Err(AttachError::Failed {
                reason: FailureReason::ProcessGone,
                message: "exited".into(),
            });
        }
        self.next_probe += 1;
        Ok(Attached {
            probes: self.next_probe,
            traced: TracedProcess::default(),
            go_version: "go1.26.6".into(),
            build_id: "b1".into(),
            image: None,
        })
    }
    fn detach(&mut self, probes: u32) {
        self.detaches.push(probes);
    }
    fn trace(&mut self, pid: u32, _: &TracedProcess) -> anyhow::Result<()> {
        if self.fail_trace {
            anyhow::bail!("map full");
        }
        self.traced.insert(pid);
        Ok(())
    }
    fn untrace(&mut self, pid: u32) {
        self.traced.remove(&pid);
        self.untraced.push(pid);
    }
    fn probe_hits(&mut self, pid: u32, probe: Probe) -> u64 {
        let samples = self.samples.get(&pid).copied().unwrap_or_default();
        match probe {
            Probe::StopTheWorld => self.entries.get(&pid).copied().unwrap_or(0),
            Probe::CpuSample => samples.all,
            Probe::StackCopySample => samples.stack_growth,
            _ => 0,
        }
    }
    fn sample_hz(&self) -> u64 {
        100
    }
}

fn proc(pid: u32, ino: u64, path: &str) -> NewProcess {
    NewProcess {
        pid,
        exe: ExeId { dev: 1, ino },
        exe_path: PathBuf::from(path),
        comm: String::new(),
        cgroup: "0::/\n".into(),
        names: None,
    }
}

fn start(t: &mut Tracker<FakeKernel>, p: &NewProcess, m: &mut MetricsSink) {
    let mut out = Vec::new();
    let _ = t.started(p, &p.exe_path.clone(), &mut out);
    m.observe_all(&out);
}

fn exit(t: &mut Tracker<FakeKernel>, pid: u32, m: &mut MetricsSink) {
    let mut out = Vec::new();
    t.exited(pid, &mut out);
    m.observe_all(&out);
}

fn poll(t: &mut Tracker<FakeKernel>, m: &mut MetricsSink) {
    let mut out = Vec::new();
    t.poll_counts(&mut out);
    m.observe_all(&out);
}

fn failures(m: &MetricsSink, reason: &str) -> bool {
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, m.registry()).unwrap();
    s.contains(&format!(
        "gostw_agent_attach_failures_total{{reason=\"{reason}\"}} 1\n"
    ))
}

#[test]
fn one_attach_per_executable_detach_after_last_exit() {
    let mut m = MetricsSink::new(Arc::new(Metrics::new()));
    let mut t = Tracker::new(FakeKernel::default(), Limits::default());
    start(&mut t, &proc(10, 1, "/srv/api"), &mut m);
    start(&mut t, &proc(11, 1, "/srv/api"), &mut m);
    start(&mut t, &proc(12, 2, "/srv/worker"), &mut m);
    assert_eq!(t.kernel.attaches.len(), 2);
    assert_eq!((t.processes(), t.executables()), (3, 2));
    assert_eq!(m.processes_traced.get(), 3);
    exit(&mut t, 10, &mut m);
    assert!(t.kernel.detaches.is_empty());
    assert_eq!(m.live_label_sets(), 2);
    exit(&mut t, 11, &mut m);
    assert_eq!(t.kernel.detaches, [1]);
    assert_eq!(m.live_label_sets(), 1);
    assert_eq!(t.kernel.traced, HashSet::from([12]));
    assert_eq!(m.executables_attached.get(), 1);
    // Unknown pids are ignored.
    exit(&mut t, 99, &mut m);
    let mut out = Vec::new();
    t.shutdown(&mut out);
    m.observe_all(&out);
    assert_eq!((t.processes(), t.executables()), (0, 0));
    assert_eq!(t.kernel.detaches, [1, 2]);
    assert_eq!(m.live_label_sets(), 0);
}

#[test]
fn non_go_and_failed_binaries_are_read_once() {
    let mut m = MetricsSink::new(Arc::new(Metrics::new()));
    let mut t = Tracker::new(FakeKernel::default(), Limits::default());
    for pid in 1..5 {
        start(&mut t, &proc(pid, 7, "/bin/bash"), &mut m);
        start(&mut t, &proc(100 + pid, 8, "/srv/stripped"), &mut m);
    }
    assert_eq!(t.kernel.attaches.len(), 2);
    assert!(failures(&m, "analysis"));
    assert_eq!(t.processes(), 0);
}

#[test]
fn a_process_gone_during_attach_is_retried_with_the_next() {
    let mut m = MetricsSink::new(Arc::new(Metrics::new()));
    let mut t = Tracker::new(FakeKernel::default(), Limits::default());
    start(&mut t, &proc(1, 7, "/srv/gone"), &mut m);
    start(&mut t, &proc(2, 7, "/srv/gone"), &mut m);
    assert_eq!(t.kernel.attaches.len(), 2);
    assert!(!failures(&m, "process_gone"), "counted twice");
}

#[test]
fn limits_bound_executables_and_label_sets() {
    let mut m = MetricsSink::new(Arc::new(Metrics::new()));
    let limits = Limits {
        max_executables: 2,
        max_label_sets: 2,
        max_rejected: 4,
    };
    let mut t = Tracker::new(FakeKernel::default(), limits);
    start(&mut t, &proc(1, 1, "/a"), &mut m);
    start(&mut t, &proc(2, 2, "/b"), &mut m);
    start(&mut t, &proc(3, 3, "/c"), &mut m);
    assert_eq!(t.executables(), 2);
    assert!(failures(&m, "limit"));
    // Same executable, another container: over the label-set limit.
    let mut other = proc(4, 1, "/a");
    other.cgroup = "0::/system.slice/x.service\n".into();
    start(&mut t, &other, &mut m);
    assert_eq!(t.labels(4).unwrap().container, OVERFLOW);
    assert_eq!(m.label_sets_overflowed.get(), 1);
    // A slot frees up: the next process of /c attaches.
    exit(&mut t, 2, &mut m);
    start(&mut t, &proc(5, 3, "/c"), &mut m);
    assert_eq!(t.executables(), 2);
    assert!(t.labels(5).is_some());
}

#[test]
fn trace_failure_detaches_an_unused_executable() {
    let mut m = MetricsSink::new(Arc::new(Metrics::new()));
    let mut t = Tracker::new(
        FakeKernel {
            fail_trace: true,
            ..Default::default()
        },
        Limits::default(),
    );
    start(&mut t, &proc(1, 1, "/a"), &mut m);
    assert_eq!((t.processes(), t.executables()), (0, 0));
    assert_eq!(t.kernel.detaches, [1]);
    assert!(failures(&m, "trace"));
}

#[test]
fn stop_the_world_entries_are_counted_as_deltas_including_at_exit() {
    let mut m = MetricsSink::new(Arc::new(Metrics::new()));
    let mut t = Tracker::new(FakeKernel::default(), Limits::default());
    start(&mut t, &proc(1, 1, "/a"), &mut m);
    start(&mut t, &proc(2, 1, "/a"), &mut m);
    t.kernel.entries.insert(1, 5);
    poll(&mut t, &mut m);
    t.kernel.entries.insert(1, 7);
    poll(&mut t, &mut m);
    t.kernel.entries.insert(1, 9);
    exit(&mut t, 1, &mut m);
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, m.registry()).unwrap();
    assert!(
        s.contains(r#"gostw_stop_the_world_entries_total{executable="a",go_version="go1.26.6",build_id="b1",container="",namespace="",pod=""} 9"#),
        "{s}"
    );
    assert_eq!(t.kernel.untraced, [1]);
}

#[test]
fn cpu_samples_are_counted_as_deltas_including_at_exit() {
    let mut m = MetricsSink::new(Arc::new(Metrics::new()));
    let mut t = Tracker::new(FakeKernel::default(), Limits::default());
    start(&mut t, &proc(1, 1, "/a"), &mut m);
    start(&mut t, &proc(2, 1, "/a"), &mut m);
    let samples = |all, stack_growth| CpuSamples { all, stack_growth };
    t.kernel.samples.insert(1, samples(100, 10));
    t.kernel.samples.insert(2, samples(50, 0));
    poll(&mut t, &mut m);
    t.kernel.samples.insert(1, samples(300, 40));
    poll(&mut t, &mut m);
    t.kernel.samples.insert(1, samples(400, 60));
    exit(&mut t, 1, &mut m);
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, m.registry()).unwrap();
    let l =
        r#"executable="a",go_version="go1.26.6",build_id="b1",container="",namespace="",pod="""#;
    for want in [
        format!("gostw_cpu_samples_total{{{l}}} 450\n"),
        format!("gostw_stack_growth_samples_total{{{l}}} 60\n"),
    ] {
        assert!(s.contains(&want), "missing {want} in\n{s}");
    }
    // 60 samples at 100 Hz.
    let seconds: f64 = s
        .lines()
        .find_map(|line| {
            line.strip_prefix("gostw_stack_growth_cpu_seconds_total{")?
                .split(' ')
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap();
    assert!((seconds - 0.6).abs() < 1e-9, "{seconds}");
}

#[test]
fn transient_attach_failures_are_retried_then_rejected() {
    let mut m = MetricsSink::new(Arc::new(Metrics::new()));
    let mut t = Tracker::new(
        FakeKernel {
            transient_failures: 2,
            ..FakeKernel::default()
        },
        Limits::default(),
    );
    // Two failures, then the third attempt in place attaches.
    start(&mut t, &proc(10, 1, "/srv/api"), &mut m);
    assert_eq!(t.kernel.attaches.len(), 3);
    assert_eq!(t.processes(), 1);
    // One that never passes: three processes try, each three times, then
    // the executable is rejected and a fourth is not tried.
    t.kernel.transient_failures = u32::MAX;
    for pid in 20..23 {
        let mut out = Vec::new();
        let r = t.started(
            &proc(pid, 2, "/srv/worker"),
            Path::new("/srv/worker"),
            &mut out,
        );
        assert!(
            matches!(r, Err(NotTraced::Failed(FailureReason::Attach, _))),
            "{r:?}"
        );
    }
    assert_eq!(t.kernel.attaches.len(), 3 + 9);
    let mut out = Vec::new();
    let r = t.started(
        &proc(23, 2, "/srv/worker"),
        Path::new("/srv/worker"),
        &mut out,
    );
    assert_eq!(r, Err(NotTraced::Rejected));
    assert_eq!(t.kernel.attaches.len(), 12);
}

#[test]
fn only_errnos_that_pass_are_transient() {
    let io =
        |n| anyhow::Error::new(std::io::Error::from_raw_os_error(n)).context("perf_event_open");
    assert!(is_transient(&io(libc::EMFILE)));
    assert!(is_transient(&io(libc::EBUSY)));
    assert!(!is_transient(&io(libc::EINVAL)));
    assert!(!is_transient(&io(libc::EPERM)));
    assert!(!is_transient(&anyhow::anyhow!("no such function")));
}
