//! The agent's end after SIGTERM (or an error): each output gets until a
//! deadline to flush (the pause log's queue, OTLP's last export, the HTTP
//! server's open connections), side by side, and whatever still blocks
//! then is left behind. A thread of its own ends the process at
//! `STOP_WITHIN` in any case: a node drains or restarts the agent on its
//! own schedule, not on a stalled log pipe's.

use std::{
    sync::mpsc,
    time::{Duration, Instant},
};

use crate::sink::{otlp::OtlpSink, pause_log::PauseLog, queued::Unwritten};

/// The process is gone this long after the signal, whatever blocks.
pub const STOP_WITHIN: Duration = Duration::from_millis(1800);

/// The outputs flush until then; the rest is for saying what was left.
pub const FLUSH_WITHIN: Duration = Duration::from_millis(1500);

/// The agent's own log, written last, until then.
pub const LOG_FLUSH_WITHIN: Duration = Duration::from_millis(1700);

/// End the process at `at` with exit code `code` if it is still running
/// then. Nothing it does can block: a line on standard error only if the
/// pipe has room now, and `_exit` (no stdio flush, no destructors, no
/// waiting for other threads).
pub fn exit_at(at: Instant, code: i32) {
    let spawned = std::thread::Builder::new()
        .name("gostw-exit".into())
        .spawn(move || {
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
            let said = b"gostw agent: outputs still blocked at the stop deadline; exiting\n";
            if writable_now(libc::STDERR_FILENO) {
                // SAFETY: a valid buffer; the fd had room, so this write
                // does not wait.
                let _ =
                    unsafe { libc::write(libc::STDERR_FILENO, said.as_ptr().cast(), said.len()) };
            }
            // SAFETY: ends the process at once; nothing runs after it.
            unsafe { libc::_exit(code) }
        });
    if let Err(e) = spawned {
        log::warn!("the stop deadline's thread: {e}");
    }
}

/// Whether a write to `fd` would not block now.
fn writable_now(fd: libc::c_int) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & libc::POLLOUT != 0
}

/// What the agent flushes when it stops.
pub struct Flush {
    pub log: Option<PauseLog>,
    pub otlp: Option<OtlpSink>,
    /// Tells the HTTP server to stop; and its result once it has.
    pub server: (
        tokio::sync::oneshot::Sender<()>,
        mpsc::Receiver<anyhow::Result<()>>,
    ),
}

/// What the flush left behind.
pub struct Flushed {
    /// The HTTP server's result (Ok if it was still closing connections).
    pub served: anyhow::Result<()>,
    log: Option<Unwritten>,
    otlp_flushed: bool,
    server_stopped: bool,
}

impl Flush {
    /// Flush everything at once until `deadline`.
    pub fn within(self, deadline: Instant) -> Flushed {
        // OTLP's shutdown waits on its exporters: on a thread of its own.
        let (otlp_tx, otlp_rx) = mpsc::channel::<()>();
        let otlp = self.otlp.is_some();
        if let Some(o) = self.otlp {
            let spawned = std::thread::Builder::new()
                .name("gostw-otlp-stop".into())
                .spawn(move || {
                    o.shutdown();
                    let _ = otlp_tx.send(());
                });
            if let Err(e) = spawned {
                log::warn!("stopping OTLP: {e}");
            }
        }
        let _ = self.server.0.send(());
        let log = self.log.map(|l| l.finish(deadline));
        let left = || deadline.saturating_duration_since(Instant::now());
        let otlp_flushed = !otlp || otlp_rx.recv_timeout(left()).is_ok();
        let (served, server_stopped) = match self.server.1.recv_timeout(left()) {
            Ok(r) => (r, true),
            Err(mpsc::RecvTimeoutError::Timeout) => (Ok(()), false),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                (Err(anyhow::anyhow!("the HTTP thread panicked")), true)
            }
        };
        Flushed {
            served,
            log,
            otlp_flushed,
            server_stopped,
        }
    }
}

impl Flushed {
    /// What was left behind, for the agent's last words ("" if nothing).
    pub fn left_behind(&self) -> String {
        let mut left = Vec::new();
        if let Some(u) = self.log.filter(|u| u.lines > 0) {
            left.push(match u.blocked_for {
                Some(b) => format!(
                    "{} pause log lines (its write blocked for {:.1}s)",
                    u.lines,
                    b.as_secs_f64()
                ),
                None => format!("{} pause log lines", u.lines),
            });
        }
        if !self.otlp_flushed {
            left.push("OTLP's last export".into());
        }
        if !self.server_stopped {
            left.push("open HTTP connections".into());
        }
        if left.is_empty() {
            String::new()
        } else {
            format!("; left behind at the deadline: {}", left.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An HTTP server that does not stop (a client holds its connection)
    /// is left behind at the deadline, and said.
    #[test]
    fn what_does_not_stop_by_the_deadline_is_left_behind_and_said() {
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel();
        let (_served_tx, served_rx) = mpsc::channel();
        let started = Instant::now();
        let flushed = Flush {
            log: None,
            otlp: None,
            server: (stop_tx, served_rx),
        }
        .within(started + Duration::from_millis(100));
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(100) && took < Duration::from_secs(1),
            "{took:?}"
        );
        assert!(
            stop_rx.try_recv().is_ok(),
            "the server was not told to stop"
        );
        assert!(flushed.served.is_ok());
        assert_eq!(
            flushed.left_behind(),
            "; left behind at the deadline: open HTTP connections"
        );

        // One that stops in time: nothing said.
        let (stop_tx, _stop_rx) = tokio::sync::oneshot::channel();
        let (served_tx, served_rx) = mpsc::channel();
        served_tx.send(Ok(())).unwrap();
        let flushed = Flush {
            log: None,
            otlp: None,
            server: (stop_tx, served_rx),
        }
        .within(Instant::now() + Duration::from_secs(5));
        assert_eq!(flushed.left_behind(), "");
    }
}
