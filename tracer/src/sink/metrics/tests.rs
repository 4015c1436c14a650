//! The metrics' families: units, buckets, series removed with their
//! processes.

use prometheus_client::encoding::text::encode;

use super::*;

fn labels(exe: &str) -> ProcessLabels {
    ProcessLabels {
        executable: exe.to_owned(),
        go_version: "go1.22.10".to_owned(),
        build_id: "abc".to_owned(),
        container: String::new(),
        namespace: String::new(),
        pod: String::new(),
    }
}

fn text(m: &Metrics) -> String {
    let mut s = String::new();
    encode(&mut s, m.registry()).unwrap();
    s
}

#[test]
fn series_have_base_units_and_vanish_with_their_processes() {
    let m = Metrics::new();
    let a = labels("api");
    m.process_started(&a);
    m.pause(
        &a,
        &PauseObservation {
            reason: "gc_mark_termination",
            duration_ns: 40_000_000,
            major_faults: 3,
            record_id: Some("7-12".into()),
        },
    );
    m.fault(
        &a,
        &FaultObservation {
            in_pause: true,
            backing: FaultKind::SwapIn,
            wait_ns: 2_000_000,
            waited_on: WaitedOn::Other,
        },
    );
    m.stack_growth(
        &a,
        &StackGrowthObservation {
            old_size: 8192,
            live_bytes: 3000,
        },
    );
    m.cpu_samples(
        &a,
        CpuSamples {
            all: 400,
            stack_growth: 33,
        },
        99,
    );
    m.cpu_samples(
        &a,
        CpuSamples {
            all: 100,
            stack_growth: 66,
        },
        99,
    );
    let t = text(&m);
    let l = r#"executable="api",go_version="go1.22.10",build_id="abc",container="",namespace="",pod="""#;
    for want in [
        format!(
            r#"gostw_pause_duration_seconds_bucket{{le="0.05",{l},reason="gc_mark_termination"}} 1"#
        ),
        format!(
            r#"gostw_pause_duration_seconds_bucket{{le="0.02",{l},reason="gc_mark_termination"}} 0"#
        ),
        // The bucket names the pause's record.
        format!(
            r#"gostw_pause_duration_seconds_bucket{{le="0.05",{l},reason="gc_mark_termination"}} 1 # {{pause_id="7-12"}} 0.04"#
        ),
        format!(r#"gostw_pause_major_faults_bucket{{le="5.0",{l}}} 1"#),
        format!(r#"gostw_pause_major_faults_bucket{{le="2.0",{l}}} 0"#),
        format!(r#"gostw_major_faults_total{{{l},in_pause="true",backing="swap"}} 1"#),
        format!(r#"gostw_fault_wait_seconds_count{{{l},in_pause="true",waited_on="other"}} 1"#),
        format!(r#"gostw_cpu_samples_total{{{l}}} 500"#),
        format!(r#"gostw_stack_growth_samples_total{{{l}}} 99"#),
        format!(r#"gostw_stack_growth_cpu_seconds_total{{{l}}} 1.0"#),
        format!(r#"gostw_stack_growth_old_size_bytes_bucket{{le="8192.0",{l}}} 1"#),
        format!(r#"gostw_stack_growth_old_size_bytes_bucket{{le="4096.0",{l}}} 0"#),
        format!(r#"gostw_traced_processes{{{l}}} 1"#),
        r#"gostw_agent_attach_failures_total{reason="limit"} 0"#.to_owned(),
    ] {
        assert!(t.contains(&want), "missing {want} in\n{t}");
    }
    m.process_exited(&a);
    m.remove(&a);
    let t = text(&m);
    assert!(!t.contains("executable=\"api\""), "{t}");
    assert_eq!(m.live_label_sets(), 0);
}

#[test]
fn buckets_cover_10us_to_10s_increasing() {
    assert_eq!(SECONDS_BUCKETS.first(), Some(&10e-6));
    assert_eq!(SECONDS_BUCKETS.last(), Some(&10.0));
    assert!(SECONDS_BUCKETS.windows(2).all(|w| w[0] < w[1]));
    let stack: Vec<f64> = stack_size_buckets().collect();
    assert_eq!((stack[0], stack[stack.len() - 1]), (2048.0, 1073741824.0));
}
