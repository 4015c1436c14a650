//! What `/healthz` and `/readyz` say, from what the agent does rather than
//! from the HTTP thread answering: the event loop records a heartbeat each
//! turn, and each output's queue says when it last lost a line.
//!
//! - `/healthz` (liveness): 503 when the loop has not turned for
//!   `STALLED_AFTER`, or an output lost lines to a full queue or a failed
//!   write within `LOSS_WINDOW` (a rate limit is chosen, not a fault); the
//!   body says which.
//! - `/readyz` (readiness): 200 once the engine is loaded and its loop has
//!   turned, while it keeps turning.

use std::{
    fmt::Write as _,
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::Duration,
};

use crate::{
    clock::monotonic_ns,
    sink::{metrics::Metrics, queued::OutputWatch},
};

/// The loop is stuck when it has not turned for this long (it turns at
/// least every second).
pub const STALLED_AFTER: Duration = Duration::from_secs(5);

/// An output is in trouble while it lost a line this recently.
pub const LOSS_WINDOW: Duration = Duration::from_secs(10);

/// The agent's health, written by the loop and read by the HTTP thread.
pub struct Health {
    /// CLOCK_MONOTONIC of the loop's last turn.
    heartbeat_ns: AtomicU64,
    /// The loop has turned once: the engine is loaded and tracing.
    turned: AtomicBool,
    outputs: Vec<OutputWatch>,
}

impl Health {
    /// The engine is loaded and the loop about to start: the heartbeat
    /// starts now.
    pub fn new(outputs: Vec<OutputWatch>) -> Health {
        Health {
            heartbeat_ns: AtomicU64::new(monotonic_ns()),
            turned: AtomicBool::new(false),
            outputs,
        }
    }

    /// The loop turned.
    pub fn beat(&self) {
        self.heartbeat_ns.store(monotonic_ns(), Ordering::Relaxed);
        self.turned.store(true, Ordering::Relaxed);
    }

    /// Why the loop is stuck, if it is.
    fn stalled(&self, now_ns: u64) -> Option<String> {
        let since =
            Duration::from_nanos(now_ns.saturating_sub(self.heartbeat_ns.load(Ordering::Relaxed)));
        (since >= STALLED_AFTER).then(|| {
            format!(
                "the event loop has not turned for {:.1}s: tracing is stuck",
                since.as_secs_f64()
            )
        })
    }

    /// `/healthz`: Ok with "ok", or Err with every reason, a line each.
    pub fn live(&self) -> Result<String, String> {
        let mut why = String::new();
        if let Some(s) = self.stalled(monotonic_ns()) {
            why += &s;
            why.push('\n');
        }
        for o in &self.outputs {
            if !o.faulted_within(LOSS_WINDOW) {
                continue;
            }
            let l = o.losses();
            let _ = write!(
                why,
                "output {} is losing lines: {} to a full queue, {} to write errors so far",
                o.name(),
                l.queue_full,
                l.write_error
            );
            if let Some(b) = o.blocked_for() {
                let _ = write!(
                    why,
                    "; its write has been blocked for {:.1}s",
                    b.as_secs_f64()
                );
            }
            why.push('\n');
        }
        if why.is_empty() {
            Ok("ok\n".into())
        } else {
            Err(why)
        }
    }

    /// `/readyz`: Ok once the loop has turned and while it turns.
    pub fn ready(&self) -> Result<String, String> {
        if !self.turned.load(Ordering::Relaxed) {
            return Err("starting: the event loop has not turned yet\n".into());
        }
        match self.stalled(monotonic_ns()) {
            Some(s) => Err(s + "\n"),
            None => Ok("ready\n".into()),
        }
    }

    /// Set the outputs' gauges that change without an event (how long a
    /// write has been blocked), before an exposition.
    pub fn refresh(&self, metrics: &Metrics) {
        for o in &self.outputs {
            metrics.outputs.blocked(o.name(), o.blocked_for());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io,
        time::{Duration, Instant},
    };

    use super::*;
    use crate::sink::queued::{Bounds, Destination, LineQueue, OutputCounters};

    struct Refusing;

    impl Destination for Refusing {
        fn write_line(&mut self, _: &[u8]) -> io::Result<()> {
            Err(io::Error::from_raw_os_error(libc::ENOSPC))
        }
    }

    #[test]
    fn a_loop_that_stopped_turning_is_not_alive_nor_ready() {
        let h = Health::new(Vec::new());
        assert_eq!(h.live(), Ok("ok\n".into()));
        assert!(h.ready().unwrap_err().contains("not turned yet"));
        h.beat();
        assert_eq!(h.ready(), Ok("ready\n".into()));
        let later = monotonic_ns() + STALLED_AFTER.as_nanos() as u64 + 1;
        assert!(h.stalled(later).unwrap().contains("has not turned for 5."));
        h.heartbeat_ns.store(1, Ordering::Relaxed);
        assert!(h.live().unwrap_err().contains("tracing is stuck"));
        assert!(h.ready().is_err());
    }

    #[test]
    fn an_output_losing_lines_makes_the_agent_unhealthy() {
        let q = LineQueue::start(
            "pause_log",
            Bounds {
                lines: 4,
                bytes: 1024,
            },
            Refusing,
            OutputCounters::default(),
        )
        .unwrap();
        let h = Health::new(vec![q.watch()]);
        assert!(h.live().is_ok());
        assert!(q.try_line(b"x\n".to_vec()));
        let deadline = Instant::now() + Duration::from_secs(5);
        while q.watch().losses().write_error == 0 {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(1));
        }
        let why = h.live().unwrap_err();
        assert!(
            why.contains("output pause_log is losing lines: 0 to a full queue, 1 to write errors"),
            "{why}"
        );
    }
}
