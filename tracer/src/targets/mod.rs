//! Where the traced processes come from, behind one interface: one running
//! process (`attach`), a program gostw starts held stopped until it is traced
//! (`run`), or every Go process of the host as they come and go (`agent`).
//! Each reports processes that started and exited; the tracker attaches and
//! traces them the same way for all three.
//!
//! - `process`: a process's exit as a pidfd, and the checks `attach` makes.
//! - `child`: starting a program stopped before its first instruction.
//! - `discovery`, `exec_events`: the host's processes (`/proc` diff, exec
//!   notifications).
//! - `tracker`: attach per executable, trace per process, bounded labels.

pub mod child;
pub mod container_names;
pub mod containerd;
pub mod cpu_throttle;
pub mod discovery;
pub mod docker;
pub mod exec_events;
pub mod podman;
pub mod process;
pub mod tracker;

use std::{
    ffi::OsString,
    path::PathBuf,
    process::Child,
    sync::mpsc::Receiver,
    time::{Duration, Instant},
};

use self::{
    child::StoppedChild,
    container_names::Resolver,
    discovery::{Discovery, Filter, NewProcess, ProcFs, ProcSource as _},
    process::{ExitWatch, LiveProcess, TargetError},
};
use crate::image::ExeId;

/// What changed since the last poll.
#[derive(Debug, Default)]
pub struct Changes {
    /// New processes, with the path their executable is attached by.
    pub started: Vec<(NewProcess, PathBuf)>,
    /// Processes that exited (their events are in the ring buffer already).
    pub exited: Vec<u32>,
    /// Exit codes of processes gostw started.
    pub statuses: Vec<(u32, i32)>,
    /// Whether the host's `/proc` was read for these (not only processes
    /// released after waiting for their container's names).
    pub scanned: bool,
}

/// One running process.
pub struct PidTarget {
    process: LiveProcess,
    announced: bool,
    gone: bool,
}

/// A program gostw starts.
pub struct ChildTarget {
    pid: u32,
    program: PathBuf,
    stopped: Option<StoppedChild>,
    child: Option<Child>,
    watch: ExitWatch,
    announced: bool,
    status: Option<i32>,
}

/// The host's processes.
pub struct HostTarget {
    discovery: Discovery,
    proc: ProcFs,
    execs: Option<Receiver<u32>>,
    poll_interval: Duration,
    next_poll: Instant,
    last_poll: Instant,
    /// How many exec notifications arrived (a health metric).
    pub exec_notifications: u64,
    /// Container names from the runtime (None: not asked). Boxed: the
    /// host target would otherwise be thrice the others' size.
    names: Option<Box<Resolver>>,
}

impl HostTarget {
    /// Processes discovery knows.
    pub fn known(&self) -> usize {
        self.discovery.known()
    }
}

/// Shortest time between two polls that exec notifications trigger.
const EXEC_POLL_GAP: Duration = Duration::from_millis(100);

/// Where the traced processes come from.
pub enum Target {
    Pid(PidTarget),
    Child(ChildTarget),
    Host(HostTarget),
}

impl Target {
    /// A running process, checked to be a Go program gostw can read.
    pub fn pid(pid: u32) -> Result<Target, TargetError> {
        Ok(Target::Pid(PidTarget {
            process: LiveProcess::open(pid)?,
            announced: false,
            gone: false,
        }))
    }

    /// Start `program` with `args`, held stopped until `resume`.
    pub fn child(program: PathBuf, args: &[OsString]) -> anyhow::Result<Target> {
        let stopped = StoppedChild::spawn(
            program.as_os_str(),
            &args.iter().map(|a| a.as_os_str()).collect::<Vec<_>>(),
            |_| {},
        )?;
        let pid = stopped.pid();
        let watch = match ExitWatch::new(pid) {
            Ok(w) => w,
            Err(e) => {
                stopped.kill();
                return Err(e.into());
            }
        };
        Ok(Target::Child(ChildTarget {
            pid,
            program,
            stopped: Some(stopped),
            child: None,
            watch,
            announced: false,
            status: None,
        }))
    }

    /// Every process of the host that `filter` accepts, polled every
    /// `poll_interval` (and soon after an exec notification); processes in
    /// containers named by `names` where it knows them.
    pub fn host(filter: Filter, poll_interval: Duration, names: Option<Resolver>) -> Target {
        let execs = match exec_events::watch() {
            Ok(rx) => Some(rx),
            Err(e) => {
                log::info!(
                    "no exec notifications ({e}): new processes are found by polling every {poll_interval:?}"
                );
                None
            }
        };
        let now = Instant::now();
        Target::Host(HostTarget {
            discovery: Discovery::new(filter),
            proc: ProcFs::new("/proc"),
            execs,
            poll_interval,
            next_poll: now,
            last_poll: now,
            exec_notifications: 0,
            names: names.map(Box::new),
        })
    }

    /// The one process of a `Pid` or `Child` target.
    pub fn single(&self) -> Option<u32> {
        match self {
            Target::Pid(t) => Some(t.process.pid),
            Target::Child(t) => Some(t.pid),
            Target::Host(_) => None,
        }
    }

    /// The host target, for its health figures.
    pub fn host_state(&self) -> Option<&HostTarget> {
        match self {
            Target::Host(h) => Some(h),
            _ => None,
        }
    }

    /// What changed, if a poll is due at `now` (a one-process target is
    /// polled every time: it only looks at its pidfd).
    pub fn poll(&mut self, now: Instant) -> std::io::Result<Option<Changes>> {
        match self {
            Target::Pid(t) => {
                let mut c = Changes::default();
                if !t.announced {
                    t.announced = true;
                    c.started
                        .push((t.process.new_process(), t.process.exe_link()));
                } else if !t.gone && t.process.watch.has_exited() {
                    t.gone = true;
                    c.exited.push(t.process.pid);
                }
                Ok(Some(c))
            }
            Target::Child(t) => {
                let mut c = Changes::default();
                if !t.announced {
                    t.announced = true;
                    let exe = ExeId::of(&t.program)?;
                    let p = NewProcess {
                        pid: t.pid,
                        exe,
                        exe_path: t.program.clone(),
                        comm: String::new(),
                        cgroup: std::fs::read_to_string(format!("/proc/{}/cgroup", t.pid))
                            .unwrap_or_default(),
                        names: None,
                    };
                    c.started.push((p, t.program.clone()));
                } else if t.status.is_none()
                    && let Some(child) = t.child.as_mut()
                    && let Some(status) = child.try_wait()?
                {
                    let code = exit_code(status);
                    t.status = Some(code);
                    c.exited.push(t.pid);
                    c.statuses.push((t.pid, code));
                }
                Ok(Some(c))
            }
            Target::Host(h) => {
                if let Some(rx) = &h.execs {
                    let n = rx.try_iter().count();
                    if n > 0 {
                        h.exec_notifications += n as u64;
                        // A program started: poll now, but not more often
                        // than EXEC_POLL_GAP however many a host starts.
                        h.next_poll = h.next_poll.min(h.last_poll + EXEC_POLL_GAP);
                    }
                }
                let scanned = now >= h.next_poll;
                let (mut started, mut exited) = (Vec::new(), Vec::new());
                if scanned {
                    h.last_poll = now;
                    h.next_poll = now + h.poll_interval;
                    let changes = h.discovery.poll(&h.proc)?;
                    started = changes
                        .started
                        .into_iter()
                        .map(|p| {
                            let link = h.proc.exe_link(p.pid);
                            (p, link)
                        })
                        .collect();
                    exited = changes.exited;
                }
                if let Some(names) = &mut h.names
                    && (scanned || names.holding())
                {
                    started = names.pass(started, &exited, now);
                }
                if !scanned && started.is_empty() {
                    return Ok(None);
                }
                Ok(Some(Changes {
                    started,
                    exited,
                    statuses: Vec::new(),
                    scanned,
                }))
            }
        }
    }

    /// After the first poll was traced: let a started program run.
    pub fn resume(&mut self) -> anyhow::Result<()> {
        if let Target::Child(t) = self
            && let Some(stopped) = t.stopped.take()
        {
            t.child = Some(stopped.resume()?);
        }
        Ok(())
    }

    /// Resolves when the one process exits (never for the host target).
    pub async fn exited(&self) {
        match self {
            Target::Pid(t) if !t.gone => t.process.watch.exited().await,
            Target::Child(t) if t.status.is_none() => t.watch.exited().await,
            _ => std::future::pending().await,
        }
    }

    /// Whether the one running process (`attach`) has exited by now; if so it
    /// is `finished` from then on, without an exit to report to the tracker
    /// (for a process that exited while it was being attached to).
    pub fn exited_now(&mut self) -> bool {
        match self {
            // A failure while it was exiting: give its exit a moment.
            Target::Pid(t)
                if t.gone
                    || t.process.watch.has_exited()
                    || (process::is_gone(t.process.pid) && t.process.watch.exits_within(1000)) =>
            {
                t.gone = true;
                true
            }
            _ => false,
        }
    }

    /// Whether the one process is gone and reported.
    pub fn finished(&self) -> bool {
        match self {
            Target::Pid(t) => t.gone,
            Target::Child(t) => t.status.is_some(),
            Target::Host(_) => false,
        }
    }

    /// The started program, to wait for or signal after tracing (None for
    /// other targets, or before `resume`).
    pub fn child_mut(&mut self) -> Option<&mut Child> {
        match self {
            Target::Child(t) => t.child.as_mut(),
            _ => None,
        }
    }

    /// The exit code of a started program that exited while traced.
    pub fn exit_status(&self) -> Option<i32> {
        match self {
            Target::Child(t) => t.status,
            _ => None,
        }
    }
}

impl Drop for ChildTarget {
    /// A program never resumed must not stay stopped forever.
    fn drop(&mut self) {
        if let Some(s) = self.stopped.take() {
            s.kill();
        }
    }
}

/// The exit code a shell would report for a wait status.
pub fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}
