//! Why the kernel said no, for the two refusals an SRE meets first: reading
//! another process (`/proc/PID/exe`, `/proc/PID/root`, `/proc/PID/mem`) and
//! loading eBPF programs. "Permission denied" even as root is common in
//! containers and sandboxes; the message says which check failed, from what
//! `/proc` shows of gostw and of the target.
//!
//! Reading `/proc/PID/exe` is a ptrace access check in read mode
//! (`PTRACE_MODE_READ_FSCREDS`, kernel/ptrace.c and commoncap.c): the caller
//! passes if its filesystem uid/gid equal all of the target's, else needs
//! `CAP_SYS_PTRACE` in the target's user namespace; a non-dumpable target
//! needs that capability too; and the target's permitted capabilities must
//! be a subset of the caller's effective ones (same user namespace), else
//! again `CAP_SYS_PTRACE` over the target's namespace. Then security modules
//! (AppArmor, SELinux, Landlock) may refuse. Yama's `ptrace_scope` limits
//! ptrace attach only, not this read, so it is not blamed.
//!
//! `bpf()` needs `CAP_BPF` (program loads, 5.8+) plus `CAP_PERFMON`
//! (tracing programs, perf events), or `CAP_SYS_ADMIN`, all in the initial
//! user namespace; a seccomp filter (container runtimes' default profiles)
//! answers `EPERM` before any of that; kernel lockdown forbids the helpers
//! that read kernel memory.
//!
//! The parsers are pure and unit-tested on captured `/proc` text; the two
//! `*_denied` functions read the live files.

use std::fs;

/// Capabilities gostw's checks name (linux/capability.h).
pub const CAP_SYS_PTRACE: u32 = 19;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_SYS_RESOURCE: u32 = 24;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// Every capability's name, by number.
const CAP_NAMES: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// A capability set (`CapEff:` and the like: a hex mask).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Caps(pub u64);

impl Caps {
    /// Does the set hold capability `cap`?
    pub fn has(self, cap: u32) -> bool {
        cap < 64 && self.0 & (1 << cap) != 0
    }

    /// The names of the capabilities in `self` that `other` lacks.
    pub fn missing_from(self, other: Caps) -> Vec<String> {
        names(self.0 & !other.0)
    }
}

/// Names of the capabilities in `mask` ("cap 45" past the known ones).
fn names(mask: u64) -> Vec<String> {
    (0..64)
        .filter(|b| mask & (1 << b) != 0)
        .map(|b| {
            CAP_NAMES
                .get(b)
                .map_or_else(|| format!("cap {b}"), |n| (*n).to_owned())
        })
        .collect()
}

/// The fields of `/proc/PID/status` the checks use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// Real, effective, saved, filesystem.
    pub uid: [u32; 4],
    pub gid: [u32; 4],
    pub cap_eff: Caps,
    pub cap_prm: Caps,
    pub cap_bnd: Caps,
    /// 0 none, 1 strict, 2 filter (`Seccomp:`).
    pub seccomp: u32,
    pub seccomp_filters: u32,
    /// The pid in each pid namespace from the one of this `/proc` down.
    pub nspid: Vec<u32>,
}

impl Status {
    /// Parse the text of `/proc/PID/status`; `None` without `Uid:`.
    pub fn parse(text: &str) -> Option<Status> {
        let mut s = Status::default();
        let mut have_uid = false;
        for line in text.lines() {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            let ids = |v: &str| {
                let mut out = [0u32; 4];
                for (o, w) in out.iter_mut().zip(v.split_whitespace()) {
                    *o = w.parse().unwrap_or(u32::MAX);
                }
                out
            };
            let caps = |v: &str| Caps(u64::from_str_radix(v, 16).unwrap_or(0));
            match key {
                "Uid" => {
                    s.uid = ids(value);
                    have_uid = true;
                }
                "Gid" => s.gid = ids(value),
                "CapEff" => s.cap_eff = caps(value),
                "CapPrm" => s.cap_prm = caps(value),
                "CapBnd" => s.cap_bnd = caps(value),
                "Seccomp" => s.seccomp = value.parse().unwrap_or(0),
                "Seccomp_filters" => s.seccomp_filters = value.parse().unwrap_or(0),
                "NSpid" => {
                    s.nspid = value
                        .split_whitespace()
                        .filter_map(|p| p.parse().ok())
                        .collect()
                }
                _ => {}
            }
        }
        have_uid.then_some(s)
    }
}

/// One line of a `uid_map`: `inside outside count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdRange {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

/// Parse `/proc/PID/uid_map` (or `gid_map`).
pub fn parse_id_map(text: &str) -> Vec<IdRange> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace().map(|w| w.parse::<u32>().ok());
            Some(IdRange {
                inside: f.next()??,
                outside: f.next()??,
                count: f.next()??,
            })
        })
        .collect()
}

/// Is this the initial user namespace's map (`0 0 4294967295`)? A child
/// namespace can copy it, but a sandbox that maps root to another uid shows
/// here.
pub fn is_initial_map(map: &[IdRange]) -> bool {
    matches!(
        map,
        [IdRange {
            inside: 0,
            outside: 0,
            count: u32::MAX
        }]
    )
}

/// The uid `/proc` shows for an id not mapped into the reader's namespace.
const OVERFLOW_UID: u32 = 65534;

/// What was known when reading process `pid` was refused.
#[derive(Clone, Debug, Default)]
pub struct ProcAccess {
    pub pid: u32,
    /// gostw's own status and uid_map.
    pub me: Status,
    pub my_uid_map: Vec<IdRange>,
    /// The target's status (world-readable), if it could be read.
    pub target: Option<Status>,
    /// Owner of `/proc/PID`: root (not the process's uid) when the process
    /// is not dumpable.
    pub proc_dir_uid: Option<u32>,
}

/// Why reading process `pid`'s `/proc` files was refused, in words.
pub fn explain_proc_access(f: &ProcAccess) -> String {
    let pid = f.pid;
    let mut why: Vec<String> = Vec::new();
    let ptrace = f.me.cap_eff.has(CAP_SYS_PTRACE);
    let in_userns = !f.my_uid_map.is_empty() && !is_initial_map(&f.my_uid_map);
    if in_userns {
        let map: Vec<String> = f
            .my_uid_map
            .iter()
            .map(|r| format!("{} {} {}", r.inside, r.outside, r.count))
            .collect();
        why.push(format!(
            "gostw runs in a user namespace (uid_map {}): its uid {} and capabilities count \
             only for processes of that namespace",
            map.join(", "),
            f.me.uid[1]
        ));
    }
    if !ptrace {
        why.push(format!(
            "gostw lacks CAP_SYS_PTRACE (CapEff {:016x}), which reading a process of another \
             user, a non-dumpable one, or one with capabilities gostw lacks needs",
            f.me.cap_eff.0
        ));
    }
    let mut kernel_checks_pass = ptrace && !in_userns;
    if let Some(t) = &f.target {
        if t.uid.contains(&OVERFLOW_UID) && f.me.uid[1] != OVERFLOW_UID {
            why.push(format!(
                "pid {pid} runs as a user gostw's namespace does not map (uid {}): it belongs \
                 to another user namespace, where gostw's capabilities do not count",
                OVERFLOW_UID
            ));
            kernel_checks_pass = false;
        } else {
            let fsuid = f.me.uid[3];
            let fsgid = f.me.gid[3];
            let same_ids =
                t.uid[..3].iter().all(|&u| u == fsuid) && t.gid[..3].iter().all(|&g| g == fsgid);
            if !same_ids && !ptrace {
                why.push(format!(
                    "pid {pid} runs as uid {} gid {} and gostw as uid {fsuid} gid {fsgid}",
                    t.uid[1], t.gid[1]
                ));
            }
        }
        let lacking = t.cap_prm.missing_from(f.me.cap_eff);
        if !lacking.is_empty() {
            let bounding = lacking.iter().all(|n| {
                CAP_NAMES
                    .iter()
                    .position(|c| c == n)
                    .is_some_and(|b| !f.me.cap_bnd.has(b as u32))
            });
            why.push(format!(
                "pid {pid} holds capabilities gostw lacks ({}{}): the kernel then requires \
                 CAP_SYS_PTRACE in pid {pid}'s user namespace{}",
                lacking.join(", "),
                if bounding {
                    ", which gostw's bounding set drops"
                } else {
                    ""
                },
                if ptrace && !in_userns {
                    ", which gostw has"
                } else {
                    ""
                }
            ));
        }
        if let Some(owner) = f.proc_dir_uid
            && owner == 0
            && t.uid[1] != 0
        {
            why.push(format!(
                "pid {pid} is not dumpable (/proc/{pid} belongs to root, the process to uid {}: \
                 prctl(PR_SET_DUMPABLE, 0) or a setuid exec), which needs CAP_SYS_PTRACE",
                t.uid[1]
            ));
        }
        if t.nspid.len() > 1 {
            why.push(format!(
                "pid {pid} is pid {} in a nested pid namespace (a container)",
                t.nspid.last().copied().unwrap_or(pid)
            ));
        }
    }
    if kernel_checks_pass {
        why.push(
            "gostw has CAP_SYS_PTRACE in the initial user namespace, which passes the kernel's \
             own checks: a security module (AppArmor, SELinux, Landlock) or the sandbox gostw \
             runs in refused it"
                .into(),
        );
    }
    format!(
        "permission to read pid {pid} was denied: {}",
        why.join("; ")
    )
}

/// `explain_proc_access` for process `pid`, from the live `/proc`.
pub fn proc_access_denied(pid: u32) -> String {
    use std::os::unix::fs::MetadataExt as _;
    let me = fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| Status::parse(&t))
        .unwrap_or_default();
    explain_proc_access(&ProcAccess {
        pid,
        me,
        my_uid_map: fs::read_to_string("/proc/self/uid_map")
            .map(|t| parse_id_map(&t))
            .unwrap_or_default(),
        target: fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|t| Status::parse(&t)),
        proc_dir_uid: fs::metadata(format!("/proc/{pid}")).ok().map(|m| m.uid()),
    })
}

/// What was known when `bpf()` was refused.
#[derive(Clone, Debug, Default)]
pub struct BpfAccess {
    pub me: Status,
    pub my_uid_map: Vec<IdRange>,
    /// `kernel.unprivileged_bpf_disabled`.
    pub unprivileged_bpf_disabled: Option<u32>,
    /// `/sys/kernel/security/lockdown`, e.g. "none [integrity] confidentiality".
    pub lockdown: Option<String>,
}

/// Why loading eBPF programs was refused, in words.
pub fn explain_bpf_access(f: &BpfAccess) -> String {
    let mut why: Vec<String> = Vec::new();
    if f.me.seccomp == 2 {
        why.push(format!(
            "a seccomp filter is installed on gostw ({} filter{}): container runtimes' default \
             profiles refuse bpf() and perf_event_open() with EPERM; run it with a profile that \
             allows them",
            f.me.seccomp_filters,
            if f.me.seccomp_filters == 1 { "" } else { "s" }
        ));
    }
    if !f.my_uid_map.is_empty() && !is_initial_map(&f.my_uid_map) {
        why.push(
            "gostw runs in a user namespace: CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN count for \
             bpf() only in the initial user namespace"
                .into(),
        );
    }
    let caps = f.me.cap_eff;
    let admin = caps.has(CAP_SYS_ADMIN);
    let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|&(c, _)| !caps.has(c))
        .map(|(_, n)| n)
        .collect();
    if !admin && !missing.is_empty() {
        why.push(format!(
            "gostw lacks {} and CAP_SYS_ADMIN (CapEff {:016x})",
            missing.join(" and "),
            caps.0
        ));
        if let Some(n) = f.unprivileged_bpf_disabled.filter(|&n| n != 0) {
            why.push(format!(
                "kernel.unprivileged_bpf_disabled is {n}: bpf() without CAP_BPF is refused"
            ));
        }
    }
    if let Some(mode) = f
        .lockdown
        .as_deref()
        .and_then(|l| l.split_whitespace().find(|w| w.starts_with('[')))
        .map(|w| w.trim_matches(['[', ']']))
        .filter(|m| *m != "none")
    {
        why.push(format!(
            "the kernel is locked down ({mode}): eBPF helpers that read kernel memory are refused"
        ));
    }
    if why.is_empty() {
        why.push(
            "gostw has CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN in the initial user namespace and \
             no seccomp filter: a security module (SELinux, AppArmor, Landlock) or the sandbox \
             gostw runs in refused it"
                .into(),
        );
    }
    format!("the kernel refused bpf(): {}", why.join("; "))
}

/// `explain_bpf_access` from the live `/proc` and `/sys`.
pub fn bpf_denied() -> String {
    explain_bpf_access(&BpfAccess {
        me: fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|t| Status::parse(&t))
            .unwrap_or_default(),
        my_uid_map: fs::read_to_string("/proc/self/uid_map")
            .map(|t| parse_id_map(&t))
            .unwrap_or_default(),
        unprivileged_bpf_disabled: fs::read_to_string("/proc/sys/kernel/unprivileged_bpf_disabled")
            .ok()
            .and_then(|t| t.trim().parse().ok()),
        lockdown: fs::read_to_string("/sys/kernel/security/lockdown").ok(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// gostw as root in this sandbox: CAP_SYS_RESOURCE dropped from the
    /// bounding set, initial user namespace.
    const SANDBOX_ROOT: &str = "Name:\tgostw\nUmask:\t0022\nState:\tR (running)\nTgid:\t28758\n\
        NSpid:\t28758\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nCapInh:\t0000000000000000\n\
        CapPrm:\t000001fffeffffff\nCapEff:\t000001fffeffffff\nCapBnd:\t000001fffeffffff\n\
        CapAmb:\t0000000000000000\nNoNewPrivs:\t0\nSeccomp:\t0\nSeccomp_filters:\t0\n";
    /// The sandbox's pid 1 (all capabilities).
    const SANDBOX_INIT: &str = "Name:\tprocess_api\nNSpid:\t1\nUid:\t0\t0\t0\t0\n\
        Gid:\t0\t0\t0\t0\nCapPrm:\t000001ffffffffff\nCapEff:\t000001ffffffffff\n\
        CapBnd:\t000001ffffffffff\nSeccomp:\t0\n";
    /// Root in a rootless container: a user namespace, Docker's seccomp
    /// profile, the default container capabilities.
    const CONTAINER_ROOT: &str = "Name:\tgostw\nNSpid:\t4242\t7\nUid:\t0\t0\t0\t0\n\
        Gid:\t0\t0\t0\t0\nCapPrm:\t00000000a80425fb\nCapEff:\t00000000a80425fb\n\
        CapBnd:\t00000000a80425fb\nNoNewPrivs:\t0\nSeccomp:\t2\nSeccomp_filters:\t1\n";
    /// A host process seen from inside that namespace: unmapped ids.
    const HOST_PROCESS: &str = "Name:\tsystemd\nNSpid:\t1\nUid:\t65534\t65534\t65534\t65534\n\
        Gid:\t65534\t65534\t65534\t65534\nCapPrm:\t000001ffffffffff\n\
        CapEff:\t000001ffffffffff\n";
    const INITIAL_MAP: &str = "         0          0 4294967295\n";
    const ROOTLESS_MAP: &str = "         0     100000      65536\n";

    fn status(t: &str) -> Status {
        Status::parse(t).unwrap()
    }

    #[test]
    fn status_and_maps_parse() {
        let s = status(SANDBOX_ROOT);
        assert_eq!(s.uid, [0; 4]);
        assert!(s.cap_eff.has(CAP_SYS_PTRACE) && !s.cap_eff.has(CAP_SYS_RESOURCE));
        assert!(s.cap_eff.has(CAP_BPF) && s.cap_eff.has(CAP_PERFMON));
        assert_eq!(s.nspid, [28758]);
        assert_eq!(status(CONTAINER_ROOT).nspid, [4242, 7]);
        assert_eq!(
            (
                status(CONTAINER_ROOT).seccomp,
                status(CONTAINER_ROOT).seccomp_filters
            ),
            (2, 1)
        );
        assert!(is_initial_map(&parse_id_map(INITIAL_MAP)));
        let rootless = parse_id_map(ROOTLESS_MAP);
        assert_eq!(
            rootless,
            [IdRange {
                inside: 0,
                outside: 100000,
                count: 65536
            }]
        );
        assert!(!is_initial_map(&rootless));
        assert_eq!(
            status(SANDBOX_INIT).cap_prm.missing_from(s.cap_eff),
            ["CAP_SYS_RESOURCE"]
        );
        assert_eq!(Status::parse("garbage"), None);
    }

    #[test]
    fn root_in_this_sandbox_is_refused_by_something_past_the_kernels_checks() {
        let why = explain_proc_access(&ProcAccess {
            pid: 1,
            me: status(SANDBOX_ROOT),
            my_uid_map: parse_id_map(INITIAL_MAP),
            target: Some(status(SANDBOX_INIT)),
            proc_dir_uid: Some(0),
        });
        assert!(why.contains("pid 1 holds capabilities gostw lacks (CAP_SYS_RESOURCE, which gostw's bounding set drops)"), "{why}");
        assert!(why.contains("which gostw has"), "{why}");
        assert!(why.contains("a security module"), "{why}");
        assert!(!why.contains("needs root"), "{why}");
        assert!(!why.contains("user namespace (uid_map"), "{why}");
    }

    #[test]
    fn root_in_a_user_namespace_is_told_so() {
        let why = explain_proc_access(&ProcAccess {
            pid: 1,
            me: status(CONTAINER_ROOT),
            my_uid_map: parse_id_map(ROOTLESS_MAP),
            target: Some(status(HOST_PROCESS)),
            proc_dir_uid: Some(65534),
        });
        assert!(
            why.contains("user namespace (uid_map 0 100000 65536)"),
            "{why}"
        );
        assert!(why.contains("does not map (uid 65534)"), "{why}");
        assert!(why.contains("lacks CAP_SYS_PTRACE"), "{why}");
        assert!(!why.contains("security module"), "{why}");
    }

    #[test]
    fn another_users_non_dumpable_process() {
        let mut me = status(SANDBOX_ROOT);
        me.uid = [1000; 4];
        me.gid = [1000; 4];
        me.cap_eff = Caps(0);
        let mut target = status(SANDBOX_INIT);
        target.uid = [33; 4];
        target.gid = [33; 4];
        target.cap_prm = Caps(0);
        let why = explain_proc_access(&ProcAccess {
            pid: 77,
            me,
            my_uid_map: parse_id_map(INITIAL_MAP),
            target: Some(target),
            proc_dir_uid: Some(0),
        });
        assert!(
            why.contains("pid 77 runs as uid 33 gid 33 and gostw as uid 1000 gid 1000"),
            "{why}"
        );
        assert!(why.contains("not dumpable"), "{why}");
        assert!(why.contains("lacks CAP_SYS_PTRACE"), "{why}");
    }

    #[test]
    fn bpf_refusals_name_seccomp_namespaces_capabilities_and_lockdown() {
        let why = explain_bpf_access(&BpfAccess {
            me: status(CONTAINER_ROOT),
            my_uid_map: parse_id_map(ROOTLESS_MAP),
            unprivileged_bpf_disabled: Some(2),
            lockdown: Some("none [integrity] confidentiality\n".into()),
        });
        for want in [
            "seccomp filter is installed on gostw (1 filter)",
            "only in the initial user namespace",
            "lacks CAP_BPF and CAP_PERFMON and CAP_SYS_ADMIN",
            "unprivileged_bpf_disabled is 2",
            "locked down (integrity)",
        ] {
            assert!(why.contains(want), "{want:?} missing: {why}");
        }
        // Root with every capability that bpf() asks for: not blamed on them.
        let why = explain_bpf_access(&BpfAccess {
            me: status(SANDBOX_ROOT),
            my_uid_map: parse_id_map(INITIAL_MAP),
            unprivileged_bpf_disabled: Some(2),
            lockdown: Some("[none] integrity confidentiality\n".into()),
        });
        assert!(why.contains("a security module"), "{why}");
        assert!(!why.contains("lacks") && !why.contains("locked"), "{why}");
    }
}
