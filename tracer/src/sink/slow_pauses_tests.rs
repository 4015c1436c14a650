use super::*;
use crate::model::pause::tests_support::record;

const MS: u64 = 1_000_000;

fn labels(exe: &str) -> ProcessLabels {
    ProcessLabels {
        executable: exe.into(),
        go_version: "go1.27.3".into(),
        build_id: String::new(),
        container: String::new(),
        namespace: String::new(),
        pod: String::new(),
    }
}

fn pause(exe: &str, pid: u32, start: u64, dur: u64) -> Arc<SlowPause> {
    Arc::new(SlowPause::new(&labels(exe), record(pid, start, dur)))
}

fn ids(v: &[Arc<SlowPause>]) -> Vec<&str> {
    v.iter().map(|p| p.id.as_str()).collect()
}

#[test]
fn the_oldest_go_first_per_label_set_then_in_all_and_are_counted() {
    let mut s = SlowPauseStore::new(StoreLimits {
        total: 4,
        per_label_set: 2,
    });
    assert_eq!(s.insert(pause("api", 1, 10, MS)), 0);
    assert_eq!(s.insert(pause("db", 2, 20, MS)), 0);
    assert_eq!(s.insert(pause("api", 1, 30, MS)), 0);
    // A third of "api" evicts the oldest "api", not "db".
    assert_eq!(s.insert(pause("api", 1, 40, MS)), 1);
    assert_eq!(ids(&s.query(&Query::default())), ["1-40", "1-30", "2-20"]);
    assert_eq!(s.insert(pause("web", 3, 50, MS)), 0);
    // Full in all: the oldest of any set goes.
    assert_eq!(s.insert(pause("cache", 4, 60, MS)), 1);
    assert_eq!(
        ids(&s.query(&Query::default())),
        ["4-60", "3-50", "1-40", "1-30"]
    );
    assert_eq!(s.len(), 4);
}

#[test]
fn queries_filter_and_return_the_newest_first() {
    let mut s = SlowPauseStore::new(StoreLimits {
        total: 100,
        per_label_set: 100,
    });
    s.insert(pause("api", 1, 10, MS));
    s.insert(pause("api", 5, 20, 30 * MS));
    s.insert(pause("db", 2, 30, 5 * MS));
    let q = |q: Query| ids(&s.query(&q)).join(",");
    assert_eq!(
        q(Query {
            executable: Some("api".into()),
            ..Query::default()
        }),
        "5-20,1-10"
    );
    assert_eq!(
        q(Query {
            min_ns: Some(5 * MS),
            ..Query::default()
        }),
        "2-30,5-20"
    );
    assert_eq!(
        q(Query {
            pid: Some(1),
            ..Query::default()
        }),
        "1-10"
    );
    assert_eq!(
        q(Query {
            since_unix_ns: Some(20),
            ..Query::default()
        }),
        "2-30,5-20"
    );
    assert_eq!(
        q(Query {
            limit: Some(1),
            ..Query::default()
        }),
        "2-30"
    );
    assert_eq!(
        q(Query {
            container: Some("x".into()),
            ..Query::default()
        }),
        ""
    );
}

#[test]
fn a_record_is_the_pause_object_with_its_id_and_labels() {
    let p = pause("api", 7, 123, 2 * MS);
    let v = serde_json::to_value(&*p).unwrap();
    assert_eq!(v["type"], "pause");
    assert_eq!(v["id"], "7-123");
    assert_eq!(v["labels"]["executable"], "api");
    assert_eq!(v["pid"], 7);
    assert_eq!(v["duration_ns"], 2 * MS);
    assert_eq!(v["reason"], "gc_sweep_termination");
}

#[test]
fn the_sink_keeps_slow_pauses_of_known_processes_and_counts() {
    use crate::model::observed::{ObservedPause, ProcessInfo};
    let metrics = Arc::new(Metrics::new());
    let store: SharedStore = Arc::new(Mutex::new(SlowPauseStore::new(StoreLimits {
        total: 1,
        per_label_set: 1,
    })));
    let mut sink = SlowPauseSink::new(
        store.clone(),
        crate::model::pause::SlowThreshold::from_ns(MS),
        None,
        metrics.clone(),
    );
    sink.observe(&Observed::Started(Arc::new(ProcessInfo {
        pid: 7,
        exe: "/srv/api".into(),
        labels: labels("api"),
        go_version: "go1.27.3".into(),
        image: None,
    })));
    let pause = |dur| {
        Observed::Pause(Box::new(ObservedPause {
            record: record(7, dur, dur),
            faults: Vec::new(),
        }))
    };
    sink.observe(&pause(MS - 1));
    sink.observe(&pause(MS));
    sink.observe(&pause(3 * MS));
    let kept = store.lock().unwrap().query(&Query::default());
    assert_eq!(ids(&kept), [format!("7-{}", 3 * MS)]);
    let m = &metrics.slow_pauses;
    assert_eq!((m.recorded.get(), m.evicted.get(), m.kept.get()), (2, 1, 1));
}
