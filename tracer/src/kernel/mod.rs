//! The tracing core: it owns the loaded kernel object and everything attached
//! to it. Probes are attached per executable (uprobes live on the inode),
//! processes are added to and removed from the traced set, and the host-wide
//! hooks (the fault backend, the CPU-clock sampler, the scheduler programs
//! that explain pauses) are attached while at least one process is traced
//! and detached when the last one goes, so a host with nothing traced runs
//! none of them.
//!
//! - `object`: the loaded object, typed program handles, maps.
//! - `capabilities`: the one detector of what the kernel supports.
//! - `compat`: program variants for kernels that lack newer helpers.
//! - `faults`: attaching and detaching a fault backend.
//! - `stacks`: the stack-growth programs (sampler, duty-cycled exact probe).
//! - `explain`: the per-process pause detail and the scheduler programs.

pub mod btf;
pub mod capabilities;
pub mod compat;
mod cpu_clock;
pub mod explain;
pub mod faults;
pub mod object;
mod pause_points;
pub mod retprobe;
pub mod stacks;
pub mod teardown;

use anyhow::Context as _;
use std::{
    collections::{HashMap, HashSet},
    path::Path,
    sync::Arc,
};

use aya::programs::{
    UProbe,
    uprobe::{UProbeLinkId, UProbeScope},
};
use tracer_common::{
    counters::Counter,
    fault::FaultCounts,
    process::{ExplainRuntime, Probe, TracedProcess},
    program_names::{STW_START_RET, STW_STOP, STW_STOPPED},
    stack::{StackSiteCounts, StackSiteKey},
};

use self::{
    capabilities::{BackendChoice, Capabilities, FaultSource},
    faults::FaultHooks,
    object::Object,
    pause_points::PausePoints,
    stacks::{StackGrowthOptions, StackGrowthProbes},
};
use crate::{
    binary::{BinaryError, GoBinary, STOP_THE_WORLD},
    image::{ExeId, ExecutableImage},
    model::{
        labels,
        observed::{FailureReason, Observed},
    },
    stackgrowth::Mode,
    targets::tracker::{AttachError, Attached, Kernel},
};

/// What to trace besides pauses.
#[derive(Clone, Copy, Debug, Default)]
pub struct CoreOptions {
    /// Major faults, from this source (None: not traced).
    pub faults: Option<FaultSource>,
    /// Stack growth, with these settings (None: not traced).
    pub stacks: Option<StackGrowthOptions>,
    /// Read Go's stopping phase where `stopTheWorldWithSema` records it
    /// (Go 1.22+). That probe fires inside the pause and adds its trap
    /// (0.8 us here) to it (docs/guide/attach-and-run.md, "Stopping phase").
    pub stopping: bool,
    /// Explain pauses: the caller of each stop (read at the entry probe),
    /// and, with the scheduler programs, the stopping thread's off-CPU time
    /// and the laggards.
    pub explain: bool,
    /// Begin faults at the `PAGE_FAULTS` perf event, as kernels without
    /// `exceptions:page_fault_*` (arm64) do, even where those exist: the
    /// kernel tests compare the two begins on x86.
    pub perf_fault_begin: bool,
}

/// The first Go version that times its stopping phase (and records it with
/// `timeHistogram.record` in `stopTheWorldWithSema`), as `GoVersion::code`.
pub const STOPPING_SINCE: u32 = 122;

/// Whether the fault backend is attached.
enum FaultState {
    /// Not asked for.
    Off,
    /// Asked for; attached with the first traced process.
    Idle,
    Attached(FaultHooks),
    /// The kernel refused it; pauses are still traced.
    Failed(String),
}

/// The uprobes of one executable.
pub struct ExeProbes {
    exe: ExeId,
    links: Vec<(&'static str, UProbeLinkId)>,
}

/// The loaded object and what is attached to it.
pub struct Core {
    object: Object,
    opts: CoreOptions,
    caps: Capabilities,
    faults: FaultState,
    /// The sampled stack-growth mode's per-CPU sampler, while anything is traced.
    sampler: Option<StackGrowthProbes>,
    /// The exact mode's copystack probe, per executable.
    exact: HashMap<ExeId, StackGrowthProbes>,
    /// The pause explanation's scheduler programs, while anything is traced.
    sched: Option<explain::SchedHooks>,
    /// Where `task_struct` keeps a task's on-CPU times (from BTF).
    task_offsets: Option<explain::TaskOffsets>,
    traced: HashSet<u32>,
    /// Leave probes attached when nothing is traced any more: gostw is about
    /// to exit, and `teardown` lets the kernel detach them afterwards.
    leaving: bool,
}

impl Core {
    /// Load the kernel object; nothing is attached yet.
    pub fn load(opts: CoreOptions) -> anyhow::Result<Core> {
        Ok(Core {
            object: Object::load()?,
            opts,
            caps: {
                let mut caps = capabilities::detect();
                caps.begin_tracepoints &= !opts.perf_fault_begin;
                caps
            },
            faults: if opts.faults.is_some() {
                FaultState::Idle
            } else {
                FaultState::Off
            },
            sampler: None,
            exact: HashMap::new(),
            sched: None,
            task_offsets: opts.explain.then(explain::TaskOffsets::detect).flatten(),
            traced: HashSet::new(),
            leaving: false,
        })
    }

    /// Check now that the fault backend asked for can be used (so an explicit
    /// `--fault-source` fails before anything runs); returns the choice.
    pub fn fault_choice(&self) -> Option<anyhow::Result<BackendChoice>> {
        self.opts.faults.map(|s| self.caps.choose(s))
    }

    /// The attached fault backend, if any.
    pub fn fault_backend(&self) -> Option<&BackendChoice> {
        match &self.faults {
            FaultState::Attached(h) => Some(&h.choice),
            _ => None,
        }
    }

    /// Why faults are not traced, if they were asked for and failed.
    pub fn fault_failure(&self) -> Option<&str> {
        match &self.faults {
            FaultState::Failed(why) => Some(why),
            _ => None,
        }
    }

    /// What the kernel supports.
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// The loaded object (maps and program information).
    pub fn object(&mut self) -> &mut Object {
        &mut self.object
    }

    /// The kernel-side health counters, summed over CPUs.
    pub fn counters(&self) -> anyhow::Result<Vec<(Counter, u64)>> {
        self.object.counters()
    }

    /// How many times `probe` fired in process `pid` so far.
    pub fn probe_hits(&self, pid: u32, probe: Probe) -> u64 {
        self.object.probe_hits(pid, probe).unwrap_or(0)
    }

    /// gostw is about to exit: untracing no longer detaches probes (the
    /// traced set filters them; `teardown::detach_after_exit` removes them).
    pub fn leave(&mut self) {
        self.leaving = true;
    }

    /// What must be undone in tracefs after gostw has exited (see
    /// `teardown::detach_after_exit`); the fault hooks stop owning it.
    pub fn after_exit(&mut self) -> Option<retprobe::AfterExit> {
        match &mut self.faults {
            FaultState::Attached(h) => h.after_exit(),
            _ => None,
        }
    }

    /// Drive the exact stack-growth mode's duty cycle; a few times a second.
    pub fn tick(&mut self) -> anyhow::Result<()> {
        for probes in self.exact.values_mut() {
            probes.tick(&mut self.object)?;
        }
        Ok(())
    }

    /// The stack-growth site counts the kernel kept for `pid`.
    pub fn stack_sites(&self, pid: u32) -> anyhow::Result<Vec<(StackSiteKey, StackSiteCounts)>> {
        stacks::site_counts(&self.object, pid)
    }

    /// How long stack growth was observed: (since attach, attached).
    pub fn stack_observed(&self) -> Option<(std::time::Duration, std::time::Duration)> {
        self.exact
            .values()
            .next()
            .or(self.sampler.as_ref())
            .map(StackGrowthProbes::observed)
    }

    /// Whether the stack-growth sampler runs now.
    pub fn sampling(&self) -> bool {
        self.sampler.is_some()
    }

    /// The stack-growth mode in use.
    pub fn stack_mode(&self) -> Option<Mode> {
        self.opts.stacks.map(|s| s.mode)
    }

    /// Attach the pause probes at `points` to the file at `path` (the
    /// analysis is shared per file, the path is this process's way to it).
    fn attach_pause_probes(
        &mut self,
        path: &Path,
        points: &PausePoints,
    ) -> anyhow::Result<Vec<(&'static str, UProbeLinkId)>> {
        let mut links = Vec::new();
        let result = (|| {
            let mut offsets = vec![(STW_STOP, points.stop)];
            offsets.extend(points.stopping.iter().map(|&o| (STW_STOPPED, o)));
            offsets.extend(points.end.iter().map(|&o| (STW_START_RET, o)));
            for (name, offset) in offsets {
                let id = self
                    .object
                    .program::<UProbe>(name)?
                    .attach(offset, path, UProbeScope::AllProcesses)
                    // Kept as the source: its errno decides whether a
                    // retry can help (`tracker::is_transient`).
                    .with_context(|| {
                        format!(
                            "attaching {name} to {} at file offset {offset:#x}",
                            path.display()
                        )
                    })?;
                links.push((name, id));
            }
            anyhow::Ok(())
        })();
        match result {
            Ok(()) => Ok(links),
            Err(e) => {
                self.detach_links(links);
                Err(e)
            }
        }
    }

    fn detach_links(&mut self, links: Vec<(&'static str, UProbeLinkId)>) {
        for (name, id) in links {
            if let Err(e) = self
                .object
                .program::<UProbe>(name)
                .and_then(|p| Ok(p.detach(id)?))
            {
                log::warn!("detaching {name}: {e:#}");
            }
        }
    }

    /// The first process is traced: attach the host-wide hooks.
    fn first_traced(&mut self) {
        if matches!(self.faults, FaultState::Idle) {
            let source = self.opts.faults.unwrap_or_default();
            self.faults = match self.caps.choose(source).and_then(|choice| {
                FaultHooks::attach(&mut self.object, &self.caps, choice, self.opts.explain)
            }) {
                Ok(h) => {
                    log::info!(
                        "major faults: {} backend ({})",
                        h.choice.backend.name(),
                        h.choice.reason
                    );
                    FaultState::Attached(h)
                }
                Err(e) => {
                    log::warn!("major faults are not traced: {e:#}");
                    FaultState::Failed(format!("{e:#}"))
                }
            };
        }
        if self.opts.explain && self.sched.is_none() {
            let switch_attached =
                matches!(&self.faults, FaultState::Attached(h) if h.switch_both());
            match explain::SchedHooks::attach(&mut self.object, switch_attached) {
                Ok(h) => self.sched = Some(h),
                Err(e) => log::warn!("pauses are explained without scheduler data: {e:#}"),
            }
        }
        if let Some(o) = self.opts.stacks.filter(|o| o.mode == Mode::Sampled)
            && self.sampler.is_none()
        {
            match StackGrowthProbes::sampler(&mut self.object, o.sample_hz) {
                Ok(p) => self.sampler = Some(p),
                Err(e) => log::warn!(
                    "stack growth is not measured: {e:#} (the CPU-clock perf event needs \
                     CAP_PERFMON or root and perf_event_paranoid <= 2)"
                ),
            }
        }
    }

    /// The last traced process is gone: detach the host-wide hooks.
    fn last_untraced(&mut self) {
        if let FaultState::Attached(_) = self.faults {
            let FaultState::Attached(h) = std::mem::replace(&mut self.faults, FaultState::Idle)
            else {
                unreachable!()
            };
            h.detach(&mut self.object);
        }
        if let Some(h) = self.sched.take() {
            h.detach(&mut self.object);
        }
        if let Some(s) = self.sampler.take()
            && let Err(e) = s.detach(&mut self.object)
        {
            log::warn!("detaching the stack-growth sampler: {e:#}");
        }
    }
}

/// What the kernel programs need to know of each process running `binary`.
pub fn traced_process(binary: &GoBinary, offsets: &crate::binary::StructOffsets) -> TracedProcess {
    let code = binary.version.code();
    let unknown = tracer_common::process::GoOffsets::UNKNOWN;
    let explain = ExplainRuntime {
        allm: binary.symbol("runtime.allm").unwrap_or(0),
        stop_the_world: binary.function(STOP_THE_WORLD).map_or(0, |f| f.address),
        m_alllink: offsets.get("m.alllink").unwrap_or(unknown),
        m_p: offsets.get("m.p").unwrap_or(unknown),
        ..ExplainRuntime::default()
    };
    TracedProcess {
        go_version: code,
        flags: if code < 121 {
            TracedProcess::FLAG_REASON_FROM_PREEMPTOFF
        } else {
            0
        },
        offsets: offsets.to_kernel(),
        explain,
        cpu_samples: 0,
    }
}

fn gone(pid: u32) -> bool {
    crate::targets::process::is_gone(pid)
}

fn failed(reason: FailureReason, message: impl ToString) -> AttachError {
    AttachError::Failed {
        reason,
        message: message.to_string(),
    }
}

/// The kernel's view of a Go executable: analysed once, by identity.
fn analyse(pid: u32, path: &Path) -> Result<Arc<ExecutableImage>, AttachError> {
    let opened = ExeId::of(path)
        .map_err(|source| BinaryError::Read {
            path: path.to_owned(),
            source,
        })
        .and_then(|id| ExecutableImage::cached(id, || GoBinary::open(path)));
    opened.map_err(|e| match e {
        BinaryError::NotGo { .. } | BinaryError::NotElf { .. } => AttachError::NotGo,
        BinaryError::Read { source, .. }
            if source.kind() == std::io::ErrorKind::NotFound
                || source.raw_os_error() == Some(libc::ESRCH)
                || gone(pid) =>
        {
            failed(FailureReason::ProcessGone, source)
        }
        e => failed(FailureReason::Analysis, e),
    })
}

impl Kernel for Core {
    type Probes = ExeProbes;

    fn attach(&mut self, pid: u32, path: &Path) -> Result<Attached<ExeProbes>, AttachError> {
        let image = analyse(pid, path)?;
        let binary = &image.binary;
        let offsets = binary
            .struct_offsets()
            .map_err(|e| failed(FailureReason::UnsupportedGo, e))?;
        let mut traced = traced_process(binary, &offsets);
        // Both functions must be found before anything is attached.
        let points = pause_points::choose(binary, self.opts.stopping, &traced.offsets)
            .map_err(|e| failed(FailureReason::Analysis, e))?;
        traced.offsets.start_call_rsp_started_stopping = points.end_at_call;
        let links = self.attach_pause_probes(path, &points).map_err(|e| {
            if gone(pid) {
                failed(FailureReason::ProcessGone, format!("{e:#}"))
            } else if crate::targets::tracker::is_transient(&e) {
                AttachError::Transient {
                    reason: FailureReason::Attach,
                    message: format!("{e:#}"),
                }
            } else {
                failed(FailureReason::Attach, format!("{e:#}"))
            }
        })?;
        if let Some(o) = self.opts.stacks.filter(|o| o.mode == Mode::Exact) {
            match StackGrowthProbes::attach(&mut self.object, binary, path, o) {
                Ok(p) => {
                    self.exact.insert(image.id, p);
                }
                Err(e) => log::warn!("stack growth is not measured: {e:#}"),
            }
        }
        if links.iter().any(|(name, _)| *name == STW_STOPPED) {
            traced.flags |= TracedProcess::FLAG_STOPPED_PROBE;
        }
        let build_id = binary
            .build_id()
            .map(labels::short_build_id)
            .unwrap_or_default();
        Ok(Attached {
            go_version: binary.version.to_string(),
            build_id,
            probes: ExeProbes {
                exe: image.id,
                links,
            },
            traced,
            image: Some(image),
        })
    }

    fn detach(&mut self, probes: ExeProbes) {
        ExecutableImage::forget(probes.exe);
        if self.leaving {
            return;
        }
        self.detach_links(probes.links);
        if let Some(p) = self.exact.remove(&probes.exe)
            && let Err(e) = p.detach(&mut self.object)
        {
            log::warn!("detaching the stack-growth probe: {e:#}");
        }
    }

    fn trace(&mut self, pid: u32, traced: &TracedProcess) -> anyhow::Result<()> {
        if self.traced.is_empty() {
            self.first_traced();
        }
        self.object.trace(pid, *traced, self.opts.explain)?;
        if self.opts.explain {
            let stopped_probe = traced.flags & TracedProcess::FLAG_STOPPED_PROBE != 0;
            let sched = self.sched.is_some();
            explain::watch(
                &mut self.object,
                pid,
                &traced.explain,
                stopped_probe,
                sched,
                self.task_offsets,
            )?;
        }
        self.traced.insert(pid);
        for p in self.exact.values_mut() {
            p.watch(pid);
        }
        Ok(())
    }

    fn untrace(&mut self, pid: u32) {
        if let Err(e) = self
            .object
            .forget(pid)
            .and_then(|()| stacks::forget_process(&mut self.object, pid))
            .and_then(|()| explain::forget(&mut self.object, pid))
        {
            log::warn!("forgetting pid {pid}: {e:#}");
        }
        if self.traced.remove(&pid) && self.traced.is_empty() && !self.leaving {
            self.last_untraced();
        }
    }

    fn probe_hits(&mut self, pid: u32, probe: Probe) -> u64 {
        Core::probe_hits(self, pid, probe)
    }

    fn sample_hz(&self) -> u64 {
        self.opts.stacks.map_or(0, |s| s.sample_hz)
    }

    fn fault_counts(&mut self, pid: u32) -> Option<FaultCounts> {
        self.opts.faults?;
        self.object
            .fault_counts(pid)
            .inspect_err(|e| log::warn!("reading the fault counts of pid {pid}: {e:#}"))
            .ok()
            .flatten()
    }

    fn collect_final(&mut self, pid: u32, out: &mut Vec<Observed>) {
        if self.opts.stacks.is_none() {
            return;
        }
        match self.stack_sites(pid) {
            Ok(rows) => out.push(Observed::StackSites {
                pid,
                rows,
                observed: self.stack_observed().unwrap_or_default(),
                code: Default::default(),
            }),
            Err(e) => log::warn!("reading the stack-growth sites of pid {pid}: {e:#}"),
        }
    }
}
