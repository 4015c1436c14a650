//! Cgroup parsing on captured files: v1 as this machine's kernel (6.18, v1
//! memory controller mounted) writes them, v2 in the formats of the kernel's
//! cgroup-v2 interface files, as Debian's 6.1 writes them in the VM suite
//! (these machines do not mount v2 memory; the VM's memory tests read v2
//! for real).

use std::{collections::HashMap, path::Path};

use super::*;

/// A fake file tree.
fn files(entries: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
    let map: HashMap<String, String> = entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |p: &Path| map.get(p.to_str()?).cloned()
}

/// This machine's mountinfo (cgroup part): v1 controllers, v2 unified.
const HYBRID_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

/// `/proc/PID/cgroup` of a process in a v1 memory group made here.
const V1_PROC_CGROUP: &str = "\
9:name=systemd:/
8:pids:/
4:memory:/gostw-capture-11895
3:cpuset:/
1:cpu:/
0::/
";

const GIB: &str = "1073741824\n";
const V1_DIR: &str = "/sys/fs/cgroup/memory/gostw-capture-11895";

fn v1_files(
    usage: &str,
    limit: &str,
    memsw_usage: &str,
    memsw_limit: &str,
) -> Vec<(String, String)> {
    [
        ("memory.usage_in_bytes", usage),
        ("memory.limit_in_bytes", limit),
        ("memory.memsw.limit_in_bytes", memsw_limit),
        ("memory.memsw.usage_in_bytes", memsw_usage),
        ("memory.swappiness", "10\n"),
        ("memory.failcnt", "0\n"),
        ("memory.memsw.failcnt", "0\n"),
        (
            "memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
        ),
        (
            "memory.stat",
            "cache 0\nrss 0\nswap 0\nhierarchical_memory_limit 1073741824\nhierarchical_memsw_limit 2147483648\ntotal_swap 0\n",
        ),
    ]
    .iter()
    .map(|(f, v)| (format!("{V1_DIR}/{f}"), (*v).to_owned()))
    .collect()
}

fn read_with(
    proc_cgroup: &str,
    mountinfo: &str,
    entries: &[(String, String)],
) -> Option<CgroupMemory> {
    let refs: Vec<(&str, &str)> = entries
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    CgroupMemory::from_files(proc_cgroup, &Mounts::parse(mountinfo), &files(&refs))
}

#[test]
fn mountinfo_finds_the_v1_memory_controller_and_v2() {
    let m = Mounts::parse(HYBRID_MOUNTINFO);
    assert_eq!(
        m.v1_memory,
        Some(("/sys/fs/cgroup/memory".into(), "/".into()))
    );
    assert_eq!(m.v2, Some(("/sys/fs/cgroup/unified".into(), "/".into())));
    let escaped = "50 1 0:40 /a\\040b /mnt/c\\040g rw - cgroup2 cgroup2 rw\n";
    assert_eq!(
        Mounts::parse(escaped).v2,
        Some(("/mnt/c g".into(), "/a b".into()))
    );
}

#[test]
fn v1_group_limits_swap_and_swappiness() {
    // 300 MiB charged, 50 MiB of it in swap.
    let entries = v1_files("314572800\n", GIB, "367001600\n", "2147483648\n");
    let c = read_with(V1_PROC_CGROUP, HYBRID_MOUNTINFO, &entries).unwrap();
    assert_eq!(c.version, CgroupVersion::V1);
    assert_eq!(c.path, "/gostw-capture-11895");
    assert_eq!(c.dir.as_deref(), Some(Path::new(V1_DIR)));
    assert_eq!(c.usage_bytes, Some(300 << 20));
    assert_eq!(c.limit, Some(Limit::Bytes(1 << 30)));
    assert_eq!(c.effective_limit, Some(Limit::Bytes(1 << 30)));
    // memsw is memory + swap: 2 GiB - 1 GiB of swap allowed.
    assert_eq!(c.swap_limit, Some(Limit::Bytes(1 << 30)));
    assert_eq!(c.swap_current_bytes, Some(50 << 20));
    assert_eq!(c.swappiness, Some(10));
    assert_eq!(c.high, None);
    assert_eq!(c.events.get("oom_kill"), Some(&0));
    assert!(c.notes.is_empty(), "{:?}", c.notes);
}

#[test]
fn v1_unlimited_and_swap_off() {
    let huge = "9223372036854771712\n";
    let entries = v1_files("4096\n", huge, "4096\n", huge);
    let c = read_with(V1_PROC_CGROUP, HYBRID_MOUNTINFO, &entries).unwrap();
    assert_eq!(c.limit, Some(Limit::Max));
    assert_eq!(c.swap_limit, Some(Limit::Max));
    // memsw limit equal to the memory limit: no swap for the group.
    let entries = v1_files("4096\n", GIB, "4096\n", GIB);
    let c = read_with(V1_PROC_CGROUP, HYBRID_MOUNTINFO, &entries).unwrap();
    assert_eq!(c.swap_limit, Some(Limit::Bytes(0)));
}

#[test]
fn v1_without_swap_accounting_says_so() {
    let mut entries = v1_files("4096\n", GIB, "", "");
    entries.retain(|(f, _)| !f.contains("memsw"));
    let c = read_with(V1_PROC_CGROUP, HYBRID_MOUNTINFO, &entries).unwrap();
    assert_eq!((c.swap_limit, c.swap_current_bytes), (None, None));
    assert!(c.notes[0].contains("swapaccount"), "{:?}", c.notes);
}

const V2_MOUNTINFO: &str = "25 1 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
const V2_PROC_CGROUP: &str = "0::/system.slice/api.service\n";

fn v2_entries(extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let dir = "/sys/fs/cgroup/system.slice/api.service";
    let mut v: Vec<(String, String)> = [
        ("memory.current", "524288000\n"),
        ("memory.max", "1073741824\n"),
        ("memory.high", "max\n"),
        ("memory.swap.max", "max\n"),
        ("memory.swap.current", "83886080\n"),
        (
            "memory.events",
            "low 0\nhigh 0\nmax 17\noom 0\noom_kill 0\noom_group_kill 0\n",
        ),
    ]
    .iter()
    .map(|(f, v)| (format!("{dir}/{f}"), (*v).to_owned()))
    .collect();
    v.extend(
        extra
            .iter()
            .map(|(f, c)| ((*f).to_owned(), (*c).to_owned())),
    );
    v
}

#[test]
fn v2_group_limits_high_swap_and_events() {
    let entries = v2_entries(&[("/sys/fs/cgroup/system.slice/memory.max", "805306368\n")]);
    let c = read_with(V2_PROC_CGROUP, V2_MOUNTINFO, &entries).unwrap();
    assert_eq!(c.version, CgroupVersion::V2);
    assert_eq!(
        c.dir.as_deref(),
        Some(Path::new("/sys/fs/cgroup/system.slice/api.service"))
    );
    assert_eq!(c.usage_bytes, Some(500 << 20));
    assert_eq!(c.limit, Some(Limit::Bytes(1 << 30)));
    // The parent's 768 MiB is tighter.
    assert_eq!(c.effective_limit, Some(Limit::Bytes(768 << 20)));
    assert_eq!(c.high, Some(Limit::Max));
    assert_eq!(c.swap_limit, Some(Limit::Max));
    assert_eq!(c.swap_current_bytes, Some(80 << 20));
    assert_eq!(c.swappiness, None);
    assert_eq!(c.events.get("max"), Some(&17));
    assert_eq!(
        serde_json::to_value(&c).unwrap()["high"],
        serde_json::json!("max")
    );
}

#[test]
fn v2_without_the_memory_controller_or_in_the_root() {
    // This machine: v2 mounted without the memory controller, and no v1
    // memory line for the process.
    let c = read_with("0::/user.slice\n", HYBRID_MOUNTINFO, &[]).unwrap();
    assert_eq!(c.version, CgroupVersion::V2);
    assert_eq!(c.dir, None);
    assert_eq!(c.limit, None);
    assert!(c.notes[0].contains("not enabled"), "{:?}", c.notes);
    let c = read_with("0::/\n", V2_MOUNTINFO, &[]).unwrap();
    assert!(c.notes[0].contains("root cgroup"), "{:?}", c.notes);
    // No cgroup line at all.
    assert_eq!(read_with("", V2_MOUNTINFO, &[]), None);
}

#[test]
fn a_group_outside_the_mounted_root_is_not_guessed() {
    let mountinfo = "25 1 0:23 /kubepods /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
    let c = read_with("0::/system.slice/x\n", mountinfo, &[]).unwrap();
    assert_eq!(c.dir, None);
    let dir = group_dir(Path::new("/sys/fs/cgroup"), "/kubepods", "/kubepods/pod1");
    assert_eq!(dir.as_deref(), Some(Path::new("/sys/fs/cgroup/pod1")));
    assert_eq!(
        group_dir(Path::new("/sys/fs/cgroup"), "/kube", "/kubepods/pod1"),
        None
    );
}

#[test]
fn page_cache_from_memory_stat_the_group_and_its_children() {
    // v1: the hierarchical `total_` figures, not the group's own.
    let mut entries = v1_files("4096\n", GIB, "4096\n", GIB);
    entries.retain(|(f, _)| !f.ends_with("memory.stat"));
    entries.push((
        format!("{V1_DIR}/memory.stat"),
        "cache 1048576\ndirty 4096\nwriteback 0\nrss 0\n\
         total_cache 52428800\ntotal_dirty 31457280\ntotal_writeback 8388608\n"
            .into(),
    ));
    let c = read_with(V1_PROC_CGROUP, HYBRID_MOUNTINFO, &entries).unwrap();
    assert_eq!(
        c.page_cache,
        Some(PageCache {
            bytes: 50 << 20,
            dirty_bytes: 30 << 20,
            writeback_bytes: 8 << 20,
        })
    );
    // v2 names them `file*` (and they are hierarchical already).
    let stat = "anon 1000\nfile 20971520\nkernel 0\nfile_dirty 4194304\nfile_writeback 1048576\n";
    let entries = v2_entries(&[("/sys/fs/cgroup/system.slice/api.service/memory.stat", stat)]);
    let c = read_with(V2_PROC_CGROUP, V2_MOUNTINFO, &entries).unwrap();
    assert_eq!(
        c.page_cache,
        Some(PageCache {
            bytes: 20 << 20,
            dirty_bytes: 4 << 20,
            writeback_bytes: 1 << 20,
        })
    );
    // No memory.stat: unknown, not zero.
    let c = read_with(V2_PROC_CGROUP, V2_MOUNTINFO, &v2_entries(&[])).unwrap();
    assert_eq!(c.page_cache, None);
}
