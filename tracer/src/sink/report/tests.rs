//! Unit tests of the report sink: live records, the summary and its text.
use std::{cell::RefCell, io::Write, rc::Rc};

use super::*;
use crate::{
    model::labels::ProcessLabels,
    model::observed::{Observed, ObservedPause},
    model::pause::tests_support::record,
};

/// A writer for the sink that keeps every `write` call apart.
#[derive(Clone, Default)]
pub(super) struct Buf(Rc<RefCell<Vec<Vec<u8>>>>);
impl Buf {
    /// Everything written, as text.
    pub(super) fn text(&self) -> String {
        String::from_utf8(self.0.borrow().concat()).unwrap()
    }
}
impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().push(b.to_vec());
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn started(pid: u32) -> Observed {
    Observed::Started(Arc::new(ProcessInfo {
        pid,
        exe: "/x".into(),
        labels: ProcessLabels {
            executable: "x".into(),
            go_version: "go1.26.6".into(),
            build_id: String::new(),
            container: String::new(),
            namespace: String::new(),
            pod: String::new(),
        },
        go_version: "go1.26.6".into(),
        image: None,
    }))
}

fn pause(pid: u32, reason: u32, d: u64) -> Observed {
    let mut r = record(pid, 200, d);
    r.reason_code = reason;
    r.reason = crate::model::pause::StwReason(reason).id();
    Observed::Pause(Box::new(ObservedPause {
        record: r,
        faults: Vec::new(),
    }))
}

#[test]
fn threshold_filters_live_records_and_summary_has_every_pause() {
    let buf = Buf::default();
    let mut sink = ReportSink::new(
        View::Trace,
        Output::new(
            Box::new(buf.clone()),
            true,
            crate::model::pause::SlowThreshold::from_ns(1_000),
        ),
        false,
        None,
    );
    sink.observe(&started(9));
    for (reason, d) in [(2, 500), (2, 5_000), (7, 2_000)] {
        sink.observe(&pause(9, reason, d));
    }
    sink.observe(&Observed::ExitStatus { pid: 9, code: 0 });
    sink.observe(&Observed::KernelCounters(vec![
        (Counter::RingbufFull, 2),
        (Counter::RingbufFullPause, 2),
    ]));
    sink.finish(1).unwrap();
    let text = buf.text();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[0]["type"], "pause");
    assert_eq!(lines[0]["duration_ns"], 5_000);
    let sum = &lines[2];
    assert_eq!(sum["type"], "summary");
    let proc0 = &sum["processes"][0];
    assert_eq!(
        (proc0["pid"].as_u64(), proc0["exit_code"].as_i64()),
        (Some(9), Some(0))
    );
    assert_eq!(proc0["pauses"], 3);
    assert_eq!(proc0["by_reason"][0]["reason"], "gc_sweep_termination");
    assert_eq!(proc0["by_reason"][0]["count"], 2);
    assert_eq!(proc0["by_reason"][0]["max_ns"], 5_000);
    assert_eq!(proc0["by_reason"][1]["reason"], "read_mem_stats");
    assert_eq!(sum["lost"]["total"], 2);
    assert_eq!(sum["lost"]["kernel"]["ringbuf_full"], 2);
    assert_eq!(sum["lost"]["kernel"]["ringbuf_full_pause"], 2);
}

#[test]
fn each_live_record_is_one_write() {
    // `run` shares stdout with the traced program: a record written in
    // pieces could have the program's output land inside it.
    for json in [true, false] {
        let writes = Buf::default();
        let mut sink = ReportSink::new(
            View::Trace,
            Output::new(
                Box::new(writes.clone()),
                json,
                crate::model::pause::SlowThreshold::ALL,
            ),
            false,
            None,
        );
        sink.observe(&started(9));
        for d in [5_000, 7_000] {
            sink.observe(&pause(9, 2, d));
        }
        let got = writes.0.borrow();
        assert_eq!(got.len(), 2, "json {json}: {got:?}");
        for w in got.iter() {
            assert_eq!(w.iter().filter(|&&b| b == b'\n').count(), 1, "{w:?}");
            assert_eq!(w.last(), Some(&b'\n'));
        }
    }
}

#[test]
fn text_summary_names_reasons_and_losses() {
    let mut sink = ReportSink::new(
        View::Trace,
        Output::new(
            Box::new(std::io::sink()),
            false,
            crate::model::pause::SlowThreshold::ALL,
        ),
        false,
        None,
    );
    sink.observe(&started(3));
    sink.observe(&pause(3, 1, 40_000));
    sink.observe(&Observed::KernelCounters(vec![(Counter::MapFull, 0)]));
    let t = summary_text(&sink.summary(1_000_000_000));
    assert!(t.contains("GC mark termination"), "{t}");
    assert!(t.contains("40.0 us"), "{t}");
    assert!(t.contains("events lost: 0\n"), "{t}");
}

/// The stack-growth summary names sites from the code the stream carries
/// (the engine's), and knows nothing the stream did not say.
#[test]
fn stack_sites_are_named_from_the_stream_s_code() {
    use crate::{
        image::Frame,
        model::code::{Code, ReturnCode},
        stackgrowth::tests_support::exact_row,
    };
    let frame = |function: &str| Frame {
        function: function.into(),
        file: "main.go".into(),
        line: 7,
        inlined: false,
        start_line: 0,
    };
    let mut code = Code::default();
    for (pc, f, max) in [
        (0x1005, "main.deep", Some(19_496)),
        (0x2005, "main.task", None),
    ] {
        code.insert(
            pc,
            ReturnCode {
                frames: vec![frame(f)].into(),
                max_frame: max,
            },
        );
    }
    let row = exact_row(9, (0x1005, 0x2005), (8192, 32768), 3, 3 * 6000);
    let summary = |code: Code| {
        let mut sink = ReportSink::new(
            View::Stacks,
            Output::new(
                Box::new(Buf::default()),
                true,
                crate::model::pause::SlowThreshold::ALL,
            ),
            false,
            Some(Mode::Exact),
        );
        sink.observe(&started(9));
        sink.observe(&Observed::StackSites {
            pid: 9,
            rows: vec![row],
            observed: Default::default(),
            code: Arc::new(code),
        });
        sink.stack_summary().unwrap()
    };
    let named = summary(code);
    let site = &named.top_sites[0];
    assert_eq!(
        (&site.site.function[..], &site.caller.function[..]),
        ("main.deep", "main.task")
    );
    assert_eq!(site.count, 3);
    // The same rows without code: addresses, not names.
    let bare = summary(Code::default());
    assert_eq!(bare.top_sites[0].site.function, "0x1005");
}

/// Standard output whose reader stalls, then reads again: the live lines
/// it could not take are counted in the summary, which comes last, whole.
#[test]
fn a_stalled_reader_costs_live_lines_counted_in_the_summary() {
    use std::sync::{Arc, Condvar, Mutex};

    use crate::sink::queued::{Bounds, Destination, LineQueue, OutputCounters};

    /// Whether the reader reads, and what it read.
    type Reader = Mutex<(bool, Vec<u8>)>;
    /// Blocks each write until the test opens it.
    #[derive(Clone, Default)]
    struct Stalled(Arc<(Reader, Condvar)>);
    impl Destination for Stalled {
        fn write_line(&mut self, line: &[u8]) -> std::io::Result<()> {
            let mut s = self.0.0.lock().unwrap();
            while !s.0 {
                s = self.0.1.wait(s).unwrap();
            }
            s.1.extend_from_slice(line);
            Ok(())
        }
    }
    let out = Stalled::default();
    let bounds = Bounds {
        lines: 2,
        bytes: 1 << 20,
    };
    let queue = LineQueue::start("stdout", bounds, out.clone(), OutputCounters::default()).unwrap();
    let mut sink = ReportSink::new(
        View::Trace,
        Output::queued(queue, true, crate::model::pause::SlowThreshold::ALL),
        false,
        None,
    );
    sink.observe(&started(9));
    let started_at = std::time::Instant::now();
    for d in 1..=10 {
        sink.observe(&pause(9, 2, d * 1_000));
    }
    assert!(started_at.elapsed() < std::time::Duration::from_secs(1));
    let opener = {
        let out = out.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            out.0.0.lock().unwrap().0 = true;
            out.0.1.notify_all();
        })
    };
    sink.finish(1).unwrap();
    opener.join().unwrap();
    let text = String::from_utf8(out.0.0.lock().unwrap().1.clone()).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // At most one line being written and two queued got through.
    let pauses = lines.iter().filter(|l| l["type"] == "pause").count();
    assert!((2..=3).contains(&pauses), "{text}");
    let summary = lines.last().unwrap();
    assert_eq!(summary["type"], "summary");
    assert_eq!(summary["processes"][0]["pauses"], 10);
    let lost = &summary["lost"]["output"];
    assert_eq!(lost["queue_full"].as_u64().unwrap(), 10 - pauses as u64);
    assert!(lost["first_unix_ns"].as_u64().unwrap() > 0);
    let (losses, unwritten) = sink.unwritten().unwrap();
    assert_eq!(losses.written as usize, pauses + 1);
    assert_eq!(unwritten.lines, 0);
    let said = text::unwritten_text(&losses);
    assert!(
        said.starts_with(&format!(
            "live lines not written: {} ({} while its reader did not keep up), from ",
            10 - pauses,
            10 - pauses
        )),
        "{said}"
    );
}
