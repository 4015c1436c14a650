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

/// Which of gostw's two profiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProfileKind {
    Faults,
    StackGrowth,
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
        let name = file
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let (stem, ext) = match name.find('.') {
            Some(i) if i > 0 => name.split_at(i),
            _ => (name.as_str(), ""),
        };
        file.with_file_name(format!("{stem}.{}{ext}", self.name()))
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

/// What a major fault read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Anonymous memory, from swap.
    Swap,
    /// A file page.
    File,
    /// The kernel did not say.
    Unknown,
}

impl Backing {
    /// The `backing` label value.
    pub fn label(self) -> &'static str {
        match self {
            Backing::Swap => "swap",
            Backing::File => "file",
            Backing::Unknown => "unknown",
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
    pub backing: Backing,
    /// `None` outside pauses.
    pub pause: Option<FaultPause<'a>>,
}

/// Sample types of the fault profile.
pub const FAULT_SAMPLE_TYPES: &[(&str, &str)] =
    &[("major_faults", "count"), ("fault_time", "nanoseconds")];

/// The gzipped fault profile of `faults`.
pub fn faults_profile(info: &ProfileInfo, faults: &[FaultRecord<'_>]) -> Vec<u8> {
    let mut b = ProfileBuilder::new(FAULT_SAMPLE_TYPES);
    info.apply(&mut b);
    b.default_sample_type("major_faults");
    for f in faults {
        let mut labels = vec![Label::str("backing", f.backing.label())];
        match f.pause {
            Some(p) => {
                labels.push(Label::str("in_pause", "true"));
                labels.push(Label::str("reason", p.reason));
                let thread = if p.by_stopper { "stopper" } else { "other" };
                labels.push(Label::str("thread", thread));
            }
            None => labels.push(Label::str("in_pause", "false")),
        }
        let time = i64::try_from(f.duration_ns).unwrap_or(i64::MAX);
        b.add(f.stack, &[1, time], &labels)
            .expect("one value per fault sample type");
    }
    b.encode_gzip()
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
    let sat = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
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
    for r in records {
        let mut labels = vec![Label::num("old_stack", sat(r.old_stack), "bytes")];
        if r.new_stack != 0 {
            labels.push(Label::num("new_stack", sat(r.new_stack), "bytes"));
        }
        let values = match period_ns {
            None => [sat(r.events), sat(r.bytes_copied)],
            Some(p) => [sat(r.events), sat(r.events).saturating_mul(p)],
        };
        b.add(r.stack, &values, &labels)
            .expect("two values per growth sample type");
    }
    b.encode_gzip()
}

#[cfg(test)]
#[path = "profiles_tests.rs"]
mod tests;
