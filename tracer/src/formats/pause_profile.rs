//! Pause time as a pprof profile, from slow-pause records: which code cost
//! the most pause time. Two sample types, in nanoseconds:
//!
//! - `laggard` (the default view): per record, the stopping time its
//!   critical laggard accounts for (the breakdown's `stopping_*` parts), on
//!   that laggard's frames (the code that kept the world from stopping),
//!   labelled with its `state`;
//! - `caller`: per record, its whole duration on the stopping thread's
//!   caller (the code that asked for the stop).
//!
//! Every sample is labelled `role` (laggard or caller), `reason`,
//! `executable`, and `container`, `namespace` and `pod` where known, so
//! `-tagfocus` splits them; the stacks are
//! symbolized frames (no addresses), so profiles of many hosts merge.

use super::pprof::{Label, Location, ProfileBuilder};
use crate::{
    image::Frame,
    model::{labels::ProcessLabels, pause::PauseRecord},
};

/// The container, namespace and pod labels of a sample, those that are
/// known.
pub fn container_labels(l: &ProcessLabels) -> impl Iterator<Item = Label> + '_ {
    [
        ("container", &l.container),
        ("namespace", &l.namespace),
        ("pod", &l.pod),
    ]
    .into_iter()
    .filter(|(_, v)| !v.is_empty())
    .map(|(k, v)| Label::str(k, v))
}

/// The profile's locations from symbolized frames, innermost first: each
/// location ends at a frame that is not inlined into the next.
fn locations(frames: &[Frame]) -> Vec<Location> {
    let mut out = Vec::new();
    let mut current = Vec::new();
    for f in frames {
        current.push(f.clone());
        if !f.inlined {
            out.push(Location {
                address: 0,
                frames: std::mem::take(&mut current),
            });
        }
    }
    if !current.is_empty() {
        out.push(Location {
            address: 0,
            frames: current,
        });
    }
    out
}

/// The stopping time the critical laggard of `r` accounts for.
pub fn laggard_ns(r: &PauseRecord) -> u64 {
    r.breakdown.as_ref().map_or(0, |b| {
        b.stopping_on_cpu_ns + b.stopping_fault_ns + b.stopping_runnable_ns + b.stopping_blocked_ns
    })
}

/// One record and the labels of its process.
pub struct ProfiledPause<'a> {
    pub record: &'a PauseRecord,
    pub labels: &'a ProcessLabels,
}

/// A pause-time profile built as pauses come: memory grows with the
/// distinct stacks, not with the pauses.
pub struct PauseProfile {
    builder: ProfileBuilder,
    pauses: u64,
}

impl PauseProfile {
    pub fn new(comment: &str) -> PauseProfile {
        let mut builder =
            ProfileBuilder::new(&[("laggard", "nanoseconds"), ("caller", "nanoseconds")]);
        builder.default_sample_type("laggard").comment(comment);
        PauseProfile { builder, pauses: 0 }
    }

    /// Pauses added that put time on a stack.
    pub fn pauses(&self) -> u64 {
        self.pauses
    }

    pub fn add(&mut self, p: &ProfiledPause) {
        let r = p.record;
        let common = |role: &str| {
            let mut l = vec![
                Label::str("role", role),
                Label::str("reason", r.reason),
                Label::str("executable", &p.labels.executable),
            ];
            l.extend(container_labels(p.labels));
            l
        };
        let mut added = false;
        let lag = laggard_ns(r);
        if let Some(l) = r.laggards.as_deref().and_then(<[_]>::first)
            && lag > 0
        {
            let mut labels = common("laggard");
            let state = serde_json::to_value(l.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            labels.push(Label::str("state", &state));
            // Values match the sample types: the builder cannot refuse them.
            let _ = self
                .builder
                .add(&locations(&l.frames), &[lag as i64, 0], &labels);
            added = true;
        }
        if let Some(caller) = &r.caller {
            let _ = self.builder.add(
                &locations(caller),
                &[0, r.duration_ns as i64],
                &common("caller"),
            );
            added = true;
        }
        self.pauses += u64::from(added);
    }

    /// The profile, gzipped.
    pub fn encode(&self) -> Vec<u8> {
        self.builder.encode_gzip()
    }
}

/// The profile of `pauses`, gzipped.
pub fn encode(pauses: &[ProfiledPause], comment: &str) -> Vec<u8> {
    let mut profile = PauseProfile::new(comment);
    for p in pauses {
        profile.add(p);
    }
    profile.encode()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        formats::pprof::decode,
        model::pause::tests_support::record,
        model::{
            breakdown::Breakdown,
            laggard::{FramesFrom, LaggardRecord, LaggardStateName},
        },
    };

    fn frame(f: &str, inlined: bool) -> Frame {
        Frame {
            function: f.into(),
            file: String::new(),
            line: 1,
            inlined,
            start_line: 0,
        }
    }

    #[test]
    fn laggard_time_goes_to_its_frames_and_pause_time_to_the_caller() {
        let mut r = record(7, 1, 10_000_000);
        r.breakdown = Some(Box::new(Breakdown {
            stopping_on_cpu_ns: 6_000_000,
            stopping_runnable_ns: 2_000_000,
            on_cpu_ns: 2_000_000,
            ..Breakdown::default()
        }));
        r.laggards = Some(vec![LaggardRecord {
            tid: 8,
            state: LaggardStateName::OnCpu,
            ns: 8_000_000,
            on_cpu_ns: 6_000_000,
            fault_ns: 0,
            runnable_ns: 2_000_000,
            blocked_ns: 0,
            running_goroutine: true,
            goid: None,
            frames: vec![frame("main.leaf", true), frame("main.spinLoop", false)],
            frames_from: FramesFrom::Sample,
            held_samples: 6,
            page_faults: 0,
            kernel: None,
            stopped_at: vec![],
        }]);
        r.caller = Some(vec![frame("runtime.GC", false), frame("main.main", false)]);
        let p = decode(&encode(
            &[ProfiledPause {
                record: &r,
                labels: &ProcessLabels {
                    executable: "api".into(),
                    ..Default::default()
                },
            }],
            "test",
        ))
        .unwrap();
        let s = |i: i64| p.string_table[i as usize].as_str();
        assert_eq!(s(p.default_sample_type), "laggard");
        let totals: Vec<i64> = (0..2)
            .map(|i| p.sample.iter().map(|x| x.value[i]).sum())
            .collect();
        assert_eq!(totals, [8_000_000, 10_000_000]);
        // The laggard's leaf location holds the inlined frame and its caller.
        let lag = p.sample.iter().find(|x| x.value[0] > 0).unwrap();
        let loc = &p.location[lag.location_id[0] as usize - 1];
        let names: Vec<&str> = loc
            .line
            .iter()
            .map(|l| s(p.function[l.function_id as usize - 1].name))
            .collect();
        assert_eq!(names, ["main.leaf", "main.spinLoop"]);
        assert_eq!(lag.location_id.len(), 1);
    }
}
