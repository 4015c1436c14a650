//! One recorded stream through every sink: the numbers agree across them,
//! and each output is byte for byte the one kept in `golden/` (so a change
//! of any output shows in review; `GOSTW_BLESS=1 cargo test -p tracer --lib
//! golden` rewrites the files after an intended change).

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
};

use super::{
    Sink as _,
    metrics::{Metrics, MetricsSink},
    report::{Output, ReportSink, View},
    slow_pauses::{Query, SlowPauseSink, SlowPauseStore, StoreLimits},
    tests_support::{Captured, summary_and_metrics, value},
    timeline::TimelineSink,
};
use crate::{
    clock::WallClock,
    engine::{
        correlate::GRACE_NS,
        stream::{
            Stream, StreamOptions,
            tests::{fault_event, pause_event},
        },
    },
    model::observed::{Observed, tests_support::api_process},
};

const MS: u64 = 1_000_000;

/// Two GCs and a ReadMemStats of one process; faults inside (stopper and
/// another thread, one ending after the pause), between and after them.
fn recorded_stream() -> Vec<Observed> {
    let pid = 7;
    let info = api_process(pid, "b1");
    let mut stream = Stream::new(
        WallClock::default(),
        StreamOptions {
            faults: true,
            stacks: false,
        },
    );
    let mut out = vec![Observed::Started(info)];
    let records = [
        fault_event(pid, pid, 1_000 * MS, 1_002 * MS),
        fault_event(pid, pid + 1, 1_001 * MS, 1_030 * MS),
        pause_event(pid, 2, 1_000 * MS, 10 * MS),
        fault_event(pid, pid, 1_005 * MS, 1_006 * MS),
        fault_event(pid, pid, 1_100 * MS, 1_101 * MS),
        pause_event(pid, 1, 1_200 * MS, 300_000),
        pause_event(pid, 7, 1_500 * MS, 2 * MS),
        fault_event(pid, pid, 1_501 * MS, 1_503 * MS),
        fault_event(pid, pid, 1_600 * MS, 1_601 * MS),
    ];
    for r in &records {
        stream.feed(r, &mut out);
    }
    stream.settle(1_600 * MS + GRACE_NS + 1, &mut out);
    stream.exited(pid, &mut out);
    out.push(Observed::Exited {
        pid,
        last_of_labels: false,
    });
    out
}

/// One recorded stream, two sinks: the report's numbers and the
/// metrics' numbers are the same.
#[test]
fn a_recorded_stream_gives_both_sinks_the_same_numbers() {
    let (s, text, _) = summary_and_metrics(&recorded_stream());
    let l =
        r#"executable="api",go_version="go1.26.6",build_id="b1",container="",namespace="",pod="""#;

    let by_reason = &s.processes[0].by_reason;
    assert_eq!(by_reason.len(), 3);
    for r in by_reason {
        let series = format!("{{{l},reason=\"{}\"}}", r.reason);
        let count = value(
            &text,
            &format!("gostw_pause_duration_seconds_count{series}"),
        );
        let sum = value(&text, &format!("gostw_pause_duration_seconds_sum{series}"));
        assert_eq!(count, r.count as f64, "{}", r.reason);
        assert!(
            (sum - r.total_ns as f64 / 1e9).abs() < 1e-12,
            "{}",
            r.reason
        );
    }
    let f = &s.faults.as_ref().unwrap().processes[0];
    let inside = value(
        &text,
        &format!("gostw_major_faults_total{{{l},in_pause=\"true\",backing=\"swap\"}}"),
    );
    let outside = value(
        &text,
        &format!("gostw_major_faults_total{{{l},in_pause=\"false\",backing=\"swap\"}}"),
    );
    assert_eq!((f.in_pauses.faults, f.outside_pauses.faults), (4, 2));
    assert_eq!((inside, outside), (4.0, 2.0));
    // Faults per pause: the histogram's sum is the faults in records.
    let per_pause = value(&text, &format!("gostw_pause_major_faults_sum{{{l}}}"));
    let in_records: u64 = s
        .faults
        .as_ref()
        .unwrap()
        .pauses
        .iter()
        .map(|p| p.all.faults)
        .sum();
    assert_eq!(per_pause, in_records as f64);
}

/// The report of `view` as text or JSON: live lines (every pause), then
/// the summary.
fn report(stream: &[Observed], view: View, json: bool) -> String {
    let out = Captured::default();
    let mut r = ReportSink::new(
        view,
        Output::new(
            Box::new(out.clone()),
            json,
            crate::model::pause::SlowThreshold::ALL,
        ),
        true,
        None,
    );
    r.observe_all(stream);
    r.finish(2_000 * MS).unwrap();
    out.text()
}

/// What differs from one machine or run to the next, made constant: local
/// times of day (the time zone's; the JSON keeps the clocks as numbers)
/// and the timeline's command line (the test binary's).
fn normalized(text: &str) -> String {
    let time_of_day = regex::Regex::new(r"\d\d:\d\d:\d\d\.\d{6}").unwrap();
    let command = regex::Regex::new(r#""command":"[^"]*""#).unwrap();
    let text = time_of_day.replace_all(text, "HH:MM:SS.uuuuuu");
    command
        .replace_all(&text, r#""command":"COMMAND""#)
        .into_owned()
}

/// Every output of `stream`, by file name in `golden/`.
fn outputs(stream: &[Observed]) -> Vec<(&'static str, String)> {
    let metrics = Arc::new(Metrics::new());
    let mut m = MetricsSink::new(metrics.clone());
    m.observe_all(stream);
    let mut prometheus = String::new();
    prometheus_client::encoding::text::encode(&mut prometheus, metrics.registry()).unwrap();

    let timeline_out = Captured::default();
    let mut timeline = TimelineSink::new(Box::new(timeline_out.clone())).unwrap();
    timeline.observe_all(stream);
    timeline.finish().unwrap();

    let store = Arc::new(Mutex::new(SlowPauseStore::new(StoreLimits {
        total: 100,
        per_label_set: 100,
    })));
    let mut slow = SlowPauseSink::new(
        store.clone(),
        crate::model::pause::SlowThreshold::from_ns(MS),
        None,
        Arc::new(Metrics::new()),
    );
    slow.observe_all(stream);
    let records: String = store
        .lock()
        .unwrap()
        .query(&Query::default())
        .iter()
        .map(|p| serde_json::to_string(&**p).unwrap() + "\n")
        .collect();

    vec![
        ("metrics.txt", sorted_series(&prometheus)),
        ("trace.txt", report(stream, View::Trace, false)),
        ("trace.jsonl", report(stream, View::Trace, true)),
        ("faults.txt", report(stream, View::Faults, false)),
        ("faults.json", report(stream, View::Faults, true)),
        ("timeline.json", timeline_out.text()),
        ("slow_pauses.jsonl", records),
    ]
    .into_iter()
    .map(|(name, text)| (name, normalized(&text)))
    .collect()
}

/// The exposition with each family's series sorted: their order is the
/// order of a hash map (Prometheus reads them in any order).
fn sorted_series(text: &str) -> String {
    let mut out = String::new();
    let mut series: Vec<&str> = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            series.sort_unstable();
            series.drain(..).for_each(|s| out.extend([s, "\n"]));
            out.extend([line, "\n"]);
        } else {
            series.push(line);
        }
    }
    series.sort_unstable();
    series.drain(..).for_each(|s| out.extend([s, "\n"]));
    out
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/sink/golden")
}

/// The outputs that differ from the kept ones, with their first different
/// line.
fn differences(outputs: &[(&'static str, String)]) -> Vec<String> {
    let mut differ = Vec::new();
    for (name, text) in outputs {
        let path = golden_dir().join(name);
        let kept = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (GOSTW_BLESS=1 writes it)", path.display()));
        if kept != *text {
            let line = kept
                .lines()
                .zip(text.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(kept.lines().count().min(text.lines().count()));
            differ.push(format!(
                "{name}: first differs at line {}:\n  kept: {:?}\n  now:  {:?}",
                line + 1,
                kept.lines().nth(line),
                text.lines().nth(line)
            ));
        }
    }
    differ
}

#[test]
fn every_output_of_a_recorded_stream_is_the_kept_one() {
    let outputs = outputs(&recorded_stream());
    if std::env::var_os("GOSTW_BLESS").is_some() {
        std::fs::create_dir_all(golden_dir()).unwrap();
        for (name, text) in &outputs {
            std::fs::write(golden_dir().join(name), text).unwrap();
        }
    }
    let differ = differences(&outputs);
    assert!(
        differ.is_empty(),
        "outputs changed (GOSTW_BLESS=1 keeps the new ones after an intended change):\n{}",
        differ.join("\n")
    );
}

#[test]
fn the_normalization_hides_only_clocks_of_day_and_the_command() {
    assert_eq!(
        normalized("at 13:04:05.123456, 1:2:3.4 \"command\":\"x y\",\"a\":\"b\""),
        "at HH:MM:SS.uuuuuu, 1:2:3.4 \"command\":\"COMMAND\",\"a\":\"b\""
    );
}

/// The control: the same stream but for its last pause changes every
/// output.
#[test]
fn a_stream_without_one_pause_differs_in_every_output() {
    let mut stream = recorded_stream();
    let last = stream
        .iter()
        .rposition(|o| matches!(o, Observed::Pause(_)))
        .unwrap();
    stream.remove(last);
    let outputs = outputs(&stream);
    let differ = differences(&outputs);
    assert_eq!(differ.len(), outputs.len(), "{differ:#?}");
}

/// Stack growth of one process as the engine hands it on: exact-mode
/// events and the kernel's site rows, each with the code the engine read
/// for its addresses (`with_code`: false gives the same stream unnamed).
fn recorded_growth_stream(with_code: bool) -> Vec<Observed> {
    use tracer_common::{
        event::EventHeader,
        stack::{STACK_FRAMES, StackChange, StackGrowthEvent, StackSource},
    };

    use crate::{
        image::Frame,
        model::code::{Code, ReturnCode},
        stackgrowth::tests_support::exact_row,
    };
    let pid = 7;
    let frame = |function: &str, line, inlined| Frame {
        function: function.into(),
        file: "/srv/api/main.go".into(),
        line,
        inlined,
        start_line: line.saturating_sub(3),
    };
    let mut code = Code::default();
    if with_code {
        for (pc, frames, max_frame) in [
            (
                0x40_1005,
                vec![frame("main.leaf", 12, true), frame("main.deep", 20, false)],
                Some(19_496),
            ),
            (0x40_2005, vec![frame("main.task", 31, false)], Some(96)),
            (0x40_3005, vec![frame("main.main", 44, false)], Some(64)),
        ] {
            code.insert(
                pc,
                ReturnCode {
                    frames: frames.into(),
                    max_frame,
                },
            );
        }
    }
    let code = Arc::new(code);
    let event = |ts_ms: u64, tid: u32, goid: u64| {
        let mut frames = [0; STACK_FRAMES];
        frames[..3].copy_from_slice(&[0x40_1005, 0x40_2005, 0x40_3005]);
        Observed::StackGrowth {
            event: StackGrowthEvent {
                header: EventHeader {
                    tgid: pid,
                    tid,
                    ts_ns: 1_000 * MS + ts_ms * MS,
                    ..Default::default()
                },
                source: StackSource::Exact as u8,
                change: StackChange::Grow as u8,
                _pad: 0,
                nframes: 3,
                goid,
                old_size: 8192,
                new_size: 32768,
                used: 6000,
                frames,
            },
            code: code.clone(),
        }
    };
    let row = |site_pc, caller_pc, count| {
        exact_row(
            pid,
            (site_pc, caller_pc),
            (8192, 32768),
            count,
            count * 6000,
        )
    };
    vec![
        Observed::Started(api_process(pid, "b1")),
        event(1, pid, 10),
        event(2, pid + 1, 11),
        Observed::StackSites {
            pid,
            rows: vec![row(0x40_1005, 0x40_2005, 40), row(0x40_2005, 0x40_3005, 2)],
            observed: (
                std::time::Duration::from_secs(10),
                std::time::Duration::from_secs(5),
            ),
            code,
        },
        Observed::Exited {
            pid,
            last_of_labels: false,
        },
    ]
}

/// The stack-growth outputs (the `stacks` report as text and JSON, the
/// timeline), by file name in `golden/`.
fn growth_outputs(stream: &[Observed]) -> Vec<(&'static str, String)> {
    let stacks = |json: bool| {
        let out = Captured::default();
        let mut r = ReportSink::new(
            View::Stacks,
            Output::new(
                Box::new(out.clone()),
                json,
                crate::model::pause::SlowThreshold::ALL,
            ),
            false,
            Some(crate::stackgrowth::Mode::Exact),
        );
        r.observe_all(stream);
        r.finish(2_000 * MS).unwrap();
        out.text()
    };
    let timeline_out = Captured::default();
    let mut timeline = TimelineSink::new(Box::new(timeline_out.clone())).unwrap();
    timeline.observe_all(stream);
    timeline.finish().unwrap();
    vec![
        ("stacks.txt", stacks(false)),
        ("stacks.json", stacks(true)),
        ("stacks_timeline.json", timeline_out.text()),
    ]
    .into_iter()
    .map(|(name, text)| (name, normalized(&text)))
    .collect()
}

/// Stack growth as every sink names it, from the code the stream carries
/// (kept byte for byte, like the pauses' outputs above).
#[test]
fn every_stack_growth_output_of_a_recorded_stream_is_the_kept_one() {
    let outputs = growth_outputs(&recorded_growth_stream(true));
    if std::env::var_os("GOSTW_BLESS").is_some() {
        for (name, text) in &outputs {
            std::fs::write(golden_dir().join(name), text).unwrap();
        }
    }
    for name in ["main.leaf", "main.task"] {
        assert!(
            outputs.iter().all(|(_, text)| text.contains(name)),
            "{name} missing from an output"
        );
    }
    let differ = differences(&outputs);
    assert!(
        differ.is_empty(),
        "outputs changed (GOSTW_BLESS=1 keeps the new ones after an intended change):\n{}",
        differ.join("\n")
    );
    // The control: the same stream without its code names no function, so
    // every output differs.
    let bare = growth_outputs(&recorded_growth_stream(false));
    assert_eq!(differences(&bare).len(), bare.len());
    assert!(bare.iter().all(|(_, text)| !text.contains("main.")));
}
