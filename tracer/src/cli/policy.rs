//! The decisions `trace` makes for every command that traces (attach, run,
//! stacks, faults): what a signal does, when the reader of the trace has
//! gone, whether an `--output` file may appear, and what gostw says last.
//! Kept apart from the engine and the files so a unit test drives each case.

use std::{io, time::Duration};

/// How long a program started by gostw gets to act on Ctrl-C itself (the
/// terminal sends it to the program too) before gostw passes it on.
pub const SIGINT_GRACE: Duration = Duration::from_secs(2);

/// What the trace does when a signal stops the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnSignal {
    /// Stop tracing now (an attached process keeps running, untraced).
    End,
    /// Pass the signal on to the started program and trace it to its end.
    Forward,
    /// Wait up to `SIGINT_GRACE` for the started program to exit (and trace
    /// it to its end if it does); if it does not, `then`.
    Grace { then: AfterGrace },
}

/// `OnSignal::Grace`'s second step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterGrace {
    End,
    Forward,
}

/// The plan for signal `sig`: `started` when gostw started the program
/// (`run`, `stacks -- CMD`), `wait_for_child` when the trace lasts as long
/// as that program (`run`: gostw takes its exit code).
pub fn on_signal(sig: i32, started: bool, wait_for_child: bool) -> OnSignal {
    if !started {
        return OnSignal::End;
    }
    match (sig == libc::SIGINT, wait_for_child) {
        (true, true) => OnSignal::Grace {
            then: AfterGrace::Forward,
        },
        (true, false) => OnSignal::Grace {
            then: AfterGrace::End,
        },
        (false, true) => OnSignal::Forward,
        (false, false) => OnSignal::End,
    }
}

/// How writing the trace went.
#[derive(Debug, Default)]
pub struct OutputState {
    /// Standard output's reader went away: the trace stops and the summary
    /// goes to standard error.
    pub closed: bool,
    /// Writing failed otherwise (a full disk): an error at the end.
    pub write_error: Option<io::Error>,
}

impl OutputState {
    /// A write of the live records failed with `e`.
    pub fn write_failed(&mut self, e: io::Error) {
        if e.kind() == io::ErrorKind::BrokenPipe {
            self.closed = true;
        } else {
            self.write_error = Some(e);
        }
    }

    /// The engine saw standard output's reader go away. After another
    /// write error, that error is what gostw reports.
    pub fn reader_gone(&mut self) {
        self.closed |= self.write_error.is_none();
    }

    /// Whether writing the summary failed because the reader went away just
    /// then (the output is closed from now on, and the summary written again,
    /// to standard error).
    pub fn summary_reader_gone(&mut self, summary: &io::Result<()>) -> bool {
        let gone = !self.closed
            && summary
                .as_ref()
                .is_err_and(|e| e.kind() == io::ErrorKind::BrokenPipe);
        self.closed |= gone;
        gone
    }

    /// Whether an `--output` file is complete and may appear.
    pub fn output_file_complete(&self, summary: &io::Result<()>) -> bool {
        self.write_error.is_none() && (summary.is_ok() || self.closed)
    }
}

/// What gostw says when tracing `pid` ends: `exited` when the process is
/// gone, `started` when gostw started it (its end is the program's own, not
/// news).
pub fn last_word(pid: Option<u32>, exited: bool, started: bool) -> Option<String> {
    match (pid?, exited, started) {
        (pid, false, _) => Some(format!(
            "gostw: tracing stopped; pid {pid} keeps running untraced"
        )),
        (pid, true, false) => Some(format!("gostw: pid {pid} exited")),
        (_, true, true) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(kind: io::ErrorKind) -> io::Error {
        io::Error::new(kind, "x")
    }

    #[test]
    fn an_attached_process_ends_the_trace_on_any_signal() {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            assert_eq!(on_signal(sig, false, false), OnSignal::End);
        }
    }

    #[test]
    fn a_started_program_gets_ctrl_c_first() {
        assert_eq!(
            on_signal(libc::SIGINT, true, true),
            OnSignal::Grace {
                then: AfterGrace::Forward
            }
        );
        assert_eq!(
            on_signal(libc::SIGINT, true, false),
            OnSignal::Grace {
                then: AfterGrace::End
            }
        );
        // Other signals come from kill, not the terminal: no grace.
        assert_eq!(on_signal(libc::SIGTERM, true, true), OnSignal::Forward);
        assert_eq!(on_signal(libc::SIGHUP, true, false), OnSignal::End);
    }

    #[test]
    fn a_broken_pipe_closes_and_other_errors_are_reported() {
        let mut o = OutputState::default();
        o.write_failed(err(io::ErrorKind::BrokenPipe));
        assert!(o.closed && o.write_error.is_none());
        let mut o = OutputState::default();
        o.write_failed(err(io::ErrorKind::StorageFull));
        o.reader_gone();
        assert!(!o.closed, "a full disk is the error, not a closed reader");
        assert!(o.write_error.is_some());
        let mut o = OutputState::default();
        o.reader_gone();
        assert!(o.closed);
    }

    #[test]
    fn an_output_file_appears_only_complete() {
        let ok = Ok(());
        let pipe = Err(err(io::ErrorKind::BrokenPipe));
        let full = Err(err(io::ErrorKind::StorageFull));
        let mut o = OutputState::default();
        assert!(o.output_file_complete(&ok));
        assert!(!o.output_file_complete(&full));
        assert!(!o.summary_reader_gone(&full));
        assert!(o.summary_reader_gone(&pipe));
        // The summary went to standard error instead: the file is whole.
        assert!(o.closed);
        assert!(o.output_file_complete(&pipe));
        assert!(!o.summary_reader_gone(&pipe), "said once");
        let failed = OutputState {
            closed: false,
            write_error: Some(err(io::ErrorKind::StorageFull)),
        };
        assert!(!failed.output_file_complete(&ok));
    }

    #[test]
    fn the_last_word_names_what_happened_to_the_process() {
        assert_eq!(
            last_word(Some(7), false, false).as_deref(),
            Some("gostw: tracing stopped; pid 7 keeps running untraced")
        );
        assert_eq!(
            last_word(Some(7), false, true).as_deref(),
            Some("gostw: tracing stopped; pid 7 keeps running untraced")
        );
        assert_eq!(
            last_word(Some(7), true, false).as_deref(),
            Some("gostw: pid 7 exited")
        );
        assert_eq!(last_word(Some(7), true, true), None);
        assert_eq!(last_word(None, true, false), None);
    }
}
