//! The exposure of traced processes over a trace (`attach`, `run`): read
//! when a process is traced, refreshed on an interval in a thread of its own
//! (a read walks smaps, pagemap and the runtime's heap index: milliseconds
//! to tens of them, never on the event loop), and read again just before
//! the process's `Exited` while it still lives. A process that exited has
//! no memory left: its last refresh stands for its end. The host's swap
//! counters are taken when the first process is traced and at each end.

use std::{
    collections::HashMap,
    path::Path,
    sync::{
        Arc,
        mpsc::{Receiver, Sender, channel},
    },
    time::{Duration, Instant},
};

use super::{Executable, Exposure, HostSwap, HostSwapDelta, ReadOptions};
use crate::image::{ExeId, ExecutableImage};

/// How soon a process not yet running its executable is tried again.
const RETRY: Duration = Duration::from_millis(100);

/// When a reading was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadAt {
    /// The first read after the process was traced.
    Start,
    /// A periodic refresh.
    Refresh,
    /// At the end of its trace, the process still alive.
    End,
    /// At the end of its trace, the process gone: its last refresh.
    LastBeforeExit,
}

/// One read of a process's exposure.
#[derive(Clone, Debug)]
pub struct ExposureReading {
    pub pid: u32,
    pub at: ReadAt,
    /// The exposure, or why it could not be read.
    pub exposure: Result<Exposure, String>,
    /// What the read took (wall time, in its thread).
    pub read_ns: u64,
    /// The host's swap traffic since the first process was traced (`End`
    /// and `LastBeforeExit` only).
    pub host_swap: Option<HostSwapDelta>,
}

/// A traced process being watched.
struct Watched {
    image: Arc<ExecutableImage>,
    /// Built on the first read that finds the process running its
    /// executable (a started program may not have exec'd yet).
    exe: Option<Arc<Executable>>,
    last: Option<ExposureReading>,
    in_flight: bool,
    next: Instant,
    started: bool,
}

/// The exposure of every traced process, read off the event loop.
pub struct ExposureWatch {
    every: Duration,
    /// Read a process again when its trace ends (`attach`, `run`; the
    /// agent's processes end by exiting).
    at_end: bool,
    processes: HashMap<u32, Watched>,
    /// The executables already prepared, for their other processes.
    executables: HashMap<ExeId, Arc<Executable>>,
    host_start: Option<HostSwap>,
    tx: Sender<(ExposureReading, Option<Arc<Executable>>)>,
    rx: Receiver<(ExposureReading, Option<Arc<Executable>>)>,
}

impl ExposureWatch {
    /// A watch that refreshes each process every `every` (zero: read at
    /// the start only, and at the end with `at_end`).
    pub fn new(every: Duration, at_end: bool) -> ExposureWatch {
        let (tx, rx) = channel();
        ExposureWatch {
            every,
            at_end,
            processes: HashMap::new(),
            executables: HashMap::new(),
            host_start: None,
            tx,
            rx,
        }
    }

    /// Process `pid`, running `image`, is traced from now on.
    pub fn started(&mut self, pid: u32, image: Option<Arc<ExecutableImage>>) {
        let Some(image) = image else {
            return;
        };
        if self.host_start.is_none() {
            self.host_start = HostSwap::snapshot().ok();
        }
        let exe = self.executables.get(&image.id).cloned();
        self.processes.insert(
            pid,
            Watched {
                image,
                exe,
                last: None,
                in_flight: false,
                next: Instant::now(),
                started: false,
            },
        );
    }

    /// Readings that finished since the last call.
    pub fn collect(&mut self) -> Vec<ExposureReading> {
        let mut out = Vec::new();
        while let Ok((mut r, exe)) = self.rx.try_recv() {
            let Some(w) = self.processes.get_mut(&r.pid) else {
                continue;
            };
            w.in_flight = false;
            if let (None, Some(exe)) = (&w.exe, exe) {
                self.executables.insert(w.image.id, exe.clone());
                w.exe = Some(exe);
            }
            // Until the process runs its executable there is nothing to
            // show: try again soon.
            if w.exe.is_none() {
                w.next = Instant::now() + RETRY;
                continue;
            }
            r.at = if w.started {
                ReadAt::Refresh
            } else {
                ReadAt::Start
            };
            w.started = true;
            // A failed read (the process exiting) does not replace a good one.
            if r.exposure.is_ok() || w.last.is_none() {
                w.last = Some(r.clone());
            }
            out.push(r);
        }
        out
    }

    /// Start a read in a thread of its own for the process most overdue,
    /// one at a time: reads of many processes (the agent) follow each other
    /// instead of taking every CPU at once.
    pub fn refresh(&mut self) {
        let now = Instant::now();
        if self.processes.values().any(|w| w.in_flight) {
            return;
        }
        let due = self
            .processes
            .iter_mut()
            .filter(|(_, w)| w.next <= now)
            .min_by_key(|(_, w)| w.next);
        if let Some((&pid, w)) = due {
            w.in_flight = true;
            // Zero: no refresh after the first read (about 30 years on).
            let every = if self.every.is_zero() {
                Duration::from_secs(1 << 30)
            } else {
                self.every
            };
            w.next = now + every;
            let (image, exe, tx) = (w.image.clone(), w.exe.clone(), self.tx.clone());
            let spawned = std::thread::Builder::new()
                .name("gostw-exposure".into())
                .spawn(move || {
                    let exe = exe.or_else(|| executable(pid, image));
                    let r = match &exe {
                        Some(exe) => read(pid, exe, ReadAt::Refresh),
                        None => ExposureReading {
                            pid,
                            at: ReadAt::Refresh,
                            exposure: Err("not running its executable yet".into()),
                            read_ns: 0,
                            host_swap: None,
                        },
                    };
                    let _ = tx.send((r, exe));
                });
            if spawned.is_err() {
                w.in_flight = false;
            }
        }
    }

    /// Process `pid`'s trace ends: read it now if it lives, else its last
    /// refresh; with the host's swap traffic since the trace began.
    pub fn ended(&mut self, pid: u32) -> Option<ExposureReading> {
        let w = self.processes.remove(&pid)?;
        if !self.processes.values().any(|o| o.image.id == w.image.id) {
            self.executables.remove(&w.image.id);
        }
        if !self.at_end {
            return None;
        }
        let exe = w.exe.or_else(|| executable(pid, w.image));
        let fresh = exe
            .map(|exe| read(pid, &exe, ReadAt::End))
            .filter(|r| r.exposure.is_ok());
        let mut r = match (fresh, w.last) {
            (Some(r), _) => r,
            (None, Some(mut last)) if last.exposure.is_ok() => {
                last.at = ReadAt::LastBeforeExit;
                last
            }
            (None, _) => ExposureReading {
                pid,
                at: ReadAt::LastBeforeExit,
                exposure: Err(format!(
                    "process {pid} exited before its memory could be read"
                )),
                read_ns: 0,
                host_swap: None,
            },
        };
        r.host_swap = match (self.host_start, HostSwap::snapshot()) {
            (Some(a), Ok(b)) => Some(HostSwap::delta(&a, &b)),
            _ => None,
        };
        Some(r)
    }
}

/// The executable of `pid`, once the process runs `image`'s file.
fn executable(pid: u32, image: Arc<ExecutableImage>) -> Option<Arc<Executable>> {
    let id = ExeId::of(Path::new(&format!("/proc/{pid}/exe"))).ok()?;
    if id != image.id {
        return None;
    }
    Some(Arc::new(Executable::for_image(image)))
}

fn read(pid: u32, exe: &Executable, at: ReadAt) -> ExposureReading {
    let t = Instant::now();
    let exposure =
        Exposure::read_with(pid, exe, &ReadOptions::default()).map_err(|e| e.to_string());
    ExposureReading {
        pid,
        at,
        exposure,
        read_ns: t.elapsed().as_nanos() as u64,
        host_swap: None,
    }
}
