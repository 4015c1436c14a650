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

use super::{BinaryError, FileBytes, GoBinary, Segment};

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
        } else if e.kind() == std::io::ErrorKind::PermissionDenied {
            format!(
                "cannot read its executable link: {e}; {}",
                crate::privilege::proc_access_denied(pid)
            )
        } else {
            format!("cannot read its executable link: {e}")
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
    /// Analyse the executable of process `pid` (`path` is the host path),
    /// mapped through `/proc/PID/exe`.
    pub fn open_pid(pid: u32) -> Result<GoBinary, BinaryError> {
        let exe = process_exe(pid)?;
        let data = FileBytes::map(Path::new(&format!("/proc/{pid}/exe"))).map_err(|e| {
            let why = if e.kind() == std::io::ErrorKind::PermissionDenied {
                format!("; {}", crate::privilege::proc_access_denied(pid))
            } else {
                String::new()
            };
            proc_error(pid, format!("cannot read its executable: {e}{why}"))
        })?;
        GoBinary::from_file(&exe.host_path, data).map_err(|e| match e {
            BinaryError::NotGo { .. } | BinaryError::NotElf { .. } => {
                proc_error(pid, format!("{} is not a Go program", exe.exe.display()))
            }
            other => other,
        })
    }
}

/// How far the process's mapping of its executable (whose loadable
/// segments are `segments`) is from its link-time
/// addresses: runtime address = link-time address + bias. 0 for non-PIE.
pub fn load_bias(pid: u32, segments: &[Segment]) -> Result<u64, BinaryError> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|e| proc_error(pid, format!("cannot read its memory map: {e}")))?;
    let exe = fs::metadata(format!("/proc/{pid}/exe"))
        .map_err(|e| proc_error(pid, format!("cannot stat its executable: {e}")))?;
    bias_from_maps(&maps, exe.ino(), segments)
        .ok_or_else(|| proc_error(pid, "its executable is not mapped"))
}

/// The bias from the lowest mapping of the file with inode `ino`.
fn bias_from_maps(maps: &str, ino: u64, segments: &[Segment]) -> Option<u64> {
    let (start, offset) = maps
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let range = f.next()?;
            let _perms = f.next()?;
            let offset = u64::from_str_radix(f.next()?, 16).ok()?;
            let _dev = f.next()?;
            let inode: u64 = f.next()?.parse().ok()?;
            let start = u64::from_str_radix(range.split('-').next()?, 16).ok()?;
            (inode == ino).then_some((start, offset))
        })
        .min()?;
    // The segment holding that file offset gives the link address mapped there.
    let seg = segments
        .iter()
        .filter(|s| s.offset <= offset.saturating_add(0xfff))
        .max_by_key(|s| s.offset)?;
    let linked = seg.vaddr.checked_add(offset)?.checked_sub(seg.offset)?;
    // Page-align as the kernel did when mapping.
    Some(start.wrapping_sub(linked & !0xfff))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(vaddr: u64, offset: u64, flags: u32) -> Segment {
        Segment {
            vaddr,
            memsz: 0x10000,
            offset,
            filesz: 0x10000,
            flags,
        }
    }

    #[test]
    fn bias_of_pie_and_fixed_executables() {
        // Go's layout: text at 0x400000 from file offset 0, then rodata.
        let segments = [seg(0x400000, 0, 5), seg(0x529000, 0x129000, 4)];
        let pie = "\
55d0aaa00000-55d0aab29000 r-xp 00000000 fd:01 1234 /srv/app
55d0aab29000-55d0aac76000 r--p 00129000 fd:01 1234 /srv/app
7f0000000000-7f0000001000 rw-p 00000000 00:00 0
";
        assert_eq!(
            bias_from_maps(pie, 1234, &segments),
            Some(0x55d0aaa00000 - 0x400000)
        );
        let fixed = "00400000-00529000 r-xp 00000000 fd:01 77 /srv/app\n";
        assert_eq!(bias_from_maps(fixed, 77, &segments), Some(0));
        // Only a later segment mapped (the first was unmapped): still right.
        let later = "55d0aab29000-55d0aac76000 r--p 00129000 fd:01 1234 /srv/app\n";
        assert_eq!(
            bias_from_maps(later, 1234, &segments),
            Some(0x55d0aaa00000 - 0x400000)
        );
        assert_eq!(bias_from_maps(pie, 999, &segments), None);
        assert_eq!(bias_from_maps("garbage\n", 1234, &segments), None);
    }
}
