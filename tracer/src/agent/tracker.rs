//! Which executables have probes and which processes are traced. Probes are
//! attached once per executable (shared by all its processes) and detached
//! when its last process exits; binaries that are not Go are remembered so
//! they are read once; failures are counted and logged once per executable.
//! The kernel side is behind `Kernel`, so this logic runs in unit tests.

use std::{
    collections::{HashMap, HashSet},
    path::Path,
};

use tracer_common::process::TracedProcess;

use super::{
    discovery::{ExeId, NewProcess},
    labels::{self, OVERFLOW, ProcessLabels},
    metrics::{FailureReason, Metrics},
    observe::CpuSamples,
};

/// What analysing and attaching an executable gave.
pub struct Attached<P> {
    /// The probes, to detach later.
    pub probes: P,
    /// What the kernel needs per traced process of this executable.
    pub traced: TracedProcess,
    /// e.g. "go1.22.10".
    pub go_version: String,
    pub build_id: String,
}

/// Why an executable could not be attached.
#[derive(Debug)]
pub enum AttachError {
    /// Not a Go program: nothing to trace, nothing to report.
    NotGo,
    /// Anything else: counted under `reason`, logged once.
    Failed {
        reason: FailureReason,
        message: String,
    },
}

/// The kernel side of tracing.
pub trait Kernel {
    /// Handle of the probes attached to one executable.
    type Probes;
    /// Analyse the executable of `pid` (reachable at `path`) and attach the
    /// probes to it.
    fn attach(&mut self, pid: u32, path: &Path) -> Result<Attached<Self::Probes>, AttachError>;
    fn detach(&mut self, probes: Self::Probes);
    /// Add `pid` to the traced set.
    fn trace(&mut self, pid: u32, traced: &TracedProcess) -> anyhow::Result<()>;
    /// Remove `pid` and its kernel state (it exited).
    fn untrace(&mut self, pid: u32);
    /// `stopTheWorldWithSema` entries of `pid` so far.
    fn stop_the_world_entries(&mut self, pid: u32) -> u64;
    /// CPU samples of `pid` so far (the stack growth sampler's).
    fn cpu_samples(&mut self, pid: u32) -> CpuSamples;
    /// Samples per second per CPU of the stack growth sampler.
    fn sample_hz(&self) -> u64;
}

struct Executable<P> {
    probes: P,
    traced: TracedProcess,
    go_version: String,
    build_id: String,
    pids: HashSet<u32>,
}

struct Process {
    exe: ExeId,
    labels: ProcessLabels,
    /// Last `stopTheWorldWithSema` entry count read from the kernel.
    stw_entries: u64,
    /// Last CPU sample counts read from the kernel.
    samples: CpuSamples,
}

/// Limits that keep the agent's memory and the series count bounded.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Executables with probes at once.
    pub max_executables: usize,
    /// Distinct label sets (executable x container) at once; beyond it the
    /// container label becomes `_overflow`.
    pub max_label_sets: usize,
    /// Executables remembered as "not Go" or "failed" (forgotten in bulk
    /// past this, so a host that runs many binaries stays bounded).
    pub max_rejected: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_executables: 64,
            max_label_sets: 512,
            max_rejected: 4096,
        }
    }
}

/// Executables, processes, and the series they own.
pub struct Tracker<K: Kernel> {
    kernel: K,
    limits: Limits,
    executables: HashMap<ExeId, Executable<K::Probes>>,
    processes: HashMap<u32, Process>,
    /// Live processes per label set (series are removed at zero).
    label_sets: HashMap<ProcessLabels, usize>,
    /// Executables not to look at again: not Go, or failed for good.
    rejected: HashSet<ExeId>,
    /// Executables whose limit failure was logged already.
    limit_logged: HashSet<ExeId>,
}

impl<K: Kernel> Tracker<K> {
    pub fn new(kernel: K, limits: Limits) -> Tracker<K> {
        Tracker {
            kernel,
            limits,
            executables: HashMap::new(),
            processes: HashMap::new(),
            label_sets: HashMap::new(),
            rejected: HashSet::new(),
            limit_logged: HashSet::new(),
        }
    }

    pub fn kernel(&mut self) -> &mut K {
        &mut self.kernel
    }

    pub fn processes(&self) -> usize {
        self.processes.len()
    }

    pub fn executables(&self) -> usize {
        self.executables.len()
    }

    /// Labels of a traced process.
    pub fn labels(&self, pid: u32) -> Option<&ProcessLabels> {
        self.processes.get(&pid).map(|p| &p.labels)
    }

    /// A process appeared: attach its executable if needed, then trace it.
    pub fn started(&mut self, p: &NewProcess, path: &Path, metrics: &Metrics) {
        if self.rejected.contains(&p.exe) || self.processes.contains_key(&p.pid) {
            return;
        }
        if !self.executables.contains_key(&p.exe) {
            if self.executables.len() >= self.limits.max_executables {
                metrics.attach_failure(FailureReason::Limit);
                if self.limit_logged.len() < self.limits.max_rejected
                    && self.limit_logged.insert(p.exe)
                {
                    log::warn!(
                        "not tracing {} (pid {}): --max-executables {} reached",
                        p.exe_path.display(),
                        p.pid,
                        self.limits.max_executables
                    );
                }
                return;
            }
            match self.kernel.attach(p.pid, path) {
                Ok(a) => {
                    log::info!(
                        "attached to {} ({}, build id {}) via pid {}",
                        p.exe_path.display(),
                        a.go_version,
                        a.build_id,
                        p.pid
                    );
                    self.executables.insert(
                        p.exe,
                        Executable {
                            probes: a.probes,
                            traced: a.traced,
                            go_version: a.go_version,
                            build_id: a.build_id,
                            pids: HashSet::new(),
                        },
                    );
                }
                Err(AttachError::NotGo) => {
                    self.reject(p.exe);
                    return;
                }
                Err(AttachError::Failed {
                    reason: FailureReason::ProcessGone,
                    ..
                }) => {
                    // Not the executable's fault: the next process of it is tried.
                    metrics.attach_failure(FailureReason::ProcessGone);
                    return;
                }
                Err(AttachError::Failed { reason, message }) => {
                    log::warn!(
                        "cannot trace Go program {} (pid {}): {message}; it will not be tried again",
                        p.exe_path.display(),
                        p.pid
                    );
                    metrics.attach_failure(reason);
                    self.reject(p.exe);
                    return;
                }
            }
        }
        let exe = self.executables.get_mut(&p.exe).expect("attached above");
        if let Err(e) = self.kernel.trace(p.pid, &exe.traced) {
            log::warn!("cannot trace pid {}: {e:#}", p.pid);
            metrics.attach_failure(FailureReason::Trace);
            if exe.pids.is_empty() {
                self.detach(p.exe, metrics);
            }
            return;
        }
        exe.pids.insert(p.pid);
        let mut labels = ProcessLabels {
            executable: labels::executable_name(&p.exe_path),
            go_version: exe.go_version.clone(),
            build_id: exe.build_id.clone(),
            container: labels::container(&p.cgroup),
        };
        if !self.label_sets.contains_key(&labels)
            && self.label_sets.len() >= self.limits.max_label_sets
        {
            labels.container = OVERFLOW.to_owned();
            metrics.label_sets_overflowed.inc();
        }
        *self.label_sets.entry(labels.clone()).or_default() += 1;
        metrics.process_started(&labels);
        self.processes.insert(
            p.pid,
            Process {
                exe: p.exe,
                labels,
                stw_entries: 0,
                samples: CpuSamples::default(),
            },
        );
        self.update_gauges(metrics);
    }

    /// A traced process exited: untrace it, drop its series if it was the
    /// last of its label set, detach its executable if it was the last.
    pub fn exited(&mut self, pid: u32, metrics: &Metrics) {
        let Some(mut proc) = self.processes.remove(&pid) else {
            return;
        };
        // Pauses and samples counted between the last poll and the exit.
        Self::read_entries(&mut self.kernel, pid, &mut proc, metrics);
        self.kernel.untrace(pid);
        metrics.process_exited(&proc.labels);
        if let Some(n) = self.label_sets.get_mut(&proc.labels) {
            *n -= 1;
            if *n == 0 {
                self.label_sets.remove(&proc.labels);
                metrics.remove(&proc.labels);
            }
        }
        if let Some(exe) = self.executables.get_mut(&proc.exe) {
            exe.pids.remove(&pid);
            if exe.pids.is_empty() {
                self.detach(proc.exe, metrics);
            }
        }
        self.update_gauges(metrics);
    }

    /// Read the kernel's per-process counts into the metrics.
    pub fn poll_counts(&mut self, metrics: &Metrics) {
        for (&pid, proc) in &mut self.processes {
            Self::read_entries(&mut self.kernel, pid, proc, metrics);
        }
    }

    /// Detach everything (shutdown).
    pub fn shutdown(&mut self, metrics: &Metrics) {
        let pids: Vec<u32> = self.processes.keys().copied().collect();
        for pid in pids {
            self.exited(pid, metrics);
        }
    }

    fn read_entries(kernel: &mut K, pid: u32, proc: &mut Process, metrics: &Metrics) {
        let now = kernel.stop_the_world_entries(pid);
        if now > proc.stw_entries {
            metrics.stop_the_world_entries(&proc.labels, now - proc.stw_entries);
            proc.stw_entries = now;
        }
        let now = kernel.cpu_samples(pid);
        let new = CpuSamples {
            all: now.all.saturating_sub(proc.samples.all),
            stack_growth: now.stack_growth.saturating_sub(proc.samples.stack_growth),
        };
        if new != CpuSamples::default() {
            metrics.cpu_samples(&proc.labels, new, kernel.sample_hz());
            proc.samples = CpuSamples {
                all: now.all.max(proc.samples.all),
                stack_growth: now.stack_growth.max(proc.samples.stack_growth),
            };
        }
    }

    fn detach(&mut self, exe: ExeId, metrics: &Metrics) {
        if let Some(e) = self.executables.remove(&exe) {
            self.kernel.detach(e.probes);
            self.limit_logged.clear();
        }
        self.update_gauges(metrics);
    }

    fn reject(&mut self, exe: ExeId) {
        if self.rejected.len() >= self.limits.max_rejected {
            // Forget them all: at worst each is read once more.
            self.rejected.clear();
        }
        self.rejected.insert(exe);
    }

    fn update_gauges(&self, metrics: &Metrics) {
        metrics.processes_traced.set(self.processes.len() as i64);
        metrics
            .executables_attached
            .set(self.executables.len() as i64);
    }
}

#[cfg(test)]
pub mod tests {
    use std::path::PathBuf;

    use super::*;

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
        fn stop_the_world_entries(&mut self, pid: u32) -> u64 {
            self.entries.get(&pid).copied().unwrap_or(0)
        }
        fn cpu_samples(&mut self, pid: u32) -> CpuSamples {
            self.samples.get(&pid).copied().unwrap_or_default()
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
        }
    }

    fn start(t: &mut Tracker<FakeKernel>, p: &NewProcess, m: &Metrics) {
        t.started(p, &p.exe_path.clone(), m);
    }

    fn failures(m: &Metrics, reason: &str) -> bool {
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, m.registry()).unwrap();
        s.contains(&format!(
            "gostw_agent_attach_failures_total{{reason=\"{reason}\"}} 1\n"
        ))
    }

    #[test]
    fn one_attach_per_executable_detach_after_last_exit() {
        let m = Metrics::new();
        let mut t = Tracker::new(FakeKernel::default(), Limits::default());
        start(&mut t, &proc(10, 1, "/srv/api"), &m);
        start(&mut t, &proc(11, 1, "/srv/api"), &m);
        start(&mut t, &proc(12, 2, "/srv/worker"), &m);
        assert_eq!(t.kernel.attaches.len(), 2);
        assert_eq!((t.processes(), t.executables()), (3, 2));
        assert_eq!(m.processes_traced.get(), 3);
        t.exited(10, &m);
        assert!(t.kernel.detaches.is_empty());
        assert_eq!(m.live_label_sets(), 2);
        t.exited(11, &m);
        assert_eq!(t.kernel.detaches, [1]);
        assert_eq!(m.live_label_sets(), 1);
        assert_eq!(t.kernel.traced, HashSet::from([12]));
        assert_eq!(m.executables_attached.get(), 1);
        // Unknown pids are ignored.
        t.exited(99, &m);
        t.shutdown(&m);
        assert_eq!((t.processes(), t.executables()), (0, 0));
        assert_eq!(t.kernel.detaches, [1, 2]);
        assert_eq!(m.live_label_sets(), 0);
    }

    #[test]
    fn non_go_and_failed_binaries_are_read_once() {
        let m = Metrics::new();
        let mut t = Tracker::new(FakeKernel::default(), Limits::default());
        for pid in 1..5 {
            start(&mut t, &proc(pid, 7, "/bin/bash"), &m);
            start(&mut t, &proc(100 + pid, 8, "/srv/stripped"), &m);
        }
        assert_eq!(t.kernel.attaches.len(), 2);
        assert!(failures(&m, "analysis"));
        assert_eq!(t.processes(), 0);
    }

    #[test]
    fn a_process_gone_during_attach_is_retried_with_the_next() {
        let m = Metrics::new();
        let mut t = Tracker::new(FakeKernel::default(), Limits::default());
        start(&mut t, &proc(1, 7, "/srv/gone"), &m);
        start(&mut t, &proc(2, 7, "/srv/gone"), &m);
        assert_eq!(t.kernel.attaches.len(), 2);
        assert!(!failures(&m, "process_gone"), "counted twice");
    }

    #[test]
    fn limits_bound_executables_and_label_sets() {
        let m = Metrics::new();
        let limits = Limits {
            max_executables: 2,
            max_label_sets: 2,
            max_rejected: 4,
        };
        let mut t = Tracker::new(FakeKernel::default(), limits);
        start(&mut t, &proc(1, 1, "/a"), &m);
        start(&mut t, &proc(2, 2, "/b"), &m);
        start(&mut t, &proc(3, 3, "/c"), &m);
        assert_eq!(t.executables(), 2);
        assert!(failures(&m, "limit"));
        // Same executable, another container: over the label-set limit.
        let mut other = proc(4, 1, "/a");
        other.cgroup = "0::/system.slice/x.service\n".into();
        start(&mut t, &other, &m);
        assert_eq!(t.labels(4).unwrap().container, OVERFLOW);
        assert_eq!(m.label_sets_overflowed.get(), 1);
        // A slot frees up: the next process of /c attaches.
        t.exited(2, &m);
        start(&mut t, &proc(5, 3, "/c"), &m);
        assert_eq!(t.executables(), 2);
        assert!(t.labels(5).is_some());
    }

    #[test]
    fn trace_failure_detaches_an_unused_executable() {
        let m = Metrics::new();
        let mut t = Tracker::new(
            FakeKernel {
                fail_trace: true,
                ..Default::default()
            },
            Limits::default(),
        );
        start(&mut t, &proc(1, 1, "/a"), &m);
        assert_eq!((t.processes(), t.executables()), (0, 0));
        assert_eq!(t.kernel.detaches, [1]);
        assert!(failures(&m, "trace"));
    }

    #[test]
    fn stop_the_world_entries_are_counted_as_deltas_including_at_exit() {
        let m = Metrics::new();
        let mut t = Tracker::new(FakeKernel::default(), Limits::default());
        start(&mut t, &proc(1, 1, "/a"), &m);
        start(&mut t, &proc(2, 1, "/a"), &m);
        t.kernel.entries.insert(1, 5);
        t.poll_counts(&m);
        t.kernel.entries.insert(1, 7);
        t.poll_counts(&m);
        t.kernel.entries.insert(1, 9);
        t.exited(1, &m);
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, m.registry()).unwrap();
        assert!(
            s.contains(r#"gostw_stop_the_world_entries_total{executable="a",go_version="go1.26.6",build_id="b1",container=""} 9"#),
            "{s}"
        );
        assert_eq!(t.kernel.untraced, [1]);
    }

    #[test]
    fn cpu_samples_are_counted_as_deltas_including_at_exit() {
        let m = Metrics::new();
        let mut t = Tracker::new(FakeKernel::default(), Limits::default());
        start(&mut t, &proc(1, 1, "/a"), &m);
        start(&mut t, &proc(2, 1, "/a"), &m);
        let samples = |all, stack_growth| CpuSamples { all, stack_growth };
        t.kernel.samples.insert(1, samples(100, 10));
        t.kernel.samples.insert(2, samples(50, 0));
        t.poll_counts(&m);
        t.kernel.samples.insert(1, samples(300, 40));
        t.poll_counts(&m);
        t.kernel.samples.insert(1, samples(400, 60));
        t.exited(1, &m);
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, m.registry()).unwrap();
        let l = r#"executable="a",go_version="go1.26.6",build_id="b1",container="""#;
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
}
