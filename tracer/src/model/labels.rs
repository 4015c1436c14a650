//! The labels every per-process series carries: which executable (name, Go
//! version, short build id) and which container (with its pod and namespace
//! where the container runtime knows them). No pid: series must outlive
//! restarts and stay few.

use std::path::Path;

use prometheus_client::encoding::EncodeLabelSet;
use serde::Serialize;

/// Labels of one executable in one container.
#[derive(
    Clone, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet, Serialize,
)]
pub struct ProcessLabels {
    /// File name of the executable.
    pub executable: String,
    /// e.g. "go1.22.10".
    pub go_version: String,
    /// First 12 characters of the build id ("" when the binary has none).
    pub build_id: String,
    /// The container's name where its runtime names it (Kubernetes'
    /// container name), else its id (12 characters), systemd unit, or cgroup
    /// path; "" for the root cgroup.
    pub container: String,
    /// Kubernetes namespace of the pod ("" when not known).
    pub namespace: String,
    /// Kubernetes pod name ("" when not known).
    pub pod: String,
}

/// What a container runtime says of one container: the Kubernetes labels
/// that CRI puts on every container it creates. Empty where absent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerNames {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

impl ContainerNames {
    /// The names from a container's runtime labels (containerd's container
    /// labels, CRI-O's and Docker's alike), None when it has none of them.
    pub fn from_labels<'a>(
        labels: impl Iterator<Item = (&'a str, &'a str)>,
    ) -> Option<ContainerNames> {
        let mut n = ContainerNames::default();
        for (k, v) in labels {
            match k {
                "io.kubernetes.pod.namespace" => n.namespace = truncate(v),
                "io.kubernetes.pod.name" => n.pod = truncate(v),
                "io.kubernetes.container.name" => n.container = truncate(v),
                _ => {}
            }
        }
        (n != ContainerNames::default()).then_some(n)
    }
}

impl ProcessLabels {
    /// Put a runtime's names in place of the container id.
    pub fn name(&mut self, names: &ContainerNames) {
        if !names.container.is_empty() {
            self.container.clone_from(&names.container);
        }
        self.namespace.clone_from(&names.namespace);
        self.pod.clone_from(&names.pod);
    }
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

/// The cgroup path of `/proc/PID/cgroup`: the unified hierarchy's ("0::"),
/// else the first line's.
fn cgroup_path(cgroup: &str) -> &str {
    cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .or_else(|| cgroup.lines().next().and_then(|l| l.splitn(3, ':').nth(2)))
        .unwrap_or("")
        .trim()
}

/// The whole 64-hex container id in `/proc/PID/cgroup`, if the process is
/// in a container. Runtimes name cgroups after it ("docker-<id>.scope",
/// "cri-containerd-<id>.scope", "crio-<id>.scope", ".../<id>").
pub fn container_id(cgroup: &str) -> Option<&str> {
    cgroup_path(cgroup).rsplit('/').find_map(|part| {
        let hex = part
            .trim_end_matches(".scope")
            .rsplit(['-', ':'])
            .next()
            .unwrap_or("");
        (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hex)
    })
}

/// A container (or service) name from `/proc/PID/cgroup`.
pub fn container(cgroup: &str) -> String {
    if let Some(id) = container_id(cgroup) {
        return id[..12].to_owned();
    }
    let path = cgroup_path(cgroup);
    if let Some(unit) = path.rsplit('/').find(|p| p.ends_with(".service")) {
        return truncate(unit);
    }
    if path == "/" {
        return String::new();
    }
    truncate(path)
}

/// `s` cut to the longest label value kept.
pub fn truncate(s: &str) -> String {
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
        assert_eq!(
            container_id(&format!("9:pids:/k8s.io/{id}\n8:cpu:/k8s.io/{id}\n")),
            Some(id)
        );
        assert_eq!(container_id("0::/system.slice/prometheus.service\n"), None);
        // 63 hex digits are not an id.
        assert_eq!(container_id(&format!("0::/docker/{}\n", &id[1..])), None);
    }

    #[test]
    fn kubernetes_names_replace_the_id() {
        let k8s = [
            ("io.kubernetes.pod.name", "web-0"),
            ("io.kubernetes.pod.namespace", "shop"),
            ("io.kubernetes.container.name", "app"),
            ("io.cri-containerd.kind", "container"),
        ];
        let names = ContainerNames::from_labels(k8s.into_iter()).unwrap();
        let mut l = ProcessLabels {
            container: "0123456789ab".into(),
            ..Default::default()
        };
        l.name(&names);
        assert_eq!(
            (l.container.as_str(), l.namespace.as_str(), l.pod.as_str()),
            ("app", "shop", "web-0")
        );
        // A container without them keeps its id.
        let plain = [("nerdctl/platform", "linux/amd64")];
        assert_eq!(ContainerNames::from_labels(plain.into_iter()), None);
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
