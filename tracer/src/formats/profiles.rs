//! gostw's two profiles, built from plain records: major faults and
//! goroutine stack growth. The same bytes are what `--pprof FILE` writes and
//! what the agent's `/debug/pprof/faults` and `/debug/pprof/stackgrowth`
//! answer; a sink only fills the records.
//!
//! | profile | sample types | labels |
//! |---|---|---|
//! | faults | `major_faults`/count, `fault_time`/nanoseconds | `backing` (swap, file, unknown), `in_pause` (true, false); in a pause also `reason` (stwReason id) and `thread` (stopper, other) |
//! | stack growth, exact | `growths`/count, `bytes_copied`/bytes | `old_stack`, `new_stack` (bytes) |
//! | stack growth, sampled | `copy_samples`/count, `copy_cpu`/nanoseconds (period: one CPU-clock sample) | `old_stack` (bytes) |
//!
//! Labels are few-valued on purpose: a label set is part of a sample's
//! identity, so a per-event number (an address, a wait time) would make
//! every event its own sample.

use std::path::{Path, PathBuf};

use super::pprof::{Label, Location, MappingInfo, ProfileBuilder};
use crate::model::fault::FaultKind;

/// Which of gostw's two profiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProfileKind {
    Faults,
    StackGrowth,
}

/// `file` with `kind` before its extension: `out.pb.gz` ->
/// `out.<kind>.pb.gz`, `out` -> `out.<kind>`.
pub fn path_for(file: &Path, kind: &str) -> PathBuf {
    let name = file
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let (stem, ext) = match name.find('.') {
        Some(i) if i > 0 => name.split_at(i),
        _ => (name.as_str(), ""),
    };
    file.with_file_name(format!("{stem}.{kind}{ext}"))
}

impl ProfileKind {
    /// The endpoint's path.
    pub fn path(self) -> &'static str {
        match self {
            ProfileKind::Faults => "/debug/pprof/faults",
            ProfileKind::StackGrowth => "/debug/pprof/stackgrowth",
        }
    }

    /// The word naming it in file names and URLs.
    pub fn name(self) -> &'static str {
        match self {
            ProfileKind::Faults => "faults",
            ProfileKind::StackGrowth => "stackgrowth",
        }
    }

    /// Where `--pprof FILE` puts this profile when a command writes both
    /// (attach, run): the kind before the extension, `out.pb.gz` ->
    /// `out.faults.pb.gz`, `out` -> `out.faults`.
    pub fn path_for(self, file: &Path) -> PathBuf {
        path_for(file, self.name())
    }

    /// `Content-Disposition`, as net/http/pprof names a download.
    pub fn content_disposition(self) -> &'static str {
        match self {
            ProfileKind::Faults => "attachment; filename=\"faults\"",
            ProfileKind::StackGrowth => "attachment; filename=\"stackgrowth\"",
        }
    }
}

/// What a profile covers, shared by both kinds.
#[derive(Clone, Debug, Default)]
pub struct ProfileInfo {
    /// The traced executable's code (named by `go tool pprof` as "File:").
    pub main: Option<MappingInfo>,
    /// Further mappings (shared libraries of a cgo binary).
    pub other_mappings: Vec<MappingInfo>,
    /// When collection started, ns since the Unix epoch (0: unknown).
    pub start_unix_ns: i64,
    /// How long it ran, ns (0: unknown).
    pub duration_ns: i64,
    /// Free text (`go tool pprof -comments`), e.g. the command line.
    pub comment: Option<String>,
}

impl ProfileInfo {
    fn apply(&self, b: &mut ProfileBuilder) {
        for m in self.main.iter().chain(&self.other_mappings) {
            b.mapping(m.clone());
        }
        b.time(self.start_unix_ns, self.duration_ns);
        if let Some(c) = &self.comment {
            b.comment(c);
        }
    }
}

/// The pause a fault began in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultPause<'a> {
    /// The pause's stwReason id, e.g. "gc_sweep_termination".
    pub reason: &'a str,
    /// Did the thread that stopped the world take the fault?
    pub by_stopper: bool,
}

/// One major fault.
#[derive(Clone, Copy, Debug)]
pub struct FaultRecord<'a> {
    /// Symbolized user stack, leaf first (empty: unknown).
    pub stack: &'a [Location],
    /// Fault begin to end, ns (0 when the begin was not seen).
    pub duration_ns: u64,
    pub backing: FaultKind,
    /// `None` outside pauses.
    pub pause: Option<FaultPause<'a>>,
}

/// Sample types of the fault profile.
pub const FAULT_SAMPLE_TYPES: &[(&str, &str)] =
    &[("major_faults", "count"), ("fault_time", "nanoseconds")];

/// The gzipped fault profile of `faults`.
pub fn faults_profile(info: &ProfileInfo, faults: &[FaultRecord<'_>]) -> Vec<u8> {
    let mut p = FaultProfile::new(info);
    for f in faults {
        p.add(f, 1, f.duration_ns, &[]);
    }
    p.encode_gzip()
}

/// A fault profile built sample by sample, for callers that count faults
/// themselves (a long-running collector adds each distinct site once).
pub struct FaultProfile(ProfileBuilder);

impl FaultProfile {
    /// An empty fault profile covering `info`.
    pub fn new(info: &ProfileInfo) -> FaultProfile {
        let mut b = ProfileBuilder::new(FAULT_SAMPLE_TYPES);
        info.apply(&mut b);
        b.default_sample_type("major_faults");
        FaultProfile(b)
    }

    /// `faults` faults like `f` (its `duration_ns` is not used), `fault_ns`
    /// in all, with `extra` labels beside the fault's own.
    pub fn add(&mut self, f: &FaultRecord<'_>, faults: u64, fault_ns: u64, extra: &[Label]) {
        let mut labels = vec![Label::str("backing", f.backing.backing_label())];
        match f.pause {
            Some(p) => {
                labels.push(Label::str("in_pause", "true"));
                labels.push(Label::str("reason", p.reason));
                let thread = if p.by_stopper { "stopper" } else { "other" };
                labels.push(Label::str("thread", thread));
            }
            None => labels.push(Label::str("in_pause", "false")),
        }
        labels.extend_from_slice(extra);
        self.0
            .add(f.stack, &[sat(faults), sat(fault_ns)], &labels)
            .expect("one value per fault sample type");
    }

    /// The gzipped profile.
    pub fn encode_gzip(&self) -> Vec<u8> {
        self.0.encode_gzip()
    }
}

fn sat(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// How the stack-growth records were counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackGrowthMode {
    /// Every copy seen (the `runtime.copystack` probe): counts and bytes.
    Exact,
    /// CPU-clock samples that caught a copy, at `sample_hz` per CPU.
    Sampled { sample_hz: u32 },
}

/// One stack-growth site: its stack and what was counted there.
#[derive(Clone, Copy, Debug)]
pub struct GrowthRecord<'a> {
    /// The function that needed more stack first, then its callers.
    pub stack: &'a [Location],
    /// Stack size before the growth, bytes.
    pub old_stack: u64,
    /// Size grown to, bytes (0: unknown, as in sampled mode).
    pub new_stack: u64,
    /// Growths (exact) or samples that caught a copy (sampled).
    pub events: u64,
    /// Bytes copied (exact mode only; ignored when sampled).
    pub bytes_copied: u64,
}

/// Sample types of the exact stack-growth profile.
pub const EXACT_GROWTH_SAMPLE_TYPES: &[(&str, &str)] =
    &[("growths", "count"), ("bytes_copied", "bytes")];
/// Sample types of the sampled stack-growth profile.
pub const SAMPLED_GROWTH_SAMPLE_TYPES: &[(&str, &str)] =
    &[("copy_samples", "count"), ("copy_cpu", "nanoseconds")];

/// The gzipped stack-growth profile of `records`.
pub fn stack_growth_profile(
    info: &ProfileInfo,
    mode: StackGrowthMode,
    records: &[GrowthRecord<'_>],
) -> Vec<u8> {
    let mut p = GrowthProfile::new(info, mode);
    for r in records {
        p.add(r, &[]);
    }
    p.encode_gzip()
}

/// A stack-growth profile built record by record.
pub struct GrowthProfile {
    b: ProfileBuilder,
    /// Sampled mode: CPU time per sample, ns.
    period_ns: Option<i64>,
}

impl GrowthProfile {
    /// An empty stack-growth profile of `mode` covering `info`.
    pub fn new(info: &ProfileInfo, mode: StackGrowthMode) -> GrowthProfile {
        let (mut b, period_ns) = match mode {
            StackGrowthMode::Exact => {
                let mut b = ProfileBuilder::new(EXACT_GROWTH_SAMPLE_TYPES);
                b.default_sample_type("growths");
                (b, None)
            }
            StackGrowthMode::Sampled { sample_hz } => {
                let period = 1_000_000_000 / i64::from(sample_hz.max(1));
                let mut b = ProfileBuilder::new(SAMPLED_GROWTH_SAMPLE_TYPES);
                b.period(("cpu", "nanoseconds"), period)
                    .default_sample_type("copy_cpu");
                (b, Some(period))
            }
        };
        info.apply(&mut b);
        GrowthProfile { b, period_ns }
    }

    /// One record, with `extra` labels beside its sizes.
    pub fn add(&mut self, r: &GrowthRecord<'_>, extra: &[Label]) {
        let mut labels = vec![Label::num("old_stack", sat(r.old_stack), "bytes")];
        if r.new_stack != 0 {
            labels.push(Label::num("new_stack", sat(r.new_stack), "bytes"));
        }
        labels.extend_from_slice(extra);
        let values = match self.period_ns {
            None => [sat(r.events), sat(r.bytes_copied)],
            Some(p) => [sat(r.events), sat(r.events).saturating_mul(p)],
        };
        self.b
            .add(r.stack, &values, &labels)
            .expect("two values per growth sample type");
    }

    /// The gzipped profile.
    pub fn encode_gzip(&self) -> Vec<u8> {
        self.b.encode_gzip()
    }
}

#[cfg(test)]
#[path = "profiles_tests.rs"]
mod tests;
