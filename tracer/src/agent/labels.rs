//! The labels every per-process series carries: which executable (name, Go
//! version, short build id) and which container. No pid: series must
//! outlive restarts and stay few.

use std::path::Path;

use object::{Object as _, ObjectSection as _};
use prometheus_client::encoding::EncodeLabelSet;

/// Labels of one executable in one container.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ProcessLabels {
    /// File name of the executable.
    pub executable: String,
    /// e.g. "go1.22.10".
    pub go_version: String,
    /// First 12 characters of the build id ("" when the binary has none).
    pub build_id: String,
    /// Container id (12 characters), systemd unit, or cgroup path; "" for the
    /// root cgroup.
    pub container: String,
}

/// Label value used when the number of label sets hit its limit.
pub const OVERFLOW: &str = "_overflow";

/// Longest label value kept (cgroup paths can be long).
const MAX_VALUE: usize = 64;

/// The executable's name from its path (`/proc/PID/exe` says " (deleted)"
/// after the file was replaced).
pub fn executable_name(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    truncate(name.trim_end_matches(" (deleted)"))
}

/// A short build id: the GNU build id when present (hex), else the Go build
/// id's content hash (its last '/'-separated part).
pub fn short_build_id(elf: &[u8]) -> String {
    let Ok(file) = object::File::parse(elf) else {
        return String::new();
    };
    if let Ok(Some(id)) = file.build_id() {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        return hex.chars().take(12).collect();
    }
    let Some(note) = file
        .section_by_name(".note.go.buildid")
        .and_then(|s| s.data().ok())
    else {
        return String::new();
    };
    // ELF note: namesz, descsz, type (u32 each), "Go\0\0", then the id.
    let desc = note.get(16..).unwrap_or_default();
    let id = String::from_utf8_lossy(desc);
    let id = id.trim_end_matches('\0');
    id.rsplit('/')
        .next()
        .unwrap_or("")
        .chars()
        .take(12)
        .collect()
}

/// A container (or service) name from `/proc/PID/cgroup`.
pub fn container(cgroup: &str) -> String {
    // Prefer the unified hierarchy ("0::"), else the first line.
    let path = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .or_else(|| cgroup.lines().next().and_then(|l| l.splitn(3, ':').nth(2)))
        .unwrap_or("")
        .trim();
    // Container runtimes name cgroups after the 64-hex container id
    // ("docker-<id>.scope", "cri-containerd-<id>.scope", ".../<id>").
    for part in path.rsplit('/') {
        let hex = part
            .trim_end_matches(".scope")
            .rsplit(['-', ':'])
            .next()
            .unwrap_or("");
        if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return hex[..12].to_owned();
        }
    }
    if let Some(unit) = path.rsplit('/').find(|p| p.ends_with(".service")) {
        return truncate(unit);
    }
    if path == "/" {
        return String::new();
    }
    truncate(path)
}

fn truncate(s: &str) -> String {
    s.chars().take(MAX_VALUE).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids_units_and_paths() {
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        assert_eq!(
            container(&format!(
                "0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-{id}.scope\n"
            )),
            "0123456789ab"
        );
        assert_eq!(
            container(&format!("12:memory:/docker/{id}\n11:cpu:/docker/{id}\n")),
            "0123456789ab"
        );
        assert_eq!(
            container("0::/system.slice/prometheus.service\n"),
            "prometheus.service"
        );
        assert_eq!(container("0::/\n"), "");
        assert_eq!(
            container("0::/user.slice/session-3.scope\n"),
            "/user.slice/session-3.scope"
        );
        assert_eq!(container(""), "");
        assert_eq!(container(&format!("0::/{}\n", "x".repeat(200))).len(), 64);
    }

    #[test]
    fn executable_names() {
        assert_eq!(executable_name(Path::new("/srv/api (deleted)")), "api");
        assert_eq!(
            executable_name(Path::new("/usr/bin/prometheus")),
            "prometheus"
        );
    }

    #[test]
    fn build_id_of_a_non_elf_is_empty() {
        assert_eq!(short_build_id(b"not an elf"), "");
    }
}
