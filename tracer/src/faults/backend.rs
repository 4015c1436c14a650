//! Choosing and attaching a fault backend. Both feed the same `FaultEvent`s.
//! `KernelSupport::detect` is the one place that asks the kernel what it
//! supports (to be unified with `inspect`'s kernel support report).

use std::{fs, path::Path};

use anyhow::{Context as _, bail};
use aya::{
    programs::{
        KProbe, PerfEvent, TracePoint,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
    util::online_cpus,
};
use tracer_common::fault::{Backend, programs};

use crate::ebpf::Programs;

/// `--fault-source`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultSource {
    /// kprobes when the kernel has them and the functions exist, else tracepoints.
    #[default]
    Auto,
    Kprobe,
    Tracepoint,
}

/// What the running kernel offers the fault backends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSupport {
    /// Ok: (program, kernel function) for every kprobe; Err: why not.
    pub kprobes: Result<Vec<(&'static str, &'static str)>, String>,
    /// Ok, or which required tracepoint is missing.
    pub tracepoints: Result<(), String>,
    /// `filemap:mm_filemap_fault` exists (not on 6.1 LTS): the tracepoint
    /// backend can tell file-backed faults from swap-ins.
    pub filemap_tracepoint: bool,
}

/// The backend to use and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendChoice {
    pub backend: Backend,
    pub reason: String,
    /// Every file-backed fault is marked, so unmarked ones are swap-ins.
    pub file_faults_seen: bool,
}

/// Where tracefs is (mounted by `ensure_tracefs`).
pub const TRACEFS: &str = "/sys/kernel/tracing";

/// Mount tracefs at /sys/kernel/tracing when no tracefs is mounted: attaching
/// tracepoints (and uprobe/kprobe events) looks event ids up there.
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
    Ok(Path::new(TRACEFS))
}

impl KernelSupport {
    /// Ask the running kernel (tracefs, perf PMUs, /proc/kallsyms).
    pub fn detect() -> KernelSupport {
        let tracefs = ensure_tracefs();
        let kprobes = (|| {
            let pmu = Path::new("/sys/bus/event_source/devices/kprobe").exists();
            let events = tracefs
                .as_ref()
                .is_ok_and(|t| t.join("kprobe_events").exists());
            if !pmu && !events {
                return Err(
                    "the kernel has no kprobes (no kprobe PMU, no kprobe_events; CONFIG_KPROBES is off)"
                        .to_owned(),
                );
            }
            let kallsyms = fs::read_to_string("/proc/kallsyms")
                .map_err(|e| format!("reading /proc/kallsyms: {e}"))?;
            resolve_kprobe_functions(&kallsyms)
        })();
        let exists = |cat: &str, name: &str| {
            tracefs
                .as_ref()
                .is_ok_and(|t| t.join("events").join(cat).join(name).is_dir())
        };
        let tracepoints = match &tracefs {
            Err(e) => Err(format!("{e:#}")),
            Ok(_) => programs::TRACEPOINTS
                .iter()
                .filter(|(prog, _, _)| *prog != programs::OPTIONAL_TRACEPOINT)
                .find(|(_, cat, name)| !exists(cat, name))
                .map_or(Ok(()), |(_, cat, name)| {
                    Err(format!("tracepoint {cat}:{name} does not exist"))
                }),
        };
        KernelSupport {
            kprobes,
            tracepoints,
            filemap_tracepoint: exists("filemap", "mm_filemap_fault"),
        }
    }

    /// Pick the backend for `source`.
    pub fn choose(&self, source: FaultSource) -> anyhow::Result<BackendChoice> {
        match (source, &self.kprobes, &self.tracepoints) {
            (FaultSource::Kprobe | FaultSource::Auto, Ok(fns), _) => {
                let mut names: Vec<&str> = fns.iter().map(|(_, f)| *f).collect();
                names.dedup();
                Ok(BackendChoice {
                    backend: Backend::Kprobe,
                    reason: format!("kprobes available; probing {}", names.join(", ")),
                    file_faults_seen: true,
                })
            }
            (FaultSource::Kprobe, Err(why), _) => {
                bail!("--fault-source kprobe: {why}; use --fault-source tracepoint")
            }
            (FaultSource::Auto | FaultSource::Tracepoint, kp, Ok(())) => {
                let mut reason = match (source, kp) {
                    (FaultSource::Auto, Err(why)) => {
                        format!("{why}; using tracepoints + perf events")
                    }
                    _ => "tracepoints + perf events requested".to_owned(),
                };
                if !self.filemap_tracepoint {
                    reason.push_str(
                        " (this kernel has no filemap:mm_filemap_fault: file-backed and \
                         swap-in faults are not told apart)",
                    );
                }
                Ok(BackendChoice {
                    backend: Backend::Tracepoint,
                    reason,
                    file_faults_seen: self.filemap_tracepoint,
                })
            }
            (_, _, Err(why)) => bail!("no fault backend: {why}"),
        }
    }
}

/// For each kprobe program, the first of its kernel functions in `kallsyms`.
fn resolve_kprobe_functions(kallsyms: &str) -> Result<Vec<(&'static str, &'static str)>, String> {
    let present: std::collections::HashSet<&str> = kallsyms
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (_, kind, name) = (it.next()?, it.next()?, it.next()?);
            matches!(kind, "T" | "t").then_some(name)
        })
        .collect();
    programs::KPROBES
        .iter()
        .map(|(prog, candidates, _)| {
            candidates
                .iter()
                .find(|f| present.contains(**f))
                .map(|f| (*prog, *f))
                .ok_or_else(|| format!("none of {} exists in this kernel", candidates.join(", ")))
        })
        .collect()
}

/// Load every kprobe-backend program (verifier check), without attaching.
pub fn load_kprobe_programs(programs: &mut Programs) -> anyhow::Result<()> {
    for (name, _, _) in programs::KPROBES {
        let prog: &mut KProbe = programs.program_mut(name)?.try_into()?;
        if prog.fd().is_err() {
            prog.load()
                .with_context(|| format!("the kernel rejected program {name}"))?;
        }
    }
    Ok(())
}

/// Load every tracepoint-backend program, without attaching.
pub fn load_tracepoint_programs(programs: &mut Programs) -> anyhow::Result<()> {
    for (name, _, _) in programs::TRACEPOINTS {
        let prog: &mut TracePoint = programs.program_mut(name)?.try_into()?;
        if prog.fd().is_err() {
            prog.load()
                .with_context(|| format!("the kernel rejected program {name}"))?;
        }
    }
    let prog: &mut PerfEvent = programs
        .program_mut(programs::MAJOR_FAULT_END)?
        .try_into()?;
    if prog.fd().is_err() {
        prog.load().with_context(|| {
            format!("the kernel rejected program {}", programs::MAJOR_FAULT_END)
        })?;
    }
    Ok(())
}

/// Attach the kprobe backend (kprobes on the functions `support` resolved).
pub fn attach_kprobes(
    programs: &mut Programs,
    functions: &[(&'static str, &'static str)],
) -> anyhow::Result<()> {
    load_kprobe_programs(programs)?;
    for (name, function) in functions {
        let prog: &mut KProbe = programs.program_mut(name)?.try_into()?;
        prog.attach(function, 0).with_context(|| {
            format!(
                "attaching kprobe {name} to {function} failed; this kernel may lack kprobes \
                 (CONFIG_KPROBES): use --fault-source tracepoint"
            )
        })?;
    }
    Ok(())
}

/// Attach the tracepoint backend: the tracepoints (the optional one only
/// when `with_filemap`), and the major-fault perf software event on every
/// online CPU.
pub fn attach_tracepoints(programs: &mut Programs, with_filemap: bool) -> anyhow::Result<()> {
    ensure_tracefs()?;
    load_tracepoint_programs(programs)?;
    for (name, category, event) in programs::TRACEPOINTS {
        if *name == programs::OPTIONAL_TRACEPOINT && !with_filemap {
            continue;
        }
        let prog: &mut TracePoint = programs.program_mut(name)?.try_into()?;
        prog.attach(category, event)
            .with_context(|| format!("attaching {name} to tracepoint {category}:{event}"))?;
    }
    let prog: &mut PerfEvent = programs
        .program_mut(programs::MAJOR_FAULT_END)?
        .try_into()?;
    let cpus = online_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
    for cpu in cpus {
        prog.attach(
            PerfEventConfig::Software(SoftwareEvent::PageFaultsMaj),
            PerfEventScope::AllProcessesOneCpu { cpu },
            SamplePolicy::Period(1),
            false,
        )
        .with_context(|| format!("attaching the PAGE_FAULTS_MAJ perf event on CPU {cpu}"))?;
    }
    Ok(())
}

/// Choose a backend for `source` on this kernel and attach it.
pub fn attach(programs: &mut Programs, source: FaultSource) -> anyhow::Result<BackendChoice> {
    let support = KernelSupport::detect();
    let choice = support.choose(source)?;
    match choice.backend {
        Backend::Kprobe => {
            let functions = support.kprobes.clone().map_err(anyhow::Error::msg)?;
            attach_kprobes(programs, &functions)?;
        }
        Backend::Tracepoint => attach_tracepoints(programs, support.filemap_tracepoint)?,
    }
    log::info!("fault backend: {:?} ({})", choice.backend, choice.reason);
    Ok(choice)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEW_KERNEL: &str = "\
ffffffff815a6080 T __folio_lock_or_retry
ffffffff815a7400 T filemap_fault
ffffffff81603510 T do_swap_page
ffffffff81657f60 T swap_read_folio
";

    #[test]
    fn kprobe_functions_follow_renames() {
        let fns = resolve_kprobe_functions(NEW_KERNEL).unwrap();
        assert!(fns.contains(&("fault_kp_swap_read", "swap_read_folio")));
        assert!(fns.contains(&("fault_kp_lock_ret", "__folio_lock_or_retry")));
        let old = NEW_KERNEL
            .replace("swap_read_folio", "swap_readpage")
            .replace("__folio_lock_or_retry", "__lock_page_or_retry");
        let fns = resolve_kprobe_functions(&old).unwrap();
        assert!(fns.contains(&("fault_kp_swap_read", "swap_readpage")));
        assert!(fns.contains(&("fault_kp_lock_entry", "__lock_page_or_retry")));
        let missing = NEW_KERNEL.replace("do_swap_page", "something_else");
        assert!(
            resolve_kprobe_functions(&missing)
                .unwrap_err()
                .contains("do_swap_page")
        );
    }

    #[test]
    fn auto_prefers_kprobes_and_falls_back_to_tracepoints() {
        let with = KernelSupport {
            kprobes: resolve_kprobe_functions(NEW_KERNEL).map_err(|e| e.to_string()),
            tracepoints: Ok(()),
            filemap_tracepoint: true,
        };
        assert_eq!(
            with.choose(FaultSource::Auto).unwrap().backend,
            Backend::Kprobe
        );
        assert_eq!(
            with.choose(FaultSource::Tracepoint).unwrap().backend,
            Backend::Tracepoint
        );
        let without = KernelSupport {
            kprobes: Err("no kprobes".into()),
            tracepoints: Ok(()),
            filemap_tracepoint: true,
        };
        let c = without.choose(FaultSource::Auto).unwrap();
        assert_eq!(c.backend, Backend::Tracepoint);
        assert!(c.reason.contains("no kprobes"));
        let e = without.choose(FaultSource::Kprobe).unwrap_err().to_string();
        assert!(e.contains("--fault-source tracepoint"), "{e}");
        let none = KernelSupport {
            kprobes: Err("no kprobes".into()),
            tracepoints: Err("tracepoint x:y does not exist".into()),
            filemap_tracepoint: false,
        };
        assert!(none.choose(FaultSource::Auto).is_err());
        let old = KernelSupport {
            kprobes: Err("no kprobes".into()),
            tracepoints: Ok(()),
            filemap_tracepoint: false,
        };
        let c = old.choose(FaultSource::Auto).unwrap();
        assert!(
            !c.file_faults_seen && c.reason.contains("not told apart"),
            "{c:?}"
        );
        assert!(with.choose(FaultSource::Auto).unwrap().file_faults_seen);
    }
}
