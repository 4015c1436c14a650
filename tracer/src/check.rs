//! `gostw check`: what gostw can do on this host, feature by feature, found
//! the way tracing finds it: the same capability detection
//! (`kernel::capabilities`), the same program variants (`kernel::compat`),
//! and the kernel's verifier on the very programs each feature loads. Exit
//! status for deployment scripts: 0 everything works, 1 something is
//! degraded or unavailable, 2 pauses cannot be traced.

use std::fmt::Write as _;

use aya::{
    maps::MapType,
    programs::{PerfEvent, ProgramType, TracePoint, UProbe},
    sys::{is_map_supported, is_program_supported},
};
use serde::Serialize;
use tracer_common::{
    explain::{LAGGARD_SAMPLER, SCHED_PROGRAMS},
    fault::programs as fault_programs,
    program_names::{STACK_COPY, STACK_SAMPLE, STW_START_RET, STW_STOP, STW_STOPPED},
};

use crate::kernel::{
    btf,
    capabilities::{self, BackendChoice, FaultBackend, SystemView as _},
    compat::Compat,
    faults::{self, ensure_tracefs},
    object::Object,
};
use crate::{
    model::backend::{Degraded, FAULTS, HostLimits, KERNEL_WAITS, STACK_GROWTH_SAMPLED},
    procfs::kallsyms::host_addresses_hidden,
};

/// How a feature fares here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "why", rename_all = "lowercase")]
pub enum Status {
    Works,
    /// It runs but loses something (said how).
    Degraded(String),
    Unavailable(String),
}

#[derive(Clone, Debug, Serialize)]
pub struct Feature {
    pub name: &'static str,
    #[serde(flatten)]
    pub status: Status,
    /// The programs it loads here (variants included), all verifier-checked.
    pub programs: Vec<String>,
    /// Older-kernel variants it uses (same results, other cost).
    pub variants: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct CheckReport {
    pub kernel: String,
    pub btf: bool,
    pub root: bool,
    /// Probe families: (family, loads, detail).
    pub families: Vec<(&'static str, bool, String)>,
    pub fault_backend: BackendChoice,
    /// Optional tracepoints: (tracepoint, exists).
    pub optional_tracepoints: Vec<(&'static str, bool)>,
    pub features: Vec<Feature>,
    pub exit_code: i32,
}

fn supported(t: ProgramType) -> (bool, String) {
    match is_program_supported(t) {
        Ok(true) => (true, "loads".into()),
        Ok(false) => (false, "the kernel refuses this program type".into()),
        Err(e) => (false, format!("probing failed: {e}")),
    }
}

/// Ask this host.
pub fn check() -> CheckReport {
    let compat = Compat::detect();
    // SAFETY: no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let tracefs = ensure_tracefs().map(|p| p.to_owned());
    // After mounting tracefs: its events tell where faults begin.
    let caps = capabilities::detect();
    let event = |tp: &str| {
        tracefs
            .as_ref()
            .is_ok_and(|d| d.join("events").join(tp.replace(':', "/")).is_dir())
    };
    let (kp, kp_detail) = supported(ProgramType::KProbe);
    let uprobe_pmu = std::path::Path::new("/sys/bus/event_source/devices/uprobe").exists();
    let (tp, tp_detail) = supported(ProgramType::TracePoint);
    let (pe, pe_detail) = supported(ProgramType::PerfEvent);
    let ringbuf = is_map_supported(MapType::RingBuf).unwrap_or(false);
    let families = vec![
        (
            "uprobes",
            kp && uprobe_pmu,
            format!(
                "{kp_detail}; uprobe PMU {}",
                if uprobe_pmu { "present" } else { "missing" }
            ),
        ),
        (
            "tracepoints",
            tp,
            tracefs
                .as_ref()
                .map_or_else(|e| format!("{e:#}"), |_| tp_detail),
        ),
        (
            "kprobes",
            caps.kprobes.available,
            caps.kprobes.detail.clone(),
        ),
        ("perf events", pe, pe_detail),
        (
            "ring buffer",
            ringbuf,
            if ringbuf {
                "supported"
            } else {
                "BPF_MAP_TYPE_RINGBUF is missing (Linux 5.8)"
            }
            .into(),
        ),
    ];
    let optional_tracepoints = vec![
        (
            "filemap:mm_filemap_fault",
            event("filemap:mm_filemap_fault"),
        ),
        ("sched:sched_waking", event("sched:sched_waking")),
    ];
    let fault_backend = caps.report();
    let features = match Object::load() {
        Ok(mut object) => features(&mut object, &compat, &fault_backend, caps.begin_tracepoints),
        Err(e) => {
            let why = format!("{e:#}");
            [
                "pauses",
                "stopping phase",
                "explanation",
                KERNEL_WAITS,
                FAULTS,
                STACK_GROWTH_SAMPLED,
                "stack growth (exact)",
                "agent",
            ]
            .into_iter()
            .map(|name| Feature {
                name,
                status: Status::Unavailable(why.clone()),
                programs: Vec::new(),
                variants: Vec::new(),
            })
            .collect()
        }
    };
    let exit_code = exit_code(&features);
    CheckReport {
        kernel: capabilities::LiveSystem.release(),
        btf: std::path::Path::new(btf::VMLINUX).exists(),
        root,
        families,
        fault_backend,
        optional_tracepoints,
        features,
        exit_code,
    }
}

/// 2 without pauses, else 1 if anything is not fully there, else 0.
pub fn exit_code(features: &[Feature]) -> i32 {
    if features
        .iter()
        .any(|f| f.name == "pauses" && f.status != Status::Works)
    {
        2
    } else if features.iter().any(|f| f.status != Status::Works) {
        1
    } else {
        0
    }
}

/// Load each feature's programs (the verifier's answer) and judge it.
fn features(
    object: &mut Object,
    compat: &Compat,
    backend: &BackendChoice,
    begin_tracepoints: bool,
) -> Vec<Feature> {
    let losses = HostLimits {
        backend: Some(backend),
        layout_error: compat.layout_error(),
        symbols_hidden: host_addresses_hidden(),
        explain: true,
        stacks: true,
    }
    .degraded();
    let mut out = Vec::new();
    let mut feature = |name, programs: &[(&'static str, Kind)], extra: Option<Status>| {
        let mut loaded = Vec::new();
        let mut variants = Vec::new();
        let mut status = Status::Works;
        for &(p, kind) in programs {
            let r = match kind {
                Kind::UProbe => object.program::<UProbe>(p).map(|_| ()),
                Kind::TracePoint => object.program::<TracePoint>(p).map(|_| ()),
                Kind::PerfEvent => object.program::<PerfEvent>(p).map(|_| ()),
            };
            match r {
                Ok(()) => loaded.push(compat.program(p).to_owned()),
                Err(e) => {
                    status = Status::Unavailable(format!("{e:#}"));
                    break;
                }
            }
            if let Some(f) = compat.fallback(p) {
                variants.push(format!(
                    "{}: no {} (Linux {})",
                    f.fallback,
                    f.helper.name(),
                    f.helper.since()
                ));
            }
        }
        if let (Status::Works, Some(s)) = (&status, extra) {
            status = s;
        }
        out.push(Feature {
            name,
            status,
            programs: loaded,
            variants,
        });
    };
    let pause_programs = [(STW_STOP, Kind::UProbe), (STW_START_RET, Kind::UProbe)];
    feature("pauses", &pause_programs, None);
    feature("stopping phase", &[(STW_STOPPED, Kind::UProbe)], None);
    let sched: Vec<_> = SCHED_PROGRAMS
        .iter()
        .map(|&(p, _, _)| (p, Kind::TracePoint))
        .collect();
    feature("explanation", &sched, None);
    let mut kernel_programs = sched.clone();
    kernel_programs.push((LAGGARD_SAMPLER, Kind::PerfEvent));
    feature(
        KERNEL_WAITS,
        &kernel_programs,
        degraded_status(&losses, KERNEL_WAITS),
    );
    feature(
        STACK_GROWTH_SAMPLED,
        &[(STACK_SAMPLE, Kind::PerfEvent)],
        degraded_status(&losses, STACK_GROWTH_SAMPLED),
    );
    feature("stack growth (exact)", &[(STACK_COPY, Kind::UProbe)], None);
    let degraded = degraded_status(&losses, FAULTS);
    let fault = fault_feature(object, compat, backend, begin_tracepoints, degraded);
    let agent = if out[0].status == Status::Works {
        Status::Works
    } else {
        Status::Unavailable("pauses cannot be traced".into())
    };
    out.push(fault);
    out.push(Feature {
        name: "agent",
        status: agent,
        programs: Vec::new(),
        variants: Vec::new(),
    });
    out
}

#[derive(Clone, Copy)]
enum Kind {
    UProbe,
    TracePoint,
    PerfEvent,
}

/// `name`'s loss here, as a status.
fn degraded_status(losses: &[Degraded], name: &str) -> Option<Status> {
    losses
        .iter()
        .find(|d| d.feature == name)
        .map(|d| Status::Degraded(d.why.clone()))
}

fn fault_feature(
    object: &mut Object,
    compat: &Compat,
    backend: &BackendChoice,
    begin_tracepoints: bool,
    degraded: Option<Status>,
) -> Feature {
    let mut f = Feature {
        name: FAULTS,
        status: Status::Works,
        programs: Vec::new(),
        variants: Vec::new(),
    };
    let loaded = match backend.backend {
        FaultBackend::None => Err(anyhow::anyhow!("{}", backend.reason)),
        FaultBackend::Kprobe => {
            f.programs = fault_programs::KPROBES
                .iter()
                .map(|k| k.0.to_owned())
                .collect();
            faults::load_kprobe_programs(object)
        }
        FaultBackend::Tracepoint => {
            let perf_begin = !begin_tracepoints;
            let (tracepoints, perf) = faults::tracepoint_programs(perf_begin);
            f.programs = tracepoints
                .map(|t| compat.program(t.0).to_owned())
                .chain(perf.into_iter().map(str::to_owned))
                .collect();
            if let Some(v) = compat.fallback(fault_programs::SWITCH) {
                f.variants.push(format!(
                    "{}: no {} (Linux {})",
                    v.fallback,
                    v.helper.name(),
                    v.helper.since()
                ));
            }
            faults::load_tracepoint_programs(object, false, perf_begin)
        }
    };
    f.status = match loaded {
        Err(e) => Status::Unavailable(format!("{e:#}")),
        Ok(()) => degraded.unwrap_or(Status::Works),
    };
    f
}

/// The report as text.
pub fn human(r: &CheckReport) -> String {
    let mut s = String::new();
    let yes = |b: bool| if b { "yes" } else { "no" };
    let _ = writeln!(s, "kernel       {}", r.kernel);
    let _ = writeln!(s, "BTF          {}", yes(r.btf));
    let _ = writeln!(s, "root         {}", yes(r.root));
    let _ = writeln!(s, "probe families:");
    for (name, ok, detail) in &r.families {
        let _ = writeln!(s, "  {name:<12} {:<4} {detail}", yes(*ok));
    }
    let _ = writeln!(
        s,
        "fault backend (auto): {}\n  {}",
        r.fault_backend.backend.describe(),
        r.fault_backend.reason
    );
    let _ = writeln!(s, "optional tracepoints:");
    for (tp, ok) in &r.optional_tracepoints {
        let _ = writeln!(s, "  {tp:<28} {}", yes(*ok));
    }
    let _ = writeln!(s, "features:");
    for f in &r.features {
        let status = match &f.status {
            Status::Works => "works".to_owned(),
            Status::Degraded(why) => format!("degraded: {why}"),
            Status::Unavailable(why) => format!("unavailable: {why}"),
        };
        let _ = writeln!(s, "  {:<24} {status}", f.name);
        for v in &f.variants {
            let _ = writeln!(s, "  {:<24}   older-kernel variant {v}", "");
        }
    }
    let _ = writeln!(s, "exit status {}", r.exit_code);
    s
}
