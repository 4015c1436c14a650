//! The agent's memory exposure series: what the traced processes hold
//! resident and in swap now, by what Go uses it for, refreshed on the
//! agent's `--exposure-every` interval. Labels stay bounded: the tracker's
//! process labels, the four memory classes and two states; processes that
//! share a label set are summed, and a set's series go when its last
//! process exits.

use std::{collections::HashMap, sync::Mutex};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};

use crate::{
    memory::{Exposure, MemoryClass, watch::ExposureReading},
    model::labels::ProcessLabels,
};

/// `state`: in memory or in swap.
const STATES: [&str; 2] = ["resident", "swapped"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemoryLabels {
    #[prometheus(flatten)]
    process: ProcessLabels,
    class: &'static str,
    state: &'static str,
}

/// The metric label of a class.
pub fn class_label(c: MemoryClass) -> &'static str {
    match c {
        MemoryClass::HeapArenas => "heap_arenas",
        MemoryClass::GcMetadata => "gc_metadata",
        MemoryClass::FileBacked => "file_backed",
        MemoryClass::Other => "other",
    }
}

/// Bytes by class and state, in `MemoryClass::ALL` and `STATES` order.
type Figures = [[u64; 2]; 4];

fn figures(e: &Exposure) -> Figures {
    MemoryClass::ALL.map(|c| {
        let u = &e.class(c).usage;
        [u.resident_bytes, u.swapped_bytes]
    })
}

/// The exposure series and what the reads cost.
pub struct ExposureMetrics {
    memory: Family<MemoryLabels, Gauge>,
    read_duration: Histogram,
    read_failures: prometheus_client::metrics::counter::Counter,
    /// The last figures of each process, for the sums of its label set.
    last: Mutex<HashMap<u32, (ProcessLabels, Figures)>>,
}

impl Default for ExposureMetrics {
    fn default() -> Self {
        ExposureMetrics {
            memory: Family::default(),
            read_duration: Histogram::new([1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0]),
            read_failures: Default::default(),
            last: Mutex::new(HashMap::new()),
        }
    }
}

impl ExposureMetrics {
    /// Register the families in `r` (the `gostw` registry).
    pub fn register(&self, r: &mut Registry) {
        r.register_with_unit(
            "process_memory",
            "Memory of traced processes resident and swapped out now, by what Go uses it for (heap_arenas, gc_metadata, file_backed, other); summed over the processes of a label set; refreshed every --exposure-every",
            Unit::Bytes,
            self.memory.clone(),
        );
        let a = r.sub_registry_with_prefix("agent");
        a.register_with_unit(
            "exposure_read_duration",
            "Time to read one process's memory exposure (smaps, pagemap, the runtime's heap index), in a thread off the event loop",
            Unit::Seconds,
            self.read_duration.clone(),
        );
        a.register(
            "exposure_read_failures",
            "Reads of a process's memory exposure that failed (the process exited during the read, or its memory could not be read)",
            self.read_failures.clone(),
        );
    }

    /// A reading of a process with `labels` came in.
    pub fn reading(&self, labels: &ProcessLabels, r: &ExposureReading) {
        self.read_duration.observe(r.read_ns as f64 / 1e9);
        let Ok(e) = &r.exposure else {
            self.read_failures.inc();
            return;
        };
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.insert(r.pid, (labels.clone(), figures(e)));
        self.set(&last, labels);
    }

    /// Process `pid` exited: its figures leave its label set's sums (and
    /// the set's series go with its last process).
    pub fn exited(&self, pid: u32) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((labels, _)) = last.remove(&pid) {
            self.set(&last, &labels);
        }
    }

    /// Set the series of `labels` to the sums of its processes' figures.
    fn set(&self, last: &HashMap<u32, (ProcessLabels, Figures)>, labels: &ProcessLabels) {
        let mut sum: Figures = [[0; 2]; 4];
        let mut any = false;
        for (_, f) in last.values().filter(|(l, _)| l == labels) {
            any = true;
            for (s, f) in sum.iter_mut().zip(f) {
                s[0] += f[0];
                s[1] += f[1];
            }
        }
        for (c, by_state) in MemoryClass::ALL.iter().zip(sum) {
            for (state, bytes) in STATES.iter().zip(by_state) {
                let key = MemoryLabels {
                    process: labels.clone(),
                    class: class_label(*c),
                    state,
                };
                if any {
                    self.memory
                        .get_or_create(&key)
                        .set(i64::try_from(bytes).unwrap_or(i64::MAX));
                } else {
                    self.memory.remove(&key);
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "exposure_tests.rs"]
mod tests;
