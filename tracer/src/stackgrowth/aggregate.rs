//! From kernel counts and sampled events to a report: per call site counts,
//! bytes copied, size distributions, rates scaled by the time the probe was
//! really attached, and the starting-stack recommendation. Pure code over
//! decoded data, unit-tested without a kernel; `render` writes it for people.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::Duration,
};

use tracer_common::stack::{
    StackChange, StackGrowthEvent, StackSiteCounts, StackSiteKey, StackSource,
};

use super::{
    Mode,
    recommend::{
        Basis, GO_STACK_GUARD, NEGLIGIBLE_COPIED_BYTES_PER_SEC, NEGLIGIBLE_CPU_SHARE,
        NEGLIGIBLE_GROWTHS_PER_SEC, Recommendation, grown_size, recommend_from,
    },
    symbolize::Symbolizer,
};
use crate::image::Frame;

/// Samples that caught a stack copy below which sampled mode calls growth
/// negligible, whatever share they make: fewer are within sampling noise.
pub const MIN_COPY_SAMPLES: u64 = 5;
/// Sampled goroutine stacks kept for the report (the first ones win).
const MAX_SAMPLES: usize = 4096;
/// Call sites listed in a summary.
const TOP_SITES: usize = 10;
/// Old-size key of samples taken after the switch to the new stack.
pub const UNKNOWN_SIZE: u64 = 0;

/// Everything observed about one process's stack growth.
#[derive(Clone, Debug)]
pub struct StackGrowthAggregator {
    mode: Mode,
    /// Latest snapshot of this process's `STACK_SITES` rows (cumulative).
    sites: Vec<(StackSiteKey, StackSiteCounts)>,
    samples: Vec<StackGrowthEvent>,
    goids: HashSet<u64>,
    events: u64,
    cpu_samples: u64,
    copy_samples: u64,
    sample_hz: u64,
    elapsed: Duration,
    attached: Duration,
}

impl StackGrowthAggregator {
    /// An empty aggregate for `mode`.
    pub fn new(mode: Mode) -> Self {
        StackGrowthAggregator {
            mode,
            sites: Vec::new(),
            samples: Vec::new(),
            goids: HashSet::new(),
            events: 0,
            cpu_samples: 0,
            copy_samples: 0,
            sample_hz: 0,
            elapsed: Duration::ZERO,
            attached: Duration::ZERO,
        }
    }

    /// Replace the per-site counts with a newer snapshot of the kernel map
    /// (its counts are cumulative), keeping this mode's rows.
    pub fn set_sites(&mut self, rows: impl IntoIterator<Item = (StackSiteKey, StackSiteCounts)>) {
        let source = self.mode.source() as u8;
        self.sites = rows
            .into_iter()
            .filter(|(k, _)| k.source == source)
            .collect();
    }

    /// Add one sampled event.
    pub fn add_event(&mut self, ev: &StackGrowthEvent) {
        self.events += 1;
        if ev.goid != 0 {
            self.goids.insert(ev.goid);
        }
        if self.samples.len() < MAX_SAMPLES {
            self.samples.push(*ev);
        }
    }

    /// Sampled mode: CPU samples of the process, and those that caught it
    /// copying a stack, at `hz` samples per second per CPU.
    pub fn set_cpu_samples(&mut self, all: u64, copying: u64, hz: u64) {
        self.cpu_samples = all;
        self.copy_samples = copying;
        self.sample_hz = hz;
    }

    /// How long the process was watched, and for how much of that the probe
    /// was attached (exact mode is duty-cycled; sampled is always on).
    pub fn set_observed(&mut self, elapsed: Duration, attached: Duration) {
        self.elapsed = elapsed;
        self.attached = attached.min(elapsed);
    }

    /// Distinct goroutine ids seen in sampled events.
    pub fn goroutines_seen(&self) -> usize {
        self.goids.len()
    }

    /// Build the report. `goroutines` is a goroutine count with its source
    /// (`runtime.allglen`, `--goroutines`, a workload's own count); without
    /// one the memory estimate says the count is unknown (the distinct
    /// goroutines seen growing are not goroutines alive at once: a server
    /// that starts one per request sees thousands while tens exist).
    pub fn summary(
        &self,
        symbols: &dyn Symbolizer,
        goroutines: Option<(u64, &str)>,
    ) -> StackGrowthSummary {
        let growth = match self.mode {
            Mode::Exact => StackChange::Grow,
            Mode::Sampled => StackChange::Copying,
        } as u8;
        // Typical live stack per (site, old size), from sampled events: what
        // the sampled mode needs to tell how far a stack grew.
        let mut used: HashMap<(u64, u64), Vec<u64>> = HashMap::new();
        for ev in &self.samples {
            used.entry((ev.frames[0], ev.old_size))
                .or_default()
                .push(ev.used);
        }
        let mut sites: BTreeMap<(String, String), SiteSummary> = BTreeMap::new();
        let mut old_sizes = BTreeMap::new();
        let mut new_sizes = BTreeMap::new();
        let (mut growths, mut shrinks, mut moves, mut copied, mut allocated) = (0, 0, 0, 0, 0);
        // Sampled: growth samples whose grown size had no frame size to go on.
        let mut guessed = 0;
        for (k, c) in &self.sites {
            match StackChange::from_u8(k.change) {
                Some(StackChange::Shrink) => shrinks += c.count,
                Some(StackChange::Move) => moves += c.count,
                _ => {}
            }
            if k.change != growth {
                continue;
            }
            let mut old = u64::from(k.old_size);
            let new = if k.new_size != 0 {
                u64::from(k.new_size)
            } else {
                let u = used
                    .get_mut(&(k.site_pc, old))
                    .map(|v| {
                        v.sort_unstable();
                        v[v.len() / 2]
                    })
                    .unwrap_or(0);
                let frame = symbols.max_frame(k.site_pc);
                match frame {
                    // The frame already fits: morestack would not have been
                    // called with this stack, so the sample came after
                    // copystack switched the goroutine to its new stack.
                    Some(f) if old.saturating_sub(u) >= f + GO_STACK_GUARD => {
                        let grown = old;
                        old = UNKNOWN_SIZE;
                        grown
                    }
                    _ => {
                        if frame.is_none() {
                            guessed += c.count;
                        }
                        grown_size(old, u, frame)
                    }
                }
            };
            growths += c.count;
            copied += c.copied_bytes;
            allocated += new * c.count;
            *old_sizes.entry(old).or_insert(0) += c.count;
            *new_sizes.entry(new).or_insert(0) += c.count;
            let site = symbols.symbolize_return_address(k.site_pc);
            let caller = symbols.symbolize_return_address(k.caller_pc);
            let s = sites
                .entry((site.function.clone(), caller.function.clone()))
                .or_insert_with(|| SiteSummary {
                    site: site.clone(),
                    caller: caller.clone(),
                    site_pc: k.site_pc,
                    count: 0,
                    share: 0.0,
                    copied_bytes: 0,
                    old_size_unknown: 0,
                    old_sizes: BTreeMap::new(),
                    new_sizes: BTreeMap::new(),
                    example_stack: Vec::new(),
                });
            s.count += c.count;
            s.copied_bytes += c.copied_bytes;
            if old == UNKNOWN_SIZE {
                s.old_size_unknown += c.count;
            }
            *s.old_sizes.entry(old).or_insert(0) += c.count;
            *s.new_sizes.entry(new).or_insert(0) += c.count;
        }
        let mut top: Vec<SiteSummary> = sites.into_values().collect();
        top.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then(a.site.function.cmp(&b.site.function))
        });
        top.truncate(TOP_SITES);
        for s in &mut top {
            s.share = s.count as f64 / growths.max(1) as f64;
            if let Some(ev) = self
                .samples
                .iter()
                .find(|e| symbols.symbolize_return_address(e.frames[0]).function == s.site.function)
            {
                s.example_stack = ev.frames[..(ev.nframes as usize).min(ev.frames.len())]
                    .iter()
                    .filter(|&&pc| pc != 0)
                    .map(|&pc| symbols.symbolize_return_address(pc))
                    .collect();
            }
        }

        let observed = self.attached.as_secs_f64();
        let (growths_per_sec, copied_per_sec) = match self.mode {
            Mode::Exact if observed > 0.0 => (
                Some(growths as f64 / observed),
                Some(copied as f64 / observed),
            ),
            _ => (None, None),
        };
        let cpu_share = (self.mode == Mode::Sampled && self.cpu_samples > 0)
            .then(|| self.copy_samples as f64 / self.cpu_samples as f64);
        let negligible = match self.mode {
            Mode::Exact => {
                growths_per_sec.unwrap_or(0.0) < NEGLIGIBLE_GROWTHS_PER_SEC
                    && copied_per_sec.unwrap_or(0.0) < NEGLIGIBLE_COPIED_BYTES_PER_SEC
            }
            // A share of a few samples is noise: one copy among 21 samples
            // of a process that barely ran is "4.8%".
            Mode::Sampled => {
                cpu_share.unwrap_or(0.0) < NEGLIGIBLE_CPU_SHARE
                    || self.copy_samples < MIN_COPY_SAMPLES
            }
        };
        let seen = self.goids.len() as u64;
        let old_size_unknown = old_sizes.get(&UNKNOWN_SIZE).copied().unwrap_or(0);
        let current_start = old_sizes
            .keys()
            .copied()
            .find(|&s| s != UNKNOWN_SIZE)
            .unwrap_or(0);
        let grown_to: Vec<(u64, u64)> = new_sizes.iter().map(|(&s, &n)| (s, n)).collect();
        let basis = match self.mode {
            Mode::Exact => Basis::Growths,
            Mode::Sampled => Basis::Samples {
                old_size_unknown,
                frame_unknown: guessed,
            },
        };
        let recommendation =
            recommend_from(basis, &grown_to, current_start, goroutines, negligible);
        StackGrowthSummary {
            mode: self.mode,
            elapsed_secs: self.elapsed.as_secs_f64(),
            attached_secs: observed,
            attached_fraction: if self.elapsed.is_zero() {
                0.0
            } else {
                observed / self.elapsed.as_secs_f64()
            },
            growths,
            shrinks,
            moves,
            copied_bytes: copied,
            new_stack_bytes: allocated,
            growths_per_sec,
            copied_bytes_per_sec: copied_per_sec,
            cpu_samples: self.cpu_samples,
            copy_samples: self.copy_samples,
            sample_hz: self.sample_hz,
            cpu_share,
            events: self.events,
            goroutines_seen: seen,
            top_sites: top,
            old_size_unknown,
            new_sizes_estimated: self.mode == Mode::Sampled,
            old_sizes,
            new_sizes,
            recommendation,
        }
    }
}

/// One call site: the function that needed more stack, and its caller.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SiteSummary {
    pub site: Frame,
    pub caller: Frame,
    /// One PC of the site (for symbolizing later).
    pub site_pc: u64,
    /// Growths (exact) or samples (sampled).
    pub count: u64,
    /// Share of all growths (exact) or growth samples (sampled).
    pub share: f64,
    pub copied_bytes: u64,
    /// Of `count`, those whose size before growth is unknown (sampled: the
    /// sample came after copystack switched the goroutine to its new
    /// stack, when the old one's size is gone); key 0 of `old_sizes`.
    pub old_size_unknown: u64,
    /// Size before -> count (sampled: 0 for samples taken after the
    /// switch to the new stack).
    pub old_sizes: BTreeMap<u64, u64>,
    /// Size after -> count (sampled: estimated from the frame size).
    pub new_sizes: BTreeMap<u64, u64>,
    /// One sampled goroutine stack through this site, innermost first.
    pub example_stack: Vec<Frame>,
}

/// The stack-growth report of one process.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct StackGrowthSummary {
    pub mode: Mode,
    pub elapsed_secs: f64,
    /// Time the probe was attached (exact mode is duty-cycled).
    pub attached_secs: f64,
    pub attached_fraction: f64,
    /// Growths (exact) or samples that caught a stack copy (sampled).
    pub growths: u64,
    pub shrinks: u64,
    pub moves: u64,
    /// Live stack bytes copied by the growths (exact).
    pub copied_bytes: u64,
    /// Bytes of the new stacks.
    pub new_stack_bytes: u64,
    /// Rates over the attached time (exact).
    pub growths_per_sec: Option<f64>,
    pub copied_bytes_per_sec: Option<f64>,
    /// Sampled mode: all CPU samples of the process, the ones copying a
    /// stack, the sampling frequency, and the share of CPU time.
    pub cpu_samples: u64,
    pub copy_samples: u64,
    pub sample_hz: u64,
    pub cpu_share: Option<f64>,
    /// Full events received.
    pub events: u64,
    /// Distinct goroutines seen in sampled events (over the whole run: not
    /// a count of goroutines alive at once).
    pub goroutines_seen: u64,
    pub top_sites: Vec<SiteSummary>,
    /// Growths (samples) whose size before growth is unknown, over all
    /// sites (sampled mode only: caught after the switch to the new stack).
    pub old_size_unknown: u64,
    /// Sizes after growth are estimates (sampled: from each site's frame
    /// size and live stack) rather than observed (exact).
    pub new_sizes_estimated: bool,
    /// Size before growth -> count, over all sites (key 0: unknown).
    pub old_sizes: BTreeMap<u64, u64>,
    pub new_sizes: BTreeMap<u64, u64>,
    pub recommendation: Recommendation,
}

impl Mode {
    /// The kernel's tag for this mode.
    pub fn source(self) -> StackSource {
        match self {
            Mode::Exact => StackSource::Exact,
            Mode::Sampled => StackSource::Sampled,
        }
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::{
        event::{EventHeader, EventKind},
        stack::STACK_FRAMES,
    };

    use super::*;

    /// A symbolizer that knows nothing (addresses are printed as hex).
    struct NoSymbols;
    impl Symbolizer for NoSymbols {
        fn return_frame(&self, _pc: u64) -> Option<Frame> {
            None
        }
    }

    /// Symbols for made-up PCs: 0x1000.. deep, 0x2000.. task, 0x3000.. other.
    struct Fake;
    impl Symbolizer for Fake {
        fn return_frame(&self, pc: u64) -> Option<Frame> {
            // The call is the instruction before the return address.
            let name = match pc.saturating_sub(1) >> 12 {
                1 => "main.deep19k",
                2 => "main.task",
                3 => "main.other",
                _ => return None,
            };
            Some(Frame {
                function: name.into(),
                file: String::new(),
                line: 0,
                inlined: false,
                start_line: 0,
            })
        }
        fn max_frame(&self, pc: u64) -> Option<u64> {
            (pc >> 12 == 1).then_some(19456 + 40)
        }
    }

    fn key(
        source: StackSource,
        change: StackChange,
        old: u32,
        new: u32,
        site: u64,
    ) -> StackSiteKey {
        StackSiteKey {
            tgid: 7,
            source: source as u8,
            change: change as u8,
            _pad: 0,
            old_size: old,
            new_size: new,
            site_pc: site,
            caller_pc: if site == 0 { 0 } else { 0x2010 },
        }
    }

    fn counts(count: u64, copied: u64) -> StackSiteCounts {
        StackSiteCounts {
            count,
            copied_bytes: copied,
        }
    }

    fn event(site: u64, old: u64, used: u64, goid: u64) -> StackGrowthEvent {
        let mut frames = [0; STACK_FRAMES];
        frames[0] = site;
        frames[1] = 0x2010;
        frames[2] = 0x3010;
        StackGrowthEvent {
            header: EventHeader {
                kind: EventKind::StackGrowth as u32,
                tgid: 7,
                ..Default::default()
            },
            source: StackSource::Sampled as u8,
            change: StackChange::Copying as u8,
            _pad: 0,
            nframes: 3,
            goid,
            old_size: old,
            new_size: 0,
            used,
            frames,
        }
    }

    #[test]
    fn exact_mode_ranks_sites_scales_rates_and_recommends_32k() {
        let mut a = StackGrowthAggregator::new(Mode::Exact);
        a.set_sites([
            (
                key(StackSource::Exact, StackChange::Grow, 2048, 32768, 0x1010),
                counts(9900, 9900 * 200),
            ),
            (
                key(StackSource::Exact, StackChange::Grow, 2048, 4096, 0x3010),
                counts(50, 50 * 1800),
            ),
            (
                key(StackSource::Exact, StackChange::Shrink, 32768, 16384, 0),
                counts(7, 0),
            ),
            // Another mode's rows are ignored.
            (
                key(StackSource::Sampled, StackChange::Copying, 2048, 0, 0x3010),
                counts(1000, 0),
            ),
        ]);
        // Attached a tenth of the time: rates are per attached second.
        a.set_observed(Duration::from_secs(10), Duration::from_secs(1));
        let s = a.summary(&Fake, Some((64, "test")));
        assert_eq!((s.growths, s.shrinks), (9950, 7));
        assert!((s.attached_fraction - 0.1).abs() < 1e-9);
        assert_eq!(s.growths_per_sec, Some(9950.0));
        assert_eq!(s.top_sites[0].site.function, "main.deep19k");
        assert_eq!(s.top_sites[0].caller.function, "main.task");
        assert_eq!(s.top_sites[0].count, 9900);
        assert_eq!(s.old_sizes.get(&2048), Some(&9950));
        assert_eq!(s.recommendation.starting_stack_bytes, Some(32768));
        assert!(!s.recommendation.negligible);
        assert_eq!(s.recommendation.memory_bytes, Some(32768 * 64));
        let text = s.render_text();
        assert!(text.contains("main.deep19k <- main.task"), "{text}");
        assert!(text.contains("32 KB starting stack"), "{text}");
        serde_json::to_string(&s).unwrap();
    }

    #[test]
    fn sampled_mode_estimates_the_grown_size_from_the_frame() {
        let mut a = StackGrowthAggregator::new(Mode::Sampled);
        for g in 0..40 {
            a.add_event(&event(0x1010, 2048, 150, 100 + g));
        }
        // Caught after the switch: the 32 KB stack already fits the frame.
        a.set_sites([
            (
                key(StackSource::Sampled, StackChange::Copying, 2048, 0, 0x1010),
                counts(30, 0),
            ),
            (
                key(StackSource::Sampled, StackChange::Copying, 32768, 0, 0x1010),
                counts(10, 0),
            ),
        ]);
        for g in 0..10 {
            a.add_event(&event(0x1010, 32768, 150, 200 + g));
        }
        a.set_cpu_samples(400, 40, 99);
        a.set_observed(Duration::from_secs(2), Duration::from_secs(2));
        let s = a.summary(&Fake, None);
        assert_eq!(s.cpu_share, Some(0.1));
        assert_eq!(s.new_sizes.get(&32768), Some(&40));
        assert_eq!(s.old_sizes.get(&2048), Some(&30));
        assert_eq!(s.old_sizes.get(&UNKNOWN_SIZE), Some(&10));
        assert_eq!(s.recommendation.starting_stack_bytes, Some(32768));
        assert_eq!(s.recommendation.current_starting_stack_bytes, 2048);
        assert_eq!(s.goroutines_seen, 50);
        // Goroutines seen growing over a run are not goroutines alive at
        // once: without a count the memory cost is said to be unknown.
        assert_eq!(s.recommendation.goroutines, None);
        assert!(
            s.recommendation
                .advice
                .contains("goroutine count is unknown")
        );
        // What sampling cannot see is said, not printed as "?".
        assert_eq!(s.old_size_unknown, 10);
        assert_eq!(s.top_sites[0].old_size_unknown, 10);
        assert!(s.new_sizes_estimated);
        let text = s.render_text();
        assert!(!text.contains('?'), "{text}");
        assert!(
            text.contains("to ~32 KBx40 from 2 KBx30, unknown x10"),
            "{text}"
        );
        assert!(text.contains("unknown for 10 samples"), "{text}");
        assert!(text.contains("of the 40 stack-copy samples"), "{text}");
        assert!(!text.contains("of growths"), "{text}");
        let names: Vec<_> = s.top_sites[0]
            .example_stack
            .iter()
            .map(|f| f.function.as_str())
            .collect();
        assert_eq!(names, ["main.deep19k", "main.task", "main.other"]);
    }

    #[test]
    fn a_share_of_a_few_samples_is_negligible() {
        let mut a = StackGrowthAggregator::new(Mode::Sampled);
        a.set_sites([(
            key(StackSource::Sampled, StackChange::Copying, 2048, 0, 0x3010),
            counts(1, 0),
        )]);
        a.set_cpu_samples(21, 1, 99);
        a.set_observed(Duration::from_secs(5), Duration::from_secs(5));
        assert!(a.summary(&NoSymbols, None).recommendation.negligible);
        a.set_cpu_samples(210, MIN_COPY_SAMPLES, 99);
        assert!(!a.summary(&NoSymbols, None).recommendation.negligible);
    }

    #[test]
    fn little_growth_is_called_negligible() {
        let mut a = StackGrowthAggregator::new(Mode::Sampled);
        a.set_sites([(
            key(StackSource::Sampled, StackChange::Copying, 2048, 0, 0x3010),
            counts(1, 0),
        )]);
        a.set_cpu_samples(1000, 1, 99);
        a.set_observed(Duration::from_secs(5), Duration::from_secs(5));
        let s = a.summary(&NoSymbols, None);
        assert!(s.recommendation.negligible);
        assert!(s.render_text().contains("nothing should change"));

        let mut a = StackGrowthAggregator::new(Mode::Exact);
        a.set_observed(Duration::from_secs(5), Duration::from_secs(5));
        let s = a.summary(&NoSymbols, None);
        assert_eq!(s.growths, 0);
        assert!(s.recommendation.negligible);
    }
}
