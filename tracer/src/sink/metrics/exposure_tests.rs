//! The exposure series through the metrics sink: summed per label set,
//! updated by each reading, gone with the set's last process. (The agent's
//! kernel test checks them with promtool, in the /metrics it serves.)

use std::sync::Arc;

use prometheus_client::encoding::text::encode;

use crate::{
    memory::{advice::tests::exposure, watch::ExposureReading, watch::ReadAt},
    model::labels::ProcessLabels,
    model::observed::{Observed, ProcessInfo},
    sink::{
        Sink as _,
        metrics::{Metrics, MetricsSink},
    },
};

fn labels(exe: &str) -> ProcessLabels {
    ProcessLabels {
        executable: exe.to_owned(),
        go_version: "go1.26.6".to_owned(),
        build_id: "abc".to_owned(),
        container: String::new(),
        namespace: String::new(),
        pod: String::new(),
    }
}

fn started(pid: u32, exe: &str) -> Observed {
    Observed::Started(Arc::new(ProcessInfo {
        pid,
        exe: format!("/srv/{exe}").into(),
        labels: labels(exe),
        go_version: "go1.26.6".into(),
        image: None,
    }))
}

fn reading(pid: u32, meta_swapped: u64, read_ns: u64) -> Observed {
    let mut e = exposure(meta_swapped, 0, None);
    e.pid = pid;
    Observed::Exposure(Arc::new(ExposureReading {
        pid,
        at: ReadAt::Refresh,
        exposure: Ok(e),
        read_ns,
        host_swap: None,
    }))
}

fn text(m: &Metrics) -> String {
    let mut s = String::new();
    encode(&mut s, m.registry()).unwrap();
    s
}

const L: &str =
    r#"executable="api",go_version="go1.26.6",build_id="abc",container="",namespace="",pod="""#;

fn series(class: &str, state: &str, v: u64) -> String {
    format!(r#"gostw_process_memory_bytes{{{L},class="{class}",state="{state}"}} {v}"#)
}

#[test]
fn processes_of_a_label_set_are_summed_and_go_with_the_last() {
    let metrics = Arc::new(Metrics::new());
    let mut sink = MetricsSink::new(metrics.clone());
    sink.observe(&started(1, "api"));
    sink.observe(&started(2, "api"));
    sink.observe(&reading(1, 1 << 20, 4_000_000));
    sink.observe(&reading(2, 2 << 20, 6_000_000));
    // The test exposure: heap 100 MiB, metadata 4 MiB resident, files 2 MiB, other 1 MiB.
    let t = text(&metrics);
    for want in [
        series("gc_metadata", "swapped", 3 << 20),
        series("gc_metadata", "resident", 8 << 20),
        series("heap_arenas", "resident", 200 << 20),
        series("heap_arenas", "swapped", 0),
        series("file_backed", "resident", 4 << 20),
        series("other", "resident", 2 << 20),
        "gostw_agent_exposure_read_duration_seconds_count 2".to_owned(),
        r#"gostw_agent_exposure_read_duration_seconds_bucket{le="0.005"} 1"#.to_owned(),
    ] {
        assert!(t.contains(&want), "missing {want} in\n{t}");
    }
    // A newer reading replaces the process's figures.
    sink.observe(&reading(1, 0, 4_000_000));
    assert!(text(&metrics).contains(&series("gc_metadata", "swapped", 2 << 20)));
    // A failed read is counted and changes nothing.
    sink.observe(&Observed::Exposure(Arc::new(ExposureReading {
        pid: 2,
        at: ReadAt::Refresh,
        exposure: Err("process 2 has exited".into()),
        read_ns: 1_000,
        host_swap: None,
    })));
    let t = text(&metrics);
    assert!(
        t.contains("gostw_agent_exposure_read_failures_total 1"),
        "{t}"
    );
    assert!(t.contains(&series("gc_metadata", "swapped", 2 << 20)));
    sink.observe(&Observed::Exited {
        pid: 2,
        last_of_labels: false,
    });
    assert!(text(&metrics).contains(&series("gc_metadata", "swapped", 0)));
    sink.observe(&Observed::Exited {
        pid: 1,
        last_of_labels: true,
    });
    let t = text(&metrics);
    assert!(!t.contains("gostw_process_memory_bytes{"), "{t}");
    // Readings of processes not traced are not series.
    sink.observe(&reading(9, 1 << 20, 1_000_000));
    assert!(!text(&metrics).contains("gostw_process_memory_bytes{"));
}
