use std::sync::Arc;

use tracer_common::stack::{
    STACK_FRAMES, StackChange, StackGrowthEvent, StackSiteCounts, StackSiteKey, StackSource,
};

use super::*;
use crate::{
    formats::pprof::{decode, proto},
    image::Frame,
    model::pause::tests_support::record,
    model::{
        fault::FaultKind,
        observed::{ObservedPause, ProcessInfo},
    },
};

const PID: u32 = 7;

fn info() -> Arc<ProcessInfo> {
    crate::model::observed::tests_support::api_process(PID, "b1")
}

fn fault(tid: u32, begin: u64, site: &str) -> Fault {
    Fault {
        tgid: PID,
        tid,
        begin_ns: begin,
        end_ns: begin + 1_000,
        address: 0xc000_0000,
        kind: FaultKind::SwapIn,
        blocked_ns: 900,
        wait_own_ns: 900,
        wait_other_ns: 0,
        stack: Arc::from(vec![Frame {
            function: site.into(),
            file: String::new(),
            line: 0,
            inlined: false,
            start_line: 0,
        }]),
        pcs: Arc::from([0x401234]),
    }
}

fn growth(site: u64, caller: u64, outer: u64) -> StackGrowthEvent {
    let mut frames = [0; STACK_FRAMES];
    frames[..3].copy_from_slice(&[site, caller, outer]);
    StackGrowthEvent {
        header: tracer_common::event::EventHeader {
            tgid: PID,
            ..Default::default()
        },
        source: StackSource::Sampled as u8,
        change: StackChange::Copying as u8,
        _pad: 0,
        nframes: 3,
        goid: 1,
        old_size: 2048,
        new_size: 0,
        used: 300,
        frames,
    }
}

/// A growth event as the stream carries it (no code: addresses unnamed).
fn grew(event: StackGrowthEvent) -> Observed {
    Observed::StackGrowth {
        event,
        code: Default::default(),
    }
}

fn s(p: &proto::Profile, i: i64) -> &str {
    &p.string_table[usize::try_from(i).unwrap()]
}

/// (leaf function, first value, sorted "key=value" labels).
fn samples(p: &proto::Profile) -> Vec<(String, i64, Vec<String>)> {
    let mut out: Vec<_> = p
        .sample
        .iter()
        .map(|x| {
            let loc = &p.location[usize::try_from(x.location_id[0]).unwrap() - 1];
            let f = &p.function[usize::try_from(loc.line[0].function_id).unwrap() - 1];
            let mut l: Vec<String> = x
                .label
                .iter()
                .filter(|l| l.str != 0)
                .map(|l| format!("{}={}", s(p, l.key), s(p, l.str)))
                .collect();
            l.sort();
            (s(p, f.name).to_owned(), x.value[0], l)
        })
        .collect();
    out.sort();
    out
}

const MS: u64 = 1_000_000;

/// A recorded stream to `--pprof` files: faults in a pause by stopper and
/// another thread, a late one, one outside; stack growth by the kernel's
/// site counts spread over the event stacks.
#[test]
fn a_recorded_stream_becomes_both_profiles() {
    let dir = std::env::temp_dir().join(format!("gostw-profile-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let files = vec![
        (ProfileKind::Faults, dir.join("out.faults.pb.gz")),
        (ProfileKind::StackGrowth, dir.join("out.stackgrowth.pb.gz")),
    ];
    let mut sink =
        ProfileFiles::create(files.clone(), Mode::Sampled, 99, "gostw test".into()).unwrap();
    let mut pause = record(PID, 1_000 * MS, 10 * MS);
    pause.tid = PID;
    let stream = [
        Observed::Started(info()),
        Observed::Pause(Box::new(ObservedPause {
            record: pause,
            faults: vec![
                fault(PID, 1_001 * MS, "runtime.(*spanSet).reset"),
                fault(PID + 1, 1_002 * MS, "runtime.(*spanSet).reset"),
            ],
        })),
        Observed::Fault(
            fault(PID + 1, 1_005 * MS, "runtime.markrootSpans"),
            Membership::LateInPause,
        ),
        Observed::Fault(fault(PID, 2_000 * MS, "main.load"), Membership::Outside),
        grew(growth(0x10, 0x20, 0x30)),
        grew(growth(0x10, 0x20, 0x30)),
        grew(growth(0x10, 0x20, 0x40)),
        Observed::StackSites {
            pid: PID,
            rows: vec![(
                StackSiteKey {
                    tgid: PID,
                    source: StackSource::Sampled as u8,
                    change: StackChange::Copying as u8,
                    _pad: 0,
                    old_size: 2048,
                    new_size: 0,
                    site_pc: 0x10,
                    caller_pc: 0x20,
                },
                // One sample more than the events: one lost to the ring buffer.
                StackSiteCounts {
                    count: 4,
                    copied_bytes: 0,
                },
            )],
            observed: Default::default(),
            code: Default::default(),
        },
        Observed::Exited {
            pid: PID,
            last_of_labels: true,
        },
    ];
    sink.observe_all(&stream);
    let written = sink.finish().unwrap();
    assert_eq!(written[0], (files[0].1.clone(), 4));
    assert_eq!(written[1], (files[1].1.clone(), 4));

    let p = decode(&std::fs::read(&files[0].1).unwrap()).unwrap();
    let label = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let gc = |thread: &str| {
        label(&[
            "backing=swap",
            "in_pause=true",
            "reason=gc_sweep_termination",
            &format!("thread={thread}"),
        ])
    };
    assert_eq!(
        samples(&p),
        [
            (
                "main.load".into(),
                1,
                label(&["backing=swap", "in_pause=false"])
            ),
            ("runtime.(*spanSet).reset".into(), 1, gc("other")),
            ("runtime.(*spanSet).reset".into(), 1, gc("stopper")),
            ("runtime.markrootSpans".into(), 1, gc("other")),
        ]
    );
    assert_eq!(s(&p, p.comment[0]), "gostw test");
    assert!(p.duration_nanos >= 0 && p.time_nanos > 0);

    let g = decode(&std::fs::read(&files[1].1).unwrap()).unwrap();
    assert_eq!(s(&g, g.sample_type[0].r#type), "copy_samples");
    // 4 samples at the site: 3 and 1 by the stacks seen (2 and 1 events).
    let mut values: Vec<(usize, i64, i64)> = g
        .sample
        .iter()
        .map(|x| (x.location_id.len(), x.value[0], x.value[1]))
        .collect();
    values.sort();
    let period = 1_000_000_000 / 99;
    assert_eq!(values, [(3, 1, period), (3, 3, 3 * period)]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The agent's way: each growth event is a sample as it comes, and readers
/// share the store.
#[test]
fn events_counting_adds_samples_as_they_come() {
    let store = Arc::new(Mutex::new(Store::new()));
    let mut c = ProfileCollector::new(store.clone(), GrowthCounting::Events);
    c.observe(&Observed::Started(info()));
    c.observe(&grew(growth(0x10, 0x20, 0x30)));
    let before = lock(&store).snapshot(ProfileKind::StackGrowth, |_| true);
    c.observe(&grew(growth(0x10, 0x20, 0x30)));
    c.observe(&grew(growth(0x10, 0x20, 0x40)));
    let now = lock(&store).snapshot(ProfileKind::StackGrowth, |_| true);
    assert_eq!(
        (before.total(), now.total(), now.since(&before).total()),
        (1, 3, 2)
    );
    // Events of a process not traced are not anyone's.
    let mut other = growth(1, 2, 3);
    other.header.tgid = 99;
    c.observe(&grew(other));
    assert_eq!(
        lock(&store)
            .snapshot(ProfileKind::StackGrowth, |_| true)
            .total(),
        3
    );
}
