//! How many goroutines a process has at the same time, for the memory a
//! bigger starting stack would cost.
//!
//! The runtime keeps every `g` it ever made in `allgs` (`allglen` long): Go
//! never frees one, dead ones wait in per-P and global free lists for reuse.
//! So `allglen` is the peak of goroutines alive plus dead ones cached (up to
//! 64 per P: a small server with 20 goroutines can show 150). Where the
//! offset of `g.atomicstatus` is known, the `allglen` entries of `allgs` are
//! read and the dead ones left out: that is the number of goroutines alive
//! (the runtime's own included, which `runtime.NumGoroutine` leaves out),
//! sampled by a thread about every millisecond (at most ~5% of a CPU) and
//! kept as a peak. Each walk counts every goroutine alive at some time since
//! the walk before (alive then, alive now, or started and gone in between,
//! told by its newer goroutine id): a burst shorter than the pause between
//! two walks is not missed, so the peak is never below the most goroutines
//! alive at once. A server that starts goroutines per connection shows more
//! (every `g` in use within a window: up to `allglen`), which is the memory
//! a bigger starting stack costs: a dead `g` kept for reuse keeps a stack
//! of the starting size (`gfput`) until a GC frees the global list's. Read from `/proc/PID/mem` and with
//! `process_vm_readv`; the variables are found by the symbol table or, on
//! stripped binaries, from `runtime.allgadd`'s code (`GoBinary::allglen`).
//! Where none of that can be found the count is unknown: goroutines seen
//! growing over a run are not goroutines alive at once.
//!
//! Only pages in memory are read (`resident`, from `/proc/PID/pagemap`):
//! reading a page in swap would swap it back in, and a paged-out process
//! would be changed by its observer. A sample that had to leave pages
//! unread is incomplete: it is counted, not taken into the peak.

use std::{
    collections::HashSet,
    fs::File,
    os::unix::fs::FileExt as _,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use crate::image::ProcessImage;
use crate::procfs::resident::Resident;

/// Where the count in a summary came from: the peak of goroutines alive,
/// counted in `allgs[:allglen]` (`allglen` itself where `g.atomicstatus`
/// is unknown).
pub const SOURCE: &str = "runtime.allglen: peak goroutines";

/// Reads of a changing pair before giving up.
const ATTEMPTS: usize = 3;
/// More goroutines than this are not walked (the read would take seconds);
/// `allglen` stands in.
const MAX_WALK: u64 = 4 << 20;
/// Pause between two walks of `allgs`: at least this, and twenty times what
/// a walk takes (gostw spends at most ~5% of a CPU on them: a program with
/// a hundred goroutines is read every millisecond or two, one with a
/// million every few seconds). Goroutines of a bursty program come and go
/// within a millisecond: sparser reads miss its peak.
const MIN_PAUSE: Duration = Duration::from_micros(200);
const MAX_PAUSE: Duration = Duration::from_secs(2);
/// Pause after an incomplete sample or a failed walk: pages in swap stay
/// there a while, and asking again every millisecond would only spend CPU.
const INCOMPLETE_PAUSE: Duration = Duration::from_millis(50);
/// `_Gdead`, and the `_Gscan` bit (runtime2.go, 1.19-1.27).
const G_DEAD: u32 = 6;
const G_SCAN: u32 = 0x1000;

/// The peak goroutine count of one process, sampled by a thread of its own
/// that walks `allgs` over and over until the process exits or the watch is
/// dropped; `allglen` where `g.atomicstatus` is unknown. A sampled peak can
/// miss the very top of a burst; it never counts a goroutine that did not
/// exist. Where `len(allgs)` is known it must equal `allglen` (they differ
/// only for an instant inside `allgadd`): a wrong address cannot pass for a
/// count.
#[derive(Debug)]
pub struct GoroutineWatch {
    sampler: Sampler,
}

impl GoroutineWatch {
    /// Start watching `process`; why not, in words, when its goroutine
    /// count cannot be found or the process cannot be read (yet).
    pub fn start(process: &ProcessImage) -> Result<GoroutineWatch, String> {
        let binary = &process.exe.binary;
        let found = binary
            .allglen()
            .ok_or("runtime.allglen was not found in the executable")?;
        let pid = process.pid;
        // Checked before the files are opened: they stay bound to the
        // memory the process has when they are (a watch opened before the
        // exec would read the shell's, never a goroutine).
        if !process.runs_exe() {
            return Err("the process does not run the executable yet (before its exec)".into());
        }
        process
            .resolve()
            .ok_or("the executable is not mapped yet")?;
        let offset = |field: &str| {
            binary
                .struct_offsets()
                .ok()
                .and_then(|o| o.get(field))
                .map(u64::from)
        };
        let target = Target {
            pid,
            mem: File::open(format!("/proc/{pid}/mem"))
                .map_err(|e| format!("/proc/{pid}/mem: {e}"))?,
            resident: Resident::open(pid).map_err(|e| format!("/proc/{pid}/pagemap: {e}"))?,
            allglen: process
                .runtime_address(found.address)
                .ok_or("the executable is not mapped yet")?,
            allgs_len: found.allgs_len.and_then(|a| process.runtime_address(a)),
            allgs: found.allgs_len.and_then(|a| process.runtime_address(a - 8)),
            status: offset("g.atomicstatus"),
            goid: offset("g.goid"),
        };
        let shared = Arc::new(Shared::default());
        // The first count before returning, so a caller gets one at once.
        let mut last = LastWalk::default();
        let first = target
            .count(&mut last, &shared)
            .ok_or_else(|| target.unreadable())?;
        target.take(&shared, first);
        let stop = Arc::new(AtomicBool::new(false));
        let (sh, st) = (shared.clone(), stop.clone());
        std::thread::Builder::new()
            .name("gostw-goroutines".into())
            .spawn(move || target.sample(&sh, &st, last))
            .map_err(|e| format!("no sampling thread: {e}"))?;
        Ok(GoroutineWatch {
            sampler: Sampler { shared, stop },
        })
    }

    /// The peak so far, of complete samples only (None before the first).
    pub fn peak(&self) -> Option<u64> {
        let n = self.sampler.shared.peak.load(Ordering::Relaxed);
        (n > 0).then_some(n)
    }

    /// The most `g`s the runtime had so far (`runtime.allglen`: goroutines
    /// alive and dead ones kept for reuse), the bound of `peak`.
    pub fn structs(&self) -> Option<u64> {
        let n = self.sampler.shared.structs.load(Ordering::Relaxed);
        (n > 0).then_some(n)
    }

    /// Why there is no peak, in words, where that is news: complete walks
    /// of `allgs` that found no goroutine alive, or walks that could not
    /// read the process. None with a peak, and where the walks were only
    /// incomplete (said when it happened).
    pub fn why_no_peak(&self) -> Option<String> {
        let s = &self.sampler.shared;
        let (complete, failed) = (
            s.complete.load(Ordering::Relaxed),
            s.failed.load(Ordering::Relaxed),
        );
        if self.peak().is_some() {
            None
        } else if complete > 0 {
            Some(format!(
                "{complete} complete walk(s) of allgs found no goroutine alive"
            ))
        } else {
            (failed > 0).then(|| format!("{failed} walk(s) of allgs could not read the process"))
        }
    }

    /// Samples left incomplete so far, because pages they needed were not
    /// in memory (and were not read).
    pub fn skipped(&self) -> Skipped {
        let s = &self.sampler.shared;
        Skipped {
            samples: s.incomplete.load(Ordering::Relaxed),
            pages: s.absent_pages.load(Ordering::Relaxed),
        }
    }
}

/// Samples a watch left incomplete rather than read pages not in memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Samples not taken into the peak.
    pub samples: u64,
    /// Pages left unread over those samples (a page can count in several).
    pub pages: u64,
}

/// One walk of `allgs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sample {
    /// Goroutines seen alive (a lower bound where pages were left unread).
    alive: u64,
    /// Pages not in memory the walk did not read: 0 for a complete count.
    absent_pages: u64,
}

impl Sample {
    fn of(alive: u64, absent_pages: u64) -> Sample {
        Sample {
            alive,
            absent_pages,
        }
    }
}

/// What the last complete walk saw, for the next one to count every
/// goroutine that lived between the two.
#[derive(Debug, Default)]
struct LastWalk {
    /// The `g`s alive then.
    alive: HashSet<u64>,
    /// The newest goroutine id then (0: none seen, or `g.goid` unknown).
    newest_goid: u64,
}

/// What the sampling thread shares with the watch.
#[derive(Debug, Default)]
struct Shared {
    peak: AtomicU64,
    structs: AtomicU64,
    incomplete: AtomicU64,
    absent_pages: AtomicU64,
    /// Complete samples taken.
    complete: AtomicU64,
    /// Walks that could not read the process.
    failed: AtomicU64,
}

impl Shared {
    /// Take a sample: into the peak if complete, else into the skipped.
    /// The incomplete samples so far (0 while all are complete).
    fn add(&self, s: Sample) -> u64 {
        if s.absent_pages == 0 {
            self.complete.fetch_add(1, Ordering::Relaxed);
            self.peak.fetch_max(s.alive, Ordering::Relaxed);
            return self.incomplete.load(Ordering::Relaxed);
        }
        self.absent_pages
            .fetch_add(s.absent_pages, Ordering::Relaxed);
        self.incomplete.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// The sampling thread's shared state.
#[derive(Debug)]
struct Sampler {
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Where a process's goroutine variables are (runtime addresses), and its
/// memory (`/proc/PID/mem`, opened once: it keeps naming that process, so a
/// reused pid cannot be read by mistake).
#[derive(Debug)]
struct Target {
    pid: u32,
    mem: File,
    resident: Resident,
    allglen: u64,
    allgs_len: Option<u64>,
    allgs: Option<u64>,
    status: Option<u64>,
    goid: Option<u64>,
}

impl Target {
    /// Goroutines alive at some time since the `last` walk (`allglen`
    /// without `g.atomicstatus`); `None` when the process cannot be read
    /// (any more).
    fn count(&self, last: &mut LastWalk, shared: &Shared) -> Option<Sample> {
        let (Some(allgs), Some(status)) = (self.allgs, self.status) else {
            return self.allglen();
        };
        // The slice header (array, len) in memory, or no walk.
        let absent = self.resident.presence(&[allgs], 16).ok()?.absent_pages;
        if absent > 0 {
            return Some(Sample::of(0, absent));
        }
        let allglen = self.allglen()?;
        if allglen.absent_pages == 0 {
            shared.structs.fetch_max(allglen.alive, Ordering::Relaxed);
        }
        if allglen.absent_pages > 0 || allglen.alive > MAX_WALK {
            return Some(allglen);
        }
        // A failed walk is no sample (the process is exiting, say): allglen
        // would put the cached dead g's into the peak (103 for a server of
        // 37), not stand in for the count.
        let alive = self.live(allgs, allglen.alive, status, last)?;
        // The statuses were read by pid: make sure it is still this process.
        self.read(self.allglen)?;
        Some(alive)
    }

    /// Count until told to stop, keeping the peak; `last`: what the first
    /// count saw. A walk that fails (the process exiting, a read between
    /// two states of the runtime) is counted and tried again later: the
    /// watch is dropped when its process is done with.
    fn sample(&self, shared: &Shared, stop: &AtomicBool, mut last: LastWalk) {
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            let Some(s) = self.count(&mut last, shared) else {
                shared.failed.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(INCOMPLETE_PAUSE);
                continue;
            };
            self.take(shared, s);
            let pause = (started.elapsed() * 20).clamp(MIN_PAUSE, MAX_PAUSE);
            std::thread::sleep(if s.absent_pages > 0 {
                pause.max(INCOMPLETE_PAUSE)
            } else {
                pause
            });
        }
    }

    /// Take a sample, saying so the first time one is incomplete.
    fn take(&self, shared: &Shared, s: Sample) {
        let incomplete = shared.add(s);
        if s.absent_pages > 0 && incomplete == 1 {
            log::warn!(
                "pid {}: goroutine count incomplete: {} page(s) not in memory left \
                 unread (reading them would swap them in); incomplete samples are \
                 left out of the peak",
                self.pid,
                s.absent_pages
            );
        }
    }

    /// Why a count failed: the two lengths as read (a wrong address reads
    /// as garbage, or as two values that never agree).
    fn unreadable(&self) -> String {
        let show = |at: Option<u64>| match at {
            None => "unknown".to_owned(),
            Some(a) => self
                .read(a)
                .map_or_else(|| format!("unreadable at {a:#x}"), |n| n.to_string()),
        };
        format!(
            "no count: runtime.allglen read {}, len(allgs) {}",
            show(Some(self.allglen)),
            show(self.allgs_len)
        )
    }

    fn read(&self, at: u64) -> Option<u64> {
        let mut buf = [0u8; 8];
        self.mem.read_exact_at(&mut buf, at).ok()?;
        Some(u64::from_le_bytes(buf))
    }

    /// `runtime.allglen`, checked against `len(allgs)` where known.
    fn allglen(&self) -> Option<Sample> {
        let vars = [self.allglen, self.allgs_len.unwrap_or(self.allglen)];
        let absent = self.resident.presence(&vars, 8).ok()?.absent_pages;
        if absent > 0 {
            return Some(Sample::of(0, absent));
        }
        for _ in 0..ATTEMPTS {
            let n = self.read(self.allglen)?;
            // A garbage read (wrong bias) is not a goroutine count.
            if n == 0 || n >= 1 << 32 {
                return None;
            }
            let counted = Sample::of(n, 0);
            match self.allgs_len {
                None => return Some(counted),
                Some(len_at) if self.read(len_at)? == n => return Some(counted),
                Some(_) => {}
            }
        }
        None
    }

    /// The `g`s among the first `n` entries of the slice whose header is at
    /// `allgs` that held a goroutine at some time since the `last` walk:
    /// alive now (`g.atomicstatus` at `status` not dead), alive then, or
    /// dead now with a goroutine id newer than any seen then. So a burst of
    /// goroutines that starts and ends between two walks still counts: the
    /// count is never below the most goroutines alive at once in between
    /// (a `g` reused by several of them counts once; two that never lived
    /// at the same time on different `g`s count twice). Of those on pages
    /// in memory only (the array's and each `g`'s); `last` becomes this
    /// walk when it read them all.
    fn live(&self, allgs: u64, n: u64, status: u64, last: &mut LastWalk) -> Option<Sample> {
        let array = self.read(allgs)?;
        let slots: Vec<u64> = (0..n).map(|i| array.wrapping_add(8 * i)).collect();
        let in_memory = self.resident.presence(&slots, 8).ok()?;
        let mut gs = vec![0u64; slots.len()];
        for run in runs(&in_memory.readable) {
            let mut bytes = vec![0u8; run.len() * 8];
            self.mem.read_exact_at(&mut bytes, slots[run.start]).ok()?;
            for (g, w) in gs[run].iter_mut().zip(bytes.chunks_exact(8)) {
                *g = u64::from_le_bytes(w.try_into().unwrap_or_default());
            }
        }
        // Entries left unread (0) are neither read nor looked up.
        gs.retain(|&g| g != 0);
        // Both fields of every g on pages in memory, or neither is read.
        let mut fields: Vec<u64> = gs.iter().map(|g| g.wrapping_add(status)).collect();
        if let Some(goid) = self.goid {
            fields.extend(gs.iter().map(|g| g.wrapping_add(goid)));
        }
        let g_memory = self.resident.presence(&fields, 8).ok()?;
        let (status_ok, goid_ok) = g_memory.readable.split_at(gs.len());
        let readable: Vec<u64> = gs
            .iter()
            .enumerate()
            .filter(|&(i, _)| status_ok[i] && goid_ok.get(i).is_none_or(|&ok| ok))
            .map(|(_, &g)| g)
            .collect();
        let statuses = read_u32s(self.pid, &readable, status)?;
        let goids = match self.goid {
            Some(goid) => read_each(self.pid, &readable, goid, 0u64)?,
            None => vec![0; readable.len()],
        };
        let since = last.newest_goid;
        let mut alive_now = HashSet::new();
        let mut counted = 0;
        for ((&g, &s), &id) in readable.iter().zip(&statuses).zip(&goids) {
            if is_alive(s) {
                alive_now.insert(g);
            }
            if is_alive(s) || last.alive.contains(&g) || (since != 0 && id > since) {
                counted += 1;
            }
        }
        let sample = Sample::of(counted, in_memory.absent_pages + g_memory.absent_pages);
        if sample.absent_pages == 0 {
            *last = LastWalk {
                alive: alive_now,
                newest_goid: goids.iter().copied().max().unwrap_or(0),
            };
        }
        Some(sample)
    }
}

/// The runs of consecutive `true`s, as index ranges.
fn runs(flags: &[bool]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, &f) in flags.iter().chain([&false]).enumerate() {
        match (f, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push(s..i);
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// A status that is neither dead nor just allocated (`_Gidle`).
fn is_alive(status: u32) -> bool {
    !matches!(status & !G_SCAN, 0 | G_DEAD)
}

/// The u32 at `base + offset` for every base, read from process `pid` with
/// `process_vm_readv` (up to 1024 reads a call). An unreadable entry (a
/// pointer read while the slice was being replaced) counts as dead.
fn read_u32s(pid: u32, bases: &[u64], offset: u64) -> Option<Vec<u32>> {
    read_each(pid, bases, offset, G_DEAD)
}

/// The `T` at `base + offset` for every base, read from process `pid` with
/// `process_vm_readv` (up to 1024 reads a call); `unreadable` where an entry
/// cannot be read.
fn read_each<T: Copy>(pid: u32, bases: &[u64], offset: u64, unreadable: T) -> Option<Vec<T>> {
    const BATCH: usize = 1024;
    let size = std::mem::size_of::<T>();
    let mut out = vec![unreadable; bases.len()];
    let mut i = 0;
    while i < bases.len() {
        let end = (i + BATCH).min(bases.len());
        let local: Vec<libc::iovec> = out[i..end]
            .iter_mut()
            .map(|v| libc::iovec {
                iov_base: (v as *mut T).cast(),
                iov_len: size,
            })
            .collect();
        let remote: Vec<libc::iovec> = bases[i..end]
            .iter()
            .map(|&g| libc::iovec {
                iov_base: g.wrapping_add(offset) as *mut libc::c_void,
                iov_len: size,
            })
            .collect();
        // SAFETY: every local iovec points at a live `T` of `out` (plain
        // integers: any bytes are valid); the remote ones are only read by
        // the kernel, in the other process.
        let got = unsafe {
            libc::process_vm_readv(
                pid as libc::pid_t,
                local.as_ptr(),
                local.len() as libc::c_ulong,
                remote.as_ptr(),
                remote.len() as libc::c_ulong,
                0,
            )
        };
        if got < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EFAULT) {
                // The first entry of the batch is unreadable: skip it.
                i += 1;
                continue;
            }
            // Not permitted, or the process is gone: no count at all.
            return None;
        }
        // A short read stops at the first unreadable entry: skip it.
        let done = usize::try_from(got).unwrap_or(0) / size;
        i += done.max(1);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_and_idle_goroutines_are_not_alive() {
        assert!(is_alive(1)); // runnable
        assert!(is_alive(4)); // waiting
        assert!(is_alive(4 | G_SCAN));
        assert!(!is_alive(G_DEAD));
        assert!(!is_alive(G_DEAD | G_SCAN));
        assert!(!is_alive(0));
    }

    #[test]
    fn runs_of_readable_entries() {
        assert_eq!(runs(&[]), Vec::<std::ops::Range<usize>>::new());
        assert_eq!(runs(&[true, true, false, true]), [0..2, 3..4]);
        assert_eq!(runs(&[false, true, true, false, true]), [1..3, 4..5]);
    }

    #[test]
    fn incomplete_samples_are_counted_not_taken_into_the_peak() {
        let s = Shared::default();
        s.add(Sample::of(40, 0));
        // Fewer seen because pages were left unread: not a lower peak,
        // nor a higher one.
        s.add(Sample::of(12, 3));
        s.add(Sample::of(90, 1));
        assert_eq!(s.peak.load(Ordering::Relaxed), 40);
        assert_eq!(s.incomplete.load(Ordering::Relaxed), 2);
        assert_eq!(s.absent_pages.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn reads_u32s_of_this_process() {
        let values: Vec<[u32; 4]> = (0..3000).map(|i| [0, i, 0, 0]).collect();
        let bases: Vec<u64> = values.iter().map(|v| v.as_ptr() as u64).collect();
        let got = read_u32s(std::process::id(), &bases, 4).unwrap();
        assert_eq!(got, (0..3000).collect::<Vec<u32>>());
        // An unreadable entry reads as dead, the rest still come.
        let mut bases = bases;
        bases[7] = 8; // page zero
        let got = read_u32s(std::process::id(), &bases, 4).unwrap();
        assert_eq!(got[7], G_DEAD);
        assert_eq!(got[8], 8);
        assert_eq!(got[2999], 2999);
    }
}
