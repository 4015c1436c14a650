//! The agent's record of every slow pause: each pause of at least a
//! threshold, with its explanation (the `pause` record `attach --json`
//! writes) and its process's labels, kept in a bounded store for
//! `/debug/pauses` and `gostw pauses`, and written to the pause log. The
//! store is bounded in all and per label set; the oldest go first, counted.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
};

use serde::Serialize;

use super::{Sink, pause_log::PauseLog};
use crate::{
    model::labels::ProcessLabels,
    model::{
        observed::Observed,
        pause::{PauseRecord, SlowThreshold},
    },
    sink::metrics::Metrics,
};

/// One slow pause as kept and served.
#[derive(Debug, Serialize)]
pub struct SlowPause {
    #[serde(rename = "type")]
    kind: &'static str,
    /// Unique on the host until it reboots, and the same for the same pause
    /// across agent restarts: `<pid>-<start, CLOCK_MONOTONIC ns>`.
    pub id: String,
    pub labels: ProcessLabels,
    #[serde(flatten)]
    pub record: PauseRecord,
}

/// The id of the record of pause `p` (see `SlowPause::id`).
pub fn record_id(p: &PauseRecord) -> String {
    format!("{}-{}", p.pid, p.start_mono_ns)
}

impl SlowPause {
    pub fn new(labels: &ProcessLabels, record: PauseRecord) -> SlowPause {
        SlowPause {
            kind: "pause",
            id: record_id(&record),
            labels: labels.clone(),
            record,
        }
    }
}

/// How many records the store keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreLimits {
    pub total: usize,
    pub per_label_set: usize,
}

/// Which records a reader wants: all of these that are set must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Query {
    pub executable: Option<String>,
    pub container: Option<String>,
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub pid: Option<u32>,
    /// At or after this wall-clock time.
    pub since_unix_ns: Option<u64>,
    /// At least this long.
    pub min_ns: Option<u64>,
    /// At most this many, the newest.
    pub limit: Option<usize>,
}

impl Query {
    fn matches(&self, p: &SlowPause) -> bool {
        self.executable
            .as_ref()
            .is_none_or(|e| *e == p.labels.executable)
            && self
                .container
                .as_ref()
                .is_none_or(|c| *c == p.labels.container)
            && self
                .namespace
                .as_ref()
                .is_none_or(|n| *n == p.labels.namespace)
            && self.pod.as_ref().is_none_or(|n| *n == p.labels.pod)
            && self.pid.is_none_or(|pid| pid == p.record.pid)
            && self
                .since_unix_ns
                .is_none_or(|t| p.record.start_unix_ns >= t)
            && self.min_ns.is_none_or(|m| p.record.duration_ns >= m)
    }
}

/// The kept records, oldest first.
pub struct SlowPauseStore {
    limits: StoreLimits,
    records: VecDeque<Arc<SlowPause>>,
    per_set: HashMap<ProcessLabels, usize>,
}

impl SlowPauseStore {
    pub fn new(limits: StoreLimits) -> SlowPauseStore {
        SlowPauseStore {
            limits,
            records: VecDeque::new(),
            per_set: HashMap::new(),
        }
    }

    /// Keep `p`; returns how many older records were evicted for it.
    pub fn insert(&mut self, p: Arc<SlowPause>) -> u64 {
        let mut evicted = 0;
        if self.limits.total == 0 || self.limits.per_label_set == 0 {
            return 1;
        }
        // Its own label set's oldest first: a storm in one service does not
        // push out the others' records.
        if self.per_set.get(&p.labels).copied().unwrap_or(0) >= self.limits.per_label_set
            && let Some(i) = self.records.iter().position(|r| r.labels == p.labels)
        {
            self.remove(i);
            evicted += 1;
        }
        while self.records.len() >= self.limits.total {
            self.remove(0);
            evicted += 1;
        }
        *self.per_set.entry(p.labels.clone()).or_default() += 1;
        self.records.push_back(p);
        evicted
    }

    fn remove(&mut self, i: usize) {
        if let Some(r) = self.records.remove(i)
            && let Some(n) = self.per_set.get_mut(&r.labels)
        {
            *n -= 1;
            if *n == 0 {
                self.per_set.remove(&r.labels);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The records `q` selects, newest first.
    pub fn query(&self, q: &Query) -> Vec<Arc<SlowPause>> {
        self.records
            .iter()
            .rev()
            .filter(|p| q.matches(p))
            .take(q.limit.unwrap_or(usize::MAX))
            .cloned()
            .collect()
    }
}

/// The store shared with the HTTP thread.
pub type SharedStore = Arc<Mutex<SlowPauseStore>>;

/// Feeds the store and the pause log from the stream.
pub struct SlowPauseSink {
    store: SharedStore,
    slow: SlowThreshold,
    log: Option<PauseLog>,
    metrics: Arc<Metrics>,
    labels: HashMap<u32, ProcessLabels>,
}

impl SlowPauseSink {
    /// Keeps and logs the `slow` pauses.
    pub fn new(
        store: SharedStore,
        slow: SlowThreshold,
        log: Option<PauseLog>,
        metrics: Arc<Metrics>,
    ) -> SlowPauseSink {
        SlowPauseSink {
            store,
            slow,
            log,
            metrics,
            labels: HashMap::new(),
        }
    }

    fn slow(&mut self, record: &PauseRecord) {
        if !self.slow.is_slow(record.duration_ns) {
            return;
        }
        let Some(labels) = self.labels.get(&record.pid) else {
            return;
        };
        let p = Arc::new(SlowPause::new(labels, record.clone()));
        let m = &self.metrics.slow_pauses;
        m.recorded.inc();
        // A line the log leaves out is counted by its queue (in `unlogged`
        // too); the record is kept below all the same.
        if let Some(log) = &mut self.log {
            log.write(&*p);
        }
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let evicted = store.insert(p);
        m.evicted.inc_by(evicted);
        m.kept.set(store.len() as i64);
    }
}

impl SlowPauseSink {
    /// The pause log, to finish it when the agent stops.
    pub fn take_log(&mut self) -> Option<PauseLog> {
        self.log.take()
    }
}

impl Sink for SlowPauseSink {
    fn observe(&mut self, o: &Observed) {
        match o {
            Observed::Started(info) => {
                self.labels.insert(info.pid, info.labels.clone());
            }
            // Records of a process that exited stay: they are why it is
            // looked at afterwards.
            Observed::Exited { pid, .. } => {
                self.labels.remove(pid);
            }
            Observed::Pause(p) => self.slow(&p.record),
            _ => {}
        }
    }
}

#[cfg(test)]
#[path = "slow_pauses_tests.rs"]
mod tests;
