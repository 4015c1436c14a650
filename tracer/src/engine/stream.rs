//! The pure part of the engine: raw ring-buffer records in, the observed
//! stream out. Each record is decoded once (`Event::decode`), fault stacks
//! are symbolized through the process's image, pauses become records, and
//! the correlator decides which faults belong to which pause. No kernel and
//! no clock of its own (the caller gives the time), so a recorded stream can
//! be replayed in tests.

use std::{collections::HashMap, sync::Arc};

use tracer_common::explain::{KernelWait, Laggard, LaggardState, PauseDetail};

use super::{
    caller,
    correlate::{Correlator, CorrelatorStats},
    event::Event,
};
use crate::model::{
    fault::Fault,
    kernel_wait::RawWait,
    laggard::{ExplainInput, RawLaggard},
    losses::Losses,
    observed::{Observed, ProcessInfo},
    pause,
};
use crate::{
    clock::WallClock,
    image::{Frame, ProcessImage},
    procfs::kallsyms::KernelSymbols,
};

/// Frames kept of a fault's user stack (from at most as many addresses:
/// the kernel sends `FAULT_STACK_DEPTH`).
pub const MAX_FRAMES: usize = 24;
const _: () = assert!(MAX_FRAMES == tracer_common::fault::FAULT_STACK_DEPTH);
/// Symbolized fault stacks kept, all processes together.
const STACK_CACHE_MAX: usize = 16_384;

/// Where laggards' user stacks are read from (the kernel's stack map).
pub trait StackSource {
    /// The addresses of stack `id`, innermost first (empty if unknown).
    fn addresses(&self, id: u32) -> Vec<u64>;
}

impl StackSource for aya::maps::StackTraceMap<aya::maps::MapData> {
    fn addresses(&self, id: u32) -> Vec<u64> {
        self.get(&id, 0)
            .map(|t| t.frames().iter().map(|f| f.ip).collect())
            .unwrap_or_default()
    }
}

/// A stack of `PAUSE_STACKS` as read, if all its addresses are of the kind
/// asked for (kernel or user), else none. User and kernel stacks share the
/// map, taken with `BPF_F_REUSE_STACKID`: a later stack that hashes to the
/// same bucket replaces the one there before user space reads it (seen
/// once: a laggard's sampled user stack read back as eight kernel
/// addresses). A replaced stack is lost, never shown as the other kind.
fn of_kind(addresses: Vec<u64>, kernel: bool) -> Vec<u64> {
    // The upper half of the address space is the kernel's (x86-64, arm64).
    let in_kernel = |a: u64| a >= 1 << 63;
    if addresses.iter().all(|&a| in_kernel(a) == kernel) {
        addresses
    } else {
        Vec::new()
    }
}

/// A fault stack's frames and the addresses they came from.
type FaultStack = (Arc<[Frame]>, Arc<[u64]>);

/// What the stream follows.
#[derive(Clone, Copy, Debug, Default)]
pub struct StreamOptions {
    pub faults: bool,
    pub stacks: bool,
}

/// Decoding, symbolization and correlation.
pub struct Stream {
    clock: WallClock,
    opts: StreamOptions,
    pub losses: Losses,
    correlator: Correlator,
    /// Where laggards' user stacks are read from.
    pause_stacks: Option<Box<dyn StackSource>>,
    /// The backend marks every file-backed fault (see `Fault::from_event`).
    file_faults_seen: bool,
    images: HashMap<u32, Arc<ProcessImage>>,
    /// Symbolized fault stacks and their frames, per process and return
    /// addresses (at most `STACK_CACHE_MAX`).
    stack_cache: HashMap<(u32, Box<[u64]>), FaultStack>,
    /// The detail of each process's pause whose event comes next.
    details: HashMap<u32, Box<PauseDetail>>,
}

impl Stream {
    pub fn new(clock: WallClock, opts: StreamOptions) -> Stream {
        Stream {
            clock,
            opts,
            losses: Losses::default(),
            correlator: Correlator::new(opts.faults),
            pause_stacks: None,
            file_faults_seen: true,
            images: HashMap::new(),
            stack_cache: HashMap::new(),
            details: HashMap::new(),
        }
    }

    /// Read laggards' user stacks from `stacks`.
    pub fn set_pause_stack_source(&mut self, stacks: Box<dyn StackSource>) {
        self.pause_stacks = Some(stacks);
    }

    /// Whether the fault backend marks every file-backed fault.
    pub fn set_file_faults_seen(&mut self, seen: bool) {
        self.file_faults_seen = seen;
    }

    /// The correlator's counts.
    pub fn correlator_stats(&self) -> CorrelatorStats {
        self.correlator.stats
    }

    /// Symbolize faults of a new traced process with its image.
    pub fn started(&mut self, info: &ProcessInfo) {
        if let Some(image) = &info.image {
            self.images.insert(info.pid, image.clone());
        }
    }

    /// Handle one raw record; what it settles goes to `out`.
    pub fn feed(&mut self, raw: &[u8], out: &mut Vec<Observed>) {
        let event = match Event::decode(raw) {
            Ok(e) => e,
            Err(e) => {
                log::debug!("{e}");
                e.count_in(&mut self.losses);
                return;
            }
        };
        match event {
            Event::Pause(ev) => {
                let mut rec = pause::record(&ev, self.clock);
                // The detail is sent just before its pause, by the same probe.
                if let Some(d) = self
                    .details
                    .remove(&ev.header.tgid)
                    .filter(|d| d.stop_ts_ns == ev.stop_ts_ns)
                {
                    rec.caller = Some(self.caller(ev.header.tgid, &d));
                    rec.explain_input = Some(Box::new(self.explain_input(ev.header.tgid, &d)));
                }
                self.correlator.pause(rec, out);
            }
            Event::PauseDetail(d) => {
                self.details.insert(d.header.tgid, d);
            }
            Event::Fault(rec) if self.opts.faults => {
                let (stack, pcs) = self.stack(rec.event.header.tgid, rec.stack());
                let mut fault = Fault::from_event(&rec.event, stack, self.file_faults_seen);
                fault.pcs = pcs;
                self.correlator.fault(fault, out);
            }
            Event::StackGrowth(ev) if self.opts.stacks => {
                // Its code is filled in on the way to the sinks (`code`).
                out.push(Observed::StackGrowth {
                    event: ev,
                    code: Arc::default(),
                });
            }
            Event::Fault(_) | Event::StackGrowth(_) => {
                self.losses.unhandled += 1;
                return;
            }
        }
        self.losses.handled += 1;
    }

    /// When the next held pause is due for release (CLOCK_MONOTONIC ns).
    pub fn next_release_ns(&self) -> Option<u64> {
        self.correlator.next_release_ns()
    }

    /// Release what `now_ns` (CLOCK_MONOTONIC) settles.
    pub fn settle(&mut self, now_ns: u64, out: &mut Vec<Observed>) {
        self.correlator.settle(now_ns, out);
    }

    /// `pid` exited and its events are in.
    pub fn exited(&mut self, pid: u32, out: &mut Vec<Observed>) {
        self.correlator.exited(pid, out);
        self.images.remove(&pid);
        self.stack_cache.retain(|(p, _), _| *p != pid);
        self.details.remove(&pid);
    }

    /// What `explain::complete` needs of a pause's detail: the laggards'
    /// frames symbolized.
    fn explain_input(&self, tgid: u32, d: &PauseDetail) -> ExplainInput {
        let image = self.image(tgid);
        let n = (d.nlaggards as usize).min(d.laggards.len());
        let laggards = d.laggards[..n]
            .iter()
            .map(|l| RawLaggard {
                tid: l.tid,
                flags: l.flags,
                last_out_ns: l.last_out_ns,
                out_state: LaggardState::from_u32(l.out_state),
                off: l.off,
                unseen_off_ns: l.unseen_off_ns,
                stopper_off_at_out: l.stopper_off_at_out,
                goid: l.goid,
                frames: self.laggard_frames(image, l),
                held: self.user_stack(image, l.held_stack_id),
                held_samples: l.held_samples,
                faults: l.faults,
            })
            .collect();
        ExplainInput {
            sched: d.config & PauseDetail::SCHED != 0,
            restart_ns: (d.restart_ns != 0).then_some(d.restart_ns),
            stopper: d.stopper,
            laggards,
            laggards_dropped: d.laggards_dropped,
            waits: d.waits[..(d.nwaits as usize).min(d.waits.len())]
                .iter()
                .map(|w| RawWait {
                    tid: w.tid,
                    phase: w.phase & !KernelWait::ON_CPU,
                    on_cpu: w.phase & KernelWait::ON_CPU != 0,
                    interruptible: w.kstack_id == KernelWait::INTERRUPTIBLE,
                    count: w.count,
                    blocked_ns: w.blocked_ns,
                    frames: self.kernel_stack(w.kstack_id),
                })
                .collect(),
            waits_dropped_ns: d.waits_dropped_ns,
        }
    }

    /// The function names of a kernel stack in `PAUSE_STACKS`, innermost
    /// first (negative id, or addresses the kernel hides: none).
    fn kernel_stack(&self, id: i32) -> Vec<String> {
        let (Some(stacks), true) = (&self.pause_stacks, id >= 0) else {
            return Vec::new();
        };
        let symbols = KernelSymbols::host();
        if symbols.is_empty() {
            return Vec::new();
        }
        of_kind(stacks.addresses(id as u32), true)
            .into_iter()
            .map(|a| {
                symbols
                    .name(a)
                    .map_or_else(|| format!("{a:#x}"), str::to_owned)
            })
            .collect()
    }

    /// A laggard's goroutine stack (all return addresses; the word after
    /// `sched.pc` is one only after a preemption at a stack check, so it is
    /// dropped when it names no function), or its thread's user stack.
    fn laggard_frames(&self, image: Option<&ProcessImage>, l: &Laggard) -> Vec<Frame> {
        let Some(image) = image else {
            return Vec::new();
        };
        if l.flags & Laggard::GOROUTINE_FRAMES != 0 {
            let n = (l.nframes as usize).min(l.frames.len());
            let mut rets = l.frames[..n].to_vec();
            if rets.len() > 1 && image.frames_of_return(rets[1]).is_empty() {
                rets.remove(1);
            }
            return image.return_stack(&rets, caller::MAX_FRAMES);
        }
        self.user_stack(Some(image), l.user_stack_id)
    }

    /// The frames of a user stack in `PAUSE_STACKS` (negative id: none).
    fn user_stack(&self, image: Option<&ProcessImage>, id: i32) -> Vec<Frame> {
        match (image, &self.pause_stacks) {
            (Some(image), Some(stacks)) if id >= 0 => image.stack(
                &of_kind(stacks.addresses(id as u32), false),
                caller::MAX_FRAMES,
            ),
            _ => Vec::new(),
        }
    }

    /// The image of `tgid`, its load bias resolved (once: the process runs
    /// while its events come in, and the sinks read the bias from here).
    fn image(&self, tgid: u32) -> Option<&ProcessImage> {
        let image = self.images.get(&tgid)?;
        image.resolve();
        Some(image)
    }

    /// The symbolized caller stack of a pause's detail.
    fn caller(&self, tgid: u32, d: &PauseDetail) -> Vec<Frame> {
        let n = (d.caller_len as usize).min(d.caller.len());
        let rets = &d.caller[..n];
        match self.image(tgid) {
            Some(image) => caller::goroutine_part(image.return_stack(rets, caller::MAX_FRAMES)),
            None => rets.iter().map(|&pc| Frame::unknown(pc)).collect(),
        }
    }

    /// The trace ends.
    pub fn finish(&mut self, out: &mut Vec<Observed>) {
        self.correlator.finish(out);
    }

    /// The frames of the user stack `pcs` of `tgid` and the addresses
    /// they came from (as many as have frames among the first `MAX_FRAMES`).
    fn stack(&mut self, tgid: u32, pcs: &[u64]) -> FaultStack {
        if pcs.is_empty() {
            return (Arc::from(Vec::new()), Arc::from([]));
        }
        let key = (tgid, Box::<[u64]>::from(pcs));
        if let Some(s) = self.stack_cache.get(&key) {
            return s.clone();
        }
        let frames: Arc<[Frame]> = match self.image(tgid) {
            Some(image) => image.stack(pcs, MAX_FRAMES).into(),
            None => pcs
                .iter()
                .take(MAX_FRAMES)
                .map(|&pc| Frame::unknown(pc))
                .collect(),
        };
        // One address per location: a location ends at a non-inlined frame
        // (or where MAX_FRAMES cut the stack).
        let cut = frames.last().is_some_and(|f| f.inlined);
        let located = frames.iter().filter(|f| !f.inlined).count() + usize::from(cut);
        let both = (frames, Arc::from(&pcs[..located.min(pcs.len())]));
        // Stacks are many only in a long trace of varied code: start over
        // (symbolizing again is cheap) rather than grow without end.
        if self.stack_cache.len() >= STACK_CACHE_MAX {
            self.stack_cache.clear();
        }
        self.stack_cache.insert(key, both.clone());
        both
    }
}

#[cfg(test)]
pub mod tests {
    use tracer_common::{
        event::{EventHeader, EventKind},
        fault::{Backend, FAULT_STACK_DEPTH, FaultEvent, FaultRecord},
        pause::{PauseEvent, REASON_TEXT_LEN},
        stack::StackGrowthEvent,
    };

    use super::*;
    use crate::engine::correlate::GRACE_NS;

    #[test]
    fn a_stack_replaced_by_one_of_the_other_kind_is_lost_not_shown() {
        let user = vec![0x4a_1234, 0x4a_2000, 0x7fff_0000_1000];
        let kernel = vec![0xffff_ffff_8142_d010, 0xffff_ffff_8100_0130];
        assert_eq!(of_kind(user.clone(), false), user);
        assert_eq!(of_kind(kernel.clone(), true), kernel);
        // What a laggard's user stack read back as once: kernel addresses.
        assert!(of_kind(kernel.clone(), false).is_empty());
        assert!(of_kind(user.clone(), true).is_empty());
        let mixed = vec![user[0], kernel[0]];
        assert!(of_kind(mixed.clone(), false).is_empty());
        assert!(of_kind(mixed, true).is_empty());
    }

    pub fn bytes<T: aya::Pod>(v: &T) -> Vec<u8> {
        // SAFETY: T is Pod: plain bytes, no padding.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    /// A pause event of `pid`: Go's own start and end, probes around them.
    pub fn pause_event(pid: u32, reason: u32, start: u64, dur: u64) -> Vec<u8> {
        bytes(&PauseEvent {
            header: EventHeader {
                kind: EventKind::Pause as u32,
                tgid: pid,
                tid: pid,
                cpu: 0,
                ts_ns: start + dur + 10,
            },
            stop_ts_ns: start - 10,
            go_now_ns: start + dur,
            go_started_ns: start,
            stop_tid: pid,
            reason,
            flags: PauseEvent::FLAG_GO_START,
            reason_text_len: 0,
            reason_text: [0; REASON_TEXT_LEN],
            stopping: Default::default(),
        })
    }

    /// A swap-in fault of `tid` in `pid` from `begin` to `end`.
    pub fn fault_event(pid: u32, tid: u32, begin: u64, end: u64) -> Vec<u8> {
        let event = FaultEvent {
            header: EventHeader {
                kind: EventKind::Fault as u32,
                tgid: pid,
                tid,
                cpu: 0,
                ts_ns: end,
            },
            begin_ns: begin,
            address: 0xc000_0000,
            ip: 0,
            blocked_ns: (end - begin) / 2,
            wait_own_ns: (end - begin) / 2,
            wait_other_ns: 0,
            user_stack_len: -14,
            flags: FaultEvent::FLAG_SWAP,
            reads_issued: 1,
            backend: Backend::Tracepoint as u32,
        };
        bytes(&FaultRecord {
            event,
            user_stack: [0; FAULT_STACK_DEPTH],
        })
    }

    #[test]
    fn a_fault_stack_comes_in_its_record() {
        let mut rec = FaultRecord {
            event: FaultEvent {
                user_stack_len: -14,
                ..FaultEvent::default()
            },
            user_stack: [0; FAULT_STACK_DEPTH],
        };
        assert!(rec.stack().is_empty(), "an error: no stack");
        rec.user_stack[..3].copy_from_slice(&[0x401000, 0x402000, 0x403000]);
        rec.event.user_stack_len = 3;
        assert_eq!(rec.stack(), &[0x401000, 0x402000, 0x403000]);

        let mut s = Stream::new(WallClock::default(), StreamOptions::default());
        let (frames, pcs) = s.stack(1, rec.stack());
        // No image of process 1: one unknown frame per address.
        assert_eq!(&pcs[..], rec.stack());
        assert_eq!(frames.len(), 3);
        let (again, _) = s.stack(1, rec.stack());
        assert!(Arc::ptr_eq(&frames, &again), "symbolized once");
        let (other, _) = s.stack(1, &rec.stack()[..2]);
        assert_eq!(other.len(), 2, "another stack is another entry");
    }

    #[test]
    fn records_decode_once_and_bad_ones_are_counted() {
        let mut s = Stream::new(
            WallClock::default(),
            StreamOptions {
                faults: false,
                stacks: true,
            },
        );
        let mut out = Vec::new();
        let ev = pause_event(42, 2, 1_000, 140);
        s.feed(&ev, &mut out);
        let Some(Observed::Pause(p)) = out.first() else {
            panic!("no pause");
        };
        assert_eq!((p.record.pid, p.record.duration_ns), (42, 140));
        s.feed(&ev[..30], &mut out);
        let mut unknown = ev.clone();
        unknown[0] = 77;
        s.feed(&unknown, &mut out);
        s.feed(&fault_event(1, 1, 10, 20), &mut out);
        s.feed(&[1, 2, 3], &mut out);
        let mut growth: StackGrowthEvent = unsafe { std::mem::zeroed() };
        growth.header.kind = EventKind::StackGrowth as u32;
        s.feed(&bytes(&growth), &mut out);
        assert_eq!(
            s.losses,
            Losses {
                handled: 2,
                malformed: 2,
                unknown_kind: 1,
                unhandled: 1
            }
        );
        assert_eq!(s.losses.lost(), 4);
        assert!(matches!(out.last(), Some(Observed::StackGrowth { .. })));
    }

    #[test]
    fn faults_join_their_pause_after_the_grace() {
        let mut s = Stream::new(
            WallClock::default(),
            StreamOptions {
                faults: true,
                stacks: false,
            },
        );
        let mut out = Vec::new();
        s.feed(&fault_event(7, 7, 1_500, 1_900), &mut out);
        s.feed(&pause_event(7, 1, 1_000, 1_000), &mut out);
        s.feed(&fault_event(7, 8, 1_600, 9_000), &mut out);
        assert!(out.is_empty());
        s.settle(2_000 + GRACE_NS + 1, &mut out);
        let [Observed::Pause(p)] = &out[..] else {
            panic!("one pause expected");
        };
        let f = p.record.faults.as_ref().unwrap();
        assert_eq!(
            (f.all.faults, f.stopper.faults, f.other_threads.faults),
            (2, 1, 1)
        );
    }
}
