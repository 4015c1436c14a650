//! The labels every per-process series carries: which executable (name, Go
//! version, short build id) and which container. No pid: series must
//! outlive restarts and stay few.

use std::path::Path;

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

/// The first 12 characters of a build id's content part: a Go build id is
/// "actionID/contentID" (or longer), the content hash naming the build; a GNU
/// build id is plain hex.
pub fn short_build_id(id: &str) -> String {
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
    fn short_build_ids() {
        assert_eq!(
            short_build_id("aBcD_123/efGH456ijkLMNop/xyz/Zd9-3Thfd6hCqqqq"),
            "Zd9-3Thfd6hC"
        );
        assert_eq!(short_build_id("1d7427685f18a0b1c2"), "1d7427685f18");
        assert_eq!(short_build_id(""), "");
    }
}
