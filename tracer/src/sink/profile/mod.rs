//! pprof profiles of the observed stream: where major faults happen (count
//! and fault time, labelled `in_pause`, `reason`, `thread` and `backing`)
//! and where goroutine stacks grow (growths and bytes copied, or copy
//! samples and their CPU time). The `ProfileCollector` sums the stream into
//! a bounded `store::Store` that another thread may read (the agent's
//! `/debug/pprof/*`); `ProfileFiles` writes its snapshot at the end of a
//! trace (`--pprof FILE`).
//!
//! - `locations`: the stream's stacks as pprof locations.
//! - `growth`: one process's stack growth (kernel site counts and event
//!   stacks) for a profile.
//! - `store`: the bounded, label-keyed samples and their snapshots.

pub mod growth;
pub mod locations;
pub mod store;

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard},
    time::Instant,
};

use self::{
    growth::GrowthSites,
    locations::{fault_locations, main_mapping, return_locations},
    store::{Encoding, PauseTag, Store, Tags},
};
use super::Sink;
use crate::{
    formats::profiles::{ProfileKind, StackGrowthMode},
    image::ProcessImage,
    model::labels::ProcessLabels,
    model::{
        code::{Code, growth_pcs},
        fault::Fault,
        observed::{Membership, Observed},
    },
    stackgrowth::Mode,
};

/// How stack-growth samples are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrowthCounting {
    /// Each event is one sample, added as it comes (the agent: sampled mode,
    /// where every copy sample is an event; windows need no kernel reads).
    Events,
    /// The kernel's per-site counts, read when a process is forgotten, spread
    /// over the stacks of the events (`attach`, `run`, `stacks`: exact
    /// counts in exact mode, and samples lost to a full ring buffer still
    /// counted in sampled mode).
    Sites(Mode),
}

/// A traced process as the collector knows it.
struct Traced {
    labels: ProcessLabels,
    image: Option<Arc<ProcessImage>>,
    growth: Option<GrowthSites>,
    /// The code at the growth addresses seen (counted by sites, named at
    /// the end), as the engine symbolized it.
    code: Code,
    /// The last pause released: (reason, stopping thread, start, end), for
    /// faults that began in it and came after its record.
    last_pause: Option<(&'static str, u32, u64, u64)>,
}

/// The sink that sums faults and stack growth into profile samples.
pub struct ProfileCollector {
    store: Arc<Mutex<Store>>,
    growth: GrowthCounting,
    processes: HashMap<u32, Traced>,
}

impl Traced {
    /// The load bias the engine resolved (None: link-time addresses unknown).
    fn bias(&self) -> Option<u64> {
        self.image.as_ref().and_then(|i| i.bias())
    }
}

impl ProfileCollector {
    /// Collect into `store`, stack growth counted as `growth` says.
    pub fn new(store: Arc<Mutex<Store>>, growth: GrowthCounting) -> ProfileCollector {
        ProfileCollector {
            store,
            growth,
            processes: HashMap::new(),
        }
    }

    /// The store, for readers.
    pub fn store(&self) -> &Arc<Mutex<Store>> {
        &self.store
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
    }

    fn fault(&self, f: &Fault, pause: Option<PauseTag>) {
        let Some(p) = self.processes.get(&f.tgid) else {
            return;
        };
        let bias = p.bias();
        let tags = Tags::Fault {
            kind: f.kind,
            pause,
        };
        self.lock().add(
            &p.labels,
            fault_locations(f, bias),
            tags,
            [1, f.duration_ns()],
        );
    }

    /// Add the growth of `pid` collected by sites (at its end).
    fn flush_growth(&mut self, pid: u32) {
        let Some(p) = self.processes.get_mut(&pid) else {
            return;
        };
        let Some(g) = p.growth.take() else { return };
        let bias = p.bias();
        let mut store = lock(&self.store);
        for r in g.records() {
            let stack = return_locations(&p.code, bias, &r.pcs);
            let tags = Tags::Growth {
                old_stack: r.old_stack,
                new_stack: r.new_stack,
            };
            store.add(&p.labels, stack, tags, [r.events, r.bytes]);
        }
    }
}

/// The store's lock (a panic elsewhere does not stop profiles).
pub fn lock(store: &Mutex<Store>) -> MutexGuard<'_, Store> {
    store.lock().unwrap_or_else(|e| e.into_inner())
}

impl Sink for ProfileCollector {
    fn observe(&mut self, o: &Observed) {
        match o {
            Observed::Started(info) => {
                self.lock().started(&info.labels, main_mapping(info));
                let t = Traced {
                    labels: info.labels.clone(),
                    image: info.image.clone(),
                    code: Code::default(),
                    growth: match self.growth {
                        GrowthCounting::Sites(mode) => Some(GrowthSites::new(mode)),
                        GrowthCounting::Events => None,
                    },
                    last_pause: None,
                };
                self.processes.insert(info.pid, t);
            }
            Observed::Pause(p) => {
                let r = &p.record;
                for f in &p.faults {
                    let pause = PauseTag {
                        reason: r.reason,
                        by_stopper: f.tid == r.tid,
                    };
                    self.fault(f, Some(pause));
                }
                if let Some(t) = self.processes.get_mut(&r.pid) {
                    let end = r.start_mono_ns + r.duration_ns;
                    t.last_pause = Some((r.reason, r.tid, r.start_mono_ns, end));
                }
            }
            Observed::Fault(f, membership) => {
                let pause = match membership {
                    Membership::Outside => None,
                    // The correlator's last released pause of the process
                    // is the last one this sink saw.
                    Membership::LateInPause => {
                        let last = self.processes.get(&f.tgid).and_then(|t| t.last_pause);
                        Some(match last {
                            Some((reason, tid, start, end))
                                if (start..end).contains(&f.at_ns()) =>
                            {
                                PauseTag {
                                    reason,
                                    by_stopper: f.tid == tid,
                                }
                            }
                            _ => PauseTag {
                                reason: "unknown",
                                by_stopper: false,
                            },
                        })
                    }
                };
                self.fault(f, pause);
            }
            Observed::StackGrowth { event: ev, code } => {
                let Some(p) = self.processes.get_mut(&ev.header.tgid) else {
                    return;
                };
                match &mut p.growth {
                    Some(g) => {
                        g.add_event(ev);
                        p.code.extend(code);
                    }
                    None => {
                        let bias = p.bias();
                        let stack = return_locations(code, bias, growth_pcs(ev));
                        let tags = Tags::Growth {
                            old_stack: ev.old_size,
                            new_stack: ev.new_size,
                        };
                        let bytes = if ev.new_size != 0 { ev.used } else { 0 };
                        lock(&self.store).add(&p.labels, stack, tags, [1, bytes]);
                    }
                }
            }
            Observed::StackSites {
                pid, rows, code, ..
            } => {
                if let Some(p) = self.processes.get_mut(pid)
                    && let Some(g) = &mut p.growth
                {
                    g.set_rows(rows);
                    p.code.extend(code);
                }
            }
            Observed::Exited { pid, .. } => {
                self.flush_growth(*pid);
                if let Some(p) = self.processes.remove(pid) {
                    let now = Instant::now();
                    let mut store = self.lock();
                    store.exited(&p.labels, now);
                    store.expire(now);
                }
            }
            Observed::HostPolled { .. } => self.lock().expire(Instant::now()),
            _ => {}
        }
    }
}

/// `--pprof`: the profiles a trace writes when it ends.
pub struct ProfileFiles {
    collector: ProfileCollector,
    files: Vec<(ProfileKind, PathBuf)>,
    growth_mode: StackGrowthMode,
    comment: String,
}

impl ProfileFiles {
    /// Write the profiles of `files` at the end; stack growth is counted in
    /// `mode` at `sample_hz` (sampled). Each file's directory is tried now,
    /// so a path that cannot be written fails before tracing starts; the
    /// files appear, whole, only at the end.
    pub fn create(
        files: Vec<(ProfileKind, PathBuf)>,
        mode: Mode,
        sample_hz: u64,
        comment: String,
    ) -> std::io::Result<ProfileFiles> {
        for (_, path) in &files {
            // Dropped uncommitted: leaves nothing behind.
            crate::sink::file::WholeFile::create(path)?;
        }
        let growth_mode = match mode {
            Mode::Exact => StackGrowthMode::Exact,
            Mode::Sampled => StackGrowthMode::Sampled {
                sample_hz: u32::try_from(sample_hz).unwrap_or(u32::MAX),
            },
        };
        Ok(ProfileFiles {
            collector: ProfileCollector::new(
                Arc::new(Mutex::new(Store::new())),
                GrowthCounting::Sites(mode),
            ),
            files,
            growth_mode,
            comment,
        })
    }

    /// The files to write.
    pub fn files(&self) -> &[(ProfileKind, PathBuf)] {
        &self.files
    }

    /// Write every profile (after the engine's `finish`); returns each
    /// file with the total of its default sample type's count.
    pub fn finish(&self) -> std::io::Result<Vec<(PathBuf, u64)>> {
        let store = self.collector.lock();
        let mut written = Vec::new();
        for (kind, path) in &self.files {
            let snapshot = store.snapshot(*kind, |_| true);
            let bytes = snapshot.encode(&Encoding {
                growth_mode: self.growth_mode,
                set_labels: false,
                comment: Some(self.comment.clone()),
                span: None,
            });
            crate::sink::file::WholeFile::write(path, &bytes)?;
            written.push((path.clone(), snapshot.total()));
        }
        Ok(written)
    }
}

impl Sink for ProfileFiles {
    fn observe(&mut self, o: &Observed) {
        self.collector.observe(o);
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
