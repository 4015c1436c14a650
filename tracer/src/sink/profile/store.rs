//! The profile samples of every traced label set, summed as they arrive,
//! with a hard memory bound: at most `MAX_SAMPLES` distinct samples and
//! `MAX_STACK_BYTES` of stacks, stacks shared between samples and label
//! sets. What does not fit is summed into one `[gostw: profile limit]`
//! frame per label set and tag, so totals stay right while the detail of new
//! sites is lost. A label set's samples are kept `RETAIN` after its last
//! process exits (so a window spanning the exit still has them), then
//! dropped.
//!
//! Profiles are cumulative snapshots; a window is the difference of two
//! (`Snapshot::since`), as net/http/pprof does for `?seconds=N`.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use super::locations::{Stack, stack_bytes};
use crate::{
    formats::{
        debug_pprof::MAX_SECONDS,
        pprof::{Label, Location, MappingInfo},
        profiles::{
            FaultPause, FaultProfile, FaultRecord, GrowthProfile, GrowthRecord, ProfileInfo,
            ProfileKind, StackGrowthMode,
        },
    },
    image::Frame,
    model::fault::FaultKind,
    model::labels::ProcessLabels,
};

/// Distinct samples kept, all label sets and both profiles together.
pub const MAX_SAMPLES: usize = 32_768;
/// Bytes of interned stacks kept (strings and structs, roughly).
pub const MAX_STACK_BYTES: usize = 8 << 20;
/// How long a label set's samples outlive its last process: longer than
/// the longest window a request may ask for.
pub const RETAIN: Duration = Duration::from_secs(MAX_SECONDS + 60);
/// The frame that stands for the sites that did not fit.
pub const LIMIT_FUNCTION: &str = "[gostw: profile limit]";

/// The pause a fault began in, as its labels say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PauseTag {
    /// The stwReason id.
    pub reason: &'static str,
    pub by_stopper: bool,
}

/// A sample's labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tags {
    Fault {
        kind: FaultKind,
        pause: Option<PauseTag>,
    },
    Growth {
        old_stack: u64,
        /// 0: unknown (sampled).
        new_stack: u64,
    },
}

impl Tags {
    /// The profile a sample with these tags belongs to.
    pub fn kind(&self) -> ProfileKind {
        match self {
            Tags::Fault { .. } => ProfileKind::Faults,
            Tags::Growth { .. } => ProfileKind::StackGrowth,
        }
    }
}

/// A sample's identity: its stack and its labels.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SampleKey {
    pub stack: Stack,
    pub tags: Tags,
}

/// A sample's values: (faults, fault ns) or (growths or copy samples,
/// bytes copied).
pub type Values = [u64; 2];

struct LabelSet {
    mapping: Option<MappingInfo>,
    since_unix_ns: i64,
    live: usize,
    gone: Option<Instant>,
    samples: HashMap<SampleKey, Values>,
}

/// Samples per label set.
pub struct Store {
    sets: HashMap<ProcessLabels, LabelSet>,
    stacks: HashSet<Stack>,
    stack_bytes: usize,
    samples: usize,
    limit: Stack,
    /// Observations summed into the limit frame because the store was full.
    pub limited: u64,
}

impl Default for Store {
    fn default() -> Self {
        Store::new()
    }
}

/// Now as ns since the Unix epoch.
pub fn unix_now_ns() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

impl Store {
    /// An empty store.
    pub fn new() -> Store {
        let limit: Stack = Arc::from(vec![Location {
            address: 0,
            frames: vec![Frame {
                function: LIMIT_FUNCTION.to_owned(),
                file: String::new(),
                line: 0,
                inlined: false,
                start_line: 0,
            }],
        }]);
        Store {
            sets: HashMap::new(),
            stacks: HashSet::new(),
            stack_bytes: 0,
            samples: 0,
            limit,
            limited: 0,
        }
    }

    /// A process of `labels` is traced, running the code of `mapping`.
    pub fn started(&mut self, labels: &ProcessLabels, mapping: Option<MappingInfo>) {
        let set = self.set(labels);
        set.live += 1;
        set.gone = None;
        if set.mapping.is_none() {
            set.mapping = mapping;
        }
    }

    /// A process of `labels` is no longer traced (at `now`).
    pub fn exited(&mut self, labels: &ProcessLabels, now: Instant) {
        if let Some(set) = self.sets.get_mut(labels) {
            set.live = set.live.saturating_sub(1);
            if set.live == 0 {
                set.gone = Some(now);
            }
        }
    }

    fn set(&mut self, labels: &ProcessLabels) -> &mut LabelSet {
        self.sets.entry(labels.clone()).or_insert_with(|| LabelSet {
            mapping: None,
            since_unix_ns: unix_now_ns(),
            live: 0,
            gone: None,
            samples: HashMap::new(),
        })
    }

    /// The shared copy of `stack`, if it is known or fits.
    fn intern(&mut self, stack: Vec<Location>) -> Option<Stack> {
        if let Some(s) = self.stacks.get(&stack[..]) {
            return Some(s.clone());
        }
        let bytes = stack_bytes(&stack);
        if self.stack_bytes + bytes > MAX_STACK_BYTES {
            return None;
        }
        self.stack_bytes += bytes;
        let s: Stack = Arc::from(stack);
        self.stacks.insert(s.clone());
        Some(s)
    }

    /// Add `values` to the sample (`stack`, `tags`) of `labels`.
    pub fn add(
        &mut self,
        labels: &ProcessLabels,
        stack: Vec<Location>,
        tags: Tags,
        values: Values,
    ) {
        let full = self.samples >= MAX_SAMPLES;
        let stack = if full {
            // Only a sample already held may grow: no need to keep this copy.
            Arc::from(stack)
        } else {
            self.intern(stack).unwrap_or_else(|| self.limit.clone())
        };
        let mut key = SampleKey { stack, tags };
        let held = self
            .sets
            .get(labels)
            .is_some_and(|s| s.samples.contains_key(&key));
        if full && !held {
            key.stack = self.limit.clone();
        }
        if Arc::ptr_eq(&key.stack, &self.limit) {
            if self.limited == 0 {
                log::warn!(
                    "profile store full ({MAX_SAMPLES} samples or {} MiB of stacks): new sites are summed as {LIMIT_FUNCTION}",
                    MAX_STACK_BYTES >> 20
                );
            }
            self.limited += 1;
        }
        let set = self.set(labels);
        let new = !set.samples.contains_key(&key);
        let v = set.samples.entry(key).or_insert([0, 0]);
        v[0] = v[0].saturating_add(values[0]);
        v[1] = v[1].saturating_add(values[1]);
        if new {
            self.samples += 1;
        }
    }

    /// Drop label sets gone for longer than `RETAIN`, and the stacks only
    /// they used.
    pub fn expire(&mut self, now: Instant) {
        let before = self.sets.len();
        self.sets
            .retain(|_, s| s.gone.is_none_or(|g| now.duration_since(g) < RETAIN));
        if self.sets.len() == before {
            return;
        }
        self.samples = self.sets.values().map(|s| s.samples.len()).sum();
        // The set holds one reference; a sample or a snapshot, the others.
        self.stacks.retain(|s| Arc::strong_count(s) > 1);
        self.stack_bytes = self.stacks.iter().map(|s| stack_bytes(s)).sum();
    }

    /// Distinct samples held.
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// Bytes of stacks held.
    pub fn stack_bytes(&self) -> usize {
        self.stack_bytes
    }

    /// Label sets held (traced or recently gone).
    pub fn label_sets(&self) -> usize {
        self.sets.len()
    }

    /// The `kind` samples so far of the label sets `select` accepts.
    pub fn snapshot(&self, kind: ProfileKind, select: impl Fn(&ProcessLabels) -> bool) -> Snapshot {
        let mut sets: Vec<SetSnapshot> = self
            .sets
            .iter()
            .filter(|(l, _)| select(l))
            .map(|(l, s)| SetSnapshot {
                labels: l.clone(),
                mapping: s.mapping.clone(),
                since_unix_ns: s.since_unix_ns,
                samples: s
                    .samples
                    .iter()
                    .filter(|(k, _)| k.tags.kind() == kind)
                    .map(|(k, v)| (k.clone(), *v))
                    .collect(),
            })
            .collect();
        sets.sort_by(|a, b| a.labels.cmp(&b.labels));
        Snapshot {
            kind,
            at_unix_ns: unix_now_ns(),
            sets,
        }
    }
}

/// One label set's samples at one time.
#[derive(Clone, Debug)]
pub struct SetSnapshot {
    pub labels: ProcessLabels,
    pub mapping: Option<MappingInfo>,
    pub since_unix_ns: i64,
    pub samples: HashMap<SampleKey, Values>,
}

/// Cumulative samples of some label sets, taken at `at_unix_ns`.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub kind: ProfileKind,
    pub at_unix_ns: i64,
    pub sets: Vec<SetSnapshot>,
}

/// How a snapshot is written as a profile.
#[derive(Clone, Debug)]
pub struct Encoding {
    /// How stack growth was observed.
    pub growth_mode: StackGrowthMode,
    /// Label each sample with its executable and container (profiles of
    /// several label sets).
    pub set_labels: bool,
    pub comment: Option<String>,
    /// Start and length of what the profile covers (None: since the first
    /// label set was first traced, until the snapshot).
    pub span: Option<(i64, i64)>,
}

impl Snapshot {
    /// What happened between `earlier` and this snapshot (a label set or
    /// sample that is new counts from zero).
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        let sets = self
            .sets
            .iter()
            .map(|s| {
                let before = earlier.sets.iter().find(|e| e.labels == s.labels);
                let samples = s
                    .samples
                    .iter()
                    .filter_map(|(k, v)| {
                        let b = before.and_then(|e| e.samples.get(k)).unwrap_or(&[0, 0]);
                        let d = [v[0].saturating_sub(b[0]), v[1].saturating_sub(b[1])];
                        (d != [0, 0]).then(|| (k.clone(), d))
                    })
                    .collect();
                SetSnapshot {
                    samples,
                    ..s.clone()
                }
            })
            .collect();
        Snapshot {
            kind: self.kind,
            at_unix_ns: self.at_unix_ns,
            sets,
        }
    }

    /// Sum of the first value (faults, growths or samples) over all samples.
    pub fn total(&self) -> u64 {
        self.sets
            .iter()
            .flat_map(|s| s.samples.values())
            .map(|v| v[0])
            .sum()
    }

    /// The gzipped profile.proto.
    pub fn encode(&self, how: &Encoding) -> Vec<u8> {
        let mut mappings: Vec<MappingInfo> = Vec::new();
        for m in self.sets.iter().filter_map(|s| s.mapping.as_ref()) {
            if !mappings
                .iter()
                .any(|k| k.build_id == m.build_id && k.file == m.file)
            {
                mappings.push(m.clone());
            }
        }
        // Executables share link-time address ranges: with several in one
        // profile, an address would name the wrong one's mapping.
        let strip = mappings.len() > 1;
        let (start, duration) = how.span.unwrap_or_else(|| {
            let since = self
                .sets
                .iter()
                .map(|s| s.since_unix_ns)
                .min()
                .unwrap_or(self.at_unix_ns);
            (since, self.at_unix_ns.saturating_sub(since))
        });
        let mut it = mappings.into_iter();
        let info = ProfileInfo {
            main: it.next(),
            other_mappings: it.collect(),
            start_unix_ns: start,
            duration_ns: duration,
            comment: how.comment.clone(),
        };
        let mut faults = FaultProfile::new(&info);
        let mut growth = GrowthProfile::new(&info, how.growth_mode);
        for set in &self.sets {
            let mut extra = Vec::new();
            if how.set_labels {
                extra.push(Label::str("executable", &set.labels.executable));
                extra.extend(crate::formats::pause_profile::container_labels(&set.labels));
            }
            // Sorted, so the same snapshot gives the same bytes.
            let mut samples: Vec<(&SampleKey, &Values)> = set.samples.iter().collect();
            samples.sort_by_key(|(k, v)| (std::cmp::Reverse(v[0]), k.stack.len()));
            for (k, v) in samples {
                let stripped: Vec<Location>;
                let stack: &[Location] = if strip {
                    stripped = k
                        .stack
                        .iter()
                        .map(|l| Location {
                            address: 0,
                            frames: l.frames.clone(),
                        })
                        .collect();
                    &stripped
                } else {
                    &k.stack
                };
                match k.tags {
                    Tags::Fault { kind, pause } => {
                        let record = FaultRecord {
                            stack,
                            duration_ns: 0,
                            backing: kind,
                            pause: pause.map(|p| FaultPause {
                                reason: p.reason,
                                by_stopper: p.by_stopper,
                            }),
                        };
                        faults.add(&record, v[0], v[1], &extra);
                    }
                    Tags::Growth {
                        old_stack,
                        new_stack,
                    } => growth.add(
                        &GrowthRecord {
                            stack,
                            old_stack,
                            new_stack,
                            events: v[0],
                            bytes_copied: v[1],
                        },
                        &extra,
                    ),
                }
            }
        }
        match self.kind {
            ProfileKind::Faults => faults.encode_gzip(),
            ProfileKind::StackGrowth => growth.encode_gzip(),
        }
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
