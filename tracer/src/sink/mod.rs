//! The front ends' ends of the one stream: every output gostw makes is a
//! `Sink` of `model::observed::Observed`.
//!
//! - `report`: live lines and the summary, as text or JSON (attach, run,
//!   faults, stacks).
//! - `metrics`: the agent's Prometheus metrics.
//! - `profile`: pprof profiles of faults and stack growth (`--pprof`, the
//!   agent's `/debug/pprof/*`).
//! - `timeline`: the trace-event timeline (`--timeline`).
//! - `slow_pauses`: the agent's record of every slow pause
//!   (`/debug/pauses`), and `pause_log` the JSON lines it writes of them.

pub mod file;
pub mod metrics;
pub mod otlp;
pub mod pause_log;
pub mod profile;
pub mod report;
pub mod slow_pauses;
pub mod timeline;

/// Defined beside the stream it consumes, so the engine, below the sinks,
/// can feed one.
pub use crate::model::observed::Sink;

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{
        Sink as _,
        metrics::{Metrics, MetricsSink},
        report::{Output, ReportSink, View},
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
        model::labels::ProcessLabels,
        model::observed::{Observed, ProcessInfo},
    };

    /// The value of the first series line starting with `prefix`.
    fn value(text: &str, prefix: &str) -> f64 {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
    }

    /// One recorded stream, two sinks: the report's numbers and the
    /// metrics' numbers are the same.
    #[test]
    fn a_recorded_stream_gives_both_sinks_the_same_numbers() {
        const MS: u64 = 1_000_000;
        let pid = 7;
        let info = Arc::new(ProcessInfo {
            pid,
            exe: "/srv/api".into(),
            labels: ProcessLabels {
                executable: "api".into(),
                go_version: "go1.26.6".into(),
                build_id: "b1".into(),
                container: String::new(),
                namespace: String::new(),
                pod: String::new(),
            },
            go_version: "go1.26.6".into(),
            image: None,
        });
        let mut stream = Stream::new(
            WallClock::default(),
            StreamOptions {
                faults: true,
                stacks: false,
            },
        );
        let mut out = vec![Observed::Started(info)];
        // Two GCs and a ReadMemStats; faults inside (stopper and another
        // thread, one ending after the pause), between and after them.
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

        let mut report = ReportSink::new(
            View::Trace,
            Output::new(Box::new(std::io::sink()), true, u64::MAX),
            true,
            None,
        );
        let metrics = Arc::new(Metrics::new());
        let mut both = (report, MetricsSink::new(metrics.clone()));
        both.observe_all(&out);
        report = both.0;
        let s = report.summary(0);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, metrics.registry()).unwrap();
        let l = r#"executable="api",go_version="go1.26.6",build_id="b1",container="",namespace="",pod="""#;

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
}
