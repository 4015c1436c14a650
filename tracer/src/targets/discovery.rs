//! Finding processes: a diff of `/proc` against the previous poll. The I/O is
//! behind `ProcSource`, so the diff logic runs in unit tests on snapshots.

use std::{
    collections::HashMap,
    fs, io,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use regex::Regex;

pub use crate::image::ExeId;
use crate::model::labels::ContainerNames;

/// What the agent reads about a process. Every call may fail because the
/// process exited in between; callers treat that as "gone".
pub trait ProcSource {
    /// Every process id now.
    fn pids(&self) -> io::Result<Vec<u32>>;
    /// Identity of the file `/proc/PID/exe` points at (also across mount
    /// namespaces: the kernel resolves the link in the process's own root).
    fn exe_id(&self, pid: u32) -> io::Result<ExeId>;
    /// The executable's path as the process sees it.
    fn exe_path(&self, pid: u32) -> io::Result<PathBuf>;
    /// The command name (`/proc/PID/comm`).
    fn comm(&self, pid: u32) -> io::Result<String>;
    /// `/proc/PID/cgroup`.
    fn cgroup(&self, pid: u32) -> io::Result<String>;
    /// Start time in clock ticks since boot (`/proc/PID/stat` field 22): a
    /// reused pid has a different one.
    fn start_time(&self, pid: u32) -> io::Result<u64>;
    /// A path to the executable that this process can open and attach to
    /// whatever mount namespace the target runs in.
    fn exe_link(&self, pid: u32) -> PathBuf;
}

/// The real `/proc` (or another procfs mount, e.g. the host's in a container).
pub struct ProcFs {
    root: PathBuf,
}

impl ProcFs {
    pub fn new(root: impl Into<PathBuf>) -> ProcFs {
        ProcFs { root: root.into() }
    }

    fn path(&self, pid: u32, file: &str) -> PathBuf {
        self.root.join(pid.to_string()).join(file)
    }
}

impl ProcSource for ProcFs {
    fn pids(&self) -> io::Result<Vec<u32>> {
        let mut pids = Vec::new();
        for entry in fs::read_dir(&self.root)? {
            if let Some(pid) = entry?.file_name().to_str().and_then(|n| n.parse().ok()) {
                pids.push(pid);
            }
        }
        Ok(pids)
    }

    fn exe_id(&self, pid: u32) -> io::Result<ExeId> {
        let meta = fs::metadata(self.path(pid, "exe"))?;
        Ok(ExeId {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    fn exe_path(&self, pid: u32) -> io::Result<PathBuf> {
        fs::read_link(self.path(pid, "exe"))
    }

    fn comm(&self, pid: u32) -> io::Result<String> {
        Ok(fs::read_to_string(self.path(pid, "comm"))?
            .trim_end()
            .to_owned())
    }

    fn cgroup(&self, pid: u32) -> io::Result<String> {
        fs::read_to_string(self.path(pid, "cgroup"))
    }

    fn start_time(&self, pid: u32) -> io::Result<u64> {
        let stat = fs::read_to_string(self.path(pid, "stat"))?;
        parse_start_time(&stat)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed stat"))
    }

    /// The kernel follows `/proc/PID/exe` into the process's own mount
    /// namespace, so this reaches binaries inside containers too.
    fn exe_link(&self, pid: u32) -> PathBuf {
        self.path(pid, "exe")
    }
}

/// Field 22 of `/proc/PID/stat`. The command name (field 2) may contain
/// spaces and parentheses, so fields are counted after its last ')'.
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After ')': field 3 (state) is the first; 22 is the 20th.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Which processes the agent looks at.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Matched against the executable path and the command name.
    pub name: Option<Regex>,
    /// Only processes in this cgroup or below (any hierarchy).
    pub cgroup: Option<String>,
}

impl Filter {
    fn accepts(&self, path: &Path, comm: &str, cgroup: &str) -> bool {
        let name_ok = self
            .name
            .as_ref()
            .is_none_or(|re| re.is_match(&path.to_string_lossy()) || re.is_match(comm));
        let cgroup_ok = self.cgroup.as_ref().is_none_or(|want| {
            let want = want.trim_end_matches('/');
            cgroup.lines().any(|line| {
                let path = line.splitn(3, ':').nth(2).unwrap_or("");
                path == want
                    || path
                        .strip_prefix(want)
                        .is_some_and(|rest| want.is_empty() || rest.starts_with('/'))
            })
        });
        name_ok && cgroup_ok
    }
}

/// A process that appeared (or exec'd another executable) and passed the filter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewProcess {
    pub pid: u32,
    pub exe: ExeId,
    pub exe_path: PathBuf,
    pub comm: String,
    pub cgroup: String,
    /// Its container's names, where the container runtime gave them (the
    /// agent's `container_names` fills this in).
    pub names: Option<ContainerNames>,
}

/// What changed since the previous poll.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub started: Vec<NewProcess>,
    /// Processes reported in an earlier `started` that are gone (or exec'd).
    pub exited: Vec<u32>,
}

#[derive(Clone, Copy, Debug)]
struct Seen {
    start_time: u64,
    /// None: no executable (kernel thread) or it could not be read.
    exe: Option<ExeId>,
    /// Reported as started (passed the filter).
    reported: bool,
}

/// The `/proc` differ. Holds one small entry per live process.
#[derive(Debug, Default)]
pub struct Discovery {
    filter: Filter,
    seen: HashMap<u32, Seen>,
    own_pid: u32,
}

impl Discovery {
    pub fn new(filter: Filter) -> Discovery {
        Discovery {
            filter,
            seen: HashMap::new(),
            own_pid: std::process::id(),
        }
    }

    /// Processes currently known (for the memory bound tests and metrics).
    pub fn known(&self) -> usize {
        self.seen.len()
    }

    /// Compare `/proc` with the previous poll.
    pub fn poll(&mut self, proc: &impl ProcSource) -> io::Result<Changes> {
        let mut changes = Changes::default();
        let pids = proc.pids()?;
        let mut alive = HashMap::with_capacity(pids.len());
        for pid in pids {
            if pid == self.own_pid {
                continue;
            }
            let Ok(start_time) = proc.start_time(pid) else {
                continue; // exited while we looked
            };
            let exe = proc.exe_id(pid).ok();
            if let Some(old) = self.seen.get(&pid)
                && old.start_time == start_time
                && old.exe == exe
            {
                alive.insert(pid, *old);
                continue;
            }
            // New, a reused pid, or an exec: the old process is gone.
            if self.seen.get(&pid).is_some_and(|old| old.reported) {
                changes.exited.push(pid);
            }
            let mut seen = Seen {
                start_time,
                exe,
                reported: false,
            };
            if let Some(exe) = exe
                && let Some(p) = self.describe(proc, pid, exe)
            {
                seen.reported = true;
                changes.started.push(p);
            }
            alive.insert(pid, seen);
        }
        for (pid, old) in &self.seen {
            if old.reported && !alive.contains_key(pid) {
                changes.exited.push(*pid);
            }
        }
        changes.exited.sort_unstable();
        changes.started.sort_by_key(|p| p.pid);
        self.seen = alive;
        Ok(changes)
    }

    fn describe(&self, proc: &impl ProcSource, pid: u32, exe: ExeId) -> Option<NewProcess> {
        let exe_path = proc.exe_path(pid).ok()?;
        let comm = proc.comm(pid).unwrap_or_default();
        let cgroup = proc.cgroup(pid).unwrap_or_default();
        self.filter
            .accepts(&exe_path, &comm, &cgroup)
            .then_some(NewProcess {
                pid,
                exe,
                exe_path,
                comm,
                cgroup,
                names: None,
            })
    }
}

#[cfg(test)]
pub mod tests {
    use std::{cell::RefCell, collections::BTreeMap};

    use super::*;

    /// A `/proc` snapshot the test edits between polls.
    #[derive(Default)]
    pub struct FakeProc {
        pub procs: RefCell<BTreeMap<u32, FakeProcess>>,
    }

    #[derive(Clone)]
    pub struct FakeProcess {
        pub start_time: u64,
        pub exe: Option<(ExeId, &'static str)>,
        pub comm: &'static str,
        pub cgroup: &'static str,
    }

    impl FakeProc {
        pub fn start(&self, pid: u32, start_time: u64, ino: u64, path: &'static str) {
            self.procs.borrow_mut().insert(
                pid,
                FakeProcess {
                    start_time,
                    exe: Some((ExeId { dev: 1, ino }, path)),
                    comm: path.rsplit('/').next().unwrap(),
                    cgroup: "0::/system.slice/app.service\n",
                },
            );
        }
        pub fn exit(&self, pid: u32) {
            self.procs.borrow_mut().remove(&pid);
        }
        fn get(&self, pid: u32) -> io::Result<FakeProcess> {
            self.procs
                .borrow()
                .get(&pid)
                .cloned()
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        }
    }

    impl ProcSource for FakeProc {
        fn pids(&self) -> io::Result<Vec<u32>> {
            Ok(self.procs.borrow().keys().copied().collect())
        }
        fn exe_id(&self, pid: u32) -> io::Result<ExeId> {
            self.get(pid)?
                .exe
                .map(|e| e.0)
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        }
        fn exe_path(&self, pid: u32) -> io::Result<PathBuf> {
            self.get(pid)?
                .exe
                .map(|e| PathBuf::from(e.1))
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        }
        fn comm(&self, pid: u32) -> io::Result<String> {
            Ok(self.get(pid)?.comm.to_owned())
        }
        fn cgroup(&self, pid: u32) -> io::Result<String> {
            Ok(self.get(pid)?.cgroup.to_owned())
        }
        fn start_time(&self, pid: u32) -> io::Result<u64> {
            Ok(self.get(pid)?.start_time)
        }
        fn exe_link(&self, pid: u32) -> PathBuf {
            self.exe_path(pid).unwrap_or_default()
        }
    }

    fn pids(c: &[NewProcess]) -> Vec<u32> {
        c.iter().map(|p| p.pid).collect()
    }

    #[test]
    fn reports_starts_and_exits_once() {
        let proc = FakeProc::default();
        proc.start(10, 1, 100, "/usr/bin/app");
        proc.start(11, 1, 100, "/usr/bin/app");
        let mut d = Discovery::new(Filter::default());
        let c = d.poll(&proc).unwrap();
        assert_eq!(pids(&c.started), [10, 11]);
        assert!(c.exited.is_empty());
        // Nothing changed: nothing reported.
        assert_eq!(d.poll(&proc).unwrap(), Changes::default());
        proc.exit(10);
        proc.start(12, 5, 200, "/opt/other");
        let c = d.poll(&proc).unwrap();
        assert_eq!(pids(&c.started), [12]);
        assert_eq!(c.started[0].exe, ExeId { dev: 1, ino: 200 });
        assert_eq!(c.exited, [10]);
        assert_eq!(d.known(), 2);
    }

    #[test]
    fn reused_pid_and_exec_are_an_exit_then_a_start() {
        let proc = FakeProc::default();
        proc.start(10, 1, 100, "/bin/sh");
        let mut d = Discovery::new(Filter::default());
        d.poll(&proc).unwrap();
        // exec: same pid and start time, another executable.
        proc.start(10, 1, 300, "/srv/goapp");
        let c = d.poll(&proc).unwrap();
        assert_eq!((pids(&c.started), c.exited), (vec![10], vec![10]));
        // pid reuse: same executable, later start time.
        proc.start(10, 9, 300, "/srv/goapp");
        let c = d.poll(&proc).unwrap();
        assert_eq!((pids(&c.started), c.exited), (vec![10], vec![10]));
    }

    #[test]
    fn kernel_threads_and_vanishing_processes_are_skipped() {
        let proc = FakeProc::default();
        proc.procs.borrow_mut().insert(
            2,
            FakeProcess {
                start_time: 0,
                exe: None,
                comm: "kthreadd",
                cgroup: "",
            },
        );
        let mut d = Discovery::new(Filter::default());
        assert_eq!(d.poll(&proc).unwrap(), Changes::default());
        assert_eq!(d.known(), 1);
    }

    #[test]
    fn filter_by_name_and_cgroup() {
        let proc = FakeProc::default();
        proc.start(10, 1, 100, "/usr/bin/app");
        proc.start(11, 1, 200, "/srv/api-server");
        proc.procs.borrow_mut().get_mut(&11).unwrap().cgroup =
            "12:memory:/kubepods/pod1/abc\n0::/kubepods/pod1/abc\n";
        let mut d = Discovery::new(Filter {
            name: Some(Regex::new("api").unwrap()),
            cgroup: None,
        });
        assert_eq!(pids(&d.poll(&proc).unwrap().started), [11]);
        for (want, expect) in [
            ("/kubepods", vec![11]),
            ("/kubepods/", vec![11]),
            ("/kubepods/pod1/abc", vec![11]),
            ("/kube", vec![]),
            ("/system.slice", vec![10]),
        ] {
            let mut d = Discovery::new(Filter {
                name: None,
                cgroup: Some(want.to_owned()),
            });
            assert_eq!(pids(&d.poll(&proc).unwrap().started), expect, "{want}");
        }
        // An unmatched process that exits is not reported as exited.
        let mut d = Discovery::new(Filter {
            name: Some(Regex::new("^/usr").unwrap()),
            cgroup: None,
        });
        d.poll(&proc).unwrap();
        proc.exit(11);
        assert!(d.poll(&proc).unwrap().exited.is_empty());
    }

    #[test]
    fn the_real_proc_describes_this_process() {
        let proc = ProcFs::new("/proc");
        let me = std::process::id();
        assert!(proc.pids().unwrap().contains(&me));
        assert!(proc.start_time(me).unwrap() > 0);
        let exe = std::env::current_exe().unwrap();
        assert_eq!(proc.exe_path(me).unwrap(), exe);
        let meta = fs::metadata(&exe).unwrap();
        assert_eq!(
            proc.exe_id(me).unwrap(),
            ExeId {
                dev: meta.dev(),
                ino: meta.ino()
            }
        );
        assert!(!proc.comm(me).unwrap().is_empty());
        assert!(proc.cgroup(me).unwrap().contains(':'));
        assert!(proc.start_time(u32::MAX).is_err());
    }

    #[test]
    fn start_time_survives_odd_command_names() {
        let mut stat = String::from("42 (a) b (c)) S");
        for i in 4..=22 {
            stat.push_str(&format!(" {i}"));
        }
        assert_eq!(parse_start_time(&stat), Some(22));
        assert_eq!(parse_start_time("42 (x) S 1"), None);
    }
}
