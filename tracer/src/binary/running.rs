//! The executable of a running process and where it is loaded.
//!
//! The file is read through `/proc/PID/exe`, which reaches it from any mount
//! namespace (a container) and even after it was deleted or replaced. It is
//! reported, and uprobes are attached, by the path the host sees: the
//! process's own path in the same mount namespace, else
//! `/proc/PID/root/<path>`.

use std::{
    fs,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use super::{BinaryError, GoBinary};

/// Where a process's executable is.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProcessExe {
    pub pid: u32,
    /// The path inside the process's mount namespace (`readlink /proc/PID/exe`).
    pub exe: PathBuf,
    /// The path this host reaches the same file by.
    pub host_path: PathBuf,
    /// Whether the process runs in another mount namespace (a container).
    pub other_mount_namespace: bool,
}

fn proc_error(pid: u32, reason: impl Into<String>) -> BinaryError {
    BinaryError::Process {
        pid,
        reason: reason.into(),
    }
}

/// Find the executable of process `pid`.
pub fn process_exe(pid: u32) -> Result<ProcessExe, BinaryError> {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    if pid == 0 || !proc_dir.exists() {
        return Err(proc_error(pid, "no such process"));
    }
    let exe_link = proc_dir.join("exe");
    let exe = fs::read_link(&exe_link).map_err(|e| {
        let why = if e.kind() == std::io::ErrorKind::NotFound {
            "has no executable (a kernel thread, or it exited)".to_owned()
        } else {
            format!("cannot read its executable link: {e} (gostw needs root or CAP_SYS_PTRACE)")
        };
        proc_error(pid, why)
    })?;
    let same_ns = match (
        fs::read_link("/proc/self/ns/mnt"),
        fs::read_link(proc_dir.join("ns/mnt")),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => true,
    };
    let target = fs::metadata(&exe_link).ok();
    let same_file = |p: &Path| {
        let (Some(t), Ok(m)) = (&target, fs::metadata(p)) else {
            return false;
        };
        t.dev() == m.dev() && t.ino() == m.ino()
    };
    let through_root = proc_dir
        .join("root")
        .join(exe.strip_prefix("/").unwrap_or(&exe));
    let host_path = if same_ns && same_file(&exe) {
        exe.clone()
    } else if same_file(&through_root) {
        through_root
    } else {
        // Deleted or replaced since the process started: only the link reaches it.
        exe_link
    };
    Ok(ProcessExe {
        pid,
        exe,
        host_path,
        other_mount_namespace: !same_ns,
    })
}

impl GoBinary {
    /// Analyse the executable of process `pid` (`path` is the host path).
    pub fn open_pid(pid: u32) -> Result<GoBinary, BinaryError> {
        let exe = process_exe(pid)?;
        let data = fs::read(format!("/proc/{pid}/exe"))
            .map_err(|e| proc_error(pid, format!("cannot read its executable: {e}")))?;
        GoBinary::from_bytes(&exe.host_path, data).map_err(|e| match e {
            BinaryError::NotGo { .. } | BinaryError::NotElf { .. } => {
                proc_error(pid, format!("{} is not a Go program", exe.exe.display()))
            }
            other => other,
        })
    }
}
