//! A writer that keeps a memory cgroup's page cache full and dirty.

use std::{
    io,
    os::unix::process::CommandExt as _,
    path::PathBuf,
    process::{Child, Command},
};

use crate::{MemCgroup, context};

/// A shell in a memory cgroup rewriting a 256 MiB file under /var/tmp 32 MiB
/// at a time, never syncing: the group's page cache stays full and mostly
/// dirty, which its reclaim cannot free without waiting for writeback.
/// Killed (with its `dd`) and the file removed on drop.
pub struct DirtyWriter {
    child: Child,
    file: PathBuf,
}

impl DirtyWriter {
    /// Start one in `cgroup`; `name` names its file.
    pub fn start(cgroup: &MemCgroup, name: &str) -> io::Result<DirtyWriter> {
        let file = PathBuf::from(format!("/var/tmp/gostw-{name}-{}", std::process::id()));
        let child = Command::new("sh")
            .arg("-c")
            .arg(
                r#"echo $$ > "$0" || exit 1
                i=0
                while :; do
                    dd if=/dev/zero of="$1" bs=1M count=32 seek=$((i % 8 * 32)) \
                        conv=notrunc 2>/dev/null || exit 1
                    i=$((i + 1))
                done"#,
            )
            .arg(cgroup.path.join("cgroup.procs"))
            .arg(&file)
            .process_group(0)
            .spawn()
            .map_err(|e| context("starting the dirty writer (sh)", e))?;
        Ok(DirtyWriter { child, file })
    }
}

impl Drop for DirtyWriter {
    fn drop(&mut self) {
        // The shell and its dd: the cgroup can go only once both have.
        // SAFETY: signalling our own child's process group.
        unsafe { libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL) };
        let _ = self.child.wait();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let _ = std::fs::remove_file(&self.file);
    }
}
