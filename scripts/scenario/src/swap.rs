//! A swap file for the length of a scenario.

use std::{fs, io, path::PathBuf, process::Command};

use crate::context;

/// A swap file, enabled while this value lives (or the swap the machine
/// already has, e.g. the VM's swap disk, left alone).
pub struct SwapFile {
    path: Option<PathBuf>,
}

impl SwapFile {
    /// `fallocate`, `mkswap`, `swapon` a file of `gib` GiB under /var/tmp,
    /// unless at least half that much swap is already enabled. A failed step
    /// removes what the earlier ones made.
    pub fn create(name: &str, gib: u32) -> io::Result<SwapFile> {
        if swap_total_kb() >= u64::from(gib) << 19 {
            return Ok(SwapFile { path: None });
        }
        let path = PathBuf::from(format!("/var/tmp/gostw-{name}-{}.swap", std::process::id()));
        let me = SwapFile {
            path: Some(path.clone()),
        };
        let p = path.as_os_str();
        run(Command::new("fallocate")
            .args(["-l", &format!("{gib}G")])
            .arg(p))?;
        run(Command::new("chmod").arg("600").arg(p))?;
        run(Command::new("mkswap").arg(p))?;
        run(Command::new("swapon").arg(p))?;
        Ok(me)
    }

    /// The file this value enabled, or `None` when existing swap is used.
    pub fn path(&self) -> Option<&std::path::Path> {
        self.path.as_deref()
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        if let Some(path) = &self.path {
            let _ = Command::new("swapoff").arg(path).status();
            let _ = fs::remove_file(path);
        }
    }
}

/// Swap already enabled on this machine, in kB.
fn swap_total_kb() -> u64 {
    fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("SwapTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Run `cmd`; its standard error is the message when it fails.
fn run(cmd: &mut Command) -> io::Result<()> {
    let out = cmd.output().map_err(|e| context(format!("{cmd:?}"), e))?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}
