//! Advice from what was measured: each item a finding, the evidence that
//! shows it (numbers), and what to change. An item appears only when its
//! evidence passes the threshold named here (docs/guide/memory.md,
//! "Advice", lists them). The pause, stack-growth and throttling inputs are
//! plain structs the tracing engine fills from its summaries.

use super::{
    Exposure, HostSwapDelta,
    cgroup::{CgroupMemory, CgroupVersion, Limit},
    classes::MemoryClass,
};
use crate::{
    stackgrowth::recommend::{
        NEGLIGIBLE_COPIED_BYTES_PER_SEC, NEGLIGIBLE_CPU_SHARE, NEGLIGIBLE_GROWTHS_PER_SEC,
    },
    units::{fmt_bytes, fmt_ms, fmt_pct, fmt_short_duration},
};

/// GC metadata in swap at or above this (16 pages) is worth acting on: each
/// swapped page the GC reads is a major fault, often inside a pause.
pub const METADATA_SWAPPED_MIN_BYTES: u64 = 64 << 10;
/// A group using this share of its limit is at its limit (the GOGC /
/// GOMEMLIMIT action is added).
pub const NEAR_LIMIT_SHARE: f64 = 0.9;
/// Suggested `memory.high`, and `GOMEMLIMIT`, as a share of the limit.
pub const SUGGESTED_SHARE_OF_LIMIT: f64 = 0.9;
/// Pause advice: faults took at least this share of all pause time...
pub const PAUSE_FAULT_SHARE_MIN: f64 = 0.10;
/// A pause this long or longer is slow (reclaim and mmap_lock advice).
pub const SLOW_PAUSE_NS: u64 = 1_000_000;
/// Reclaim or mmap_lock advice: that part took at least this share of the
/// slow pauses' time (and `PAUSE_FAULT_MIN_NS` in all).
pub const KERNEL_PART_SHARE_MIN: f64 = 0.10;
/// ...and at least this much time in all.
pub const PAUSE_FAULT_MIN_NS: u64 = 1_000_000;
/// Throttling advice: at least this share of CFS periods throttled...
pub const THROTTLED_PERIODS_SHARE_MIN: f64 = 0.05;
/// With the periods unknown: throttled time at least this share of the
/// traced time...
pub const THROTTLED_TIME_SHARE_MIN: f64 = 0.05;
/// ...or at least this much throttled time inside pauses.
pub const THROTTLED_IN_PAUSES_MIN_NS: u64 = 1_000_000;

/// Which advice an item is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AdviceKind {
    GcMetadataSwapped,
    PauseFaults,
    Reclaim,
    MmapLock,
    StackGrowth,
    Throttling,
}

/// One piece of advice.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Advice {
    pub kind: AdviceKind,
    /// What is wrong.
    pub finding: String,
    /// The measured numbers that show it.
    pub evidence: String,
    /// What to change.
    pub action: String,
}

/// Faults inside stop-the-world pauses over a trace (from the pause and
/// fault correlation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PauseEvidence {
    pub pauses: u64,
    pub pause_ns: u64,
    pub pauses_with_faults: u64,
    pub faults_in_pauses: u64,
    /// Of those, swap-ins and file-backed faults, when the backend tells.
    pub swap_in_faults_in_pauses: Option<u64>,
    pub file_faults_in_pauses: Option<u64>,
    /// Time in faults that began inside pauses.
    pub fault_ns_in_pauses: u64,
    /// The pause with the most fault time: its length and that fault time
    /// (the longest pause may have had none).
    pub most_faulted_pause_ns: u64,
    pub most_faulted_pause_fault_ns: u64,
    /// Explained pauses of `SLOW_PAUSE_NS` or more, and their time.
    pub slow_pauses: u64,
    pub slow_pause_ns: u64,
    /// Of those, the ones whose breakdown has a `reclaim` part, and that
    /// part added up.
    pub slow_pauses_reclaim: u64,
    pub reclaim_ns: u64,
    /// The same for the `mmap_lock` part, and for sleeps in gostw's own
    /// probe (`kernel_waits` of kind `uprobe`, asleep: the probe's lookup
    /// sleeps only on that lock), counted with it.
    pub slow_pauses_mmap_lock: u64,
    pub mmap_lock_ns: u64,
    pub probe_lock_ns: u64,
}

/// The top stack-growth site.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct StackSite {
    pub function: String,
    /// `file:line`, when known.
    pub location: Option<String>,
    /// Share of all growths.
    pub share: f64,
    /// The size its growths reach most often.
    pub grown_to_bytes: Option<u64>,
}

/// Goroutine stack growth over a trace (from the stack-growth summary).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct StackGrowthEvidence {
    /// Exact mode rates.
    pub growths_per_sec: Option<f64>,
    pub copied_bytes_per_sec: Option<f64>,
    /// Sampled mode: share of the process's CPU time copying stacks.
    pub cpu_share: Option<f64>,
    pub current_starting_stack_bytes: u64,
    /// The starting stack that would have avoided most growths.
    pub recommended_starting_stack_bytes: Option<u64>,
    pub avoided_fraction: f64,
    pub top_site: Option<StackSite>,
}

/// CPU throttling (CFS quota) over a trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct ThrottlingEvidence {
    /// CFS periods (0: not known; then `traced_ns` is the measure).
    pub periods: u64,
    pub throttled_periods: u64,
    pub throttled_ns: u64,
    /// Pauses that were throttled and the throttled time inside them.
    pub pauses_throttled: Option<u64>,
    pub throttled_ns_in_pauses: Option<u64>,
    /// The quota in CPUs, and the process's GOMAXPROCS, when known.
    pub quota_cpus: Option<f64>,
    pub gomaxprocs: Option<u64>,
    /// How long the process was traced (for throttled time as a share of it
    /// when the periods are not known).
    pub traced_ns: Option<u64>,
}

/// Everything measured besides the exposure itself; absent parts give no advice.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Evidence {
    pub host_swap: Option<HostSwapDelta>,
    pub pauses: Option<PauseEvidence>,
    pub stack_growth: Option<StackGrowthEvidence>,
    pub throttling: Option<ThrottlingEvidence>,
}

/// The advice the evidence supports, most urgent first.
pub fn advice(exposure: &Exposure, evidence: &Evidence) -> Vec<Advice> {
    let mut out = Vec::new();
    out.extend(metadata_swapped(exposure, evidence));
    out.extend(
        evidence
            .pauses
            .as_ref()
            .and_then(|p| pause_faults(exposure, p)),
    );
    if let Some(p) = &evidence.pauses {
        out.extend(reclaim(exposure, p));
        out.extend(mmap_lock(p));
    }
    out.extend(evidence.throttling.as_ref().and_then(throttling));
    out.extend(evidence.stack_growth.as_ref().and_then(stack_growth));
    out
}

fn metadata_swapped(e: &Exposure, ev: &Evidence) -> Option<Advice> {
    let meta = e.class(MemoryClass::GcMetadata);
    let reads = &e.gc_metadata_reads;
    if reads.swapped_bytes < METADATA_SWAPPED_MIN_BYTES {
        return None;
    }
    let mut evidence = format!(
        "{} of GC metadata in swap ({} of the {} it holds); the next GC reads it: up to {} major faults ({} with {}-page swap readahead)",
        fmt_bytes(reads.swapped_bytes),
        fmt_pct(reads.swapped_bytes as f64 / meta.usage.touched_bytes().max(1) as f64),
        fmt_bytes(meta.usage.touched_bytes()),
        reads.faults_at_most,
        reads.faults_at_least,
        reads.readahead_pages
    );
    if let Some(p) = ev.pauses.filter(|p| p.faults_in_pauses > 0) {
        let per_fault = p.fault_ns_in_pauses / p.faults_in_pauses;
        evidence += &format!(
            ", about {} at the {} per fault measured in pauses",
            fmt_ms(per_fault.saturating_mul(reads.faults_at_least)),
            fmt_short_duration(per_fault)
        );
    }
    let heap = e.class(MemoryClass::HeapArenas);
    if heap.usage.swapped_bytes > 0 {
        evidence += &format!(
            "; heap arenas: {} in swap",
            fmt_bytes(heap.usage.swapped_bytes)
        );
    }
    if let Some(c) = &e.cgroup {
        evidence += &format!("; {}", cgroup_summary(c));
    }
    if let Some(h) = &ev.host_swap {
        evidence += &format!(
            "; host: {:.0} pages/s swapped in, {:.0} out over {:.1} s",
            h.pswpin_per_sec, h.pswpout_per_sec, h.interval_secs
        );
        if let Some(r) = h.readahead_hit_ratio {
            evidence += &format!(", swap readahead hit {}", fmt_pct(r));
        }
    }
    Some(Advice {
        kind: AdviceKind::GcMetadataSwapped,
        finding: "the Go runtime's GC metadata is swapped out: the next GC faults it back in, \
                  much of it inside stop-the-world pauses"
            .into(),
        evidence,
        action: metadata_actions(e).join("; or "),
    })
}

fn cgroup_summary(c: &CgroupMemory) -> String {
    let v = match c.version {
        CgroupVersion::V1 => "v1",
        CgroupVersion::V2 => "v2",
    };
    let lim = |l: Option<Limit>| match l {
        Some(Limit::Bytes(b)) => fmt_bytes(b),
        Some(Limit::Max) => "max".into(),
        None => "?".into(),
    };
    let mut s = format!("cgroup {v} {}", c.path);
    if c.dir.is_none() {
        return s + " (no memory controller)";
    }
    s += &format!(
        ": usage {}, limit {}",
        c.usage_bytes.map_or("?".into(), fmt_bytes),
        lim(c.effective_limit)
    );
    if c.version == CgroupVersion::V2 {
        s += &format!(", high {}", lim(c.high));
    }
    s += &format!(
        ", swap {} (limit {})",
        c.swap_current_bytes.map_or("?".into(), fmt_bytes),
        lim(c.swap_limit)
    );
    if let Some(sw) = c.swappiness {
        s += &format!(", swappiness {sw}");
    }
    s
}

/// The actions that fit the process's cgroup, best first.
fn metadata_actions(e: &Exposure) -> Vec<String> {
    let mut a = Vec::new();
    let group = e.cgroup.as_ref().filter(|c| c.dir.is_some());
    let limit = group.and_then(|c| c.effective_limit).and_then(Limit::bytes);
    let share = |b: u64| (b as f64 * SUGGESTED_SHARE_OF_LIMIT) as u64;
    match group {
        Some(c) if c.version == CgroupVersion::V2 => {
            if let (Some(max), Some(Limit::Max) | None) = (c.limit.and_then(Limit::bytes), c.high) {
                a.push(format!(
                    "set memory.high to about {} (below memory.max {}) for {}: the kernel then reclaims and throttles the group gradually, instead of reclaiming whatever is cold (the runtime's metadata between GCs) when it hits the hard limit",
                    fmt_bytes(share(max)),
                    fmt_bytes(max),
                    c.path
                ));
            }
            if c.swap_limit != Some(Limit::Bytes(0)) {
                a.push(format!(
                    "turn swap off for the group: memory.swap.max=0 for {}",
                    c.path
                ));
            }
        }
        Some(c) => {
            if c.swappiness.is_some_and(|s| s > 0) {
                a.push(format!(
                    "set memory.swappiness=0 for {} (cgroup v1: the group's own reclaim then leaves anonymous memory in place)",
                    c.path
                ));
            }
            if let (Some(l), true) = (
                c.limit.and_then(Limit::bytes),
                c.swap_limit != Some(Limit::Bytes(0)),
            ) {
                a.push(format!(
                    "turn swap off for the group: memory.memsw.limit_in_bytes = memory.limit_in_bytes ({}) for {}",
                    fmt_bytes(l),
                    c.path
                ));
            }
        }
        None => {}
    }
    let near_limit = match (group.and_then(|c| c.usage_bytes), limit) {
        (Some(u), Some(l)) => u as f64 >= NEAR_LIMIT_SHARE * l as f64,
        _ => false,
    };
    if let (true, Some(l)) = (near_limit, limit) {
        a.push(format!(
            "lower GOGC, or set GOMEMLIMIT={}MiB (under the {} limit), so the heap's peak leaves the group room and reclaim need not swap the runtime",
            share(l) >> 20,
            fmt_bytes(l)
        ));
    }
    let host_swappiness = e.host.swappiness.map_or("?".into(), |s| s.to_string());
    match (group, limit) {
        (None, _) => a.push(format!(
            "run the process in a memory cgroup with swap off for it (v2 memory.swap.max=0, v1 memory.swappiness=0), or lower the host's vm.swappiness (now {host_swappiness}): no group limit applies, so the host's own reclaim swapped it"
        )),
        (Some(_), None) => a.push(format!(
            "lower the host's vm.swappiness (now {host_swappiness}): the group has no memory limit, so the host's own reclaim swapped it"
        )),
        _ => {}
    }
    if a.is_empty() {
        a.push("turn swap off for the process's cgroup, or give it more memory".into());
    }
    a
}

/// `part` of the slow pauses is worth advice: its time and share.
fn kernel_part(p: &PauseEvidence, part_ns: u64) -> Option<f64> {
    let share = part_ns as f64 / p.slow_pause_ns.max(1) as f64;
    (part_ns >= PAUSE_FAULT_MIN_NS && share >= KERNEL_PART_SHARE_MIN).then_some(share)
}

/// "n of m slow pauses (1 ms or more) waited on WHAT: x ms of their y ms (z%)".
fn slow_share(p: &PauseEvidence, n: u64, what: &str, part_ns: u64, share: f64) -> String {
    format!(
        "{n} of {} slow pauses ({} or more) waited on {what}: {} of their {} ({})",
        p.slow_pauses,
        fmt_short_duration(SLOW_PAUSE_NS),
        fmt_ms(part_ns),
        fmt_ms(p.slow_pause_ns),
        fmt_pct(share.min(1.0))
    )
}

/// Slow pauses that waited while a thread they needed freed memory.
fn reclaim(e: &Exposure, p: &PauseEvidence) -> Option<Advice> {
    let share = kernel_part(p, p.reclaim_ns)?;
    let mut evidence = slow_share(p, p.slow_pauses_reclaim, "reclaim", p.reclaim_ns, share);
    let group = e.cgroup.as_ref().filter(|c| c.dir.is_some());
    let limit = group.and_then(|c| c.effective_limit).and_then(Limit::bytes);
    // Usage is read once, at the end, and reclaim brings it down: the
    // group's own count of reaching its limit (v1 `failcnt`, v2
    // `memory.events` max) says it too.
    let hit_limit = group
        .and_then(|c| c.events.get("failcnt").or_else(|| c.events.get("max")))
        .copied()
        .filter(|&n| n > 0);
    let at_limit = match (group.and_then(|c| c.usage_bytes), limit) {
        (Some(u), Some(l)) => u as f64 >= NEAR_LIMIT_SHARE * l as f64 || hit_limit.is_some(),
        _ => false,
    };
    if let Some(c) = group {
        evidence += &format!("; {}", cgroup_summary(c));
        if let Some(n) = hit_limit {
            evidence += &format!(", at its limit {n} times");
        }
        if let Some(pc) = c.page_cache {
            evidence += &format!(
                ", page cache {} ({} dirty, {} under writeback)",
                fmt_bytes(pc.bytes),
                fmt_bytes(pc.dirty_bytes),
                fmt_bytes(pc.writeback_bytes)
            );
        }
    }
    let (finding, action) = match (group, limit) {
        (Some(c), Some(l)) if at_limit => (
            format!(
                "slow pauses waited on reclaim in memory cgroup {} at its limit: a thread the stop waited for had to free the group's memory before it got a fresh page",
                c.path
            ),
            format!(
                "give the group room for the program and the page cache it keeps (limit {}), or keep that page cache small: dirty pages (a writer in the group: logs, files) make reclaim wait for the disk, so write them back sooner (fdatasync, O_DIRECT) or move the writer to a group of its own{}",
                fmt_bytes(l),
                if c.version == CgroupVersion::V2 {
                    "; memory.high below memory.max lets the kernel reclaim before the hard limit, outside the pauses"
                } else {
                    ""
                }
            ),
        ),
        _ => (
            "slow pauses waited on reclaim: a thread the stop waited for had to free memory before it got a fresh page".to_owned(),
            "the host (or the group) is short of free memory: free some, or have kswapd start earlier (vm.watermark_scale_factor, vm.min_free_kbytes) so allocating threads reclaim less themselves".to_owned(),
        ),
    };
    Some(Advice {
        kind: AdviceKind::Reclaim,
        finding,
        evidence,
        action,
    })
}

/// Slow pauses that waited for the process's address-space lock.
fn mmap_lock(p: &PauseEvidence) -> Option<Advice> {
    let ns = p.mmap_lock_ns + p.probe_lock_ns;
    let share = kernel_part(p, ns)?;
    let mut evidence = slow_share(p, p.slow_pauses_mmap_lock, "mmap_lock", ns, share);
    if p.probe_lock_ns > 0 {
        evidence += &format!(
            "; {} of it in gostw's own probe, whose lookup waits for the same lock (--no-stopping keeps that probe out of the pause)",
            fmt_ms(p.probe_lock_ns)
        );
    }
    Some(Advice {
        kind: AdviceKind::MmapLock,
        finding: "slow pauses waited for the process's address-space lock (mmap_lock): another thread held it for writing while a thread the stop needed took a page fault".into(),
        evidence,
        action: "find what maps, unmaps or changes the protection of memory in the process while GCs run (a cgo library's mmap, munmap or mprotect, madvise of large ranges): each call holds the lock for writing over its whole range; make such calls fewer or smaller, or keep them off the hot path; the pauses' kernel_waits show where they waited".into(),
    })
}

fn pause_faults(e: &Exposure, p: &PauseEvidence) -> Option<Advice> {
    if p.pause_ns == 0 || p.fault_ns_in_pauses < PAUSE_FAULT_MIN_NS {
        return None;
    }
    let share = p.fault_ns_in_pauses as f64 / p.pause_ns as f64;
    if share < PAUSE_FAULT_SHARE_MIN {
        return None;
    }
    let mut evidence = format!(
        "{} of {} pauses had major faults ({} faults); faults took {} of {} pause time ({}); the pause with the most fault time: {}, {} of it in faults",
        p.pauses_with_faults,
        p.pauses,
        p.faults_in_pauses,
        fmt_ms(p.fault_ns_in_pauses),
        fmt_ms(p.pause_ns),
        fmt_pct(share.min(1.0)),
        fmt_ms(p.most_faulted_pause_ns),
        fmt_pct(p.most_faulted_pause_fault_ns as f64 / p.most_faulted_pause_ns.max(1) as f64)
    );
    if let (Some(s), Some(f)) = (p.swap_in_faults_in_pauses, p.file_faults_in_pauses) {
        evidence += &format!(" ({s} swap-ins, {f} file-backed)");
    }
    let metadata_swapped = e.gc_metadata_reads.swapped_bytes >= METADATA_SWAPPED_MIN_BYTES;
    let action = if metadata_swapped {
        "keep the runtime's GC metadata in memory (see the GC metadata advice): the pauses wait on it".to_owned()
    } else if p
        .file_faults_in_pauses
        .is_some_and(|f| f * 2 > p.faults_in_pauses)
    {
        "the faults read the program's own file pages back: give its cgroup memory headroom (or memory.low / memory.min) so its binary stays in the page cache".to_owned()
    } else {
        "keep the process out of swap (swap off for its cgroup, or a lower swappiness); `gostw faults` names the code that faulted".to_owned()
    };
    Some(Advice {
        kind: AdviceKind::PauseFaults,
        finding: "major page faults lengthened stop-the-world pauses".into(),
        evidence,
        action,
    })
}

fn throttling(t: &ThrottlingEvidence) -> Option<Advice> {
    let in_pauses = t.throttled_ns_in_pauses.unwrap_or(0);
    let (share, min, mut evidence) = if t.periods > 0 {
        let share = t.throttled_periods as f64 / t.periods as f64;
        let text = format!(
            "{} of {} CFS periods throttled ({}), {} throttled in all",
            t.throttled_periods,
            t.periods,
            fmt_pct(share),
            fmt_ms(t.throttled_ns)
        );
        (share, THROTTLED_PERIODS_SHARE_MIN, text)
    } else {
        let traced = t.traced_ns.unwrap_or(0);
        let share = t.throttled_ns as f64 / traced.max(1) as f64;
        let text = format!(
            "{} CFS periods throttled, {} throttled in {} traced ({})",
            t.throttled_periods,
            fmt_ms(t.throttled_ns),
            fmt_ms(traced),
            fmt_pct(share)
        );
        let share = if traced == 0 { 0.0 } else { share };
        (share, THROTTLED_TIME_SHARE_MIN, text)
    };
    if share < min && in_pauses < THROTTLED_IN_PAUSES_MIN_NS {
        return None;
    }
    if let (Some(n), Some(ns)) = (t.pauses_throttled, t.throttled_ns_in_pauses) {
        evidence += &format!("; {n} pauses throttled, {} inside them", fmt_ms(ns));
    }
    let mut action = "raise the CPU quota (cpu.max, or cpu.cfs_quota_us on v1)".to_owned();
    match (t.quota_cpus, t.gomaxprocs) {
        (Some(q), Some(g)) if (g as f64) > q.ceil() => {
            action += &format!(
                ", or set GOMAXPROCS={} to match the {q:.1}-CPU quota (now {g}): more Ps than the quota lets the GC's workers use it up and get the whole process throttled, pauses included",
                q.ceil() as u64
            )
        }
        _ => action += ", or lower GOMAXPROCS to the quota",
    }
    Some(Advice {
        kind: AdviceKind::Throttling,
        finding: "the process is CPU-throttled by its cgroup quota, pauses included".into(),
        evidence,
        action,
    })
}

fn stack_growth(s: &StackGrowthEvidence) -> Option<Advice> {
    let over = s
        .growths_per_sec
        .is_some_and(|r| r >= NEGLIGIBLE_GROWTHS_PER_SEC)
        || s.copied_bytes_per_sec
            .is_some_and(|r| r >= NEGLIGIBLE_COPIED_BYTES_PER_SEC)
        || s.cpu_share.is_some_and(|c| c >= NEGLIGIBLE_CPU_SHARE);
    if !over {
        return None;
    }
    let mut evidence = Vec::new();
    if let (Some(g), Some(c)) = (s.growths_per_sec, s.copied_bytes_per_sec) {
        evidence.push(format!(
            "{g:.0} growths/s copying {}/s",
            fmt_bytes(c as u64)
        ));
    }
    if let Some(c) = s.cpu_share {
        evidence.push(format!("{} of CPU time copying stacks", fmt_pct(c)));
    }
    if let Some(t) = &s.top_site {
        evidence.push(format!(
            "top site {}{} ({} of growths{})",
            t.function,
            t.location
                .as_deref()
                .map_or(String::new(), |l| format!(" at {l}")),
            fmt_pct(t.share),
            t.grown_to_bytes
                .map_or(String::new(), |b| format!(", to {}", fmt_bytes(b)))
        ));
    }
    evidence.push(format!(
        "goroutines start at {}",
        fmt_bytes(s.current_starting_stack_bytes)
    ));
    let mut actions = Vec::new();
    if let Some(r) = s.recommended_starting_stack_bytes {
        actions.push(format!(
            "start goroutines bigger: a {} start would avoid {} of growths (Go has no per-goroutine setting; GODEBUG=adaptivestackstart=1 starts new goroutines at the average stack size the last GC saw)",
            fmt_bytes(r),
            fmt_pct(s.avoided_fraction)
        ));
    }
    let site = s.top_site.as_ref().map(|t| t.function.as_str());
    actions.push(format!(
        "run the work in a pool of long-lived goroutines{}: their grown stacks are kept",
        site.map_or(String::new(), |f| format!(" (those calling {f})"))
    ));
    if let Some(f) = site {
        actions.push(format!(
            "move the large frame of {f} off the stack (heap-allocate or reuse its big locals)"
        ));
    }
    Some(Advice {
        kind: AdviceKind::StackGrowth,
        finding: "goroutine stack growth costs CPU".into(),
        evidence: evidence.join("; "),
        action: actions.join("; or "),
    })
}

#[cfg(test)]
#[path = "advice_tests.rs"]
pub(crate) mod tests;
