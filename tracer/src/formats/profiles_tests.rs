use super::*;
use crate::{
    binary::Frame,
    formats::pprof::{decode, proto},
};

fn stack(names: &[&str]) -> Vec<Location> {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| Location {
            address: 0x401000 + 0x100 * i as u64,
            frames: vec![Frame {
                function: (*n).to_owned(),
                file: "x.go".into(),
                line: 1,
                inlined: false,
                start_line: 1,
            }],
        })
        .collect()
}

fn s(p: &proto::Profile, i: i64) -> &str {
    &p.string_table[usize::try_from(i).unwrap()]
}

fn types(p: &proto::Profile) -> Vec<(&str, &str)> {
    p.sample_type
        .iter()
        .map(|t| (s(p, t.r#type), s(p, t.unit)))
        .collect()
}

/// (label key, value as text) pairs of sample `i`, sorted.
fn labels(p: &proto::Profile, i: usize) -> Vec<(String, String)> {
    let mut l: Vec<(String, String)> = p.sample[i]
        .label
        .iter()
        .map(|l| {
            let v = if l.str != 0 {
                s(p, l.str).to_owned()
            } else {
                format!("{} {}", l.num, s(p, l.num_unit))
            };
            (s(p, l.key).to_owned(), v)
        })
        .collect();
    l.sort();
    l
}

fn info() -> ProfileInfo {
    ProfileInfo {
        main: Some(MappingInfo {
            start: 0x400000,
            limit: 0x500000,
            offset: 0,
            file: "/srv/server".into(),
            build_id: "abc/def".into(),
        }),
        other_mappings: Vec::new(),
        start_unix_ns: 1_700_000_000_000_000_000,
        duration_ns: 30_000_000_000,
        comment: Some("gostw attach --pid 42".into()),
    }
}

#[test]
fn fault_profile_counts_each_fault_with_its_time_and_pause() {
    let gc = stack(&[
        "runtime.(*spanSet).reset",
        "runtime.finishsweep_m",
        "runtime.gcStart",
    ]);
    let user = stack(&["main.walk"]);
    let in_pause = FaultPause {
        reason: "gc_sweep_termination",
        by_stopper: true,
    };
    let faults = [
        FaultRecord {
            stack: &gc,
            duration_ns: 40_000,
            backing: FaultKind::SwapIn,
            pause: Some(in_pause),
        },
        FaultRecord {
            stack: &gc,
            duration_ns: 60_000,
            backing: FaultKind::SwapIn,
            pause: Some(in_pause),
        },
        FaultRecord {
            stack: &user,
            duration_ns: 900_000,
            backing: FaultKind::FileBacked,
            pause: None,
        },
        FaultRecord {
            stack: &[],
            duration_ns: 0,
            backing: FaultKind::Unknown,
            pause: None,
        },
    ];
    let p = decode(&faults_profile(&info(), &faults)).unwrap();
    assert_eq!(
        types(&p),
        [("major_faults", "count"), ("fault_time", "nanoseconds")]
    );
    assert_eq!(s(&p, p.default_sample_type), "major_faults");
    assert_eq!(p.sample.len(), 3, "the two in-pause faults share a sample");
    assert_eq!(p.sample[0].value, [2, 100_000]);
    assert_eq!(
        labels(&p, 0),
        [
            ("backing".into(), "swap".into()),
            ("in_pause".into(), "true".into()),
            ("reason".into(), "gc_sweep_termination".into()),
            ("thread".into(), "stopper".into()),
        ]
    );
    assert_eq!(p.sample[1].value, [1, 900_000]);
    assert_eq!(
        labels(&p, 1),
        [
            ("backing".into(), "file".into()),
            ("in_pause".into(), "false".into())
        ]
    );
    assert_eq!(p.sample[2].location_id.len(), 1, "[unknown] stands in");
    let total: i64 = p.sample.iter().map(|x| x.value[0]).sum();
    assert_eq!(total, faults.len() as i64);
    assert_eq!(s(&p, p.mapping[0].filename), "/srv/server");
    assert_eq!(s(&p, p.mapping[0].build_id), "abc/def");
    assert_eq!(p.duration_nanos, 30_000_000_000);
    assert_eq!(s(&p, p.comment[0]), "gostw attach --pid 42");
}

#[test]
fn exact_growth_profile_counts_growths_and_bytes() {
    let deep = stack(&["main.deep19k", "main.task"]);
    let records = [
        GrowthRecord {
            stack: &deep,
            old_stack: 2048,
            new_stack: 32768,
            events: 1000,
            bytes_copied: 1000 * 1500,
        },
        GrowthRecord {
            stack: &deep,
            old_stack: 8192,
            new_stack: 32768,
            events: 3,
            bytes_copied: 3 * 6000,
        },
    ];
    let p = decode(&stack_growth_profile(
        &info(),
        StackGrowthMode::Exact,
        &records,
    ))
    .unwrap();
    assert_eq!(types(&p), [("growths", "count"), ("bytes_copied", "bytes")]);
    assert_eq!(s(&p, p.default_sample_type), "growths");
    assert_eq!(p.sample.len(), 2, "one sample per size pair");
    assert_eq!(p.sample[0].value, [1000, 1_500_000]);
    assert_eq!(
        labels(&p, 0),
        [
            ("new_stack".into(), "32768 bytes".into()),
            ("old_stack".into(), "2048 bytes".into())
        ]
    );
    assert_eq!(p.sample[1].value, [3, 18_000]);
    assert_eq!(p.location.len(), 2);
}

#[test]
fn sampled_growth_profile_is_cpu_time_at_the_sampling_period() {
    let site = stack(&["main.deep19k", "main.task"]);
    let records = [GrowthRecord {
        stack: &site,
        old_stack: 2048,
        new_stack: 0,
        events: 62,
        bytes_copied: 12345,
    }];
    let p = decode(&stack_growth_profile(
        &info(),
        StackGrowthMode::Sampled { sample_hz: 99 },
        &records,
    ))
    .unwrap();
    assert_eq!(
        types(&p),
        [("copy_samples", "count"), ("copy_cpu", "nanoseconds")]
    );
    let pt = p.period_type.unwrap();
    assert_eq!((s(&p, pt.r#type), s(&p, pt.unit)), ("cpu", "nanoseconds"));
    assert_eq!(p.period, 10_101_010, "1/99 s");
    assert_eq!(p.sample[0].value, [62, 62 * 10_101_010]);
    assert_eq!(
        labels(&p, 0),
        [("old_stack".into(), "2048 bytes".into())],
        "no new size and no bytes: sampling does not see them"
    );
}

#[test]
fn commands_writing_both_profiles_name_them_by_kind() {
    use std::path::Path;
    let cases = [
        ("out.pb.gz", "out.faults.pb.gz", "out.stackgrowth.pb.gz"),
        (
            "/tmp/run/prof",
            "/tmp/run/prof.faults",
            "/tmp/run/prof.stackgrowth",
        ),
        (".hidden", ".hidden.faults", ".hidden.stackgrowth"),
    ];
    for (given, faults, growth) in cases {
        assert_eq!(
            ProfileKind::Faults.path_for(Path::new(given)),
            Path::new(faults)
        );
        assert_eq!(
            ProfileKind::StackGrowth.path_for(Path::new(given)),
            Path::new(growth)
        );
    }
}
