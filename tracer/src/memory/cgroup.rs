//! The memory cgroup of a process (v1 or v2): its limit, high mark, swap
//! limit, the swap it uses now, swappiness and limit events. The figures
//! decide which advice fits (memory.high or swap off for the group, v1's
//! per-group swappiness).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

/// Values at or above this mean "no limit" in cgroup v1 (the kernel prints
/// `PAGE_COUNTER_MAX` pages, 9223372036854771712 with 4 KiB pages).
const V1_UNLIMITED: u64 = 1 << 62;

/// Which cgroup hierarchy holds the process's memory controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    V1,
    V2,
}

/// A limit: a byte count, or `max` (none). Serialized as the number or the
/// string "max", as cgroup v2 writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    Max,
    Bytes(u64),
}

impl Limit {
    /// The byte count, if limited.
    pub fn bytes(self) -> Option<u64> {
        match self {
            Limit::Max => None,
            Limit::Bytes(b) => Some(b),
        }
    }

    /// The tighter of two limits.
    pub fn min(self, other: Limit) -> Limit {
        match (self, other) {
            (Limit::Bytes(a), Limit::Bytes(b)) => Limit::Bytes(a.min(b)),
            (Limit::Bytes(a), Limit::Max) | (Limit::Max, Limit::Bytes(a)) => Limit::Bytes(a),
            (Limit::Max, Limit::Max) => Limit::Max,
        }
    }

    /// A v2 file's value ("max" or bytes).
    fn parse_v2(text: &str) -> Option<Limit> {
        match text.trim() {
            "max" => Some(Limit::Max),
            n => n.parse().ok().map(Limit::Bytes),
        }
    }

    /// A v1 file's value (huge numbers mean none).
    fn from_v1(n: u64) -> Limit {
        if n >= V1_UNLIMITED {
            Limit::Max
        } else {
            Limit::Bytes(n)
        }
    }
}

impl serde::Serialize for Limit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Limit::Max => s.serialize_str("max"),
            Limit::Bytes(b) => s.serialize_u64(*b),
        }
    }
}

/// The memory cgroup of a process and its figures now. Absent figures
/// (`None`) could not be read; `notes` says why.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CgroupMemory {
    pub version: CgroupVersion,
    /// The group as `/proc/PID/cgroup` names it.
    pub path: String,
    /// The directory of its files; `None` when the memory controller is not
    /// mounted or not enabled for it.
    pub dir: Option<PathBuf>,
    /// Memory charged to the group now (v1 `memory.usage_in_bytes`, v2
    /// `memory.current`).
    pub usage_bytes: Option<u64>,
    /// `memory.limit_in_bytes` (v1) or `memory.max` (v2).
    pub limit: Option<Limit>,
    /// The tightest limit of the group and its ancestors.
    pub effective_limit: Option<Limit>,
    /// `memory.high` (v2 only).
    pub high: Option<Limit>,
    /// Swap the group may use: v2 `memory.swap.max`; v1
    /// `memory.memsw.limit_in_bytes - memory.limit_in_bytes`.
    pub swap_limit: Option<Limit>,
    /// Swap the group uses now: v2 `memory.swap.current`; v1
    /// `memory.memsw.usage_in_bytes - memory.usage_in_bytes`.
    pub swap_current_bytes: Option<u64>,
    /// `memory.swappiness` (v1; v2 has none, the host's `vm.swappiness` applies).
    pub swappiness: Option<u64>,
    /// The group's page cache, from `memory.stat`.
    pub page_cache: Option<PageCache>,
    /// Limit events: v2 `memory.events` (high, max, oom, oom_kill), v1
    /// `failcnt` and `memsw_failcnt`.
    pub events: BTreeMap<String, u64>,
    pub notes: Vec<String>,
}

/// A memory cgroup's page cache (the group and its children): what reclaim
/// frees first, unless it is dirty or under writeback (then reclaim waits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PageCache {
    /// v1 `total_cache`, v2 `file`.
    pub bytes: u64,
    /// v1 `total_dirty`, v2 `file_dirty`.
    pub dirty_bytes: u64,
    /// v1 `total_writeback`, v2 `file_writeback`.
    pub writeback_bytes: u64,
}

impl PageCache {
    /// From `memory.stat`'s keys (`cache`, `dirty`, `writeback` with v1's
    /// hierarchical `total_` prefix, or v2's `file` keys).
    fn of(stat: &BTreeMap<String, u64>, version: CgroupVersion) -> Option<PageCache> {
        let key = |v1: &str, v2: &str| match version {
            CgroupVersion::V1 => stat
                .get(&format!("total_{v1}"))
                .or_else(|| stat.get(v1))
                .copied(),
            CgroupVersion::V2 => stat.get(v2).copied(),
        };
        Some(PageCache {
            bytes: key("cache", "file")?,
            dirty_bytes: key("dirty", "file_dirty").unwrap_or(0),
            writeback_bytes: key("writeback", "file_writeback").unwrap_or(0),
        })
    }
}

/// Where the cgroup hierarchies are mounted, from `/proc/self/mountinfo`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mounts {
    /// (mount point, root of the hierarchy it shows) of the v1 memory controller.
    pub v1_memory: Option<(PathBuf, String)>,
    /// The same for the v2 hierarchy.
    pub v2: Option<(PathBuf, String)>,
}

impl Mounts {
    /// Parse `/proc/self/mountinfo`.
    pub fn parse(mountinfo: &str) -> Mounts {
        let mut m = Mounts::default();
        for line in mountinfo.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            let (Some(root), Some(point), Some(fstype)) = (l.get(3), l.get(4), r.first()) else {
                continue;
            };
            let entry = (PathBuf::from(unescape(point)), unescape(root));
            match *fstype {
                "cgroup2" if m.v2.is_none() => m.v2 = Some(entry),
                "cgroup"
                    if m.v1_memory.is_none()
                        && r.get(2)
                            .is_some_and(|o| o.split(',').any(|o| o == "memory")) =>
                {
                    m.v1_memory = Some(entry)
                }
                _ => {}
            }
        }
        m
    }
}

/// mountinfo escapes spaces and the like as `\040`.
fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 4);
        match code.and_then(|c| u8::from_str_radix(c, 8).ok()) {
            Some(b) => {
                out.push(b as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The cgroup of a process in one hierarchy (a line of `/proc/PID/cgroup`).
fn membership(proc_cgroup: &str, v1_memory: bool) -> Option<String> {
    proc_cgroup.lines().find_map(|line| {
        let mut f = line.splitn(3, ':');
        let (_id, controllers, path) = (f.next()?, f.next()?, f.next()?);
        let wanted = if v1_memory {
            controllers.split(',').any(|c| c == "memory")
        } else {
            controllers.is_empty()
        };
        wanted.then(|| path.to_owned())
    })
}

/// Directory of cgroup `path` under a hierarchy mounted at `point` showing
/// `root`; `None` when the group is outside what the mount shows.
fn group_dir(point: &Path, root: &str, path: &str) -> Option<PathBuf> {
    let rel = if root == "/" {
        path
    } else {
        let rest = path.strip_prefix(root)?;
        if !(rest.is_empty() || rest.starts_with('/')) {
            return None;
        }
        rest
    };
    Some(point.join(rel.trim_start_matches('/')))
}

impl CgroupMemory {
    /// The memory cgroup of the process whose `/proc/PID/cgroup` is
    /// `proc_cgroup`, with the hierarchies of `mounts`; files are read by
    /// `read` (so tests can feed captured files). `None` when the process is
    /// in no cgroup at all.
    pub fn from_files(
        proc_cgroup: &str,
        mounts: &Mounts,
        read: &dyn Fn(&Path) -> Option<String>,
    ) -> Option<CgroupMemory> {
        if let (Some(path), Some((point, root))) =
            (membership(proc_cgroup, true), &mounts.v1_memory)
        {
            let dir = group_dir(point, root, &path);
            return Some(read_v1(path, dir, read));
        }
        let path = membership(proc_cgroup, false)?;
        let dir = mounts
            .v2
            .as_ref()
            .and_then(|(point, root)| group_dir(point, root, &path));
        Some(read_v2(path, dir, mounts, read))
    }

    /// Read the memory cgroup of `pid` from this machine.
    pub fn read(pid: u32) -> std::io::Result<Option<CgroupMemory>> {
        let proc_cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
        let mounts = Mounts::parse(&std::fs::read_to_string("/proc/self/mountinfo")?);
        Ok(Self::from_files(&proc_cgroup, &mounts, &|p| {
            std::fs::read_to_string(p).ok()
        }))
    }
}

fn number(read: &dyn Fn(&Path) -> Option<String>, dir: &Path, file: &str) -> Option<u64> {
    read(&dir.join(file))?.trim().parse().ok()
}

/// `key value` lines (memory.stat, memory.events).
fn keyed(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_owned(), v.trim().parse().ok()?))
        })
        .collect()
}

fn empty(version: CgroupVersion, path: String, dir: Option<PathBuf>) -> CgroupMemory {
    CgroupMemory {
        version,
        path,
        dir,
        usage_bytes: None,
        limit: None,
        effective_limit: None,
        high: None,
        swap_limit: None,
        swap_current_bytes: None,
        swappiness: None,
        page_cache: None,
        events: BTreeMap::new(),
        notes: Vec::new(),
    }
}

fn read_v1(
    path: String,
    dir: Option<PathBuf>,
    read: &dyn Fn(&Path) -> Option<String>,
) -> CgroupMemory {
    let mut c = empty(CgroupVersion::V1, path, dir.clone());
    let Some(dir) = dir.filter(|d| read(&d.join("memory.usage_in_bytes")).is_some()) else {
        c.dir = None;
        c.notes.push(
            "the group's v1 memory files cannot be read (outside the mounted hierarchy)".into(),
        );
        return c;
    };
    let n = |f: &str| number(read, &dir, f);
    c.usage_bytes = n("memory.usage_in_bytes");
    let limit = n("memory.limit_in_bytes").map(Limit::from_v1);
    c.limit = limit;
    let stat = read(&dir.join("memory.stat"))
        .map(|s| keyed(&s))
        .unwrap_or_default();
    c.effective_limit = stat
        .get("hierarchical_memory_limit")
        .map(|&v| Limit::from_v1(v))
        .or(limit);
    c.page_cache = PageCache::of(&stat, CgroupVersion::V1);
    c.swappiness = n("memory.swappiness");
    match (n("memory.memsw.limit_in_bytes"), n("memory.memsw.usage_in_bytes")) {
        (Some(memsw_limit), Some(memsw_usage)) => {
            c.swap_limit = Some(match (Limit::from_v1(memsw_limit), limit) {
                (Limit::Max, _) => Limit::Max,
                (Limit::Bytes(m), Some(Limit::Bytes(l))) => Limit::Bytes(m.saturating_sub(l)),
                (Limit::Bytes(m), _) => Limit::Bytes(m),
            });
            c.swap_current_bytes = c.usage_bytes.map(|u| memsw_usage.saturating_sub(u));
        }
        _ => c.notes.push(
            "no memory.memsw.* files: the kernel does not account swap per cgroup (boot with swapaccount=1)"
                .into(),
        ),
    }
    for (file, key) in [
        ("memory.failcnt", "failcnt"),
        ("memory.memsw.failcnt", "memsw_failcnt"),
    ] {
        if let Some(v) = n(file) {
            c.events.insert(key.into(), v);
        }
    }
    if let Some(oom) = read(&dir.join("memory.oom_control"))
        && let Some(&kills) = keyed(&oom).get("oom_kill")
    {
        c.events.insert("oom_kill".into(), kills);
    }
    c
}

fn read_v2(
    path: String,
    dir: Option<PathBuf>,
    mounts: &Mounts,
    read: &dyn Fn(&Path) -> Option<String>,
) -> CgroupMemory {
    let mut c = empty(CgroupVersion::V2, path, dir.clone());
    let Some(dir) = dir else {
        c.notes
            .push("the cgroup v2 hierarchy is not mounted where gostw can read it".into());
        return c;
    };
    if read(&dir.join("memory.current")).is_none() {
        c.dir = None;
        c.notes.push(if c.path == "/" {
            "the process is in the root cgroup: no group limit applies, only the host's memory".into()
        } else {
            "the memory controller is not enabled for this cgroup (no memory.current): no group limit applies".into()
        });
        return c;
    }
    let limit = |dir: &Path, f: &str| read(&dir.join(f)).and_then(|t| Limit::parse_v2(&t));
    c.usage_bytes = number(read, &dir, "memory.current");
    c.limit = limit(&dir, "memory.max");
    c.high = limit(&dir, "memory.high");
    c.swap_limit = limit(&dir, "memory.swap.max");
    c.swap_current_bytes = number(read, &dir, "memory.swap.current");
    if c.swap_limit.is_none() {
        c.notes
            .push("no memory.swap.* files: swap is not accounted per cgroup".into());
    }
    c.events = read(&dir.join("memory.events"))
        .map(|s| keyed(&s))
        .unwrap_or_default();
    c.page_cache =
        read(&dir.join("memory.stat")).and_then(|s| PageCache::of(&keyed(&s), CgroupVersion::V2));
    // The tightest memory.max up to the mount's root.
    let top = mounts
        .v2
        .as_ref()
        .map(|(p, _)| p.clone())
        .unwrap_or_default();
    let mut effective = c.limit;
    let mut d = dir.parent();
    while let Some(p) = d.filter(|p| p.starts_with(&top) && *p != top) {
        if let Some(l) = limit(p, "memory.max") {
            effective = Some(effective.map_or(l, |e| e.min(l)));
        }
        d = p.parent();
    }
    c.effective_limit = effective;
    c
}

#[cfg(test)]
#[path = "cgroup_tests.rs"]
mod tests;
