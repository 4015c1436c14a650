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
//! kept as a peak. Read from `/proc/PID/mem` and with
//! `process_vm_readv`; the variables are found by the symbol table or, on
//! stripped binaries, from `runtime.allgadd`'s code (`GoBinary::allglen`).
//! Where none of that can be found the count is unknown: goroutines seen
//! growing over a run are not goroutines alive at once.

use std::{
    fs::File,
    os::unix::fs::FileExt as _,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use crate::image::ProcessImage;

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
    /// Start watching `process` (None when its goroutine count cannot be
    /// found, or the process cannot be read yet).
    pub fn start(process: &ProcessImage) -> Option<GoroutineWatch> {
        let binary = &process.exe.binary;
        let found = binary.allglen()?;
        let target = Target {
            pid: process.pid,
            mem: File::open(format!("/proc/{}/mem", process.pid)).ok()?,
            allglen: process.runtime_address(found.address)?,
            allgs_len: found.allgs_len.and_then(|a| process.runtime_address(a)),
            allgs: found.allgs_len.and_then(|a| process.runtime_address(a - 8)),
            status: binary
                .struct_offsets()
                .ok()
                .and_then(|o| o.get("g.atomicstatus"))
                .map(u64::from),
        };
        // The first count before returning, so a caller gets one at once.
        let first = target.count()?;
        let peak = Arc::new(AtomicU64::new(first));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, st) = (peak.clone(), stop.clone());
        std::thread::Builder::new()
            .name("gostw-goroutines".into())
            .spawn(move || target.sample(&p, &st))
            .ok()?;
        Some(GoroutineWatch {
            sampler: Sampler { peak, stop },
        })
    }

    /// The peak so far.
    pub fn peak(&self) -> Option<u64> {
        let n = self.sampler.peak.load(Ordering::Relaxed);
        (n > 0).then_some(n)
    }
}

/// The sampling thread's shared state.
#[derive(Debug)]
struct Sampler {
    peak: Arc<AtomicU64>,
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
    allglen: u64,
    allgs_len: Option<u64>,
    allgs: Option<u64>,
    status: Option<u64>,
}

impl Target {
    /// Goroutines alive now (`allglen` without `g.atomicstatus`); `None`
    /// when the process cannot be read (any more).
    fn count(&self) -> Option<u64> {
        let allglen = self.allglen()?;
        let (Some(allgs), Some(status)) = (self.allgs, self.status) else {
            return Some(allglen);
        };
        if allglen > MAX_WALK {
            return Some(allglen);
        }
        // A failed walk is no sample (the process is exiting, say): allglen
        // would put the cached dead g's into the peak (103 for a server of
        // 37), not stand in for the count.
        let alive = self.live(allgs, allglen, status)?;
        // The statuses were read by pid: make sure it is still this process.
        self.read(self.allglen)?;
        Some(alive)
    }

    /// Count until told to stop or the process is gone, keeping the peak.
    fn sample(&self, peak: &AtomicU64, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            let Some(n) = self.count() else {
                return;
            };
            peak.fetch_max(n, Ordering::Relaxed);
            std::thread::sleep((started.elapsed() * 20).clamp(MIN_PAUSE, MAX_PAUSE));
        }
    }

    fn read(&self, at: u64) -> Option<u64> {
        let mut buf = [0u8; 8];
        self.mem.read_exact_at(&mut buf, at).ok()?;
        Some(u64::from_le_bytes(buf))
    }

    /// `runtime.allglen`, checked against `len(allgs)` where known.
    fn allglen(&self) -> Option<u64> {
        for _ in 0..ATTEMPTS {
            let n = self.read(self.allglen)?;
            // A garbage read (wrong bias) is not a goroutine count.
            if n == 0 || n >= 1 << 32 {
                return None;
            }
            match self.allgs_len {
                None => return Some(n),
                Some(len_at) if self.read(len_at)? == n => return Some(n),
                Some(_) => {}
            }
        }
        None
    }

    /// Goroutines not dead among the first `n` entries of the slice whose
    /// header is at `allgs`, with `g.atomicstatus` at `status`.
    fn live(&self, allgs: u64, n: u64, status: u64) -> Option<u64> {
        let array = self.read(allgs)?;
        let mut bytes = vec![0u8; usize::try_from(n).ok()? * 8];
        self.mem.read_exact_at(&mut bytes, array).ok()?;
        let gs: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
            .collect();
        let statuses = read_u32s(self.pid, &gs, status)?;
        Some(statuses.iter().filter(|&&s| is_alive(s)).count() as u64)
    }
}

/// A status that is neither dead nor just allocated (`_Gidle`).
fn is_alive(status: u32) -> bool {
    !matches!(status & !G_SCAN, 0 | G_DEAD)
}

/// The u32 at `base + offset` for every base, read from process `pid` with
/// `process_vm_readv` (up to 1024 reads a call). An unreadable entry (a
/// pointer read while the slice was being replaced) counts as dead.
fn read_u32s(pid: u32, bases: &[u64], offset: u64) -> Option<Vec<u32>> {
    const BATCH: usize = 1024;
    let mut out = vec![G_DEAD; bases.len()];
    let mut i = 0;
    while i < bases.len() {
        let end = (i + BATCH).min(bases.len());
        let local: Vec<libc::iovec> = out[i..end]
            .iter_mut()
            .map(|v| libc::iovec {
                iov_base: (v as *mut u32).cast(),
                iov_len: 4,
            })
            .collect();
        let remote: Vec<libc::iovec> = bases[i..end]
            .iter()
            .map(|&g| libc::iovec {
                iov_base: g.wrapping_add(offset) as *mut libc::c_void,
                iov_len: 4,
            })
            .collect();
        // SAFETY: every local iovec points at a live u32 of `out`; the
        // remote ones are only read by the kernel, in the other process.
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
        let done = usize::try_from(got).unwrap_or(0) / 4;
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
