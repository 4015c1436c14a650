//! Attaching and detaching a fault backend. Both feed the same `FaultEvent`s;
//! which one is used is `capabilities::Capabilities::choose`'s decision. The
//! hooks are host-wide (system-wide tracepoints, per-CPU perf events,
//! kprobes), so the core attaches them only while some process is traced.

use std::{os::fd::AsFd as _, path::Path};

use anyhow::{Context as _, bail};
use aya::{
    maps::Array,
    programs::{
        KProbe, PerfEvent, TracePoint,
        kprobe::KProbeLinkId,
        perf_event::{
            PerfEventConfig, PerfEventLinkId, PerfEventScope, SamplePolicy, SoftwareEvent,
        },
        trace_point::TracePointLinkId,
    },
    util::online_cpus,
};
use tracer_common::{
    explain::SWITCH_BOTH,
    fault::{FAULT_LAYOUT, FaultLayout, programs},
};

use super::{
    btf::Btf,
    capabilities::{BackendChoice, Capabilities, FaultBackend, PERF_BEGIN_NOTE},
    object::Object,
    retprobe::{AfterExit, RetProbes},
};

/// Where tracefs is mounted by `ensure_tracefs` when nothing is.
pub const TRACEFS: &str = "/sys/kernel/tracing";

/// Whether `ensure_tracefs` mounted tracefs (and `unmount_tracefs` is to
/// take it away again).
static MOUNTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Mount tracefs at /sys/kernel/tracing when no tracefs is mounted: attaching
/// tracepoints (and uprobe/kprobe events) looks event ids up there. gostw
/// leaves the system as it found it: `unmount_tracefs` at exit.
pub fn ensure_tracefs() -> anyhow::Result<&'static Path> {
    for dir in [TRACEFS, "/sys/kernel/debug/tracing"] {
        if Path::new(dir).join("events").is_dir() {
            return Ok(Path::new(dir));
        }
    }
    let c = |s: &str| std::ffi::CString::new(s).expect("no NUL");
    let (src, target) = (c("tracefs"), c(TRACEFS));
    // SAFETY: valid NUL-terminated strings; no data argument.
    let ret = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            src.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if ret != 0 {
        bail!(
            "tracefs is not mounted and mounting it at {TRACEFS} failed ({}); run \
             `mount -t tracefs tracefs {TRACEFS}` as root",
            std::io::Error::last_os_error()
        );
    }
    MOUNTED.store(true, std::sync::atomic::Ordering::SeqCst);
    Ok(Path::new(TRACEFS))
}

/// Unmount the tracefs `ensure_tracefs` mounted, if it did (at exit).
/// Attached tracepoints do not need it; the unmount is lazy, so another
/// program's open tracefs files stay valid until closed.
pub fn unmount_tracefs() {
    if !MOUNTED.swap(false, std::sync::atomic::Ordering::SeqCst) {
        return;
    }
    let target = std::ffi::CString::new(TRACEFS).expect("no NUL");
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
        log::warn!(
            "unmounting the tracefs gostw mounted at {TRACEFS}: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// An attached backend: what to detach.
pub struct FaultHooks {
    pub choice: BackendChoice,
    kprobes: Vec<(&'static str, KProbeLinkId)>,
    /// The kprobe backend's return probes, made in tracefs with room for
    /// every thread in a fault at once (`retprobe`).
    retprobes: Option<RetProbes>,
    tracepoints: Vec<(&'static str, TracePointLinkId)>,
    /// Perf event programs, one link per CPU each.
    perf: Vec<(&'static str, PerfEventLinkId)>,
}

/// Say that a return probe falls back to aya's (the kprobe PMU's) default
/// `maxactive`.
fn warn_default_room(e: &anyhow::Error) {
    log::warn!(
        "a return probe keeps the kernel's default room ({e:#}): under a fault storm some \
         faults may go unseen (`fault_returns_pending` in the summary)"
    );
}

/// Give the kprobe programs the kernel struct offsets they read
/// (`FaultLayout`), from the kernel's BTF. Without BTF they count faults as
/// kernels before 6.4 do, and a fault abandoned for a signal as major: said
/// once.
fn write_fault_layout(object: &mut Object) -> anyhow::Result<()> {
    let layout = (|| -> anyhow::Result<FaultLayout> {
        let btf = Btf::vmlinux()?;
        Ok(FaultLayout {
            vmf_flags: btf.offset("vm_fault", &["flags"])?,
            task_pending_signal: btf.offset("task_struct", &["pending", "signal"])?,
            task_blocked: btf.offset("task_struct", &["blocked"])?,
            _pad: 0,
        })
    })();
    let layout = match layout {
        Ok(l) => l,
        Err(e) => {
            log::warn!(
                "the kernel's BTF gives no fault and signal offsets ({e:#}): the kprobe backend \
                 may count as major a fault the kernel abandoned for a signal or retried \
                 without counting (per-VMA lock, 6.4+)"
            );
            return Ok(());
        }
    };
    let mut array: Array<_, FaultLayout> = Array::try_from(object.map_mut(FAULT_LAYOUT)?)?;
    array.set(0, layout, 0)?;
    Ok(())
}

/// Load every kprobe-backend program (verifier check), without attaching.
pub fn load_kprobe_programs(object: &mut Object) -> anyhow::Result<()> {
    for (name, _, _) in programs::KPROBES {
        object.program::<KProbe>(name)?;
    }
    Ok(())
}

/// The tracepoint backend's programs: its tracepoints' (x86's fault begins
/// dropped for `perf_begin`), then its perf events' (the begin's first if
/// `perf_begin`).
pub fn tracepoint_programs(
    perf_begin: bool,
) -> (
    impl Iterator<Item = &'static (&'static str, &'static str, &'static str)>,
    Vec<&'static str>,
) {
    let tracepoints = programs::TRACEPOINTS
        .iter()
        .filter(move |(name, _, _)| !(perf_begin && programs::BEGIN_TRACEPOINTS.contains(name)));
    let perf = perf_begin
        .then_some(programs::FAULT_BEGIN_PERF)
        .into_iter()
        .chain([programs::MAJOR_FAULT_END])
        .collect();
    (tracepoints, perf)
}

/// Load every tracepoint-backend program, without attaching.
pub fn load_tracepoint_programs(
    object: &mut Object,
    switch_both: bool,
    perf_begin: bool,
) -> anyhow::Result<()> {
    let (tracepoints, perf) = tracepoint_programs(perf_begin);
    for &(name, _, _) in tracepoints {
        object.program::<TracePoint>(switch_program(name, switch_both))?;
    }
    for name in perf {
        object.program::<PerfEvent>(name)?;
    }
    Ok(())
}

/// The program to attach for the tracepoint backend's `name`: on
/// `sched_switch`, the one that also explains pauses when `switch_both`.
fn switch_program(name: &'static str, switch_both: bool) -> &'static str {
    if switch_both && name == programs::SWITCH {
        SWITCH_BOTH
    } else {
        name
    }
}

impl FaultHooks {
    /// Attach the backend `choice` names (decided on `caps`); with
    /// `explain`, the tracepoint backend's `sched_switch` program is the one
    /// that also does the explanation's (`switch_both`).
    pub fn attach(
        object: &mut Object,
        caps: &Capabilities,
        choice: BackendChoice,
        explain: bool,
    ) -> anyhow::Result<FaultHooks> {
        let mut hooks = FaultHooks {
            choice,
            kprobes: Vec::new(),
            retprobes: None,
            tracepoints: Vec::new(),
            perf: Vec::new(),
        };
        let attached = match hooks.choice.backend {
            FaultBackend::Kprobe => hooks.attach_kprobes(object, &caps.kprobe_functions),
            FaultBackend::Tracepoint => hooks.attach_tracepoints(object, caps, explain),
            FaultBackend::None => Err(anyhow::anyhow!("{}", hooks.choice.reason)),
        };
        match attached {
            Ok(()) => Ok(hooks),
            Err(e) => {
                hooks.detach(object);
                Err(e)
            }
        }
    }

    fn attach_kprobes(
        &mut self,
        object: &mut Object,
        functions: &[(&'static str, &'static str)],
    ) -> anyhow::Result<()> {
        load_kprobe_programs(object)?;
        write_fault_layout(object)?;
        let mut retprobes = ensure_tracefs().and_then(RetProbes::new);
        if let Err(e) = &retprobes {
            warn_default_room(e);
        }
        for &(name, function) in functions {
            let is_return = programs::KPROBES
                .iter()
                .any(|&(n, _, ret)| n == name && ret);
            if is_return && let Ok(r) = &mut retprobes {
                let fd = object.program::<KProbe>(name)?.fd()?;
                match r.attach(name, function, fd.as_fd()) {
                    Ok(()) => continue,
                    Err(e) => warn_default_room(&e),
                }
            }
            let link = object.program::<KProbe>(name)?.attach(function, 0).with_context(|| {
                format!(
                    "attaching kprobe {name} to {function} failed; this kernel may lack kprobes \
                     (CONFIG_KPROBES): use --fault-source tracepoint"
                )
            })?;
            self.kprobes.push((name, link));
        }
        self.retprobes = retprobes.ok();
        Ok(())
    }

    /// What `teardown`'s child must remove from tracefs after gostw exits.
    pub fn after_exit(&mut self) -> Option<AfterExit> {
        self.retprobes.as_mut().and_then(RetProbes::after_exit)
    }

    fn attach_tracepoints(
        &mut self,
        object: &mut Object,
        caps: &Capabilities,
        mut switch_both: bool,
    ) -> anyhow::Result<()> {
        ensure_tracefs()?;
        let mut perf_begin = !caps.begin_tracepoints;
        if !perf_begin && !super::capabilities::begin_tracepoints_mounted() {
            // Assumed while tracefs was not mounted; not there after all.
            perf_begin = true;
            self.choice.reason.push_str(PERF_BEGIN_NOTE);
        }
        if switch_both && !object.compat().missing.is_empty() {
            // It calls the newer helpers and has no variant: the two
            // programs it combines load as their variants instead.
            switch_both = false;
        }
        if switch_both && let Err(e) = object.program::<TracePoint>(SWITCH_BOTH) {
            // Its parts load on their own: a kernel that refuses the whole
            // pays two programs on sched_switch, not the faults.
            log::info!("{e:#}; one sched_switch program each for faults and explanations");
            switch_both = false;
        }
        load_tracepoint_programs(object, switch_both, perf_begin)?;
        let (tracepoints, perf) = tracepoint_programs(perf_begin);
        for &(name, category, event) in tracepoints {
            if name == programs::OPTIONAL_TRACEPOINT && !caps.filemap_tracepoint {
                continue;
            }
            let name = switch_program(name, switch_both);
            let link = object
                .program::<TracePoint>(name)?
                .attach(category, event)
                .with_context(|| format!("attaching {name} to tracepoint {category}:{event}"))?;
            self.tracepoints.push((name, link));
        }
        let cpus = online_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
        for name in perf {
            let (event, what) = if name == programs::FAULT_BEGIN_PERF {
                (SoftwareEvent::PageFaults, "PAGE_FAULTS")
            } else {
                (SoftwareEvent::PageFaultsMaj, "PAGE_FAULTS_MAJ")
            };
            let prog = object.program::<PerfEvent>(name)?;
            for &cpu in &cpus {
                let link = prog
                    .attach(
                        PerfEventConfig::Software(event),
                        PerfEventScope::AllProcessesOneCpu { cpu },
                        SamplePolicy::Period(1),
                        false,
                    )
                    .with_context(|| format!("attaching the {what} perf event on CPU {cpu}"))?;
                self.perf.push((name, link));
            }
        }
        Ok(())
    }

    /// Whether its `sched_switch` program does the explanation's work too.
    pub fn switch_both(&self) -> bool {
        self.tracepoints
            .iter()
            .any(|(name, _)| *name == SWITCH_BOTH)
    }

    /// Detach every hook (errors are logged: the kernel drops what is left
    /// when gostw exits).
    pub fn detach(mut self, object: &mut Object) {
        // Closing their perf events detaches them; then tracefs forgets them.
        self.retprobes = None;
        for (name, link) in self.kprobes.drain(..) {
            if let Err(e) = object
                .program::<KProbe>(name)
                .and_then(|p| Ok(p.detach(link)?))
            {
                log::warn!("detaching {name}: {e:#}");
            }
        }
        for (name, link) in self.tracepoints.drain(..) {
            if let Err(e) = object
                .program::<TracePoint>(name)
                .and_then(|p| Ok(p.detach(link)?))
            {
                log::warn!("detaching {name}: {e:#}");
            }
        }
        for (name, link) in self.perf.drain(..) {
            if let Err(e) = object
                .program::<PerfEvent>(name)
                .and_then(|p| Ok(p.detach(link)?))
            {
                log::warn!("detaching {name}: {e:#}");
            }
        }
    }
}
