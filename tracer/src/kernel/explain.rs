//! Explaining pauses (`tracer_common::explain`): the per-process detail the
//! pause probes fill, present only for the processes to explain, and the
//! scheduler programs (`sched:sched_switch`, `sched:sched_waking`), which
//! are host-wide and so attached only while a process is traced.

use anyhow::Context as _;
use aya::{
    maps::HashMap,
    programs::{
        PerfEvent, TracePoint,
        perf_event::{PerfEventLinkId, SamplePolicy},
        trace_point::TracePointLinkId,
    },
};
use tracer_common::{
    explain::{
        EXPLAIN_SWITCH, LAGGARD_SAMPLE_PERIOD_NS, LAGGARD_SAMPLER, PauseDetail, SCHED_PROGRAMS,
    },
    map_names,
    process::ExplainRuntime,
};

use super::{faults::ensure_tracefs, object::Object};

/// Explain the pauses of process `tgid` from now on; `stopped_probe`: its
/// stopping probe is attached (it marks the end of the stopping phase);
/// `sched`: the scheduler programs are.
pub fn watch(
    object: &mut Object,
    tgid: u32,
    runtime: &ExplainRuntime,
    stopped_probe: bool,
    sched: bool,
    task: Option<TaskOffsets>,
) -> anyhow::Result<()> {
    let mut details: HashMap<_, u32, PauseDetail> =
        HashMap::try_from(object.map_mut(map_names::PAUSE_DETAILS)?)?;
    let mut d = PauseDetail::ZERO;
    d.allm_link = runtime.allm;
    d.stop_the_world_link = runtime.stop_the_world;
    if stopped_probe {
        d.config |= PauseDetail::STOPPED_PROBE;
    }
    if sched {
        d.config |= PauseDetail::SCHED;
    }
    if let Some(t) = task {
        d.task_sum_exec = t.sum_exec_runtime;
        d.task_prev_sum_exec = t.prev_sum_exec_runtime;
    }
    details
        .insert(tgid, d, 0)
        .with_context(|| format!("adding pid {tgid} to the explained processes"))
}

/// Where a task's scheduler times are in this kernel's `task_struct`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskOffsets {
    pub sum_exec_runtime: u32,
    pub prev_sum_exec_runtime: u32,
}

impl TaskOffsets {
    /// From the kernel's BTF; `None` (logged) where it cannot say.
    pub fn detect() -> Option<TaskOffsets> {
        let read = || -> anyhow::Result<TaskOffsets> {
            let btf = super::btf::Btf::vmlinux()?;
            Ok(TaskOffsets {
                sum_exec_runtime: btf.offset("task_struct", &["se", "sum_exec_runtime"])?,
                prev_sum_exec_runtime: btf
                    .offset("task_struct", &["se", "prev_sum_exec_runtime"])?,
            })
        };
        read()
            .map_err(|e| log::info!("laggards' on-CPU stints are not read: {e:#}"))
            .ok()
    }
}

/// Forget process `tgid` (absent is fine).
pub fn forget(object: &mut Object, tgid: u32) -> anyhow::Result<()> {
    let mut details: HashMap<_, u32, PauseDetail> =
        HashMap::try_from(object.map_mut(map_names::PAUSE_DETAILS)?)?;
    let _ = details.remove(&tgid);
    Ok(())
}

/// The attached scheduler programs and the laggard sampler.
pub struct SchedHooks {
    links: Vec<(&'static str, TracePointLinkId)>,
    sampler: Vec<PerfEventLinkId>,
}

impl SchedHooks {
    /// Load and attach the scheduler programs; without the `sched_switch`
    /// one when `switch_attached` (the fault backend's `switch_both` does
    /// its work).
    pub fn attach(object: &mut Object, switch_attached: bool) -> anyhow::Result<SchedHooks> {
        ensure_tracefs()?;
        let mut hooks = SchedHooks {
            links: Vec::new(),
            sampler: Vec::new(),
        };
        for &(name, category, event) in SCHED_PROGRAMS {
            if switch_attached && name == EXPLAIN_SWITCH {
                continue;
            }
            let attached = object
                .program::<TracePoint>(name)
                .and_then(|p| Ok(p.attach(category, event)?))
                .with_context(|| format!("attaching {name} to tracepoint {category}:{event}"));
            match attached {
                Ok(link) => hooks.links.push((name, link)),
                Err(e) => {
                    hooks.detach(object);
                    return Err(e);
                }
            }
        }
        // Without it a laggard's frames are where it stopped, not what it
        // ran while the world waited: worse, not wrong.
        if let Err(e) = hooks.attach_sampler(object) {
            log::warn!(
                "laggards' code while they hold a stop is not sampled (their frames are where \
                 they stopped): {e:#}"
            );
            hooks.detach_sampler(object);
        }
        Ok(hooks)
    }

    /// The laggard sampler on every online CPU.
    fn attach_sampler(&mut self, object: &mut Object) -> anyhow::Result<()> {
        let prog = object.program::<PerfEvent>(LAGGARD_SAMPLER)?;
        super::cpu_clock::attach_every_cpu(
            prog,
            LAGGARD_SAMPLER,
            &SamplePolicy::Period(LAGGARD_SAMPLE_PERIOD_NS),
            &mut self.sampler,
        )
    }

    /// Whether the laggard sampler runs.
    pub fn sampling(&self) -> bool {
        !self.sampler.is_empty()
    }

    fn detach_sampler(&mut self, object: &mut Object) {
        for link in self.sampler.drain(..) {
            if let Err(e) = object
                .program::<PerfEvent>(LAGGARD_SAMPLER)
                .and_then(|p| Ok(p.detach(link)?))
            {
                log::warn!("detaching {LAGGARD_SAMPLER}: {e:#}");
            }
        }
    }

    /// Whether program `name` is attached.
    pub fn attached(&self, name: &str) -> bool {
        self.links.iter().any(|(n, _)| *n == name)
    }

    /// Detach them (errors are logged: the kernel drops what is left when
    /// gostw exits).
    pub fn detach(mut self, object: &mut Object) {
        self.detach_sampler(object);
        for (name, link) in self.links {
            if let Err(e) = object
                .program::<TracePoint>(name)
                .and_then(|p| Ok(p.detach(link)?))
            {
                log::warn!("detaching {name}: {e:#}");
            }
        }
    }
}
