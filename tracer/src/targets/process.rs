//! The processes gostw traces: finding a live one by pid (with a clear error
//! for every way that can fail) and noticing when one exits (a pidfd becomes
//! readable when its process exits; it never refers to a reused pid).

use std::{
    io,
    os::fd::{FromRawFd as _, OwnedFd},
    path::PathBuf,
    sync::Arc,
};

use tokio::io::unix::AsyncFd;

use super::discovery::NewProcess;
use crate::{binary::BinaryError, image::ExecutableImage};

/// Why a pid cannot be traced; each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("no process with pid {0} (it has exited, or never existed)")]
    NoSuchProcess(u32),
    #[error("cannot read /proc/{pid}/exe: {error}; {why}")]
    NoAccess {
        pid: u32,
        error: io::Error,
        /// Which check refused it (`privilege::proc_access_denied`).
        why: String,
    },
    #[error("pid {pid} ({exe}) is not a Go program: gostw traces Go programs (Go 1.19 or later)")]
    NotGo { pid: u32, exe: String },
    #[error("pid {pid} ({exe}): {error}")]
    Binary {
        pid: u32,
        exe: String,
        error: BinaryError,
    },
    #[error("pid {0} exited while gostw was attaching to it")]
    ExitedDuringAttach(u32),
    #[error("{0} is a thread id, not a process id: use the Tgid of /proc/{0}/status")]
    Thread(u32),
    #[error("pidfd_open({pid}): {error}")]
    Pidfd { pid: u32, error: io::Error },
}

/// A handle on a process that says when it has exited.
pub struct ExitWatch {
    pid: u32,
    fd: AsyncFd<OwnedFd>,
}

impl ExitWatch {
    /// Watch `pid` (needs a tokio runtime with I/O enabled).
    pub fn new(pid: u32) -> Result<ExitWatch, TargetError> {
        // SAFETY: plain syscall; a non-negative result is a new fd we own.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                // pidfd_open takes only thread-group leaders: other threads
                // get EINVAL (ENOENT from 6.9).
                Some(libc::EINVAL | libc::ENOENT) if tgid_of(pid).is_some_and(|t| t != pid) => {
                    TargetError::Thread(pid)
                }
                Some(libc::ESRCH | libc::EINVAL | libc::ENOENT) => TargetError::NoSuchProcess(pid),
                _ => TargetError::Pidfd { pid, error: e },
            });
        }
        // SAFETY: fd is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // SAFETY: the OwnedFd keeps its descriptor open and unchanged for as
        // long as it lives, and the AsyncFd owns it.
        let fd = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
            .map_err(|e| TargetError::Pidfd {
                pid,
                error: e.into(),
            })?;
        Ok(ExitWatch { pid, fd })
    }

    /// The watched pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Wait until the process has exited.
    pub async fn exited(&self) {
        // A pidfd only ever becomes readable once, for good: no need to clear.
        let _ = self.fd.readable().await;
    }

    /// Whether it has exited already.
    pub fn has_exited(&self) -> bool {
        self.exits_within(0)
    }

    /// Whether it has exited, or does within `ms` milliseconds (blocking):
    /// a killed process is still tearing down its threads for a moment
    /// after its executable and memory are gone.
    pub fn exits_within(&self, ms: i32) -> bool {
        let mut p = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(self.fd.get_ref()),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ms) > 0 }
    }
}

/// Whether process `pid` has exited or is exiting: no /proc entry, a
/// zombie (exited, not yet reaped by its parent: its /proc entry stays, its
/// memory and executable are gone), or a leader already in `do_exit`
/// (`PF_EXITING`: a killed process tears down its threads for a while, and
/// its executable link is gone before it is a zombie).
pub fn is_gone(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    stat_says_gone(&stat)
}

/// `is_gone` from the text of `/proc/PID/stat`.
fn stat_says_gone(stat: &str) -> bool {
    const PF_EXITING: u64 = 0x4;
    // "pid (comm) S ppid pgrp session tty tpgid flags ...": the fields
    // follow the last ')' (comm may hold any).
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return false;
    };
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next().and_then(|s| s.chars().next());
    let flags = fields
        .nth(5)
        .and_then(|f| f.parse::<u64>().ok())
        .unwrap_or(0);
    matches!(state, Some('Z' | 'X' | 'x')) || flags & PF_EXITING != 0
}

/// The process (thread group) id of thread `tid`, from /proc.
fn tgid_of(tid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))?
        .trim()
        .parse()
        .ok()
}

/// A live process to attach to: its executable (analysed) and exit watch.
pub struct LiveProcess {
    pub pid: u32,
    /// The executable's path as the process sees it.
    pub exe_name: String,
    pub image: Arc<ExecutableImage>,
    pub watch: ExitWatch,
}

impl LiveProcess {
    /// Check that `pid` is a running Go program gostw can read.
    pub fn open(pid: u32) -> Result<LiveProcess, TargetError> {
        let watch = ExitWatch::new(pid)?;
        let exe = PathBuf::from(format!("/proc/{pid}/exe"));
        let gone_or = |e: TargetError| {
            if watch.has_exited() {
                TargetError::NoSuchProcess(pid)
            } else {
                e
            }
        };
        let exe_name = match std::fs::read_link(&exe) {
            Ok(p) => p.display().to_string(),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                return Err(gone_or(TargetError::NotGo {
                    pid,
                    exe: "no executable".into(),
                }));
            }
            Err(error) => {
                return Err(gone_or(TargetError::NoAccess {
                    pid,
                    error,
                    why: crate::privilege::proc_access_denied(pid),
                }));
            }
        };
        let image = ExecutableImage::of_pid(pid).map_err(|e| {
            gone_or(match e {
                BinaryError::NotGo { .. } | BinaryError::NotElf { .. } => TargetError::NotGo {
                    pid,
                    exe: exe_name.clone(),
                },
                BinaryError::Process { ref reason, .. } if reason.contains("not a Go program") => {
                    TargetError::NotGo {
                        pid,
                        exe: exe_name.clone(),
                    }
                }
                BinaryError::Read { source, .. }
                    if source.kind() == io::ErrorKind::PermissionDenied =>
                {
                    TargetError::NoAccess {
                        pid,
                        error: source,
                        why: crate::privilege::proc_access_denied(pid),
                    }
                }
                error => TargetError::Binary {
                    pid,
                    exe: exe_name.clone(),
                    error,
                },
            })
        })?;
        Ok(LiveProcess {
            pid,
            exe_name,
            image,
            watch,
        })
    }

    /// The process as discovery would describe it.
    pub fn new_process(&self) -> NewProcess {
        let read = |f: &str| {
            std::fs::read_to_string(format!("/proc/{}/{f}", self.pid)).unwrap_or_default()
        };
        NewProcess {
            pid: self.pid,
            exe: self.image.id,
            exe_path: PathBuf::from(&self.exe_name),
            comm: read("comm").trim_end().to_owned(),
            cgroup: read("cgroup"),
            names: None,
        }
    }

    /// The path its executable is attached by (reaches containers too).
    pub fn exe_link(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/exe", self.pid))
    }
}

#[cfg(test)]
mod tests {
    use super::stat_says_gone;

    #[test]
    fn a_zombie_or_an_exiting_leader_is_gone_a_running_one_is_not() {
        // Fields after comm: state ppid pgrp session tty tpgid flags.
        let running = "42 (a) b) S 1 42 42 0 -1 4194560 12 0";
        assert!(!stat_says_gone(running));
        assert!(stat_says_gone("42 (a) b) Z 1 42 42 0 -1 4194560 12 0"));
        // Flags 0x400004: PF_EXITING (0x4) set.
        assert!(stat_says_gone("42 (a) b) S 1 42 42 0 -1 4194308 12 0"));
        assert!(!stat_says_gone("garbage"));
    }
}
