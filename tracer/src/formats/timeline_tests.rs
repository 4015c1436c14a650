use serde_json::json;

use super::*;

fn parse(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("not valid JSON ({e}):\n{}", String::from_utf8_lossy(bytes)))
}

fn events(v: &Value) -> &Vec<Value> {
    v["traceEvents"].as_array().unwrap()
}

#[test]
fn micros_keep_every_nanosecond() {
    let cases = [
        (0, "0"),
        (1, "0.001"),
        (999, "0.999"),
        (1000, "1"),
        (1500, "1.5"),
        (1520, "1.52"),
        (40_500, "40.5"),
        (12_345_678, "12345.678"),
        // A week of uptime on CLOCK_MONOTONIC, to the nanosecond.
        (604_800_000_000_007, "604800000000.007"),
    ];
    for (ns, text) in cases {
        assert_eq!(Micros(ns).to_string(), text, "{ns} ns");
    }
}

#[test]
fn an_empty_timeline_is_valid_json() {
    let t = TimelineWriter::new(Vec::new()).unwrap();
    assert_eq!(t.events(), 0);
    let v = parse(&t.finish().unwrap());
    assert!(events(&v).is_empty());
    assert_eq!(v["displayTimeUnit"], "ns");
    assert_eq!(v["otherData"]["clock"], "CLOCK_MONOTONIC");
}

#[test]
fn one_complete_event_per_pause_with_its_duration_in_microseconds() {
    // Pause records as the correlator reports them: start and duration in ns.
    let pauses: Vec<(u32, &str, u64, u64)> = (0..50u64)
        .map(|i| {
            let pid = if i % 2 == 0 { 100 } else { 200 };
            let reason = if i % 3 == 0 {
                "GC mark termination"
            } else {
                "GC sweep termination"
            };
            // Odd nanosecond counts on purpose: nothing may be rounded.
            (
                pid,
                reason,
                5_000_000_000_000 + i * 10_000_003,
                7_919 * (i + 1) + i,
            )
        })
        .collect();
    let mut t = TimelineWriter::new(Vec::new()).unwrap();
    t.process(100, "server").unwrap();
    t.process(200, "worker").unwrap();
    for (n, &(pid, reason, start, dur)) in pauses.iter().enumerate() {
        let args = json!({ "breakdown": { "stopping_ns": dur / 3 }, "faults": n, "caller": "runtime.gcStart" });
        t.pause(pid, reason, start, dur, &args).unwrap();
    }
    let text = String::from_utf8(t.finish().unwrap()).unwrap();
    let v = parse(text.as_bytes());
    let complete: Vec<&Value> = events(&v).iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(complete.len(), pauses.len(), "one X event per pause");
    for (e, &(pid, reason, start, dur)) in complete.iter().zip(&pauses) {
        assert_eq!(e["name"], reason);
        assert_eq!(e["cat"], "pause");
        assert_eq!(e["pid"], pid);
        assert_eq!(e["tid"], PAUSE_TRACK_TID);
        assert_eq!(e["ts"].to_string(), Micros(start).to_string());
        assert_eq!(e["dur"].to_string(), Micros(dur).to_string());
        let dur_us = e["dur"].as_f64().unwrap();
        assert_eq!((dur_us * 1000.0).round() as u64, dur);
        assert_eq!(e["args"]["caller"], "runtime.gcStart");
    }
    // Each process's pause track is named once and sorted first.
    let named: Vec<&Value> = events(&v)
        .iter()
        .filter(|e| e["name"] == "thread_name" && e["args"]["name"] == PAUSE_TRACK_NAME)
        .collect();
    assert_eq!(named.len(), 2);
    let sorted = events(&v)
        .iter()
        .filter(|e| e["name"] == "thread_sort_index")
        .count();
    assert_eq!(sorted, 2);
    assert!(
        text.contains(r#""dur":7.919,"#),
        "exact decimals in the text"
    );
}

#[test]
fn faults_are_slices_and_stack_growths_instants_on_their_threads() {
    let mut t = TimelineWriter::new(Vec::new()).unwrap();
    t.process(100, "server").unwrap();
    t.thread(100, 101, "gc worker").unwrap();
    t.slice(
        Track::thread(100, 101),
        "fault",
        "major fault (swap)",
        2_000_000,
        1_250_000,
        &json!({ "address": "0xc000123000", "wait_own_ns": 1_000_000 }),
    )
    .unwrap();
    t.instant(
        Track::thread(100, 102),
        "stack",
        "stack growth 2 KiB -> 32 KiB",
        2_500_000,
        &json!({ "function": "main.deep19k" }),
    )
    .unwrap();
    t.instant(
        Track::thread(100, 102),
        "stack",
        "plain",
        2_600_000,
        &Value::Null,
    )
    .unwrap();
    let v = parse(&t.finish().unwrap());
    let e = events(&v);
    assert_eq!(e.len(), 5);
    assert_eq!(e[2]["ph"], "X");
    assert_eq!(
        (e[2]["pid"].clone(), e[2]["tid"].clone()),
        (json!(100), json!(101))
    );
    assert_eq!(
        (e[2]["ts"].clone(), e[2]["dur"].clone()),
        (json!(2000), json!(1250))
    );
    assert_eq!(e[2]["args"]["wait_own_ns"], 1_000_000);
    assert_eq!(e[3]["ph"], "i");
    assert_eq!(e[3]["s"], "t");
    assert_eq!(e[3]["tid"], 102);
    assert_eq!(e[3]["ts"], 2500);
    assert_eq!(e[3]["args"]["function"], "main.deep19k");
    assert!(e[4].get("args").is_none(), "null args are left out");
}

#[test]
fn names_are_written_once_unless_they_change() {
    let mut t = TimelineWriter::new(Vec::new()).unwrap();
    t.process(7, "a").unwrap();
    t.process(7, "a").unwrap();
    t.thread(7, 8, "t").unwrap();
    t.thread(7, 8, "t").unwrap();
    assert_eq!(t.events(), 2);
    // After an exec the process has a new name.
    t.process(7, "b").unwrap();
    assert_eq!(t.events(), 3);
    let v = parse(&t.finish().unwrap());
    assert_eq!(events(&v)[2]["args"]["name"], "b");
}

#[test]
fn names_with_quotes_and_control_characters_stay_valid_json() {
    let mut t = TimelineWriter::new(Vec::new()).unwrap();
    let odd = "say \"hi\"\n\t\\ \u{1}";
    t.process(1, odd).unwrap();
    t.slice(Track::thread(1, 1), odd, odd, 0, 1, &json!({ odd: odd }))
        .unwrap();
    t.other_data("command", json!(odd));
    let v = parse(&t.finish().unwrap());
    assert_eq!(events(&v)[0]["args"]["name"], odd);
    assert_eq!(events(&v)[1]["name"], odd);
    assert_eq!(events(&v)[1]["cat"], odd);
    assert_eq!(events(&v)[1]["args"][odd], odd);
    assert_eq!(v["otherData"]["command"], odd);
}

#[test]
fn write_errors_reach_the_caller() {
    struct Full;
    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::other("disk full"))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    assert!(TimelineWriter::new(Full).is_err());
}
