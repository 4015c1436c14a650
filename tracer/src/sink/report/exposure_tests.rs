//! The summary's exposure section and advice, fed through the report sink.

use std::sync::Arc;

use super::*;
use crate::{
    memory::{AdviceKind, HostSwap, advice::tests::exposure},
    model::labels::ProcessLabels,
    model::pause::tests_support::record,
    model::throttling::ThrottleCounts,
    model::{
        fault::{FaultTotals, PauseFaultStats},
        observed::{Observed, ObservedPause, ProcessInfo},
    },
    sink::{
        Sink as _,
        report::{Output, ReportSink, View, tests::Buf},
    },
};

fn sink(json: bool) -> (ReportSink, Buf) {
    let buf = Buf::default();
    let mut s = ReportSink::new(
        View::Trace,
        Output::new(
            Box::new(buf.clone()),
            json,
            crate::model::pause::SlowThreshold::NONE,
        ),
        true,
        None,
    );
    s.observe(&Observed::Started(Arc::new(ProcessInfo {
        pid: 42,
        exe: "/srv/app".into(),
        labels: ProcessLabels {
            executable: "app".into(),
            go_version: "go1.26.6".into(),
            build_id: String::new(),
            container: String::new(),
            namespace: String::new(),
            pod: String::new(),
        },
        go_version: "go1.26.6".into(),
        image: None,
    })));
    (s, buf)
}

fn reading(at: ReadAt, meta_swapped: u64, read_ns: u64) -> Observed {
    let host_swap = matches!(at, ReadAt::End | ReadAt::LastBeforeExit).then(|| {
        let a = HostSwap {
            at_ns: 0,
            pswpin: 100,
            ..HostSwap::default()
        };
        let b = HostSwap {
            at_ns: 2_000_000_000,
            pswpin: 900,
            pswpout: 4000,
            ..HostSwap::default()
        };
        HostSwap::delta(&a, &b)
    });
    Observed::Exposure(Arc::new(ExposureReading {
        pid: 42,
        at,
        exposure: Ok(exposure(meta_swapped, 0, None)),
        read_ns,
        host_swap,
    }))
}

/// A pause of `d` ns with `faults` swap-ins taking `fault_ns` in all.
fn pause(start: u64, d: u64, faults: u64, fault_ns: u64) -> Observed {
    let mut r = record(42, start, d);
    let all = FaultTotals {
        faults,
        swap_in: faults,
        fault_ns,
        ..FaultTotals::default()
    };
    r.faults = Some(PauseFaultStats {
        all,
        ..PauseFaultStats::default()
    });
    Observed::Pause(Box::new(ObservedPause {
        record: r,
        faults: Vec::new(),
    }))
}

#[test]
fn swapped_metadata_and_faulting_pauses_give_advice_citing_the_trace() {
    let (mut s, _) = sink(true);
    s.observe(&reading(ReadAt::Start, 0, 4_000_000));
    s.observe(&pause(10, 50_000, 0, 0));
    s.observe(&pause(20, 3_000_000, 40, 2_400_000));
    s.observe(&pause(30, 1_000_000, 10, 600_000));
    s.observe(&reading(ReadAt::Refresh, 1 << 20, 6_000_000));
    s.observe(&reading(ReadAt::End, 2 << 20, 5_000_000));
    let sum = s.summary(2_000_000_000);
    let e = sum.exposure.as_ref().unwrap();
    assert_eq!(e.read_at, ReadAt::End);
    assert_eq!(e.reads, 3);
    assert!((e.read_ms_mean - 5.0).abs() < 1e-9 && (e.read_ms_max - 6.0).abs() < 1e-9);
    assert_eq!(e.at_start.unwrap().gc_metadata_swapped_bytes, 0);
    assert_eq!(
        e.exposure
            .as_ref()
            .unwrap()
            .class(MemoryClass::GcMetadata)
            .usage
            .swapped_bytes,
        2 << 20
    );
    let advice = sum.advice.as_ref().unwrap();
    let kinds: Vec<_> = advice.iter().map(|a| a.kind).collect();
    assert_eq!(
        kinds,
        vec![AdviceKind::GcMetadataSwapped, AdviceKind::PauseFaults]
    );
    // 60 us per fault measured in the pauses; the host's traffic over 2 s.
    assert!(
        advice[0]
            .evidence
            .contains("2.0 MiB of GC metadata in swap")
            && advice[0]
                .evidence
                .contains("at the 60 us per fault measured in pauses")
            && advice[0]
                .evidence
                .contains("400 pages/s swapped in, 2000 out"),
        "{}",
        advice[0].evidence
    );
    assert!(
        advice[1].evidence.contains(
            "2 of 3 pauses had major faults (50 faults); faults took 3.0 ms of 4.0 ms pause time"
        ) && advice[1].evidence.contains("(50 swap-ins, 0 file-backed)"),
        "{}",
        advice[1].evidence
    );
    let json = serde_json::to_value(&sum).unwrap();
    let first = &json["advice"][0];
    assert_eq!(first["kind"], "gc_metadata_swapped");
    for k in ["finding", "evidence", "action"] {
        assert!(first[k].as_str().is_some_and(|t| !t.is_empty()), "{k}");
    }
    assert_eq!(json["exposure"]["read_at"], "end");
    assert_eq!(json["exposure"]["host_swap"]["pswpin"], 800);
}

#[test]
fn a_quiet_trace_has_an_exposure_and_no_advice() {
    let (mut s, buf) = sink(false);
    s.observe(&reading(ReadAt::Start, 0, 1_000_000));
    s.observe(&pause(10, 50_000, 0, 0));
    s.observe(&reading(ReadAt::End, 0, 1_000_000));
    let sum = s.summary(1_000_000_000);
    assert_eq!(sum.advice, Some(vec![]));
    s.finish(1_000_000_000).unwrap();
    let text = buf.text();
    assert!(text.contains("memory exposure (at the end of the trace; 2 reads"));
    assert!(text.contains("advice: none"), "{text}");
}

#[test]
fn an_exited_process_keeps_its_last_read_and_a_failed_read_hides_nothing() {
    let (mut s, _) = sink(true);
    s.observe(&reading(ReadAt::Start, 0, 1_000_000));
    s.observe(&reading(ReadAt::Refresh, 1 << 20, 1_000_000));
    s.observe(&Observed::Exposure(Arc::new(ExposureReading {
        pid: 42,
        at: ReadAt::Refresh,
        exposure: Err("process 42 has exited".into()),
        read_ns: 1_000,
        host_swap: None,
    })));
    s.observe(&reading(ReadAt::LastBeforeExit, 1 << 20, 1_000_000));
    let sum = s.summary(1_000_000_000);
    let e = sum.exposure.unwrap();
    assert_eq!(e.read_at, ReadAt::LastBeforeExit);
    // The last refresh is not counted twice.
    assert_eq!(e.reads, 3);
    assert!(e.exposure.is_some() && e.error.is_none());
    assert!(e.host_swap.is_some());
    assert_eq!(sum.advice.unwrap()[0].kind, AdviceKind::GcMetadataSwapped);
}

#[test]
fn throttling_while_traced_gives_throttling_advice() {
    let (mut s, _) = sink(true);
    s.observe(&reading(ReadAt::End, 0, 1_000_000));
    s.observe(&Observed::CpuThrottling {
        pid: 42,
        throttling: CpuThrottling {
            cgroup: "/capped".into(),
            while_traced: ThrottleCounts {
                nr_throttled: 30,
                throttled_ns: 900_000_000,
            },
        },
    });
    let advice = s.summary(3_000_000_000).advice.unwrap();
    assert_eq!(advice.len(), 1);
    assert_eq!(advice[0].kind, AdviceKind::Throttling);
    assert!(
        advice[0]
            .evidence
            .contains("900.0 ms throttled in 3000.0 ms traced (30.0%)"),
        "{}",
        advice[0].evidence
    );
}

#[test]
fn no_reading_no_section() {
    let (s, _) = sink(true);
    let sum = s.summary(1);
    assert!(sum.exposure.is_none() && sum.advice.is_none());
    let json = serde_json::to_value(&sum).unwrap();
    assert!(json.get("exposure").is_none() && json.get("advice").is_none());
}
