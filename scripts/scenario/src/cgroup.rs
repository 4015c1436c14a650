//! A memory cgroup, the scenario's way to drop a process's swap cache.

use std::{
    fs, io,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::context;

/// A memory cgroup (v1 where its memory controller is mounted, as on these
/// machines, else v2, as in the VM); its processes are killed and the group
/// removed on drop.
pub struct MemCgroup {
    pub path: PathBuf,
    v2: bool,
}

const CGROUP_V1_MEMORY: &str = "/sys/fs/cgroup/memory";
const CGROUP_V2: &str = "/sys/fs/cgroup";

impl MemCgroup {
    /// A new group named `name-<our pid>`.
    pub fn create(name: &str) -> io::Result<MemCgroup> {
        let v2 = !Path::new(CGROUP_V1_MEMORY)
            .join("memory.limit_in_bytes")
            .exists();
        let root = if v2 {
            // The memory controller must be enabled for the root's children.
            let _ = fs::write(
                Path::new(CGROUP_V2).join("cgroup.subtree_control"),
                "+memory",
            );
            CGROUP_V2
        } else {
            CGROUP_V1_MEMORY
        };
        let path = PathBuf::from(root).join(format!("{name}-{}", std::process::id()));
        fs::create_dir_all(&path)
            .map_err(|e| context(format!("creating {} (memory cgroup)", path.display()), e))?;
        Ok(MemCgroup { path, v2 })
    }

    /// Whether this is a cgroup v1 memory group (v2 names its files differently).
    pub fn is_v1(&self) -> bool {
        !self.v2
    }

    /// Write `value` to the group's `file`.
    pub fn write(&self, file: &str, value: &str) -> io::Result<()> {
        fs::write(self.path.join(file), value).map_err(|e| {
            context(
                format!("writing {value} to {}/{file}", self.path.display()),
                e,
            )
        })
    }

    /// Move `pid` into the group: what it allocates from now on is charged here.
    pub fn add(&self, pid: u32) -> io::Result<()> {
        self.write("cgroup.procs", &pid.to_string())
    }

    /// Move `pid` back to the memory cgroup `original` (from
    /// [`MemCgroup::current`]). Pages it was charged while in this group stay
    /// charged here.
    pub fn move_to(&self, pid: u32, original: &Path) -> io::Result<()> {
        let procs = original.join("cgroup.procs");
        fs::write(&procs, pid.to_string())
            .map_err(|e| context(format!("writing {pid} to {}", procs.display()), e))
    }

    /// The memory cgroup directory `pid` is in now, of the same kind (v1 or
    /// v2) as this group.
    pub fn current(&self, pid: u32) -> io::Result<PathBuf> {
        let file = format!("/proc/{pid}/cgroup");
        let text = fs::read_to_string(&file).map_err(|e| context(&file, e))?;
        let rel = text
            .lines()
            .find_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
                let ours = if self.v2 {
                    controllers.is_empty()
                } else {
                    controllers.split(',').any(|c| c == "memory")
                };
                ours.then_some(path)
            })
            .ok_or_else(|| io::Error::other(format!("{file} names no memory cgroup")))?;
        let root = if self.v2 { CGROUP_V2 } else { CGROUP_V1_MEMORY };
        Ok(Path::new(root).join(rel.trim_start_matches('/')))
    }

    /// Reclaim everything the group holds: the swap cache a page-out leaves
    /// behind (clean, unmapped, still "in memory": the next touch would be a
    /// minor fault) and whatever is still mapped.
    pub fn force_empty(&self) -> io::Result<()> {
        if self.v2 {
            // Asks for more than the group holds: reclaims what it can and
            // answers EAGAIN for the rest, which is fine here.
            match fs::write(self.path.join("memory.reclaim"), "4G") {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    // Before 5.19 (Debian 11's 5.10): lowering memory.high
                    // reclaims down to it in the writer, then lift it again.
                    self.write("memory.high", "0")?;
                    self.write("memory.high", "max")
                }
                _ => Ok(()),
            }
        } else {
            self.write("memory.force_empty", "0")
        }
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        if let Ok(pids) = fs::read_to_string(self.path.join("cgroup.procs")) {
            for pid in pids.lines().filter_map(|p| p.parse::<i32>().ok()) {
                // SAFETY: plain kill(2) of a process the scenario put here.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while fs::remove_dir(&self.path).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
