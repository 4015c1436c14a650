//! The goroutine counts of a one-process trace with stack growth on: a
//! watch per process (its sampling thread costs up to ~5% of a CPU), the
//! peaks it sends into the observed stream, and why a process ended
//! without one.

use std::{collections::HashMap, sync::Arc};

use crate::{
    model::observed::{Observed, ProcessInfo},
    stackgrowth::goroutines::GoroutineWatch,
    targets::process::is_gone,
};

/// The counts being sampled, per process.
#[derive(Debug, Default)]
pub struct GoroutineCounts {
    counts: HashMap<u32, GoroutineCount>,
}

/// One process's count: its watch once started, why it has not started
/// (yet), and the last peak sent.
#[derive(Debug, Default)]
struct GoroutineCount {
    watch: Option<GoroutineWatch>,
    failure: Option<String>,
    sent: u64,
}

impl GoroutineCounts {
    /// Start the watches of `infos` not watched yet (retried until the
    /// process runs its executable) and send each peak that rose.
    pub fn read(&mut self, infos: Vec<Arc<ProcessInfo>>, out: &mut Vec<Observed>) {
        for info in infos {
            let Some(image) = &info.image else { continue };
            let count = self.counts.entry(info.pid).or_default();
            if count.watch.is_none() {
                match GoroutineWatch::start(image) {
                    Ok(watch) => count.watch = Some(watch),
                    // Only a failure of a live process says something; the
                    // same one again is not looked at twice.
                    Err(why) if count.failure.as_ref() != Some(&why) => {
                        count.failure = (!is_gone(info.pid)).then_some(why);
                    }
                    Err(_) => {}
                }
            }
            let Some(n) = count.watch.as_ref().and_then(GoroutineWatch::peak) else {
                continue;
            };
            if n > count.sent {
                count.sent = n;
                out.push(Observed::Goroutines {
                    pid: info.pid,
                    peak: n,
                });
            }
        }
    }

    /// Process `pid` is done with: its watch stops.
    pub fn exited(&mut self, pid: u32) {
        if let Some(count) = self.counts.remove(&pid) {
            count.say_why_none(pid);
        }
    }

    /// The trace ends: every watch stops.
    pub fn finish(&mut self) {
        for (pid, count) in self.counts.drain() {
            count.say_why_none(pid);
        }
    }
}

impl GoroutineCount {
    /// Said once, when the process is done with and no count was read
    /// while it could be (the summary says only that the count is
    /// unknown); a process gone too soon is not news.
    fn say_why_none(&self, pid: u32) {
        let why = match &self.watch {
            Some(watch) => watch.why_no_peak(),
            None => self.failure.clone(),
        };
        if let Some(why) = why {
            log::warn!("pid {pid}: goroutine count not read: {why}");
        }
    }
}
