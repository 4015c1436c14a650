//! Advice from exposures and evidence: each item appears exactly when its
//! threshold is passed, cites the numbers, and fits the cgroup it is for.

use std::collections::BTreeMap;

use super::*;
use crate::memory::{
    ArenaSummary, ClassUsage, HostMemory, MetadataReads, Source, Usage,
    cgroup::{CgroupMemory, CgroupVersion, Limit, PageCache},
};

fn usage(resident: u64, swapped: u64) -> Usage {
    Usage {
        mapped_bytes: resident + swapped,
        reserved_bytes: 0,
        resident_bytes: resident,
        swapped_bytes: swapped,
    }
}

/// An exposure with these swapped bytes (for the sinks' tests too).
pub(crate) fn exposure(
    meta_swapped: u64,
    heap_swapped: u64,
    cgroup: Option<CgroupMemory>,
) -> Exposure {
    let class = |class, u| ClassUsage {
        class,
        source: Source::ArenaIndex,
        usage: u,
        mappings: 1,
        parts: vec![],
    };
    Exposure {
        pid: 42,
        exe: "/srv/app".into(),
        go_version: "go1.26.6".into(),
        symbols: true,
        dwarf: true,
        c_runtime: false,
        page_size: 4096,
        at_ns: 1,
        total: Usage::default(),
        classes: vec![
            class(MemoryClass::HeapArenas, usage(100 << 20, heap_swapped)),
            class(MemoryClass::GcMetadata, usage(4 << 20, meta_swapped)),
            class(MemoryClass::FileBacked, usage(2 << 20, 0)),
            class(MemoryClass::Other, usage(1 << 20, 0)),
        ],
        arenas: ArenaSummary {
            source: Source::ArenaIndex,
            count: 2,
            ranges: vec![],
        },
        gc_metadata_reads: MetadataReads::estimate(meta_swapped, heap_swapped, 4096, Some(3)),
        cgroup,
        host: HostMemory {
            swap_total_bytes: 1 << 30,
            swap_free_bytes: 1 << 29,
            swappiness: Some(60),
            page_cluster: Some(3),
        },
        notes: vec![],
    }
}

fn v1_group(usage: u64, limit: u64) -> CgroupMemory {
    CgroupMemory {
        version: CgroupVersion::V1,
        path: "/svc".into(),
        dir: Some("/sys/fs/cgroup/memory/svc".into()),
        usage_bytes: Some(usage),
        limit: Some(Limit::Bytes(limit)),
        effective_limit: Some(Limit::Bytes(limit)),
        high: None,
        swap_limit: Some(Limit::Max),
        swap_current_bytes: Some(90 << 20),
        swappiness: Some(60),
        page_cache: None,
        events: BTreeMap::new(),
        notes: vec![],
    }
}

fn v2_group(usage: u64, max: u64) -> CgroupMemory {
    CgroupMemory {
        version: CgroupVersion::V2,
        dir: Some("/sys/fs/cgroup/svc".into()),
        high: Some(Limit::Max),
        swappiness: None,
        ..v1_group(usage, max)
    }
}

#[test]
fn no_swapped_metadata_no_advice() {
    let e = exposure(0, 0, Some(v1_group(10 << 20, 1 << 30)));
    assert_eq!(advice(&e, &Evidence::default()), vec![]);
    // Just under the threshold: still none.
    let e = exposure(METADATA_SWAPPED_MIN_BYTES - 4096, 50 << 20, None);
    assert_eq!(advice(&e, &Evidence::default()), vec![]);
}

#[test]
fn swapped_metadata_in_a_v1_group_at_its_limit() {
    let e = exposure(3 << 20, 80 << 20, Some(v1_group(1000 << 20, 1 << 30)));
    let a = advice(&e, &Evidence::default());
    assert_eq!(a.len(), 1);
    let a = &a[0];
    assert_eq!(a.kind, AdviceKind::GcMetadataSwapped);
    // Cites the figures: 3 MiB of 7 MiB, 768 pages, 96 with readahead.
    assert!(
        a.evidence.contains("3.0 MiB of GC metadata in swap"),
        "{}",
        a.evidence
    );
    assert!(a.evidence.contains("42.9%"), "{}", a.evidence);
    assert!(
        a.evidence
            .contains("up to 768 major faults (96 with 8-page"),
        "{}",
        a.evidence
    );
    assert!(
        a.evidence.contains("heap arenas: 80.0 MiB in swap"),
        "{}",
        a.evidence
    );
    assert!(a.evidence.contains("cgroup v1 /svc"), "{}", a.evidence);
    // v1: swappiness for the group, swap off for it, and (at its limit) GOGC.
    assert!(
        a.action.contains("memory.swappiness=0 for /svc"),
        "{}",
        a.action
    );
    assert!(
        a.action.contains("memory.memsw.limit_in_bytes"),
        "{}",
        a.action
    );
    assert!(a.action.contains("GOMEMLIMIT=921MiB"), "{}", a.action);
    assert!(!a.action.contains("memory.high"), "{}", a.action);
}

#[test]
fn swapped_metadata_in_a_v2_group_far_from_its_limit() {
    let e = exposure(1 << 20, 0, Some(v2_group(100 << 20, 1 << 30)));
    let a = &advice(&e, &Evidence::default())[0];
    assert!(
        a.action.contains("memory.high to about 921.6 MiB"),
        "{}",
        a.action
    );
    assert!(a.action.contains("memory.swap.max=0"), "{}", a.action);
    assert!(
        !a.action.contains("GOGC"),
        "not near the limit: {}",
        a.action
    );
    assert!(a.evidence.contains("high max"), "{}", a.evidence);
}

#[test]
fn swapped_metadata_without_a_limit_points_at_the_host() {
    let e = exposure(1 << 20, 0, None);
    let ev = Evidence {
        host_swap: Some(HostSwapDelta {
            interval_secs: 2.0,
            pswpin: 400,
            pswpout: 0,
            swpin_zero: 0,
            swpout_zero: 0,
            pswpin_per_sec: 200.0,
            pswpout_per_sec: 0.0,
            swap_ra: 100,
            swap_ra_hit: 25,
            readahead_hit_ratio: Some(0.25),
            pgmajfault_per_sec: 200.0,
            swap_used_bytes: 1 << 29,
        }),
        ..Evidence::default()
    };
    let a = &advice(&e, &ev)[0];
    assert!(
        a.action
            .contains("run the process in a memory cgroup with swap off"),
        "{}",
        a.action
    );
    assert!(a.action.contains("vm.swappiness (now 60)"), "{}", a.action);
    assert!(
        a.evidence.contains("200 pages/s swapped in"),
        "{}",
        a.evidence
    );
    assert!(a.evidence.contains("readahead hit 25.0%"), "{}", a.evidence);
}

fn pauses(pause_ms: u64, fault_ms: u64) -> PauseEvidence {
    PauseEvidence {
        pauses: 20,
        pause_ns: pause_ms * 1_000_000,
        pauses_with_faults: 4,
        faults_in_pauses: 200,
        swap_in_faults_in_pauses: Some(200),
        file_faults_in_pauses: Some(0),
        fault_ns_in_pauses: fault_ms * 1_000_000,
        most_faulted_pause_ns: 8_000_000,
        most_faulted_pause_fault_ns: 6_000_000,
        ..PauseEvidence::default()
    }
}

/// 14 slow pauses of 52 ms in all, 12 of them with `reclaim_ms` of reclaim,
/// 3 with `lock_ms` waiting for mmap_lock; no major faults.
fn kernel_pauses(reclaim_ms: u64, lock_ms: u64) -> PauseEvidence {
    PauseEvidence {
        pauses: 40,
        pause_ns: 60_000_000,
        slow_pauses: 14,
        slow_pause_ns: 52_000_000,
        slow_pauses_reclaim: 12,
        reclaim_ns: reclaim_ms * 1_000_000,
        slow_pauses_mmap_lock: 3,
        mmap_lock_ns: lock_ms * 1_000_000,
        ..PauseEvidence::default()
    }
}

fn kinds(a: &[Advice]) -> Vec<AdviceKind> {
    a.iter().map(|a| a.kind).collect()
}

#[test]
fn reclaim_in_a_group_at_its_limit_names_the_group_and_its_page_cache() {
    let mut group = v1_group(63 << 20, 64 << 20);
    group.path = "/gostw-reclaim".into();
    group.page_cache = Some(PageCache {
        bytes: 50 << 20,
        dirty_bytes: 30 << 20,
        writeback_bytes: 8 << 20,
    });
    let ev = Evidence {
        pauses: Some(kernel_pauses(38, 0)),
        ..Evidence::default()
    };
    let a = advice(&exposure(0, 0, Some(group.clone())), &ev);
    assert_eq!(kinds(&a), [AdviceKind::Reclaim]);
    let r = &a[0];
    assert!(
        r.finding
            .contains("memory cgroup /gostw-reclaim at its limit"),
        "{}",
        r.finding
    );
    for part in [
        "12 of 14 slow pauses (1.0 ms or more) waited on reclaim: 38.0 ms of their 52.0 ms (73.1%)",
        "usage 63.0 MiB, limit 64.0 MiB",
        "page cache 50.0 MiB (30.0 MiB dirty, 8.0 MiB under writeback)",
    ] {
        assert!(r.evidence.contains(part), "{part:?} in {}", r.evidence);
    }
    assert!(r.action.contains("limit 64.0 MiB"), "{}", r.action);
    assert!(
        !r.action.contains("memory.high"),
        "v1 has none: {}",
        r.action
    );
    // v2 adds memory.high.
    let v2 = CgroupMemory {
        page_cache: group.page_cache,
        ..v2_group(63 << 20, 64 << 20)
    };
    let a = advice(&exposure(0, 0, Some(v2)), &ev);
    assert!(a[0].action.contains("memory.high"), "{}", a[0].action);
    // Below 90% when read, but the group reached its limit while traced
    // (reclaim had brought it down): v1's failcnt, v2's memory.events max.
    for (mut below, key) in [
        (v1_group(55 << 20, 64 << 20), "failcnt"),
        (v2_group(55 << 20, 64 << 20), "max"),
    ] {
        below.path = "/gostw-reclaim".into();
        below.events.insert(key.into(), 12);
        let a = advice(&exposure(0, 0, Some(below.clone())), &ev);
        assert!(a[0].finding.contains("at its limit"), "{}", a[0].finding);
        assert!(
            a[0].evidence.contains("at its limit 12 times"),
            "{}",
            a[0].evidence
        );
        // Without the count, 86% of the limit is not at it.
        below.events.clear();
        let a = advice(&exposure(0, 0, Some(below)), &ev);
        assert!(!a[0].finding.contains("at its limit"), "{}", a[0].finding);
    }
    // Far from its limit, the group is not blamed.
    let a = advice(&exposure(0, 0, Some(v1_group(10 << 20, 1 << 30))), &ev);
    assert!(!a[0].finding.contains("at its limit"), "{}", a[0].finding);
    assert!(
        a[0].action.contains("vm.watermark_scale_factor"),
        "{}",
        a[0].action
    );
}

#[test]
fn kernel_parts_under_either_threshold_give_nothing() {
    for (reclaim, lock) in [(0, 0), (5, 5)] {
        // 5 ms of 52: under 10%.
        let ev = Evidence {
            pauses: Some(kernel_pauses(reclaim, lock)),
            ..Evidence::default()
        };
        assert!(advice(&exposure(0, 0, None), &ev).is_empty());
    }
    // 10% of a short total, but under 1 ms in all.
    let mut p = kernel_pauses(0, 0);
    p.slow_pause_ns = 5_000_000;
    p.reclaim_ns = 900_000;
    let ev = Evidence {
        pauses: Some(p),
        ..Evidence::default()
    };
    assert!(advice(&exposure(0, 0, None), &ev).is_empty());
}

#[test]
fn mmap_lock_waits_name_the_lock_and_what_holds_it() {
    let ev = Evidence {
        pauses: Some(kernel_pauses(0, 20)),
        ..Evidence::default()
    };
    let a = advice(&exposure(0, 0, None), &ev);
    assert_eq!(kinds(&a), [AdviceKind::MmapLock]);
    assert!(
        a[0].evidence
            .contains("3 of 14 slow pauses (1.0 ms or more) waited on mmap_lock: 20.0 ms"),
        "{}",
        a[0].evidence
    );
    assert!(a[0].action.contains("munmap"), "{}", a[0].action);
    assert!(!a[0].evidence.contains("probe"), "{}", a[0].evidence);
    // Sleeps in gostw's own probe count, and are told apart.
    let mut p = kernel_pauses(0, 2);
    p.probe_lock_ns = 6_000_000;
    let ev = Evidence {
        pauses: Some(p),
        ..Evidence::default()
    };
    let a = advice(&exposure(0, 0, None), &ev);
    assert!(
        a[0].evidence
            .contains("waited on mmap_lock: 8.0 ms of their 52.0 ms (15.4%); 6.0 ms of it in gostw's own probe"),
        "{}",
        a[0].evidence
    );
}

#[test]
fn a_group_without_a_limit_gets_group_and_host_actions() {
    let mut group = v1_group(10 << 20, 0);
    group.limit = Some(Limit::Max);
    group.effective_limit = Some(Limit::Max);
    let e = exposure(1 << 20, 0, Some(group));
    let a = &advice(&e, &Evidence::default())[0];
    assert!(
        a.action.contains("memory.swappiness=0 for /svc"),
        "{}",
        a.action
    );
    assert!(
        a.action.contains("the group has no memory limit"),
        "{}",
        a.action
    );
    assert!(
        !a.action.contains("memsw"),
        "no limit to match: {}",
        a.action
    );
    assert!(!a.action.contains("GOMEMLIMIT"), "{}", a.action);
}

#[test]
fn pause_faults_over_the_threshold_say_how_much() {
    let e = exposure(2 << 20, 0, None);
    let ev = Evidence {
        pauses: Some(pauses(25, 20)),
        ..Evidence::default()
    };
    let a = advice(&e, &ev);
    assert_eq!(a.len(), 2);
    // The metadata item uses the measured time per fault: 0.1 ms x 64.
    assert!(
        a[0].evidence
            .contains("about 6.4 ms at the 100 us per fault"),
        "{}",
        a[0].evidence
    );
    let p = &a[1];
    assert_eq!(p.kind, AdviceKind::PauseFaults);
    assert!(
        p.evidence
            .contains("4 of 20 pauses had major faults (200 faults)"),
        "{}",
        p.evidence
    );
    assert!(
        p.evidence
            .contains("faults took 20.0 ms of 25.0 ms pause time (80.0%)"),
        "{}",
        p.evidence
    );
    assert!(
        p.evidence
            .contains("the pause with the most fault time: 8.0 ms, 75.0% of it in faults"),
        "{}",
        p.evidence
    );
    assert!(p.action.contains("GC metadata advice"), "{}", p.action);
}

#[test]
fn pause_faults_under_either_threshold_give_nothing() {
    let e = exposure(0, 0, None);
    // 0.9 ms of faults: under PAUSE_FAULT_MIN_NS.
    let mut small = pauses(2, 0);
    small.fault_ns_in_pauses = 900_000;
    // 2 ms of 100 ms: under PAUSE_FAULT_SHARE_MIN.
    for p in [small, pauses(100, 2)] {
        let ev = Evidence {
            pauses: Some(p),
            ..Evidence::default()
        };
        assert_eq!(advice(&e, &ev), vec![]);
    }
}

#[test]
fn stack_growth_uses_the_stack_growth_thresholds() {
    let e = exposure(0, 0, None);
    let site = StackSite {
        function: "main.handle".into(),
        location: Some("main.go:42".into()),
        share: 0.9,
        grown_to_bytes: Some(32768),
    };
    let busy = StackGrowthEvidence {
        cpu_share: Some(0.05),
        current_starting_stack_bytes: 2048,
        recommended_starting_stack_bytes: Some(32768),
        avoided_fraction: 0.99,
        top_site: Some(site),
        ..StackGrowthEvidence::default()
    };
    let a = advice(
        &e,
        &Evidence {
            stack_growth: Some(busy.clone()),
            ..Evidence::default()
        },
    );
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].kind, AdviceKind::StackGrowth);
    assert!(
        a[0].evidence.contains("5.0% of CPU time"),
        "{}",
        a[0].evidence
    );
    assert!(
        a[0].evidence
            .contains("main.handle at main.go:42 (90.0% of growths, to 32.0 KiB)")
    );
    assert!(
        a[0].action.contains("a 32.0 KiB start would avoid 99.0%"),
        "{}",
        a[0].action
    );
    assert!(a[0].action.contains("pool"));
    assert!(
        a[0].action
            .contains("move the large frame of main.handle off the stack")
    );
    let quiet = StackGrowthEvidence {
        cpu_share: Some(NEGLIGIBLE_CPU_SHARE / 2.0),
        ..busy
    };
    let ev = Evidence {
        stack_growth: Some(quiet),
        ..Evidence::default()
    };
    assert_eq!(advice(&e, &ev), vec![]);
}

#[test]
fn throttling_when_present() {
    let e = exposure(0, 0, None);
    let t = ThrottlingEvidence {
        periods: 1000,
        throttled_periods: 120,
        throttled_ns: 900_000_000,
        pauses_throttled: Some(7),
        throttled_ns_in_pauses: Some(30_000_000),
        quota_cpus: Some(1.5),
        gomaxprocs: Some(8),
        traced_ns: None,
    };
    let a = advice(
        &e,
        &Evidence {
            throttling: Some(t),
            ..Evidence::default()
        },
    );
    assert_eq!(a[0].kind, AdviceKind::Throttling);
    assert!(
        a[0].evidence
            .contains("120 of 1000 CFS periods throttled (12.0%)")
    );
    assert!(
        a[0].evidence
            .contains("7 pauses throttled, 30.0 ms inside them")
    );
    assert!(a[0].action.contains("GOMAXPROCS=2"), "{}", a[0].action);
    let calm = ThrottlingEvidence {
        throttled_periods: 10,
        throttled_ns_in_pauses: Some(0),
        ..t
    };
    let ev = Evidence {
        throttling: Some(calm),
        ..Evidence::default()
    };
    assert_eq!(advice(&e, &ev), vec![]);
}

#[test]
fn throttling_without_periods_is_a_share_of_the_traced_time() {
    let e = exposure(0, 0, None);
    let t = ThrottlingEvidence {
        throttled_periods: 40,
        throttled_ns: 600_000_000,
        traced_ns: Some(10_000_000_000),
        ..ThrottlingEvidence::default()
    };
    let ev = |t| Evidence {
        throttling: Some(t),
        ..Evidence::default()
    };
    let a = advice(&e, &ev(t));
    assert_eq!(a.len(), 1);
    assert!(
        a[0].evidence
            .contains("40 CFS periods throttled, 600.0 ms throttled in 10000.0 ms traced (6.0%)"),
        "{}",
        a[0].evidence
    );
    let calm = ThrottlingEvidence {
        throttled_ns: 400_000_000,
        ..t
    };
    assert_eq!(advice(&e, &ev(calm)), vec![]);
    // Without a traced time there is no share to judge.
    let unknown = ThrottlingEvidence {
        traced_ns: None,
        ..t
    };
    assert_eq!(advice(&e, &ev(unknown)), vec![]);
}
