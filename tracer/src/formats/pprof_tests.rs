use super::*;

fn frame(function: &str, line: u32, inlined: bool) -> Frame {
    Frame {
        function: function.into(),
        file: format!("/src/{}.go", function.rsplit('.').next().unwrap()),
        line,
        inlined,
        // One start line per function, as in a real binary.
        start_line: match function {
            "runtime.gcStart" => 695,
            _ => 1,
        },
    }
}

fn loc(address: u64, frames: &[Frame]) -> Location {
    Location {
        address,
        frames: frames.to_vec(),
    }
}

fn s(p: &proto::Profile, i: i64) -> &str {
    &p.string_table[usize::try_from(i).unwrap()]
}

/// A sample's stack as "function:line" per line, leaf first.
fn stack_names(p: &proto::Profile, sample: &proto::Sample) -> Vec<String> {
    sample
        .location_id
        .iter()
        .flat_map(|id| {
            let l = p.location.iter().find(|l| l.id == *id).unwrap();
            l.line.iter().map(|line| {
                let f = p
                    .function
                    .iter()
                    .find(|f| f.id == line.function_id)
                    .unwrap();
                format!("{}:{}", s(p, f.name), line.line)
            })
        })
        .collect()
}

fn fault_builder() -> ProfileBuilder {
    let mut b = ProfileBuilder::new(&[("major_faults", "count"), ("fault_time", "nanoseconds")]);
    b.mapping(MappingInfo {
        start: 0x400000,
        limit: 0x500000,
        offset: 0,
        file: "/bin/server".into(),
        build_id: "abc123".into(),
    });
    b
}

#[test]
fn round_trip_keeps_sample_types_values_and_labels() {
    let mut b = fault_builder();
    b.time(1_700_000_000_000_000_000, 5_000_000_000);
    let stack = [
        loc(0x401000, &[frame("runtime.gcStart", 700, false)]),
        loc(0x402000, &[frame("main.main", 20, false)]),
    ];
    let labels = [
        Label::str("in_pause", "true"),
        Label::str("reason", "gc_sweep_termination"),
        Label::str("backing", "swap"),
        Label::num("wait", 1500, "nanoseconds"),
    ];
    b.add(&stack, &[2, 3000], &labels).unwrap();
    let gz = b.encode_gzip();
    assert_eq!(&gz[..2], &[0x1f, 0x8b], "pprof files are gzipped");
    let p = decode(&gz).unwrap();
    assert_eq!(p, *b.profile());
    assert_eq!(decode(&b.encode()).unwrap(), p, "raw protobuf decodes too");
    assert_eq!(p.string_table[0], "");
    let types: Vec<(&str, &str)> = p
        .sample_type
        .iter()
        .map(|t| (s(&p, t.r#type), s(&p, t.unit)))
        .collect();
    assert_eq!(
        types,
        [("major_faults", "count"), ("fault_time", "nanoseconds")]
    );
    let period = p.period_type.unwrap();
    assert_eq!((s(&p, period.r#type), p.period), ("major_faults", 1));
    assert_eq!(
        (p.time_nanos, p.duration_nanos),
        (1_700_000_000_000_000_000, 5_000_000_000)
    );
    assert_eq!(p.sample.len(), 1);
    assert_eq!(p.sample[0].value, [2, 3000]);
    assert_eq!(
        stack_names(&p, &p.sample[0]),
        ["runtime.gcStart:700", "main.main:20"]
    );
    let mut got: Vec<String> = p.sample[0]
        .label
        .iter()
        .map(|l| {
            if l.str != 0 {
                format!("{}={}", s(&p, l.key), s(&p, l.str))
            } else {
                format!("{}={}{}", s(&p, l.key), l.num, s(&p, l.num_unit))
            }
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            "backing=swap",
            "in_pause=true",
            "reason=gc_sweep_termination",
            "wait=1500nanoseconds"
        ]
    );
    let m = &p.mapping[0];
    assert_eq!(
        (m.id, m.memory_start, m.memory_limit),
        (1, 0x400000, 0x500000)
    );
    assert_eq!(
        (s(&p, m.filename), s(&p, m.build_id)),
        ("/bin/server", "abc123")
    );
    assert!(m.has_functions && m.has_filenames && m.has_line_numbers && m.has_inline_frames);
    let f = &p.function[0];
    assert_eq!(
        (
            s(&p, f.name),
            s(&p, f.system_name),
            s(&p, f.filename),
            f.start_line
        ),
        ("runtime.gcStart", "runtime.gcStart", "/src/gcStart.go", 695)
    );
}

#[test]
fn functions_locations_and_samples_are_stored_once() {
    let mut b = fault_builder();
    let gc = frame("runtime.gcStart", 700, false);
    let gc_other_line = frame("runtime.gcStart", 712, false);
    let main = frame("main.main", 20, false);
    let a = [
        loc(0x401000, &[gc]),
        loc(0x402000, std::slice::from_ref(&main)),
    ];
    let b2 = [loc(0x401010, &[gc_other_line]), loc(0x402000, &[main])];
    b.add(&a, &[1, 10], &[Label::str("in_pause", "true")])
        .unwrap();
    // The same stack and labels again: summed.
    b.add(&a, &[1, 5], &[Label::str("in_pause", "true")])
        .unwrap();
    // Same stack, other labels: its own sample.
    b.add(&a, &[1, 7], &[Label::str("in_pause", "false")])
        .unwrap();
    b.add(&b2, &[4, 40], &[]).unwrap();
    let p = decode(&b.encode_gzip()).unwrap();
    assert_eq!(p.function.len(), 2, "gcStart and main, once each");
    assert_eq!(p.location.len(), 3, "0x401000, 0x401010, 0x402000");
    assert_eq!(p.sample.len(), 3);
    assert_eq!(p.sample[0].value, [2, 15]);
    assert_eq!(p.sample[1].value, [1, 7]);
    assert_eq!(p.sample[2].value, [4, 40]);
    assert_eq!(p.sample[0].location_id, p.sample[1].location_id);
    assert_eq!(p.sample[0].location_id[1], p.sample[2].location_id[1]);
    let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(total, 7);
    let mut strings = p.string_table.clone();
    strings.sort();
    strings.dedup();
    assert_eq!(strings.len(), p.string_table.len(), "no string twice");
}

#[test]
fn labels_in_another_order_are_the_same_sample() {
    let mut b = fault_builder();
    let a = [loc(0x401000, &[frame("runtime.gcStart", 700, false)])];
    let x = Label::str("in_pause", "true");
    let y = Label::str("backing", "swap");
    b.add(&a, &[1, 1], &[x.clone(), y.clone()]).unwrap();
    b.add(&a, &[1, 1], &[y, x]).unwrap();
    assert_eq!(b.len(), 1);
    assert_eq!(b.profile().sample[0].value, [2, 2]);
}

#[test]
fn inlined_frames_are_lines_of_one_location_innermost_first() {
    let mut b = ProfileBuilder::new(&[("growths", "count"), ("bytes_copied", "bytes")]);
    b.mapping(MappingInfo {
        start: 0x400000,
        limit: 0x500000,
        ..MappingInfo::default()
    });
    // What the symbolizer gives for one PC: atomic.Add inlined into task.
    let pc = loc(
        0x4a0010,
        &[
            frame("sync/atomic.(*Int64).Add", 80, true),
            frame("main.task", 74, false),
        ],
    );
    let caller = loc(0x4a0100, &[frame("main.worker", 120, false)]);
    b.add(&[pc, caller], &[1, 32768], &[]).unwrap();
    let p = decode(&b.encode_gzip()).unwrap();
    assert_eq!(p.location.len(), 2, "one location per address");
    assert_eq!(p.location[0].line.len(), 2);
    assert_eq!(
        stack_names(&p, &p.sample[0]),
        [
            "sync/atomic.(*Int64).Add:80",
            "main.task:74",
            "main.worker:120"
        ]
    );
    assert_eq!(p.location[0].mapping_id, 1);
}

#[test]
fn addresses_outside_every_mapping_have_none() {
    let mut b = fault_builder();
    b.add(
        &[loc(0x7fff_0000_1000, &[frame("main.cgo", 1, false)])],
        &[1, 1],
        &[],
    )
    .unwrap();
    assert_eq!(b.profile().location[0].mapping_id, 0);
}

#[test]
fn a_sample_needs_one_value_per_sample_type() {
    let mut b = fault_builder();
    let err = b.add(&[], &[1], &[]).unwrap_err();
    assert!(matches!(err, ProfileError::ValueCount { got: 1, want: 2 }));
    assert!(b.is_empty());
}

#[test]
fn period_comment_and_default_type_are_kept() {
    let mut b = ProfileBuilder::new(&[("copy_samples", "count"), ("bytes_copied", "bytes")]);
    b.period(("cpu", "nanoseconds"), 1_000_000)
        .comment("sampled: one in 1000")
        .default_sample_type("bytes_copied");
    let p = decode(&b.encode_gzip()).unwrap();
    let pt = p.period_type.unwrap();
    assert_eq!(
        (s(&p, pt.r#type), s(&p, pt.unit), p.period),
        ("cpu", "nanoseconds", 1_000_000)
    );
    assert_eq!(s(&p, p.comment[0]), "sampled: one in 1000");
    assert_eq!(s(&p, p.default_sample_type), "bytes_copied");
}

#[test]
fn garbage_is_an_error_not_a_profile() {
    assert!(matches!(
        decode(&[0x1f, 0x8b, 1, 2, 3]),
        Err(ProfileError::Gzip(_))
    ));
    assert!(matches!(
        decode(&[0xff, 0xff, 0xff]),
        Err(ProfileError::Decode(_))
    ));
}

#[test]
fn a_sample_without_a_stack_keeps_its_values_under_unknown() {
    let mut b = fault_builder();
    b.add(&[], &[1, 100], &[]).unwrap();
    b.add(&[], &[1, 50], &[]).unwrap();
    let p = decode(&b.encode_gzip()).unwrap();
    assert_eq!(p.sample.len(), 1);
    assert_eq!(p.sample[0].value, [2, 150]);
    assert_eq!(stack_names(&p, &p.sample[0]), ["[unknown]:0"]);
}
