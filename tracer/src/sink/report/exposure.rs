//! The summary's memory exposure and advice (`attach`, `run`): the traced
//! process's exposure at the end of its trace (or its last read before it
//! exited), the figures it started with, the host's swap traffic over the
//! trace, and advice from what the trace measured: faults inside pauses,
//! stack growth, CFS throttling.

use std::{collections::HashMap, fmt::Write as _, sync::Arc};

use serde::Serialize;

use crate::{
    memory::{
        Advice, Evidence, Exposure, HostSwapDelta, MemoryClass, PauseEvidence, SLOW_PAUSE_NS,
        StackGrowthEvidence, StackSite, ThrottlingEvidence, advice,
        render::{render_advice, render_exposure},
        watch::{ExposureReading, ReadAt},
    },
    model::throttling::CpuThrottling,
    model::{kernel_wait::WaitKind, observed::ObservedPause},
    stackgrowth::StackGrowthSummary,
    units::fmt_bytes,
};

/// A few figures of an exposure (the one the trace started with).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ExposureBrief {
    /// `CLOCK_MONOTONIC` when read, ns.
    pub at_ns: u64,
    pub resident_bytes: u64,
    pub swapped_bytes: u64,
    pub heap_arenas_swapped_bytes: u64,
    pub gc_metadata_swapped_bytes: u64,
}

impl ExposureBrief {
    fn of(e: &Exposure) -> ExposureBrief {
        ExposureBrief {
            at_ns: e.at_ns,
            resident_bytes: e.total.resident_bytes,
            swapped_bytes: e.total.swapped_bytes,
            heap_arenas_swapped_bytes: e.class(MemoryClass::HeapArenas).usage.swapped_bytes,
            gc_metadata_swapped_bytes: e.class(MemoryClass::GcMetadata).usage.swapped_bytes,
        }
    }
}

/// The summary's `exposure` section.
#[derive(Clone, Debug, Serialize)]
pub struct ExposureSection {
    pub pid: u32,
    /// When `exposure` was read: `end` (the process alive), `last_before_exit`
    /// (its last refresh), or `refresh` (a summary before the end).
    pub read_at: ReadAt,
    pub exposure: Option<Exposure>,
    /// Why the last read failed, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What the first read found.
    pub at_start: Option<ExposureBrief>,
    /// The host's swap traffic from the start of the trace to its end.
    pub host_swap: Option<HostSwapDelta>,
    /// Reads made, and what they took (ms).
    pub reads: u64,
    pub read_ms_mean: f64,
    pub read_ms_max: f64,
}

/// One process's readings and the pause evidence.
#[derive(Default)]
struct Watched {
    first: Option<Arc<ExposureReading>>,
    last: Option<Arc<ExposureReading>>,
    reads: u64,
    read_ns: u64,
    read_ns_max: u64,
    pauses: PauseEvidence,
    /// A pause whose faults' kinds were not all told.
    kinds_unknown: bool,
}

/// What the report sink keeps for the exposure section.
#[derive(Default)]
pub struct ExposureReport {
    processes: HashMap<u32, Watched>,
}

impl ExposureReport {
    /// A reading came in.
    pub fn reading(&mut self, r: &Arc<ExposureReading>) {
        let w = self.processes.entry(r.pid).or_default();
        // The last refresh standing for the end was counted when it was read.
        if r.at != ReadAt::LastBeforeExit {
            w.reads += 1;
            w.read_ns += r.read_ns;
            w.read_ns_max = w.read_ns_max.max(r.read_ns);
        }
        if w.first.is_none() && r.exposure.is_ok() {
            w.first = Some(r.clone());
        }
        // A failed read does not hide the last good one.
        if r.exposure.is_ok() || w.last.is_none() {
            w.last = Some(r.clone());
        }
    }

    /// A pause, with the faults that began inside it.
    pub fn pause(&mut self, p: &ObservedPause) {
        let w = self.processes.entry(p.record.pid).or_default();
        let e = &mut w.pauses;
        let d = p.record.duration_ns;
        e.pauses += 1;
        e.pause_ns += d;
        let all = p.record.faults.as_ref().map(|f| f.all).unwrap_or_default();
        e.faults_in_pauses += all.faults;
        e.pauses_with_faults += u64::from(all.faults > 0);
        e.fault_ns_in_pauses += all.fault_ns;
        *e.swap_in_faults_in_pauses.get_or_insert(0) += all.swap_in;
        *e.file_faults_in_pauses.get_or_insert(0) += all.file_backed;
        if let Some(b) = p.record.breakdown.as_deref().filter(|_| d >= SLOW_PAUSE_NS) {
            e.slow_pauses += 1;
            e.slow_pause_ns += d;
            e.slow_pauses_reclaim += u64::from(b.reclaim_ns > 0);
            e.reclaim_ns += b.reclaim_ns;
            let probe_lock_ns: u64 = p
                .record
                .kernel_waits
                .iter()
                .flatten()
                .filter(|w| w.kind == WaitKind::Uprobe && !w.on_cpu)
                .map(|w| w.ns)
                .sum();
            e.slow_pauses_mmap_lock += u64::from(b.mmap_lock_ns + probe_lock_ns > 0);
            e.mmap_lock_ns += b.mmap_lock_ns;
            e.probe_lock_ns += probe_lock_ns;
        }
        w.kinds_unknown |= all.unknown_kind > 0;
        if all.fault_ns > e.most_faulted_pause_fault_ns {
            e.most_faulted_pause_ns = d;
            e.most_faulted_pause_fault_ns = all.fault_ns;
        }
    }

    /// The section of process `pid`, when it was read at all.
    pub fn section(&self, pid: u32) -> Option<ExposureSection> {
        let w = self.processes.get(&pid)?;
        let last = w.last.as_ref()?;
        Some(ExposureSection {
            pid,
            read_at: last.at,
            exposure: last.exposure.as_ref().ok().cloned(),
            error: last.exposure.as_ref().err().cloned(),
            at_start: w
                .first
                .as_ref()
                .and_then(|f| f.exposure.as_ref().ok())
                .map(ExposureBrief::of),
            host_swap: last.host_swap,
            reads: w.reads,
            read_ms_mean: w.read_ns as f64 / w.reads.max(1) as f64 / 1e6,
            read_ms_max: w.read_ns_max as f64 / 1e6,
        })
    }

    /// The advice for process `pid` from its last exposure and what the
    /// trace measured (none without an exposure).
    pub fn advice(
        &self,
        pid: u32,
        stacks: Option<&StackGrowthSummary>,
        throttling: Option<&CpuThrottling>,
        traced_ns: u64,
    ) -> Vec<Advice> {
        let Some(w) = self.processes.get(&pid) else {
            return Vec::new();
        };
        let Some(Ok(exposure)) = w.last.as_ref().map(|l| &l.exposure) else {
            return Vec::new();
        };
        let mut pauses = w.pauses;
        if w.kinds_unknown {
            pauses.swap_in_faults_in_pauses = None;
            pauses.file_faults_in_pauses = None;
        }
        let evidence = Evidence {
            host_swap: w.last.as_ref().and_then(|l| l.host_swap),
            pauses: (pauses.pauses > 0).then_some(pauses),
            stack_growth: stacks.map(stack_evidence),
            throttling: throttling.map(|t| ThrottlingEvidence {
                throttled_periods: t.while_traced.nr_throttled,
                throttled_ns: t.while_traced.throttled_ns,
                traced_ns: Some(traced_ns),
                ..ThrottlingEvidence::default()
            }),
        };
        advice(exposure, &evidence)
    }
}

/// The advice's view of a stack-growth summary.
fn stack_evidence(s: &StackGrowthSummary) -> StackGrowthEvidence {
    let r = &s.recommendation;
    StackGrowthEvidence {
        growths_per_sec: s.growths_per_sec,
        copied_bytes_per_sec: s.copied_bytes_per_sec,
        // A negligible share (too few samples, or under 1%) is no evidence.
        cpu_share: s.cpu_share.filter(|_| !r.negligible),
        current_starting_stack_bytes: r.current_starting_stack_bytes,
        recommended_starting_stack_bytes: r.starting_stack_bytes.filter(|_| !r.negligible),
        avoided_fraction: r.avoided_fraction,
        top_site: s.top_sites.first().map(|t| StackSite {
            function: t.site.function.clone(),
            location: (!t.site.file.is_empty()).then(|| format!("{}:{}", t.site.file, t.site.line)),
            share: t.share,
            grown_to_bytes: t
                .new_sizes
                .iter()
                .max_by_key(|&(size, n)| (*n, *size))
                .map(|(size, _)| *size),
        }),
    }
}

/// The section as text: the exposure table and the advice.
pub fn render_text(section: &ExposureSection, advice: &[Advice]) -> String {
    let mut t = String::new();
    let when = match section.read_at {
        ReadAt::End => "at the end of the trace",
        ReadAt::LastBeforeExit => "last read before the process exited",
        ReadAt::Start | ReadAt::Refresh => "latest read",
    };
    let _ = writeln!(
        t,
        "\nmemory exposure ({when}; {} reads, {:.1} ms each on average):",
        section.reads, section.read_ms_mean
    );
    match &section.exposure {
        Some(e) => t += &render_exposure(e, section.host_swap.as_ref()),
        None => {
            let _ = writeln!(
                t,
                "  not read: {}",
                section.error.as_deref().unwrap_or("unknown")
            );
        }
    }
    if let Some(s) = &section.at_start {
        let _ = writeln!(
            t,
            "at the start: {} resident, {} swapped ({} GC metadata, {} heap arenas)",
            fmt_bytes(s.resident_bytes),
            fmt_bytes(s.swapped_bytes),
            fmt_bytes(s.gc_metadata_swapped_bytes),
            fmt_bytes(s.heap_arenas_swapped_bytes)
        );
    }
    if advice.is_empty() {
        t += "advice: none (no finding passed its threshold)\n";
    } else {
        t += &render_advice(advice);
    }
    t
}

#[cfg(test)]
#[path = "exposure_tests.rs"]
mod tests;
