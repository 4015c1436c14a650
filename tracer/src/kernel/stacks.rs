//! Attaching the stack-growth programs and reading what they counted.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use aya::{
    maps::{Array, PerCpuHashMap},
    programs::{
        PerfEvent, UProbe,
        perf_event::{PerfEventLinkId, SamplePolicy},
        uprobe::{UProbeLinkId, UProbeScope},
    },
};
use tracer_common::{
    map_names,
    process::Probe,
    stack::{StackConfig, StackSiteCounts, StackSiteKey},
};

use super::object::Object;
use crate::{
    binary::{COPYSTACK, GoBinary},
    stackgrowth::Mode,
};

const EXACT_PROGRAM: &str = tracer_common::program_names::STACK_COPY;
const SAMPLED_PROGRAM: &str = tracer_common::program_names::STACK_SAMPLE;

/// When the exact-mode uprobe is attached: `on` out of every `period`, and
/// within a window only until `max_events` copies were seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DutyCycle {
    pub on: Duration,
    pub period: Duration,
    pub max_events: u64,
}

impl DutyCycle {
    /// Attached all the time (for short runs and tests).
    pub const ALWAYS: DutyCycle = DutyCycle {
        on: Duration::MAX,
        period: Duration::MAX,
        max_events: u64::MAX,
    };
}

impl Default for DutyCycle {
    /// 1 s out of 10, at most 50 000 copies a window: a growth-heavy process
    /// pays the uprobe (15-20 us a hit here) for a bounded share of the time.
    fn default() -> Self {
        DutyCycle {
            on: Duration::from_secs(1),
            period: Duration::from_secs(10),
            max_events: 50_000,
        }
    }
}

/// Settings of a stack-growth session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackGrowthOptions {
    pub mode: Mode,
    /// Sampled mode: samples per second per CPU.
    pub sample_hz: u64,
    /// Exact mode: when the uprobe is attached.
    pub duty: DutyCycle,
    /// Exact mode: one full event (with a goroutine stack) per this many
    /// growths per CPU; 0 for counts only.
    pub exact_event_every: u32,
}

/// CPU samples per second per CPU of the stack growth sampler: the
/// affordable default of `gostw stacks` and the agent (measured at under 3%
/// throughput on a growth-heavy workload), and off the 100 Hz of timer
/// ticks.
pub const SAMPLE_HZ: u64 = 99;

impl Default for StackGrowthOptions {
    fn default() -> Self {
        StackGrowthOptions {
            mode: Mode::Sampled,
            sample_hz: SAMPLE_HZ,
            duty: DutyCycle::default(),
            exact_event_every: StackConfig::default().exact_event_every,
        }
    }
}

/// The attached stack-growth programs of one executable (exact) or of the
/// whole machine (sampled; the traced-process map filters).
pub struct StackGrowthProbes {
    opts: StackGrowthOptions,
    binary: std::path::PathBuf,
    copystack_offset: u64,
    uprobe: Option<UProbeLinkId>,
    window_start: Instant,
    window_hits_start: u64,
    attached_since: Option<Instant>,
    attached_total: Duration,
    perf_links: Vec<PerfEventLinkId>,
    started: Instant,
    /// Processes whose copies count towards a window's `max_events`.
    tgids: Vec<u32>,
}

impl StackGrowthProbes {
    /// Load and attach the programs of `opts.mode` for `binary`, whose file
    /// is reached at `path`. Tracing a process still needs `Object::trace`.
    pub fn attach(
        programs: &mut Object,
        binary: &GoBinary,
        path: &std::path::Path,
        opts: StackGrowthOptions,
    ) -> anyhow::Result<StackGrowthProbes> {
        let copystack_offset = match opts.mode {
            Mode::Exact => binary.function(COPYSTACK)?.entry_probe_offset,
            Mode::Sampled => 0,
        };
        Self::start(programs, path.to_owned(), copystack_offset, opts)
    }

    /// The sampled mode alone, for every traced process of the machine (its
    /// perf events are per CPU, not per executable): one for a whole agent.
    pub fn sampler(programs: &mut Object, sample_hz: u64) -> anyhow::Result<StackGrowthProbes> {
        let opts = StackGrowthOptions {
            mode: Mode::Sampled,
            sample_hz,
            ..StackGrowthOptions::default()
        };
        Self::start(programs, std::path::PathBuf::new(), 0, opts)
    }

    fn start(
        programs: &mut Object,
        binary: std::path::PathBuf,
        copystack_offset: u64,
        opts: StackGrowthOptions,
    ) -> anyhow::Result<StackGrowthProbes> {
        let mut config: Array<_, StackConfig> =
            Array::try_from(programs.map_mut(map_names::STACK_CONFIG)?)?;
        config.set(
            0,
            StackConfig {
                exact_event_every: opts.exact_event_every,
                _pad: 0,
            },
            0,
        )?;
        let now = Instant::now();
        let mut probes = StackGrowthProbes {
            opts,
            binary,
            copystack_offset,
            uprobe: None,
            window_start: now,
            window_hits_start: 0,
            attached_since: None,
            attached_total: Duration::ZERO,
            perf_links: Vec::new(),
            started: now,
            tgids: Vec::new(),
        };
        match opts.mode {
            Mode::Exact => probes.attach_uprobe(programs)?,
            Mode::Sampled => probes.attach_sampler(programs)?,
        }
        Ok(probes)
    }

    /// Count process `tgid`'s copies towards the exact mode's per-window cap.
    pub fn watch(&mut self, tgid: u32) {
        self.tgids.push(tgid);
    }

    fn uprobe_program(programs: &mut Object) -> anyhow::Result<&mut UProbe> {
        programs.program::<UProbe>(EXACT_PROGRAM)
    }

    fn attach_uprobe(&mut self, programs: &mut Object) -> anyhow::Result<()> {
        let (offset, path) = (self.copystack_offset, self.binary.clone());
        let t = Instant::now();
        let link = Self::uprobe_program(programs)?
            .attach(offset, &path, UProbeScope::AllProcesses)
            .with_context(|| {
                format!("attaching stack_copy to {COPYSTACK} in {}", path.display())
            })?;
        self.uprobe = Some(link);
        log::debug!("stack_copy attached in {:?}", t.elapsed());
        let now = Instant::now();
        self.attached_since = Some(now);
        self.window_start = now;
        self.window_hits_start = self.hits(programs);
        Ok(())
    }

    fn detach_uprobe(&mut self, programs: &mut Object) -> anyhow::Result<()> {
        if let Some(link) = self.uprobe.take() {
            let t = Instant::now();
            Self::uprobe_program(programs)?.detach(link)?;
            log::debug!("stack_copy detached in {:?}", t.elapsed());
        }
        if let Some(since) = self.attached_since.take() {
            self.attached_total += since.elapsed();
        }
        Ok(())
    }

    fn attach_sampler(&mut self, programs: &mut Object) -> anyhow::Result<()> {
        let prog = programs.program::<PerfEvent>(SAMPLED_PROGRAM)?;
        super::cpu_clock::attach_every_cpu(
            prog,
            "the CPU-clock sampler",
            &SamplePolicy::Frequency(self.opts.sample_hz),
            &mut self.perf_links,
        )?;
        self.attached_since = Some(Instant::now());
        Ok(())
    }

    fn hits(&self, programs: &Object) -> u64 {
        self.tgids
            .iter()
            .map(|&t| programs.probe_hits(t, Probe::Copystack).unwrap_or(0))
            .sum()
    }

    /// Drive the exact mode's duty cycle; call a few times a second.
    pub fn tick(&mut self, programs: &mut Object) -> anyhow::Result<()> {
        if self.opts.mode != Mode::Exact {
            return Ok(());
        }
        let duty = self.opts.duty;
        let in_window = self.window_start.elapsed();
        if self.uprobe.is_some() {
            let events = self.hits(programs).saturating_sub(self.window_hits_start);
            if in_window >= duty.on || events >= duty.max_events {
                self.detach_uprobe(programs)?;
            }
        } else if in_window >= duty.period {
            self.attach_uprobe(programs)?;
        }
        Ok(())
    }

    /// Time since attach, and how much of it the programs were attached.
    pub fn observed(&self) -> (Duration, Duration) {
        let live = self.attached_since.map_or(Duration::ZERO, |s| s.elapsed());
        (self.started.elapsed(), self.attached_total + live)
    }

    /// Detach everything (also done when `Object` is dropped).
    pub fn detach(mut self, programs: &mut Object) -> anyhow::Result<()> {
        self.detach_uprobe(programs)?;
        if !self.perf_links.is_empty() {
            let prog = programs.program::<PerfEvent>(SAMPLED_PROGRAM)?;
            for link in self.perf_links.drain(..) {
                prog.detach(link)?;
            }
        }
        Ok(())
    }
}

/// Delete process `tgid`'s rows of `STACK_SITES` (after its last
/// `collect`), so a long-running tracer does not fill the map with the
/// counts of processes gone.
pub fn forget_process(programs: &mut Object, tgid: u32) -> anyhow::Result<()> {
    let mut map: PerCpuHashMap<_, StackSiteKey, StackSiteCounts> =
        PerCpuHashMap::try_from(programs.map_mut(map_names::STACK_SITES)?)?;
    let keys: Vec<StackSiteKey> = map
        .keys()
        .filter_map(Result::ok)
        .filter(|k| k.tgid == tgid)
        .collect();
    for key in keys {
        // Already gone is fine.
        let _ = map.remove(&key);
    }
    Ok(())
}

/// This process's rows of `STACK_SITES`, summed over CPUs.
pub fn site_counts(
    programs: &Object,
    tgid: u32,
) -> anyhow::Result<Vec<(StackSiteKey, StackSiteCounts)>> {
    let map: PerCpuHashMap<_, StackSiteKey, StackSiteCounts> =
        PerCpuHashMap::try_from(programs.map(map_names::STACK_SITES)?)?;
    let mut rows = Vec::new();
    for item in map.iter() {
        let (key, per_cpu) = item?;
        if key.tgid != tgid {
            continue;
        }
        let mut sum = StackSiteCounts::default();
        for c in per_cpu.iter() {
            sum.count += c.count;
            sum.copied_bytes += c.copied_bytes;
        }
        rows.push((key, sum));
    }
    Ok(rows)
}
