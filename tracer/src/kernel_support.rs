//! Which kernel mechanism the page-fault probes can attach with on this
//! machine, and why.
//!
//! - `kprobe`: needs a kernel built with `CONFIG_KPROBES` (evidence: a
//!   `kprobe_events` file in tracefs, or the kernel config says so) and the
//!   probed function (`do_swap_page`) in `/proc/kallsyms`.
//! - `tracepoint`: needs tracefs (mounted, or mountable: gostw mounts it when
//!   it traces) and the event `exceptions:page_fault_user`
//!   (`filemap:mm_filemap_fault` is optional: without it, as on Debian's 6.1,
//!   the backend attaches the rest and reports the fault kind as unknown).
//!
//! kprobes are preferred where they work (they see the swap-in itself); the
//! tracepoints are the stable fallback. All reads go through `SystemView`
//! so the decision is testable without the machine.

use std::path::Path;

/// The fault backend gostw would use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultBackend {
    Kprobe,
    Tracepoint,
    /// Neither can attach here.
    None,
}

/// The decision and what it rests on.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BackendChoice {
    pub backend: FaultBackend,
    pub reason: String,
    pub kprobes: Support,
    pub tracepoints: Support,
}

/// Whether one mechanism works, with the evidence.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Support {
    pub available: bool,
    pub detail: String,
}

/// Read access to the files the checks look at.
pub trait SystemView {
    fn exists(&self, path: &str) -> bool;
    /// A file's contents (`None` if missing or unreadable).
    fn read(&self, path: &str) -> Option<Vec<u8>>;
    /// `uname -r`.
    fn release(&self) -> String;
}

/// The running machine.
pub struct LiveSystem;

impl SystemView for LiveSystem {
    fn exists(&self, path: &str) -> bool {
        Path::new(path).exists()
    }

    fn read(&self, path: &str) -> Option<Vec<u8>> {
        std::fs::read(path).ok()
    }

    fn release(&self) -> String {
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    }
}

const TRACEFS_DIRS: &[&str] = &["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];
/// Kernel functions the kprobe backend probes (renamed across versions; any one will do).
const KPROBE_TARGETS: &[&str] = &["do_swap_page"];
const TRACEPOINTS: &[&str] = &["exceptions/page_fault_user"];

/// Decide for the running machine.
pub fn detect() -> BackendChoice {
    detect_with(&LiveSystem)
}

/// Decide from what `sys` shows.
pub fn detect_with(sys: &dyn SystemView) -> BackendChoice {
    let config = kernel_config(sys);
    let kprobes = kprobe_support(sys, config.as_deref());
    let tracepoints = tracepoint_support(sys, config.as_deref());
    let (backend, reason) = if kprobes.available {
        (
            FaultBackend::Kprobe,
            format!("kprobes work: {}", kprobes.detail),
        )
    } else if tracepoints.available {
        (
            FaultBackend::Tracepoint,
            format!(
                "kprobes do not: {}; tracepoints do: {}",
                kprobes.detail, tracepoints.detail
            ),
        )
    } else {
        (
            FaultBackend::None,
            format!(
                "no fault backend can attach: {}; {}",
                kprobes.detail, tracepoints.detail
            ),
        )
    };
    BackendChoice {
        backend,
        reason,
        kprobes,
        tracepoints,
    }
}

/// The kernel config, from `/proc/config.gz` or `/boot/config-$(uname -r)`.
fn kernel_config(sys: &dyn SystemView) -> Option<String> {
    if let Some(gz) = sys.read("/proc/config.gz")
        && let Some(text) = gunzip(&gz)
    {
        return Some(String::from_utf8_lossy(&text).into_owned());
    }
    sys.read(&format!("/boot/config-{}", sys.release()))
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// `Some(true)` if the config sets `option=y` (or `=m`), `Some(false)` if
/// the config says it is not set, `None` without a config.
fn config_has(config: Option<&str>, option: &str) -> Option<bool> {
    let config = config?;
    Some(config.lines().any(|l| {
        l.strip_prefix(option)
            .is_some_and(|rest| rest == "=y" || rest == "=m")
    }))
}

fn kprobe_support(sys: &dyn SystemView, config: Option<&str>) -> Support {
    let events_file = TRACEFS_DIRS
        .iter()
        .map(|d| format!("{d}/kprobe_events"))
        .find(|p| sys.exists(p));
    let compiled_in = match (&events_file, config_has(config, "CONFIG_KPROBES")) {
        (Some(p), _) => Ok(format!("{p} exists")),
        (None, Some(true)) => Ok("the kernel config sets CONFIG_KPROBES".to_owned()),
        (None, Some(false)) => Err("the kernel is built without CONFIG_KPROBES".to_owned()),
        (None, None) => Err(
            "no kprobe_events file in tracefs and no kernel config to check CONFIG_KPROBES"
                .to_owned(),
        ),
    };
    let symbols = sys.read("/proc/kallsyms").unwrap_or_default();
    let target = KPROBE_TARGETS.iter().find(|t| kallsyms_has(&symbols, t));
    match (compiled_in, target) {
        (Ok(why), Some(t)) => Support {
            available: true,
            detail: format!("{why} and {t} is in /proc/kallsyms"),
        },
        (Ok(why), None) => Support {
            available: false,
            detail: format!(
                "{why}, but none of {} is in /proc/kallsyms",
                KPROBE_TARGETS.join(", ")
            ),
        },
        (Err(why), _) => Support {
            available: false,
            detail: why,
        },
    }
}

fn tracepoint_support(sys: &dyn SystemView, config: Option<&str>) -> Support {
    if let Some(dir) = TRACEFS_DIRS
        .iter()
        .find(|d| sys.exists(&format!("{d}/events")))
    {
        let missing: Vec<&str> = TRACEPOINTS
            .iter()
            .copied()
            .filter(|t| !sys.exists(&format!("{dir}/events/{t}")))
            .collect();
        return if missing.is_empty() {
            Support {
                available: true,
                detail: format!(
                    "tracefs is mounted at {dir} with {}",
                    TRACEPOINTS.join(", ").replace('/', ":")
                ),
            }
        } else {
            Support {
                available: false,
                detail: format!(
                    "tracefs at {dir} lacks {}",
                    missing.join(", ").replace('/', ":")
                ),
            }
        };
    }
    let mountable = sys.read("/proc/filesystems").is_some_and(|f| {
        String::from_utf8_lossy(&f)
            .lines()
            .any(|l| l.ends_with("\ttracefs"))
    });
    match (mountable, config_has(config, "CONFIG_TRACEPOINTS")) {
        (false, _) => Support {
            available: false,
            detail: "tracefs is neither mounted nor supported by this kernel".into(),
        },
        (true, Some(false)) => Support {
            available: false,
            detail: "the kernel is built without CONFIG_TRACEPOINTS".into(),
        },
        (true, _) => Support {
            available: true,
            detail: "tracefs is not mounted but mountable (gostw mounts it to trace); events not listed until then".into(),
        },
    }
}

/// Does `/proc/kallsyms` (its bytes) define `name`?
fn kallsyms_has(kallsyms: &[u8], name: &str) -> bool {
    kallsyms.split(|&b| b == b'\n').any(|line| {
        // "ffffffff81603510 T do_swap_page" (modules add "\t[mod]").
        line.split(|&b| b == b' ' || b == b'\t')
            .nth(2)
            .is_some_and(|sym| sym == name.as_bytes())
    })
}

/// Decompress a gzip file (RFC 1952) such as `/proc/config.gz`.
fn gunzip(data: &[u8]) -> Option<Vec<u8>> {
    if data.get(0..3)? != [0x1f, 0x8b, 8] {
        return None;
    }
    let flags = *data.get(3)?;
    let mut at = 10usize;
    if flags & 0x04 != 0 {
        let xlen = u16::from_le_bytes([*data.get(at)?, *data.get(at + 1)?]) as usize;
        at += 2 + xlen;
    }
    for bit in [0x08, 0x10] {
        if flags & bit != 0 {
            at += data.get(at..)?.iter().position(|&b| b == 0)? + 1;
        }
    }
    if flags & 0x02 != 0 {
        at += 2;
    }
    miniz_oxide::inflate::decompress_to_vec_with_limit(data.get(at..)?, 64 << 20).ok()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[derive(Default)]
    struct FakeSystem {
        files: HashMap<String, Vec<u8>>,
    }

    impl FakeSystem {
        fn with(mut self, path: &str, contents: &str) -> Self {
            self.files
                .insert(path.to_owned(), contents.as_bytes().to_vec());
            self
        }
    }

    impl SystemView for FakeSystem {
        fn exists(&self, path: &str) -> bool {
            self.files
                .keys()
                .any(|p| p == path || p.starts_with(&format!("{path}/")))
        }
        fn read(&self, path: &str) -> Option<Vec<u8>> {
            self.files.get(path).cloned()
        }
        fn release(&self) -> String {
            "6.1.0-test".into()
        }
    }

    fn with_tracepoints(sys: FakeSystem) -> FakeSystem {
        sys.with(
            "/sys/kernel/tracing/events/exceptions/page_fault_user/id",
            "1",
        )
        .with(
            "/sys/kernel/tracing/events/filemap/mm_filemap_fault/id",
            "2",
        )
    }

    #[test]
    fn no_kprobes_config_picks_tracepoints() {
        // This development machine: CONFIG_KPROBES unset, tracefs mounted.
        let sys = with_tracepoints(FakeSystem::default())
            .with(
                "/boot/config-6.1.0-test",
                "# CONFIG_KPROBES is not set\nCONFIG_TRACEPOINTS=y\n",
            )
            .with("/proc/kallsyms", "ffffffff81603510 T do_swap_page\n");
        let c = detect_with(&sys);
        assert_eq!(c.backend, FaultBackend::Tracepoint);
        assert!(c.reason.contains("without CONFIG_KPROBES"), "{}", c.reason);
    }

    #[test]
    fn kprobe_events_and_symbol_pick_kprobes() {
        let sys = with_tracepoints(FakeSystem::default())
            .with("/sys/kernel/tracing/kprobe_events", "")
            .with("/proc/kallsyms", "ffffffff81603510 T do_swap_page\n");
        assert_eq!(detect_with(&sys).backend, FaultBackend::Kprobe);
    }

    #[test]
    fn config_alone_needs_the_probed_symbol() {
        let sys = with_tracepoints(FakeSystem::default())
            .with("/boot/config-6.1.0-test", "CONFIG_KPROBES=y\n")
            .with("/proc/kallsyms", "ffffffff81603510 T do_other\n");
        let c = detect_with(&sys);
        assert_eq!(c.backend, FaultBackend::Tracepoint);
        assert!(c.kprobes.detail.contains("do_swap_page"));
    }

    #[test]
    fn unmounted_tracefs_is_mountable() {
        let sys = FakeSystem::default().with("/proc/filesystems", "nodev\tsysfs\nnodev\ttracefs\n");
        let c = detect_with(&sys);
        assert_eq!(c.backend, FaultBackend::Tracepoint);
        assert!(c.tracepoints.detail.contains("mountable"));
    }

    #[test]
    fn nothing_available() {
        let c = detect_with(&FakeSystem::default());
        assert_eq!(c.backend, FaultBackend::None);
    }

    #[test]
    fn missing_event_is_reported() {
        let sys = FakeSystem::default().with(
            "/sys/kernel/tracing/events/filemap/mm_filemap_fault/id",
            "1",
        );
        let c = detect_with(&sys);
        assert!(!c.tracepoints.available);
        assert!(c.tracepoints.detail.contains("exceptions:page_fault_user"));
    }

    #[test]
    fn gunzip_reads_gzip() {
        // gzip of "CONFIG_KPROBES=y\n" (no optional header fields).
        let gz = [
            0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x73, 0xf6, 0xf7, 0x73,
            0xf3, 0x74, 0x8f, 0xf7, 0x0e, 0x08, 0xf2, 0x77, 0x72, 0x0d, 0xb6, 0xad, 0xe4, 0x02,
            0x00, 0xe6, 0xa0, 0x19, 0xe4, 0x11, 0x00, 0x00, 0x00,
        ];
        assert_eq!(gunzip(&gz).as_deref(), Some(&b"CONFIG_KPROBES=y\n"[..]));
    }
}
