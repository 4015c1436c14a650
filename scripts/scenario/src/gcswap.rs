//! The `gcswap` workload's protocol (scripts/workloads/gcswap): it prints
//! `READY` once its heap is built, runs one GC per `gc` line read from stdin
//! (answering `GC <n>`), answers other commands with a line of their own
//! (`metrics` -> `METRICS {json}`, `cwork` -> `CWORK <n>`), and on `quit`
//! prints `GOSTW_REPORT {json}` (its own pause histogram and major faults)
//! and exits.

use std::io::{self, BufRead, Write};

/// gcswap's arguments in the page-out scenario. Eight walkers on eight Ps:
/// a thread blocked in a fault keeps its P, so only GOMAXPROCS threads can
/// wait at once, and with the leader of the walk waiting on its read, the
/// others queue behind it on the same pages (other-thread waits) however
/// busy the machine's two CPUs are.
pub const PAGEOUT_ARGS: &[&str] = &["-live-mb", "64", "-goroutines", "4000", "-walkers", "8"];
/// gcswap's environment in the page-out scenario.
pub const PAGEOUT_ENV: &[(&str, &str)] = &[("GOMAXPROCS", "8")];
/// Paged-out GCs per run of the scenario.
pub const PAGEOUT_ROUNDS: usize = 4;

/// Commands to a running gcswap and its answers. Lines of its output that
/// are not answers (e.g. a tracer's output sharing the stream) go to the
/// `other` callback of each call, in order.
pub struct GcSwapControl<R, W> {
    lines: R,
    commands: Option<W>,
}

impl<R: BufRead, W: Write> GcSwapControl<R, W> {
    /// Talk to gcswap through `commands` (its stdin) and `lines` (its stdout).
    pub fn new(lines: R, commands: W) -> Self {
        GcSwapControl {
            lines,
            commands: Some(commands),
        }
    }

    /// Wait until gcswap has built its heap.
    pub fn ready(&mut self, other: &mut dyn FnMut(&str)) -> io::Result<()> {
        self.expect("READY", other).map(drop)
    }

    /// Run one GC and wait for it to finish; returns gcswap's GC count.
    pub fn gc(&mut self, other: &mut dyn FnMut(&str)) -> io::Result<u32> {
        self.send("gc")?;
        let line = self.expect("GC ", other)?;
        line["GC ".len()..]
            .parse()
            .map_err(|_| io::Error::other(format!("gcswap answered {line:?} to gc")))
    }

    /// Send `command` and return gcswap's answer: the first line starting
    /// with `reply` (e.g. "metrics" -> the "METRICS {...}" line).
    pub fn ask(
        &mut self,
        command: &str,
        reply: &str,
        other: &mut dyn FnMut(&str),
    ) -> io::Result<String> {
        self.send(command)?;
        self.expect(reply, other)
    }

    /// Ask for the report and close gcswap's stdin (it exits next); returns
    /// the report's JSON text.
    pub fn quit(&mut self, other: &mut dyn FnMut(&str)) -> io::Result<String> {
        self.send("quit")?;
        let line = self.expect("GOSTW_REPORT ", other)?;
        self.commands = None;
        Ok(line["GOSTW_REPORT ".len()..].to_owned())
    }

    /// Every line after the last answer, to `other`, until the stream ends.
    pub fn rest(&mut self, other: &mut dyn FnMut(&str)) -> io::Result<()> {
        self.commands = None;
        let mut line = String::new();
        while self.lines.read_line(&mut line)? > 0 {
            other(line.trim_end_matches('\n'));
            line.clear();
        }
        Ok(())
    }

    fn send(&mut self, command: &str) -> io::Result<()> {
        let w = self
            .commands
            .as_mut()
            .ok_or_else(|| io::Error::other("gcswap's stdin is already closed"))?;
        writeln!(w, "{command}")?;
        w.flush()
    }

    /// Read lines until one is gcswap's answer starting with `prefix`.
    fn expect(&mut self, prefix: &str, other: &mut dyn FnMut(&str)) -> io::Result<String> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.lines.read_line(&mut line)? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("gcswap exited before printing {prefix:?}"),
                ));
            }
            let l = line.trim_end_matches('\n');
            if is_answer(l, prefix) {
                return Ok(l.to_owned());
            }
            other(l);
        }
    }
}

/// Whether `line` is gcswap's answer of kind `prefix` (exactly `READY`,
/// `GC <digits>`, `GOSTW_REPORT {...}`), so a tracer's lines sharing the
/// stream are never taken for one.
fn is_answer(line: &str, prefix: &str) -> bool {
    match prefix {
        "READY" => line == "READY",
        "GC " => line
            .strip_prefix("GC ")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())),
        "GOSTW_REPORT " => line.starts_with("GOSTW_REPORT {"),
        _ => line.starts_with(prefix),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_told_from_other_lines() {
        let out = "gostw: tracing pid 7\nREADY\n  GC mark termination  3\nGC 1\n\
                   10:00:00.1  pid 7  STW GC sweep termination  2.1 ms\nMETRICS {}\n\
                   GOSTW_REPORT {\"gcs\":1}\npid 7: 4 pauses\n";
        let mut commands = Vec::new();
        let mut others = Vec::new();
        {
            let mut c = GcSwapControl::new(out.as_bytes(), &mut commands);
            let mut other = |l: &str| others.push(l.to_owned());
            c.ready(&mut other).unwrap();
            assert_eq!(c.gc(&mut other).unwrap(), 1);
            assert_eq!(
                c.ask("metrics", "METRICS ", &mut other).unwrap(),
                "METRICS {}"
            );
            assert_eq!(c.quit(&mut other).unwrap(), "{\"gcs\":1}");
            assert!(c.commands.is_none(), "stdin closed after quit");
            c.rest(&mut other).unwrap();
        }
        assert_eq!(commands, b"gc\nmetrics\nquit\n");
        assert_eq!(
            others,
            [
                "gostw: tracing pid 7",
                "  GC mark termination  3",
                "10:00:00.1  pid 7  STW GC sweep termination  2.1 ms",
                "pid 7: 4 pauses"
            ]
        );
    }

    #[test]
    fn an_early_exit_is_an_error() {
        let mut c = GcSwapControl::new("READY\n".as_bytes(), Vec::new());
        c.ready(&mut |_| {}).unwrap();
        let e = c.gc(&mut |_| {}).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(e.to_string().contains("\"GC \""), "{e}");
    }
}
