use super::*;
use crate::formats::pprof::{decode, proto};

fn labels(exe: &str) -> ProcessLabels {
    ProcessLabels {
        executable: exe.into(),
        go_version: "go1.26.6".into(),
        build_id: "b1".into(),
        container: String::new(),
        namespace: String::new(),
        pod: String::new(),
    }
}

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

fn mapping(file: &str, build_id: &str) -> MappingInfo {
    MappingInfo {
        start: 0x400000,
        limit: 0x500000,
        offset: 0,
        file: file.into(),
        build_id: build_id.into(),
    }
}

const GC: Tags = Tags::Fault {
    kind: FaultKind::SwapIn,
    pause: Some(PauseTag {
        reason: "gc_sweep_termination",
        by_stopper: true,
    }),
};
const OUTSIDE: Tags = Tags::Fault {
    kind: FaultKind::FileBacked,
    pause: None,
};

fn encoding() -> Encoding {
    Encoding {
        growth_mode: StackGrowthMode::Exact,
        set_labels: false,
        comment: None,
        span: None,
    }
}

fn s(p: &proto::Profile, i: i64) -> &str {
    &p.string_table[usize::try_from(i).unwrap()]
}

/// (leaf function, values, labels as "key=value") of every sample.
fn samples(p: &proto::Profile) -> Vec<(String, Vec<i64>, Vec<String>)> {
    let mut out: Vec<_> = p
        .sample
        .iter()
        .map(|x| {
            let loc = &p.location[usize::try_from(x.location_id[0]).unwrap() - 1];
            let f = &p.function[usize::try_from(loc.line[0].function_id).unwrap() - 1];
            let mut l: Vec<String> = x
                .label
                .iter()
                .map(|l| {
                    let v = if l.str != 0 {
                        s(p, l.str).to_owned()
                    } else {
                        l.num.to_string()
                    };
                    format!("{}={v}", s(p, l.key))
                })
                .collect();
            l.sort();
            (s(p, f.name).to_owned(), x.value.clone(), l)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn samples_sum_per_stack_and_labels() {
    let mut st = Store::new();
    let api = labels("api");
    st.started(&api, Some(mapping("/srv/api", "b1/full")));
    for _ in 0..3 {
        st.add(
            &api,
            stack(&["runtime.(*spanSet).reset", "runtime.gcStart"]),
            GC,
            [1, 500],
        );
    }
    st.add(&api, stack(&["main.load"]), OUTSIDE, [1, 70]);
    st.add(
        &api,
        stack(&["main.deep19k", "main.task"]),
        Tags::Growth {
            old_stack: 2048,
            new_stack: 32768,
        },
        [9, 18432],
    );
    assert_eq!(st.samples(), 3);
    let snap = st.snapshot(ProfileKind::Faults, |_| true);
    assert_eq!(snap.total(), 4);
    let p = decode(&snap.encode(&encoding())).unwrap();
    assert_eq!(s(&p, p.mapping[0].build_id), "b1/full");
    assert_eq!(
        samples(&p),
        [
            (
                "main.load".into(),
                vec![1, 70],
                vec!["backing=file".into(), "in_pause=false".into()]
            ),
            (
                "runtime.(*spanSet).reset".into(),
                vec![3, 1500],
                vec![
                    "backing=swap".into(),
                    "in_pause=true".into(),
                    "reason=gc_sweep_termination".into(),
                    "thread=stopper".into()
                ]
            ),
        ]
    );
    let g = decode(
        &st.snapshot(ProfileKind::StackGrowth, |_| true)
            .encode(&encoding()),
    )
    .unwrap();
    assert_eq!(
        samples(&g),
        [(
            "main.deep19k".into(),
            vec![9, 18432],
            vec!["new_stack=32768".into(), "old_stack=2048".into()]
        )]
    );
}

#[test]
fn a_window_is_the_difference_of_two_snapshots() {
    let mut st = Store::new();
    let (api, web) = (labels("api"), labels("web"));
    st.started(&api, None);
    st.add(&api, stack(&["a"]), GC, [5, 50]);
    let before = st.snapshot(ProfileKind::Faults, |_| true);
    st.add(&api, stack(&["a"]), GC, [2, 20]);
    st.add(&api, stack(&["b"]), GC, [1, 10]);
    st.started(&web, None);
    st.add(&web, stack(&["c"]), OUTSIDE, [4, 40]);
    let window = st.snapshot(ProfileKind::Faults, |_| true).since(&before);
    assert_eq!(window.total(), 7);
    let p = decode(&window.encode(&encoding())).unwrap();
    let got: Vec<(String, Vec<i64>)> = samples(&p).into_iter().map(|(f, v, _)| (f, v)).collect();
    assert_eq!(
        got,
        [
            ("a".into(), vec![2, 20]),
            ("b".into(), vec![1, 10]),
            ("c".into(), vec![4, 40])
        ]
    );
    // A selection by label.
    let only = st.snapshot(ProfileKind::Faults, |l| l.executable == "web");
    assert_eq!(only.total(), 4);
}

#[test]
fn the_store_is_bounded_and_totals_survive() {
    let mut st = Store::new();
    let api = labels("api");
    st.started(&api, None);
    let name = |i: usize| format!("main.f{i}");
    for i in 0..MAX_SAMPLES {
        st.add(&api, stack(&[&name(i)]), OUTSIDE, [1, 1]);
    }
    assert_eq!((st.samples(), st.limited), (MAX_SAMPLES, 0));
    // A known sample still grows; new ones go to the limit frame.
    st.add(&api, stack(&[&name(0)]), OUTSIDE, [1, 1]);
    st.add(&api, stack(&["main.new1"]), OUTSIDE, [1, 1]);
    st.add(&api, stack(&["main.new2"]), OUTSIDE, [1, 1]);
    assert_eq!((st.samples(), st.limited), (MAX_SAMPLES + 1, 2));
    let snap = st.snapshot(ProfileKind::Faults, |_| true);
    assert_eq!(snap.total(), MAX_SAMPLES as u64 + 3);
    let p = decode(&snap.encode(&encoding())).unwrap();
    let limit = samples(&p)
        .into_iter()
        .find(|(f, _, _)| f == LIMIT_FUNCTION)
        .expect("a limit sample");
    assert_eq!(limit.1, [2, 2]);
    assert!(st.stack_bytes() <= MAX_STACK_BYTES);

    // Stack bytes are bounded too: big stacks stop being kept.
    let mut st = Store::new();
    st.started(&api, None);
    let long = "x".repeat(64 * 1024);
    for i in 0..200 {
        st.add(&api, stack(&[&format!("{long}{i}")]), OUTSIDE, [1, 0]);
    }
    assert!(st.stack_bytes() <= MAX_STACK_BYTES);
    assert!(st.limited > 0);
    assert_eq!(st.snapshot(ProfileKind::Faults, |_| true).total(), 200);
}

#[test]
fn gone_label_sets_are_kept_for_a_while_then_dropped_with_their_stacks() {
    let mut st = Store::new();
    let (api, web) = (labels("api"), labels("web"));
    st.started(&api, None);
    st.started(&api, None);
    st.started(&web, None);
    st.add(&api, stack(&["a", "shared"]), GC, [1, 1]);
    st.add(&web, stack(&["a", "shared"]), GC, [1, 1]);
    st.add(&api, stack(&["only_api"]), GC, [1, 1]);
    let t0 = Instant::now();
    st.exited(&api, t0);
    st.expire(t0 + RETAIN * 2);
    assert_eq!(st.label_sets(), 2, "one api process is still traced");
    st.exited(&api, t0);
    st.expire(t0 + RETAIN / 2);
    assert_eq!(st.label_sets(), 2, "kept for windows that span the exit");
    let bytes = st.stack_bytes();
    st.expire(t0 + RETAIN + Duration::from_secs(1));
    assert_eq!(st.label_sets(), 1);
    assert_eq!(st.samples(), 1);
    // The stack web still uses stays; api's own goes.
    assert!(st.stack_bytes() < bytes && st.stack_bytes() > 0);
    // A new process of the label set starts it again.
    st.started(&api, None);
    assert_eq!(st.label_sets(), 2);
}

#[test]
fn profiles_of_several_executables_label_samples_and_drop_addresses() {
    let mut st = Store::new();
    let (api, web) = (labels("api"), labels("web"));
    st.started(&api, Some(mapping("/srv/api", "A")));
    st.started(&web, Some(mapping("/srv/web", "W")));
    st.add(&api, stack(&["a"]), GC, [1, 1]);
    st.add(&web, stack(&["w"]), GC, [1, 1]);
    let how = Encoding {
        set_labels: true,
        ..encoding()
    };
    let p = decode(&st.snapshot(ProfileKind::Faults, |_| true).encode(&how)).unwrap();
    assert_eq!(p.mapping.len(), 2);
    assert!(
        p.location
            .iter()
            .all(|l| l.address == 0 && l.mapping_id == 0)
    );
    let got = samples(&p);
    assert!(got[0].2.contains(&"executable=api".to_owned()), "{got:?}");
    assert!(got[1].2.contains(&"executable=web".to_owned()), "{got:?}");
    // One executable: addresses kept, in its mapping.
    let p = decode(
        &st.snapshot(ProfileKind::Faults, |l| l.executable == "api")
            .encode(&how),
    )
    .unwrap();
    assert!(
        p.location
            .iter()
            .all(|l| l.address != 0 && l.mapping_id == 1)
    );
}
