//! A bounded line writer that never makes its caller wait: the event loop
//! hands it whole lines, a thread of its own does the blocking writes. A
//! reader that stalls (a log pipe nobody drains), a full disk or any other
//! failing write costs lines, never tracing: what the queue cannot take, or
//! the destination refuses, is counted by reason with the wall time of the
//! first and last loss, and how long the current write has been blocked
//! can be read at any time.

use std::{
    collections::VecDeque,
    io,
    sync::{
        Arc, Condvar, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use prometheus_client::metrics::counter::Counter;

use crate::clock::monotonic_ns;

/// Why a line was not written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The queue was at its bound: the destination did not keep up.
    QueueFull,
    /// The destination refused the line (a closed pipe, a full disk).
    WriteError,
    /// The caller's own rate limit left it out.
    RateLimit,
}

impl Reason {
    pub const ALL: [Reason; 3] = [Reason::QueueFull, Reason::WriteError, Reason::RateLimit];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Reason::QueueFull => "queue_full",
            Reason::WriteError => "write_error",
            Reason::RateLimit => "rate_limit",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// A loss that says the output is in trouble (a rate limit is chosen).
    fn is_fault(self) -> bool {
        self != Reason::RateLimit
    }
}

/// The counters of one output. They are Prometheus counters so the agent
/// hands in those of its families; elsewhere the defaults count alone.
#[derive(Clone, Debug, Default)]
pub struct OutputCounters {
    /// Lines written whole.
    pub written: Counter,
    /// Lines lost, by `Reason::index`.
    pub dropped: [Counter; 3],
    /// Also counts every loss, whatever the reason (e.g. the slow-pause
    /// records left out of the pause log).
    pub any_loss: Option<Counter>,
}

impl OutputCounters {
    /// The counter of lines lost for `reason`.
    pub fn dropped_for(&self, reason: Reason) -> &Counter {
        &self.dropped[reason.index()]
    }
}

/// How many lines and bytes may wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub lines: usize,
    pub bytes: usize,
}

/// Where the writer thread puts the lines.
pub trait Destination: Send + 'static {
    /// Write `line` whole or fail. A line that failed must not leave a
    /// part behind that a reader would take for a line of its own.
    fn write_line(&mut self, line: &[u8]) -> io::Result<()>;
}

/// Standard output, written through fd 1 itself: a writer blocked on a
/// stalled pipe then holds no lock that anything else (a panic message,
/// the runtime's exit) would wait for, as `std::io::stdout().lock()` would.
pub struct RawStdout;

impl Destination for RawStdout {
    fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        write_fd(libc::STDOUT_FILENO, line)
    }
}

/// Standard error, written through fd 2 (as `RawStdout`).
pub struct RawStderr;

impl Destination for RawStderr {
    fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        write_fd(libc::STDERR_FILENO, line)
    }
}

/// Write all of `bytes` to `fd`, one `write` per try: a pipe keeps a write
/// of up to 4 KiB whole, so a line shared with another writer is not cut.
pub fn write_fd(fd: libc::c_int, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: a valid buffer of that length.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

/// What the caller and the writer thread share.
struct Shared {
    pending: Mutex<Pending>,
    /// The writer waits here for lines.
    has_lines: Condvar,
    /// `send_within` and `finish` wait here for room or an empty queue.
    progressed: Condvar,
    counters: OutputCounters,
    first_loss_unix_ns: AtomicU64,
    last_loss_unix_ns: AtomicU64,
    /// CLOCK_MONOTONIC of the last loss that was not a rate limit (0: none).
    last_fault_mono_ns: AtomicU64,
    /// CLOCK_MONOTONIC when the write under way began (0: none under way).
    writing_since_mono_ns: AtomicU64,
    first_error: Mutex<Option<io::Error>>,
}

#[derive(Default)]
struct Pending {
    lines: VecDeque<Vec<u8>>,
    bytes: usize,
    /// No more lines will come: the writer ends once the queue is empty.
    closed: bool,
    /// The writer holds a line it took from the queue.
    writing: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait for the writer to make progress, until `deadline` at most:
    /// `Err` with the lock back when the deadline has passed.
    fn wait_until<'a>(
        &self,
        p: MutexGuard<'a, Pending>,
        deadline: Instant,
    ) -> Result<MutexGuard<'a, Pending>, MutexGuard<'a, Pending>> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(p);
        }
        Ok(self
            .progressed
            .wait_timeout(p, left)
            .unwrap_or_else(|e| e.into_inner())
            .0)
    }

    fn lost(&self, reason: Reason, n: u64) {
        if n == 0 {
            return;
        }
        self.counters.dropped[reason.index()].inc_by(n);
        if let Some(c) = &self.counters.any_loss {
            c.inc_by(n);
        }
        let now = unix_ns();
        let _ =
            self.first_loss_unix_ns
                .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        self.last_loss_unix_ns.store(now, Ordering::Relaxed);
        if reason.is_fault() {
            self.last_fault_mono_ns
                .store(monotonic_ns().max(1), Ordering::Relaxed);
        }
    }

    /// The writer thread: one line at a time, until closed and empty.
    fn write_all(&self, mut dest: impl Destination) {
        loop {
            let line = {
                let mut p = self.lock();
                while p.lines.is_empty() && !p.closed {
                    p = self.has_lines.wait(p).unwrap_or_else(|e| e.into_inner());
                }
                let Some(line) = p.lines.pop_front() else {
                    return;
                };
                p.bytes -= line.len();
                p.writing = true;
                line
            };
            self.writing_since_mono_ns
                .store(monotonic_ns().max(1), Ordering::Relaxed);
            let written = dest.write_line(&line);
            self.writing_since_mono_ns.store(0, Ordering::Relaxed);
            match written {
                Ok(()) => {
                    self.counters.written.inc();
                }
                Err(e) => {
                    self.lost(Reason::WriteError, 1);
                    let mut first = self.first_error.lock().unwrap_or_else(|e| e.into_inner());
                    first.get_or_insert(e);
                }
            }
            self.lock().writing = false;
            self.progressed.notify_all();
        }
    }
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The queue and its writer thread. Dropped, it lets the writer finish
/// what is queued without waiting for it.
pub struct LineQueue {
    name: &'static str,
    bounds: Bounds,
    shared: Arc<Shared>,
}

impl LineQueue {
    /// Start the writer thread of output `name` writing to `dest`.
    pub fn start(
        name: &'static str,
        bounds: Bounds,
        dest: impl Destination,
        counters: OutputCounters,
    ) -> io::Result<LineQueue> {
        let shared = Arc::new(Shared {
            pending: Mutex::default(),
            has_lines: Condvar::new(),
            progressed: Condvar::new(),
            counters,
            first_loss_unix_ns: AtomicU64::new(0),
            last_loss_unix_ns: AtomicU64::new(0),
            last_fault_mono_ns: AtomicU64::new(0),
            writing_since_mono_ns: AtomicU64::new(0),
            first_error: Mutex::new(None),
        });
        let writer = shared.clone();
        std::thread::Builder::new()
            .name(format!("gostw-out-{name}"))
            .spawn(move || writer.write_all(dest))?;
        Ok(LineQueue {
            name,
            bounds,
            shared,
        })
    }

    /// Queue `line` (newline included) if there is room; never waits.
    /// Returns false, counted, when the queue is full.
    pub fn try_line(&self, line: Vec<u8>) -> bool {
        let mut p = self.shared.lock();
        if !self.fits(&p, line.len()) || p.closed {
            drop(p);
            self.shared.lost(Reason::QueueFull, 1);
            return false;
        }
        p.bytes += line.len();
        p.lines.push_back(line);
        drop(p);
        self.shared.has_lines.notify_one();
        true
    }

    /// A line always fits an empty queue, however long.
    fn fits(&self, p: &Pending, len: usize) -> bool {
        p.lines.is_empty()
            || (p.lines.len() < self.bounds.lines && p.bytes + len <= self.bounds.bytes)
    }

    /// Queue `bytes`, waiting for room until `deadline` (a summary that
    /// must come after the lines before it). False, counted, if there was
    /// none by then.
    pub fn send_within(&self, bytes: Vec<u8>, deadline: Instant) -> bool {
        let mut p = self.shared.lock();
        while !self.fits(&p, bytes.len()) {
            p = match self.shared.wait_until(p, deadline) {
                Ok(p) => p,
                Err(p) => {
                    drop(p);
                    self.shared.lost(Reason::QueueFull, 1);
                    return false;
                }
            };
        }
        p.bytes += bytes.len();
        p.lines.push_back(bytes);
        drop(p);
        self.shared.has_lines.notify_one();
        true
    }

    /// Count `n` lines the caller left out for `reason` (its rate limit).
    pub fn lost(&self, reason: Reason, n: u64) {
        self.shared.lost(reason, n);
    }

    /// The first error a write met since the last call.
    pub fn take_error(&self) -> Option<io::Error> {
        self.watch().take_error()
    }

    /// A view of this queue's state for other threads (health, metrics).
    pub fn watch(&self) -> OutputWatch {
        OutputWatch {
            name: self.name,
            shared: self.shared.clone(),
        }
    }

    /// No more lines: let the writer write what is queued until `deadline`,
    /// and say what it could not. The writer thread is left behind if it is
    /// still blocked then (the process is about to end).
    pub fn finish(self, deadline: Instant) -> Unwritten {
        self.close_within(deadline)
    }

    /// `finish` for a queue that cannot be given up (one in a static):
    /// later lines are counted as lost.
    pub fn close_within(&self, deadline: Instant) -> Unwritten {
        let mut p = self.shared.lock();
        p.closed = true;
        self.shared.has_lines.notify_all();
        let p = loop {
            if p.lines.is_empty() && !p.writing {
                break p;
            }
            p = match self.shared.wait_until(p, deadline) {
                Ok(p) => p,
                Err(p) => break p,
            };
        };
        Unwritten {
            lines: p.lines.len() + usize::from(p.writing),
            blocked_for: self.watch().blocked_for(),
        }
    }
}

impl LineQueue {
    /// Queue `last` after every line (waiting for room), then let the
    /// writer write everything; give up only once `stall` has passed with
    /// no line written. A reader that is slow but reads (a pager, a slow
    /// pipe) gets every line; one that stopped costs at most `stall`.
    pub fn finish_after(self, last: Vec<u8>, stall: Duration) -> Unwritten {
        let mut last = Some(last);
        let progress = || {
            let l = self.watch().losses();
            l.written + l.write_error
        };
        loop {
            let before = progress();
            let deadline = Instant::now() + stall;
            let mut p = self.shared.lock();
            let p = loop {
                if let Some(l) = last.take_if(|l| self.fits(&p, l.len())) {
                    p.bytes += l.len();
                    p.lines.push_back(l);
                    p.closed = true;
                    self.shared.has_lines.notify_all();
                }
                if last.is_none() && p.lines.is_empty() && !p.writing {
                    return Unwritten::default();
                }
                p = match self.shared.wait_until(p, deadline) {
                    Ok(p) => p,
                    Err(p) => break p,
                };
            };
            if progress() == before {
                let unwritten = Unwritten {
                    lines: p.lines.len() + usize::from(p.writing) + usize::from(last.is_some()),
                    blocked_for: self.watch().blocked_for(),
                };
                drop(p);
                if last.is_some() {
                    self.shared.lost(Reason::QueueFull, 1);
                }
                return unwritten;
            }
        }
    }
}

impl Drop for LineQueue {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.has_lines.notify_all();
    }
}

/// What `finish` could not write by its deadline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unwritten {
    /// Lines still queued or being written.
    pub lines: usize,
    /// How long the write under way had been blocked.
    pub blocked_for: Option<Duration>,
}

/// One output's state as other threads read it.
#[derive(Clone)]
pub struct OutputWatch {
    name: &'static str,
    shared: Arc<Shared>,
}

/// An output's losses so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Losses {
    pub written: u64,
    pub queue_full: u64,
    pub write_error: u64,
    pub rate_limit: u64,
    /// Wall-clock times of the first and last loss (0: none).
    pub first_unix_ns: u64,
    pub last_unix_ns: u64,
}

impl Losses {
    /// Lines lost for any reason.
    pub fn total(&self) -> u64 {
        self.queue_full + self.write_error + self.rate_limit
    }
}

impl OutputWatch {
    /// The output's name (a metric label).
    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn losses(&self) -> Losses {
        let c = &self.shared.counters;
        let dropped = |r: Reason| c.dropped[r.index()].get();
        Losses {
            written: c.written.get(),
            queue_full: dropped(Reason::QueueFull),
            write_error: dropped(Reason::WriteError),
            rate_limit: dropped(Reason::RateLimit),
            first_unix_ns: self.shared.first_loss_unix_ns.load(Ordering::Relaxed),
            last_unix_ns: self.shared.last_loss_unix_ns.load(Ordering::Relaxed),
        }
    }

    /// How long the write under way has been blocked (None: no write).
    pub fn blocked_for(&self) -> Option<Duration> {
        let since = self.shared.writing_since_mono_ns.load(Ordering::Relaxed);
        (since != 0).then(|| Duration::from_nanos(monotonic_ns().saturating_sub(since)))
    }

    /// Whether a line was lost to a full queue or a failed write within
    /// `window` (a rate limit is not a fault).
    pub fn faulted_within(&self, window: Duration) -> bool {
        let last = self.shared.last_fault_mono_ns.load(Ordering::Relaxed);
        last != 0 && monotonic_ns().saturating_sub(last) <= window.as_nanos() as u64
    }

    /// The first error a write met since the last call.
    pub fn take_error(&self) -> Option<io::Error> {
        self.shared
            .first_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Lines waiting to be written.
    pub fn queued(&self) -> usize {
        self.shared.lock().lines.len()
    }
}

#[cfg(test)]
#[path = "queued_tests.rs"]
mod tests;
