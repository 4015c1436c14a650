//! Stack growth of one process for its profile, from two sources: the
//! kernel's per-site counts (`STACK_SITES`: exact, per function that needed
//! more stack, its caller and the sizes, read when the process is
//! forgotten) and the full goroutine stacks of the events (every sample in
//! sampled mode; one per `--event-every` growths in exact mode). A site's
//! count goes to the full stacks seen through it in proportion to how often
//! each was seen, so the totals per site stay the kernel's and the deeper
//! frames are the events'. Without events for a site its stack is the two
//! frames the kernel counted.

use std::collections::HashMap;

use tracer_common::stack::{
    StackChange, StackGrowthEvent, StackSiteCounts, StackSiteKey, StackSource,
};

use crate::model::code::growth_pcs;
use crate::stackgrowth::Mode;

/// Distinct full stacks kept per process; events of further stacks count at
/// their site only.
pub const MAX_STACKS: usize = 4096;

/// (site pc, caller pc, old size, new size): what the kernel counts by.
type SiteKey = (u64, u64, u64, u64);

/// Growth at one stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrowthAt {
    /// Return addresses, the function that needed more stack first.
    pub pcs: Vec<u64>,
    pub old_stack: u64,
    /// 0 in sampled mode (unknown).
    pub new_stack: u64,
    /// Growths (exact) or copy samples (sampled).
    pub events: u64,
    /// Bytes copied (exact only).
    pub bytes: u64,
}

/// One process's stack growth, as the stream brings it.
#[derive(Debug)]
pub struct GrowthSites {
    mode: Mode,
    /// Per site: the stacks of its events and (events, bytes to copy).
    events: HashMap<SiteKey, HashMap<Vec<u64>, (u64, u64)>>,
    stacks: usize,
    rows: Option<Vec<(StackSiteKey, StackSiteCounts)>>,
}

impl GrowthSites {
    /// Nothing seen yet, in `mode`.
    pub fn new(mode: Mode) -> GrowthSites {
        GrowthSites {
            mode,
            events: HashMap::new(),
            stacks: 0,
            rows: None,
        }
    }

    /// The change this mode counts as growth.
    fn growth(&self) -> u8 {
        match self.mode {
            Mode::Exact => StackChange::Grow as u8,
            Mode::Sampled => StackChange::Copying as u8,
        }
    }

    fn source(&self) -> u8 {
        match self.mode {
            Mode::Exact => StackSource::Exact as u8,
            Mode::Sampled => StackSource::Sampled as u8,
        }
    }

    /// One event (of this mode's source; others are left out).
    pub fn add_event(&mut self, ev: &StackGrowthEvent) {
        if ev.source != self.source() || ev.change != self.growth() {
            return;
        }
        let pcs = growth_pcs(ev);
        // The kernel keys its counts by 32-bit sizes: an event's sizes are
        // cut the same way, or a size past 4 GiB (a sample that read the
        // stack bounds while copystack changed them) would count once in
        // the kernel's row and again as a site it did not count.
        let key = (
            pcs.first().copied().unwrap_or(0),
            pcs.get(1).copied().unwrap_or(0),
            u64::from(ev.old_size as u32),
            u64::from(ev.new_size as u32),
        );
        let site = self.events.entry(key).or_default();
        let stack = match site.get_mut(pcs) {
            Some(s) => s,
            None if self.stacks < MAX_STACKS => {
                self.stacks += 1;
                site.entry(pcs.to_vec()).or_default()
            }
            // Past the bound: the site's two frames stand for it.
            None => site
                .entry(pcs.iter().take(2).copied().collect())
                .or_default(),
        };
        stack.0 += 1;
        stack.1 += ev.used;
    }

    /// The kernel's cumulative per-site counts of the process.
    pub fn set_rows(&mut self, rows: &[(StackSiteKey, StackSiteCounts)]) {
        let (source, growth) = (self.source(), self.growth());
        self.rows = Some(
            rows.iter()
                .filter(|(k, _)| k.source == source && k.change == growth)
                .copied()
                .collect(),
        );
    }

    /// Growth per stack: the kernel's site counts spread over the stacks
    /// seen at each site; with no counts (not read), the events alone.
    pub fn records(&self) -> Vec<GrowthAt> {
        let mut out = Vec::new();
        let mut counted = std::collections::HashSet::new();
        for (k, c) in self.rows.iter().flatten() {
            let key = (
                k.site_pc,
                k.caller_pc,
                u64::from(k.old_size),
                u64::from(k.new_size),
            );
            counted.insert(key);
            let bytes = if self.mode == Mode::Exact {
                c.copied_bytes
            } else {
                0
            };
            let mut stacks: Vec<(&Vec<u64>, u64)> = self
                .events
                .get(&key)
                .map(|s| s.iter().map(|(pcs, (n, _))| (pcs, *n)).collect())
                .unwrap_or_default();
            if stacks.is_empty() {
                out.push(at(vec![k.site_pc, k.caller_pc], key, c.count, bytes));
                continue;
            }
            // The same order every time, for the same split.
            stacks.sort();
            let weights: Vec<u64> = stacks.iter().map(|s| s.1).collect();
            let counts = split(c.count, &weights);
            let bytes = split(bytes, &weights);
            for (((pcs, _), n), b) in stacks.into_iter().zip(counts).zip(bytes) {
                if n > 0 || b > 0 {
                    out.push(at(pcs.clone(), key, n, b));
                }
            }
        }
        // Sites the kernel did not count (its map was full, or it was not
        // read): their events as they came.
        for (key, stacks) in &self.events {
            if counted.contains(key) {
                continue;
            }
            for (pcs, (n, used)) in stacks {
                let bytes = if self.mode == Mode::Exact { *used } else { 0 };
                out.push(at(pcs.clone(), *key, *n, bytes));
            }
        }
        out
    }
}

fn at(pcs: Vec<u64>, key: SiteKey, events: u64, bytes: u64) -> GrowthAt {
    GrowthAt {
        pcs,
        old_stack: key.2,
        new_stack: key.3,
        events,
        bytes,
    }
}

/// `total` split in proportion to `weights`, in whole units adding up to
/// `total` (largest remainders get the units left over).
pub fn split(total: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let exact: Vec<(u64, u128)> = weights
        .iter()
        .map(|&w| {
            let p = u128::from(total) * u128::from(w);
            ((p / sum) as u64, p % sum)
        })
        .collect();
    let mut out: Vec<u64> = exact.iter().map(|e| e.0).collect();
    let left = total - out.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| exact[b].1.cmp(&exact[a].1).then(a.cmp(&b)));
    for &i in order.iter().take(left as usize) {
        out[i] += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use tracer_common::{event::EventHeader, stack::STACK_FRAMES};

    use super::*;
    use crate::stackgrowth::tests_support::exact_row;

    fn event(pcs: &[u64], old: u64, new: u64, mode: Mode) -> StackGrowthEvent {
        let mut frames = [0; STACK_FRAMES];
        frames[..pcs.len()].copy_from_slice(pcs);
        let (source, change) = match mode {
            Mode::Exact => (StackSource::Exact, StackChange::Grow),
            Mode::Sampled => (StackSource::Sampled, StackChange::Copying),
        };
        StackGrowthEvent {
            header: EventHeader::default(),
            source: source as u8,
            change: change as u8,
            _pad: 0,
            nframes: pcs.len() as u32,
            goid: 1,
            old_size: old,
            new_size: new,
            used: 100,
            frames,
        }
    }

    fn row(site: u64, caller: u64, count: u64, copied: u64) -> (StackSiteKey, StackSiteCounts) {
        exact_row(1, (site, caller), (2048, 32768), count, copied)
    }

    #[test]
    fn split_keeps_the_total() {
        assert_eq!(split(10, &[1, 1, 1]), [4, 3, 3]);
        assert_eq!(split(1000, &[3, 1]), [750, 250]);
        assert_eq!(split(5, &[0, 0]), [0, 0]);
        assert_eq!(split(7, &[2]), [7]);
        let s = split(u64::MAX, &[u64::MAX, 1]);
        assert_eq!(s.iter().sum::<u64>(), u64::MAX);
    }

    /// Exact mode: the kernel's counts are the totals; one event in 64
    /// says which deeper stacks they went through.
    #[test]
    fn kernel_counts_spread_over_the_stacks_seen() {
        let mut g = GrowthSites::new(Mode::Exact);
        for _ in 0..3 {
            g.add_event(&event(&[0x10, 0x20, 0x30], 2048, 32768, Mode::Exact));
        }
        g.add_event(&event(&[0x10, 0x20, 0x40], 2048, 32768, Mode::Exact));
        // Another mode's event is not this profile's.
        g.add_event(&event(&[0x10, 0x20, 0x50], 2048, 0, Mode::Sampled));
        g.set_rows(&[row(0x10, 0x20, 400, 400 * 1500), row(0x70, 0x80, 5, 50)]);
        let mut r = g.records();
        r.sort_by_key(|a| std::cmp::Reverse(a.events));
        let summary: Vec<(&[u64], u64, u64)> =
            r.iter().map(|a| (&a.pcs[..], a.events, a.bytes)).collect();
        assert_eq!(
            summary,
            [
                (&[0x10, 0x20, 0x30][..], 300, 450_000),
                (&[0x10, 0x20, 0x40][..], 100, 150_000),
                (&[0x70, 0x80][..], 5, 50),
            ]
        );
        assert_eq!((r[0].old_stack, r[0].new_stack), (2048, 32768));
    }

    #[test]
    fn without_counts_the_events_are_the_samples() {
        let mut g = GrowthSites::new(Mode::Sampled);
        g.add_event(&event(&[0x10, 0x20, 0x30], 2048, 0, Mode::Sampled));
        g.add_event(&event(&[0x10, 0x20, 0x30], 2048, 0, Mode::Sampled));
        let r = g.records();
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].events, r[0].bytes, r[0].new_stack), (2, 0, 0));
    }

    #[test]
    fn a_size_past_32_bits_is_the_kernels_row_not_a_site_of_its_own() {
        // Seen once: a sample read the stack bounds while copystack changed
        // them, old size 0x1_0000_0800; the kernel counted it at 0x800.
        let mut g = GrowthSites::new(Mode::Sampled);
        let torn = 0x1_0000_0800;
        g.add_event(&event(&[0x10, 0x20, 0x30], torn, 0, Mode::Sampled));
        g.add_event(&event(&[0x10, 0x20, 0x30], 2048, 0, Mode::Sampled));
        let sampled = |old_size: u32| {
            let (k, c) = row(0x10, 0x20, 1, 0);
            (
                StackSiteKey {
                    source: StackSource::Sampled as u8,
                    change: StackChange::Copying as u8,
                    old_size,
                    new_size: 0,
                    ..k
                },
                c,
            )
        };
        let rows = [sampled(2048), sampled(torn as u32)];
        g.set_rows(&rows);
        let total: u64 = g.records().iter().map(|r| r.events).sum();
        assert_eq!(total, 2, "{:?}", g.records());
    }
}
