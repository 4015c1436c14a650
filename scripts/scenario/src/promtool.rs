//! `promtool check metrics`, Prometheus's own linter of the text format
//! (`cargo xtask setup` installs it), for every test that checks /metrics.

use std::{
    io::{self, Write as _},
    process::{Command, Stdio},
};

/// `Ok` when `promtool check metrics` accepts `body`; else an error with
/// what it said (or why it could not run).
pub fn promtool_check(body: &str) -> io::Result<()> {
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| crate::context("running promtool (`cargo xtask setup` installs it)", e))?;
    promtool
        .stdin
        .take()
        .expect("piped")
        .write_all(body.as_bytes())?;
    let out = promtool.wait_with_output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )))
}
