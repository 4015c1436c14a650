//! Which executables have probes and which processes are traced. Probes are
//! attached once per executable (shared by all its processes) and detached
//! when its last process exits; binaries that are not Go are remembered so
//! they are read once; failures are counted and logged once per executable.
//! The kernel side is behind `Kernel`, so this logic runs in unit tests.

use std::{
    collections::{HashMap, HashSet},
    path::Path,
    sync::Arc,
    time::Duration,
};

use tracer_common::{
    fault::FaultCounts,
    process::{Probe, TracedProcess},
};

use super::discovery::NewProcess;
use crate::{
    image::{ExeId, ExecutableImage, ProcessImage},
    model::{
        labels::{self, OVERFLOW, ProcessLabels},
        observed::{CpuSamples, FailureReason, Observed, ProcessInfo},
    },
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
    /// The analysed executable (None only for test kernels).
    pub image: Option<Arc<ExecutableImage>>,
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
    /// A failure that may pass (the kernel was out of something for a
    /// moment: `is_transient`): retried, a bounded number of times.
    Transient {
        reason: FailureReason,
        message: String,
    },
}

/// Errnos of a kernel call that say "not now" rather than "never": busy,
/// interrupted, out of memory or of file descriptors for a moment (seen as
/// `perf_event_open` failures while processes exec in bursts).
const TRANSIENT_ERRNOS: [i32; 6] = [
    libc::EAGAIN,
    libc::EBUSY,
    libc::EINTR,
    libc::ENOMEM,
    libc::EMFILE,
    libc::ENFILE,
];

/// Whether `e` was caused by a kernel call that may succeed if tried again.
pub fn is_transient(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
            .is_some_and(|n| TRANSIENT_ERRNOS.contains(&n))
    })
}

/// Pauses before each new attempt of an attach that failed transiently.
const ATTACH_RETRY_DELAYS: [Duration; 2] = [Duration::from_millis(10), Duration::from_millis(50)];

/// Processes of one executable whose attach may fail transiently (each
/// after every retry of `ATTACH_RETRY_DELAYS`) before it is rejected.
const TRANSIENT_ROUNDS: u32 = 3;

/// Why a process is not traced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotTraced {
    NotGo,
    /// Its executable failed before and is not tried again.
    Rejected,
    Failed(FailureReason, String),
}

impl std::fmt::Display for NotTraced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotTraced::NotGo => f.write_str("not a Go program"),
            NotTraced::Rejected => f.write_str("its executable could not be traced before"),
            NotTraced::Failed(_, message) => f.write_str(message),
        }
    }
}

/// The kernel side of tracing (the real one is `kernel::Core`).
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
    /// How many times `probe` fired in `pid` so far.
    fn probe_hits(&mut self, pid: u32, probe: Probe) -> u64;
    /// Samples per second per CPU of the stack growth sampler.
    fn sample_hz(&self) -> u64;
    /// The major faults the kernel counted for `pid` so far (None: not
    /// counted, e.g. faults are not traced).
    fn fault_counts(&mut self, _pid: u32) -> Option<FaultCounts> {
        None
    }
    /// What else the kernel kept for `pid`, read just before it is untraced.
    fn collect_final(&mut self, _pid: u32, _out: &mut Vec<Observed>) {}
}

struct Executable<P> {
    probes: P,
    traced: TracedProcess,
    go_version: String,
    build_id: String,
    image: Option<Arc<ExecutableImage>>,
    pids: HashSet<u32>,
}

struct Process {
    exe: ExeId,
    info: Arc<ProcessInfo>,
    /// Last `stopTheWorldWithSema` entry count read from the kernel.
    stw_entries: u64,
    /// Last CPU sample counts read from the kernel.
    samples: CpuSamples,
    /// Last fault counts read from the kernel.
    faults: FaultCounts,
}

/// Limits that keep the agent's memory and the series count bounded.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Executables with probes at once.
    pub max_executables: usize,
    /// Distinct label sets (executable x container) at once; beyond it the
    /// container label becomes `_overflow` (and namespace and pod empty).
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
    /// Transient attach failures so far, per executable not yet attached.
    transient: HashMap<ExeId, u32>,
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
            transient: HashMap::new(),
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

    /// The traced processes.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.processes.keys().copied().collect();
        pids.sort_unstable();
        pids
    }

    /// What every traced process is.
    pub fn infos(&self) -> Vec<Arc<ProcessInfo>> {
        self.processes.values().map(|p| p.info.clone()).collect()
    }

    /// Resolve the load bias of every traced process not known yet (read
    /// from its memory map once it runs its executable), for the sinks that
    /// symbolize what the maps count: they never read `/proc` themselves.
    pub fn resolve_images(&self) {
        for p in self.processes.values() {
            if let Some(image) = &p.info.image {
                image.resolve();
            }
        }
    }

    /// Labels of a traced process.
    pub fn labels(&self, pid: u32) -> Option<&ProcessLabels> {
        self.processes.get(&pid).map(|p| &p.info.labels)
    }

    /// A process appeared: attach its executable if needed, then trace it.
    /// Returns why it is not traced, if it is not (a front end that traces
    /// one process reports it; the agent counts and logs).
    pub fn started(
        &mut self,
        p: &NewProcess,
        path: &Path,
        out: &mut Vec<Observed>,
    ) -> Result<(), NotTraced> {
        if self.processes.contains_key(&p.pid) {
            return Ok(());
        }
        if self.rejected.contains(&p.exe) {
            return Err(NotTraced::Rejected);
        }
        if !self.executables.contains_key(&p.exe) {
            if self.executables.len() >= self.limits.max_executables {
                out.push(Observed::AttachFailed(FailureReason::Limit));
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
                return Err(NotTraced::Failed(
                    FailureReason::Limit,
                    format!("--max-executables {} reached", self.limits.max_executables),
                ));
            }
            let mut attached = self.kernel.attach(p.pid, path);
            for delay in ATTACH_RETRY_DELAYS {
                if !matches!(attached, Err(AttachError::Transient { .. })) {
                    break;
                }
                std::thread::sleep(delay);
                attached = self.kernel.attach(p.pid, path);
            }
            match attached {
                Ok(a) => {
                    self.transient.remove(&p.exe);
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
                            image: a.image,
                            pids: HashSet::new(),
                        },
                    );
                }
                Err(AttachError::NotGo) => {
                    self.reject(p.exe);
                    return Err(NotTraced::NotGo);
                }
                Err(AttachError::Failed {
                    reason: FailureReason::ProcessGone,
                    message,
                }) => {
                    // Not the executable's fault: the next process of it is tried.
                    out.push(Observed::AttachFailed(FailureReason::ProcessGone));
                    return Err(NotTraced::Failed(FailureReason::ProcessGone, message));
                }
                Err(AttachError::Transient { reason, message }) => {
                    out.push(Observed::AttachFailed(reason));
                    if self.transient.len() >= self.limits.max_rejected {
                        self.transient.clear();
                    }
                    let rounds = self.transient.entry(p.exe).or_default();
                    *rounds += 1;
                    if *rounds >= TRANSIENT_ROUNDS {
                        log::warn!(
                            "cannot trace Go program {} (pid {}): {message}, {TRANSIENT_ROUNDS} times; \
                             it will not be tried again",
                            p.exe_path.display(),
                            p.pid
                        );
                        self.transient.remove(&p.exe);
                        self.reject(p.exe);
                    } else {
                        log::warn!(
                            "cannot trace Go program {} (pid {}) for now: {message}; \
                             its next process will be tried",
                            p.exe_path.display(),
                            p.pid
                        );
                    }
                    return Err(NotTraced::Failed(reason, message));
                }
                Err(AttachError::Failed { reason, message }) => {
                    log::warn!(
                        "cannot trace Go program {} (pid {}): {message}; it will not be tried again",
                        p.exe_path.display(),
                        p.pid
                    );
                    out.push(Observed::AttachFailed(reason));
                    self.reject(p.exe);
                    return Err(NotTraced::Failed(reason, message));
                }
            }
        }
        let exe = self.executables.get_mut(&p.exe).expect("attached above");
        if let Err(e) = self.kernel.trace(p.pid, &exe.traced) {
            // A process that exited meanwhile is not a failure to report.
            let reason = if crate::targets::process::is_gone(p.pid) {
                FailureReason::ProcessGone
            } else {
                log::warn!("cannot trace pid {}: {e:#}", p.pid);
                FailureReason::Trace
            };
            out.push(Observed::AttachFailed(reason));
            if exe.pids.is_empty() {
                self.detach(p.exe, out);
            }
            return Err(NotTraced::Failed(reason, format!("{e:#}")));
        }
        exe.pids.insert(p.pid);
        let mut labels = ProcessLabels {
            executable: labels::executable_name(&p.exe_path),
            go_version: exe.go_version.clone(),
            build_id: exe.build_id.clone(),
            container: labels::container(&p.cgroup),
            namespace: String::new(),
            pod: String::new(),
        };
        if let Some(names) = &p.names {
            labels.name(names);
        }
        if !self.label_sets.contains_key(&labels)
            && self.label_sets.len() >= self.limits.max_label_sets
        {
            labels.container = OVERFLOW.to_owned();
            labels.namespace.clear();
            labels.pod.clear();
            out.push(Observed::LabelsOverflowed);
        }
        *self.label_sets.entry(labels.clone()).or_default() += 1;
        let info = Arc::new(ProcessInfo {
            pid: p.pid,
            exe: p.exe_path.clone(),
            labels,
            go_version: exe.go_version.clone(),
            image: exe
                .image
                .clone()
                .map(|i| Arc::new(ProcessImage::new(p.pid, i))),
        });
        out.push(Observed::Started(info.clone()));
        self.processes.insert(
            p.pid,
            Process {
                exe: p.exe,
                info,
                stw_entries: 0,
                samples: CpuSamples::default(),
                faults: FaultCounts::default(),
            },
        );
        self.update_gauges(out);
        Ok(())
    }

    /// A traced process exited: untrace it, drop its series if it was the
    /// last of its label set, detach its executable if it was the last.
    pub fn exited(&mut self, pid: u32, out: &mut Vec<Observed>) {
        let Some(mut proc) = self.processes.remove(&pid) else {
            return;
        };
        // Pauses and samples counted between the last poll and the exit.
        Self::read_entries(&mut self.kernel, pid, &mut proc, out);
        self.kernel.collect_final(pid, out);
        self.kernel.untrace(pid);
        let mut last_of_labels = false;
        if let Some(n) = self.label_sets.get_mut(&proc.info.labels) {
            *n -= 1;
            if *n == 0 {
                self.label_sets.remove(&proc.info.labels);
                last_of_labels = true;
            }
        }
        out.push(Observed::Exited {
            pid,
            last_of_labels,
        });
        if let Some(exe) = self.executables.get_mut(&proc.exe) {
            exe.pids.remove(&pid);
            if exe.pids.is_empty() {
                self.detach(proc.exe, out);
            }
        }
        self.update_gauges(out);
    }

    /// Read the kernel's per-process counts into the metrics.
    pub fn poll_counts(&mut self, out: &mut Vec<Observed>) {
        for (&pid, proc) in &mut self.processes {
            Self::read_entries(&mut self.kernel, pid, proc, out);
        }
    }

    /// Detach everything (shutdown).
    pub fn shutdown(&mut self, out: &mut Vec<Observed>) {
        let pids: Vec<u32> = self.processes.keys().copied().collect();
        for pid in pids {
            self.exited(pid, out);
        }
    }

    fn read_entries(kernel: &mut K, pid: u32, proc: &mut Process, out: &mut Vec<Observed>) {
        if let Some(counts) = kernel.fault_counts(pid)
            && counts != proc.faults
        {
            proc.faults = counts;
            out.push(Observed::FaultCounts { pid, counts });
        }
        let entries = kernel.probe_hits(pid, Probe::StopTheWorld);
        let now = CpuSamples {
            all: kernel.probe_hits(pid, Probe::CpuSample),
            stack_growth: kernel.probe_hits(pid, Probe::StackCopySample),
        };
        let new = CpuSamples {
            all: now.all.saturating_sub(proc.samples.all),
            stack_growth: now.stack_growth.saturating_sub(proc.samples.stack_growth),
        };
        let new_entries = entries.saturating_sub(proc.stw_entries);
        if new_entries == 0 && new == CpuSamples::default() {
            return;
        }
        proc.stw_entries = proc.stw_entries.max(entries);
        proc.samples = CpuSamples {
            all: now.all.max(proc.samples.all),
            stack_growth: now.stack_growth.max(proc.samples.stack_growth),
        };
        out.push(Observed::Counts {
            pid,
            stop_the_world_entries: new_entries,
            samples: new,
            sample_hz: kernel.sample_hz(),
        });
    }

    fn detach(&mut self, exe: ExeId, out: &mut Vec<Observed>) {
        if let Some(e) = self.executables.remove(&exe) {
            self.kernel.detach(e.probes);
            self.limit_logged.clear();
        }
        self.update_gauges(out);
    }

    fn reject(&mut self, exe: ExeId) {
        if self.rejected.len() >= self.limits.max_rejected {
            // Forget them all: at worst each is read once more.
            self.rejected.clear();
        }
        self.rejected.insert(exe);
    }

    fn update_gauges(&self, out: &mut Vec<Observed>) {
        out.push(Observed::Traced {
            processes: self.processes.len(),
            executables: self.executables.len(),
        });
    }
}

#[cfg(test)]
#[path = "tracker_tests.rs"]
pub mod tests;
