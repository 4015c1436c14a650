//! What the running kernel offers gostw, asked in one place: which fault
//! backend can attach and why. `inspect` reports it, and attach follows it.
//!
//! - `kprobe`: needs a kernel built with `CONFIG_KPROBES` (evidence: a
//!   `kprobe_events` file in tracefs, the kprobe PMU, or the kernel config)
//!   and, for every kprobe program, one of its kernel functions in
//!   `/proc/kallsyms` (they were renamed across versions).
//! - `tracepoint`: needs tracefs (mounted, or mountable: gostw mounts it when
//!   it attaches; detection never mounts) and every tracepoint of the backend
//!   but `filemap:mm_filemap_fault` (without it, as on Debian's 6.1, file-backed
//!   faults and swap-ins are not told apart) and x86's
//!   `exceptions:page_fault_*` (without them, as on arm64, faults begin at the
//!   `PAGE_FAULTS` perf software event).
//!
//! kprobes are preferred where they work (they see the swap-in itself); the
//! tracepoints are the stable fallback. All reads go through `SystemView`
//! so the decision is testable without the machine.

use std::path::Path;

use anyhow::bail;
use tracer_common::fault::programs;

pub use crate::model::backend::{BackendChoice, FaultBackend, Support};

/// `--fault-source`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultSource {
    /// kprobes when the kernel has them and the functions exist, else tracepoints.
    #[default]
    Auto,
    Kprobe,
    Tracepoint,
}

/// Said in the tracepoint backend's reason when faults begin at the
/// `PAGE_FAULTS` perf event.
pub const PERF_BEGIN_NOTE: &str = " (faults begin at the PAGE_FAULTS perf event)";

/// What the kernel offers the fault backends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    pub kprobes: Support,
    /// (program, kernel function) for every kprobe program, when available.
    pub kprobe_functions: Vec<(&'static str, &'static str)>,
    pub tracepoints: Support,
    /// `filemap:mm_filemap_fault` exists.
    pub filemap_tracepoint: bool,
    /// The tracepoint backend begins faults at `exceptions:page_fault_*`
    /// (x86); false where they do not exist (arm64), or when asked to
    /// (`CoreOptions::perf_fault_begin`): the `PAGE_FAULTS` perf event then.
    /// Assumed on x86 while tracefs is not mounted; attach checks again.
    pub begin_tracepoints: bool,
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

/// Ask the running machine.
pub fn detect() -> Capabilities {
    detect_with(&LiveSystem)
}

/// Ask what `sys` shows.
pub fn detect_with(sys: &dyn SystemView) -> Capabilities {
    let config = kernel_config(sys);
    let (kprobes, kprobe_functions) = kprobe_support(sys, config.as_deref());
    let tracefs = TRACEFS_DIRS
        .iter()
        .find(|d| sys.exists(&format!("{d}/events")));
    Capabilities {
        kprobes,
        kprobe_functions,
        tracepoints: tracepoint_support(sys, config.as_deref()),
        filemap_tracepoint: tracefs
            .is_some_and(|d| sys.exists(&format!("{d}/events/filemap/mm_filemap_fault"))),
        begin_tracepoints: tracefs.map_or(cfg!(target_arch = "x86_64"), |d| {
            begin_tracepoints_in(sys, d)
        }),
    }
}

/// Whether tracefs at `dir` has every tracepoint a fault begins at.
fn begin_tracepoints_in(sys: &dyn SystemView, dir: &str) -> bool {
    programs::TRACEPOINTS
        .iter()
        .filter(|(prog, _, _)| programs::BEGIN_TRACEPOINTS.contains(prog))
        .all(|(_, cat, name)| sys.exists(&format!("{dir}/events/{cat}/{name}")))
}

/// Whether the running machine's mounted tracefs has the tracepoints a
/// fault begins at (asked again at attach, once tracefs is mounted).
pub fn begin_tracepoints_mounted() -> bool {
    TRACEFS_DIRS
        .iter()
        .find(|d| LiveSystem.exists(&format!("{d}/events")))
        .is_some_and(|d| begin_tracepoints_in(&LiveSystem, d))
}

impl Capabilities {
    /// The backend `source` asks for on this kernel, or why there is none.
    pub fn choose(&self, source: FaultSource) -> anyhow::Result<BackendChoice> {
        let choice = |backend, reason: String| BackendChoice {
            backend,
            reason,
            kprobes: self.kprobes.clone(),
            tracepoints: self.tracepoints.clone(),
            file_faults_seen: backend == FaultBackend::Kprobe || self.filemap_tracepoint,
        };
        match source {
            FaultSource::Auto | FaultSource::Kprobe if self.kprobes.available => Ok(choice(
                FaultBackend::Kprobe,
                format!("kprobes work: {}", self.kprobes.detail),
            )),
            FaultSource::Kprobe => bail!(
                "--fault-source kprobe: {}; use --fault-source tracepoint",
                self.kprobes.detail
            ),
            FaultSource::Auto | FaultSource::Tracepoint if self.tracepoints.available => {
                let mut reason = match source {
                    FaultSource::Auto => format!(
                        "kprobes do not: {}; tracepoints do: {}",
                        self.kprobes.detail, self.tracepoints.detail
                    ),
                    _ => format!("tracepoints requested: {}", self.tracepoints.detail),
                };
                if !self.filemap_tracepoint {
                    reason.push_str(
                        " (no filemap:mm_filemap_fault: file-backed and swap-in faults are not told apart)",
                    );
                }
                if !self.begin_tracepoints {
                    reason.push_str(PERF_BEGIN_NOTE);
                }
                Ok(choice(FaultBackend::Tracepoint, reason))
            }
            _ => bail!(
                "no fault backend can attach: {}; {}",
                self.kprobes.detail,
                self.tracepoints.detail
            ),
        }
    }

    /// What `inspect` reports: the automatic choice, or none and why.
    pub fn report(&self) -> BackendChoice {
        self.choose(FaultSource::Auto)
            .unwrap_or_else(|e| BackendChoice {
                backend: FaultBackend::None,
                reason: format!("{e:#}"),
                kprobes: self.kprobes.clone(),
                tracepoints: self.tracepoints.clone(),
                file_faults_seen: false,
            })
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

fn kprobe_support(
    sys: &dyn SystemView,
    config: Option<&str>,
) -> (Support, Vec<(&'static str, &'static str)>) {
    let events_file = TRACEFS_DIRS
        .iter()
        .map(|d| format!("{d}/kprobe_events"))
        .find(|p| sys.exists(p));
    let pmu = "/sys/bus/event_source/devices/kprobe";
    let compiled_in = match (&events_file, config_has(config, "CONFIG_KPROBES")) {
        (Some(p), _) => Ok(format!("{p} exists")),
        (None, _) if sys.exists(pmu) => Ok(format!("{pmu} exists")),
        (None, Some(true)) => Ok("the kernel config sets CONFIG_KPROBES".to_owned()),
        (None, Some(false)) => Err("the kernel is built without CONFIG_KPROBES".to_owned()),
        (None, None) => Err(
            "no kprobe_events file in tracefs, no kprobe PMU and no kernel config to check CONFIG_KPROBES"
                .to_owned(),
        ),
    };
    let why = match compiled_in {
        Ok(why) => why,
        Err(why) => {
            return (
                Support {
                    available: false,
                    detail: why,
                },
                Vec::new(),
            );
        }
    };
    let symbols = sys.read("/proc/kallsyms").unwrap_or_default();
    let mut resolved = Vec::new();
    for (prog, candidates, _) in programs::KPROBES {
        match candidates.iter().find(|f| kallsyms_has(&symbols, f)) {
            Some(f) => resolved.push((*prog, *f)),
            None => {
                return (
                    Support {
                        available: false,
                        detail: format!(
                            "{why}, but none of {} is in /proc/kallsyms",
                            candidates.join(", ")
                        ),
                    },
                    Vec::new(),
                );
            }
        }
    }
    let mut names: Vec<&str> = resolved.iter().map(|(_, f)| *f).collect();
    names.dedup();
    (
        Support {
            available: true,
            detail: format!("{why} and {} are in /proc/kallsyms", names.join(", ")),
        },
        resolved,
    )
}

/// Tracepoints the backend cannot do without, as `category/name`.
fn required_tracepoints() -> impl Iterator<Item = String> {
    programs::TRACEPOINTS
        .iter()
        .filter(|(prog, _, _)| {
            *prog != programs::OPTIONAL_TRACEPOINT && !programs::BEGIN_TRACEPOINTS.contains(prog)
        })
        .map(|(_, cat, name)| format!("{cat}/{name}"))
}

fn tracepoint_support(sys: &dyn SystemView, config: Option<&str>) -> Support {
    if let Some(dir) = TRACEFS_DIRS
        .iter()
        .find(|d| sys.exists(&format!("{d}/events")))
    {
        let missing: Vec<String> = required_tracepoints()
            .filter(|t| !sys.exists(&format!("{dir}/events/{t}")))
            .collect();
        return if missing.is_empty() {
            Support {
                available: true,
                detail: format!("tracefs is mounted at {dir} with every tracepoint needed"),
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
        programs::TRACEPOINTS
            .iter()
            .fold(sys, |sys, (_, cat, name)| {
                sys.with(&format!("/sys/kernel/tracing/events/{cat}/{name}/id"), "1")
            })
    }

    const NEW_KERNEL: &str = "\
ffffffff815a6080 T __folio_lock_or_retry
ffffffff815a7400 T filemap_fault
ffffffff81603510 T do_swap_page
ffffffff81657f60 T swap_read_folio
";

    #[test]
    fn no_kprobes_config_picks_tracepoints() {
        // This development machine: CONFIG_KPROBES unset, tracefs mounted.
        let sys = with_tracepoints(FakeSystem::default())
            .with(
                "/boot/config-6.1.0-test",
                "# CONFIG_KPROBES is not set\nCONFIG_TRACEPOINTS=y\n",
            )
            .with("/proc/kallsyms", "ffffffff81603510 T do_swap_page\n");
        let c = detect_with(&sys).report();
        assert_eq!(c.backend, FaultBackend::Tracepoint);
        assert!(c.reason.contains("without CONFIG_KPROBES"), "{}", c.reason);
    }

    #[test]
    fn kprobe_events_and_symbol_pick_kprobes() {
        let sys = with_tracepoints(FakeSystem::default())
            .with("/sys/kernel/tracing/kprobe_events", "")
            .with("/proc/kallsyms", NEW_KERNEL);
        assert_eq!(detect_with(&sys).report().backend, FaultBackend::Kprobe);
    }

    #[test]
    fn config_alone_needs_the_probed_symbol() {
        let sys = with_tracepoints(FakeSystem::default())
            .with("/boot/config-6.1.0-test", "CONFIG_KPROBES=y\n")
            .with("/proc/kallsyms", "ffffffff81603510 T do_other\n");
        let c = detect_with(&sys).report();
        assert_eq!(c.backend, FaultBackend::Tracepoint);
        assert!(c.kprobes.detail.contains("do_swap_page"));
    }

    #[test]
    fn unmounted_tracefs_is_mountable() {
        let sys = FakeSystem::default().with("/proc/filesystems", "nodev\tsysfs\nnodev\ttracefs\n");
        let c = detect_with(&sys).report();
        assert_eq!(c.backend, FaultBackend::Tracepoint);
        assert!(c.tracepoints.detail.contains("mountable"));
    }

    #[test]
    fn nothing_available() {
        let c = detect_with(&FakeSystem::default()).report();
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
        assert!(c.tracepoints.detail.contains("sched:sched_switch"));
        // The fault-begin tracepoints are not required (arm64 has none).
        assert!(!c.tracepoints.detail.contains("exceptions:"));
    }

    #[test]
    fn without_exception_tracepoints_faults_begin_at_the_perf_event() {
        // arm64: no exceptions:page_fault_*.
        let sys = programs::TRACEPOINTS
            .iter()
            .filter(|(p, _, _)| !programs::BEGIN_TRACEPOINTS.contains(p))
            .fold(FakeSystem::default(), |sys, (_, cat, name)| {
                sys.with(&format!("/sys/kernel/tracing/events/{cat}/{name}/id"), "1")
            });
        let c = detect_with(&sys);
        assert!(c.tracepoints.available && !c.begin_tracepoints);
        let choice = c.report();
        assert_eq!(choice.backend, FaultBackend::Tracepoint);
        assert!(
            choice.reason.contains("PAGE_FAULTS perf event"),
            "{}",
            choice.reason
        );
        // x86: both exist, the tracepoints begin faults.
        let x86 = detect_with(&with_tracepoints(FakeSystem::default()));
        assert!(x86.begin_tracepoints);
        assert!(!x86.report().reason.contains("PAGE_FAULTS"));
    }

    #[test]
    fn kprobe_functions_follow_renames() {
        let sys =
            with_tracepoints(FakeSystem::default()).with("/sys/kernel/tracing/kprobe_events", "");
        let fns = detect_with(&sys.with("/proc/kallsyms", NEW_KERNEL)).kprobe_functions;
        assert!(fns.contains(&("fault_kp_swap_read", "swap_read_folio")));
        assert!(fns.contains(&("fault_kp_lock_ret", "__folio_lock_or_retry")));
        let old = NEW_KERNEL
            .replace("swap_read_folio", "swap_readpage")
            .replace("__folio_lock_or_retry", "__lock_page_or_retry");
        let sys = with_tracepoints(FakeSystem::default())
            .with("/sys/kernel/tracing/kprobe_events", "")
            .with("/proc/kallsyms", &old);
        let fns = detect_with(&sys).kprobe_functions;
        assert!(fns.contains(&("fault_kp_swap_read", "swap_readpage")));
        assert!(fns.contains(&("fault_kp_lock_entry", "__lock_page_or_retry")));
    }

    #[test]
    fn auto_prefers_kprobes_and_falls_back_to_tracepoints() {
        let with = with_tracepoints(FakeSystem::default())
            .with("/sys/kernel/tracing/kprobe_events", "")
            .with("/proc/kallsyms", NEW_KERNEL);
        let with = detect_with(&with);
        assert_eq!(
            with.choose(FaultSource::Auto).unwrap().backend,
            FaultBackend::Kprobe
        );
        assert_eq!(
            with.choose(FaultSource::Tracepoint).unwrap().backend,
            FaultBackend::Tracepoint
        );
        assert!(with.choose(FaultSource::Auto).unwrap().file_faults_seen);
        let without = detect_with(
            &with_tracepoints(FakeSystem::default())
                .with("/boot/config-6.1.0-test", "# CONFIG_KPROBES is not set\n"),
        );
        let c = without.choose(FaultSource::Auto).unwrap();
        assert_eq!(c.backend, FaultBackend::Tracepoint);
        assert!(c.reason.contains("CONFIG_KPROBES"));
        let e = without.choose(FaultSource::Kprobe).unwrap_err().to_string();
        assert!(e.contains("--fault-source tracepoint"), "{e}");
        assert!(
            detect_with(&FakeSystem::default())
                .choose(FaultSource::Auto)
                .is_err()
        );
        // 6.1 LTS: no filemap tracepoint, so fault kinds are not told apart.
        let old = FakeSystem::default().with(
            "/sys/kernel/tracing/events/exceptions/page_fault_user/id",
            "1",
        );
        let old = programs::TRACEPOINTS
            .iter()
            .filter(|(p, _, _)| *p != programs::OPTIONAL_TRACEPOINT)
            .fold(old, |sys, (_, cat, name)| {
                sys.with(&format!("/sys/kernel/tracing/events/{cat}/{name}/id"), "1")
            });
        let c = detect_with(&old).choose(FaultSource::Auto).unwrap();
        assert!(
            !c.file_faults_seen && c.reason.contains("not told apart"),
            "{c:?}"
        );
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
