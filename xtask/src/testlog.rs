//! What a libtest run prints, read line by line as it comes: each test's
//! result and how long it took, the tests it ignored and why, and the test
//! still running when the output stopped. The kernel tests run serially
//! (`--test-threads=1`), so a test's time is the time from the line before
//! its result (or from `running N tests`) to its result.

use std::time::{Duration, Instant};

/// How one test ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    Failed,
    /// Ignored, with libtest's reason (empty when the test gives none).
    Ignored(String),
}

/// One test's result line.
#[derive(Clone, Debug)]
pub struct TestResult {
    pub name: String,
    pub outcome: Outcome,
    pub took: Duration,
}

/// The results of one libtest run, in order.
#[derive(Debug, Default)]
pub struct TestLog {
    pub results: Vec<TestResult>,
    since: Option<Instant>,
    /// The test whose `test NAME ... ` began a line that has no result.
    running: Option<String>,
}

impl TestLog {
    /// Take one line of output, seen at `now`.
    pub fn line(&mut self, line: &str, now: Instant) {
        if line.starts_with("running ") && line.ends_with(" tests")
            || line.ends_with(" test") && line.starts_with("running ")
        {
            self.since = Some(now);
            return;
        }
        let Some(rest) = line.strip_prefix("test ") else {
            return;
        };
        let Some((name, result)) = rest.split_once(" ... ") else {
            return;
        };
        let outcome = match result.trim() {
            "ok" => Outcome::Passed,
            "FAILED" => Outcome::Failed,
            "ignored" => Outcome::Ignored(String::new()),
            r => match r.strip_prefix("ignored, ") {
                Some(reason) => Outcome::Ignored(reason.to_owned()),
                None => {
                    // Something else shares the line (the guest's watchdog,
                    // a kernel message): the test has not ended yet.
                    self.running = Some(name.to_owned());
                    return;
                }
            },
        };
        let took = self
            .since
            .map_or(Duration::ZERO, |s| now.saturating_duration_since(s));
        if !matches!(outcome, Outcome::Ignored(_)) {
            self.since = Some(now);
        }
        self.running = None;
        self.results.push(TestResult {
            name: name.to_owned(),
            outcome,
            took,
        });
    }

    /// The test that began and never printed its result, if any.
    pub fn running(&self) -> Option<&str> {
        self.running.as_deref()
    }

    /// The `n` slowest tests, slowest first.
    pub fn slowest(&self, n: usize) -> Vec<&TestResult> {
        let mut ran: Vec<&TestResult> = self
            .results
            .iter()
            .filter(|r| !matches!(r.outcome, Outcome::Ignored(_)))
            .collect();
        ran.sort_by_key(|r| std::cmp::Reverse(r.took));
        ran.truncate(n);
        ran
    }

    /// The ignored tests with their reasons.
    pub fn ignored(&self) -> impl Iterator<Item = (&str, &str)> {
        self.results.iter().filter_map(|r| match &r.outcome {
            Outcome::Ignored(why) => Some((r.name.as_str(), why.as_str())),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_times_and_ignored_tests_are_read() {
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let mut log = TestLog::default();
        log.line("running 4 tests", at(1));
        log.line("test faults::a ... ok", at(4));
        log.line("test x::stall ... ignored, sleeps past the watchdog", at(4));
        log.line("test storm::b ... FAILED", at(14));
        log.line("test result: ok. 3 passed; 0 failed", at(14));
        log.line(
            "test c ... GOSTW_VM_SILENT=no console output for 600 s",
            at(20),
        );
        let got: Vec<_> = log
            .results
            .iter()
            .map(|r| (r.name.as_str(), r.outcome.clone(), r.took.as_secs()))
            .collect();
        assert_eq!(
            got,
            [
                ("faults::a", Outcome::Passed, 3),
                (
                    "x::stall",
                    Outcome::Ignored("sleeps past the watchdog".into()),
                    0
                ),
                ("storm::b", Outcome::Failed, 10),
            ]
        );
        assert_eq!(log.running(), Some("c"));
        assert_eq!(log.slowest(1)[0].name, "storm::b");
        assert_eq!(
            log.ignored().collect::<Vec<_>>(),
            [("x::stall", "sleeps past the watchdog")]
        );
    }
}
