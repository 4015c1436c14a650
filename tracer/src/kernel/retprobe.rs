//! Return probes with room for every thread in the function at once.
//!
//! A kretprobe keeps one "instance" per call in progress; when they run out,
//! returns go unseen (the kernel counts them as missed). The kprobe PMU, which
//! aya attaches through, always takes the kernel's default number, `maxactive`
//! = max(10, 2 x CPUs) on preemptible kernels and only the CPU count on the
//! others (Debian 11's 5.10: 2 in a 2-CPU VM). Under a page-out storm more
//! threads than that sleep inside `do_swap_page` at once, so most major faults
//! were never seen to end. tracefs's `kprobe_events` takes `maxactive`
//! explicitly (`r<N>:`): gostw creates its return probes there, under a group
//! named for its pid, and hands them to the loaded programs through
//! `PERF_EVENT_IOC_SET_BPF`.
//!
//! tracefs events outlive the process that made them, so they are removed
//! when dropped, by `teardown`'s child after a fast exit (`AfterExit`), and
//! at the next start when the gostw that made them is gone (`remove_stale`).

use std::{
    fs::{File, OpenOptions},
    io::Write as _,
    os::fd::RawFd,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};

/// Calls in progress each return probe has room for: the kernel's largest
/// (`KRETPROBE_MAXACTIVE_MAX`). An instance is a few dozen bytes, so the
/// three probes take well under a megabyte of kernel memory.
pub const MAXACTIVE: u32 = 4096;

/// The tracefs group of this process's probe events.
fn group() -> String {
    format!("gostw_{}", std::process::id())
}

/// The event of `program` in probe set `set` of this process: the pid is in
/// the group and the name both (some listings show names without groups),
/// the set number keeps two engines of one process apart.
fn event_name(program: &str, set: u32) -> String {
    format!("{program}_{}_{set}", std::process::id())
}

/// Probe sets made by this process so far.
static SETS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// This process's return probes, created in tracefs and attached.
pub struct RetProbes {
    tracefs: PathBuf,
    /// This set's number in the process (`event_name`).
    set: u32,
    /// `kprobe_events`, opened once: the teardown child writes the removals
    /// through it after tracefs may have been unmounted (lazily).
    events_file: File,
    /// (event name, perf event carrying the program), in creation order.
    probes: Vec<(String, OwnedFd)>,
}

/// The probe events to remove once every probe descriptor is closed: by
/// `teardown`'s child after gostw has exited, or here (`remove_now`).
pub struct AfterExit {
    /// `kprobe_events`.
    pub file: OwnedFd,
    /// The probes' perf events.
    pub probes: Vec<OwnedFd>,
    /// `-:group/event` lines.
    pub removals: Vec<u8>,
}

impl AfterExit {
    /// Close the probes and remove their events now.
    pub fn remove_now(self) {
        drop(self.probes);
        remove_events(self.file.as_raw_fd(), &self.removals);
    }
}

impl RetProbes {
    /// An empty set on the tracefs at `tracefs`; fails if `kprobe_events`
    /// cannot be opened for writing.
    pub fn new(tracefs: &Path) -> anyhow::Result<RetProbes> {
        let path = tracefs.join("kprobe_events");
        let mut events_file = OpenOptions::new()
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        remove_stale(&path, &mut events_file);
        Ok(RetProbes {
            set: SETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            tracefs: tracefs.to_owned(),
            events_file,
            probes: Vec::new(),
        })
    }

    /// Create a return probe on `function` for program `name` and run
    /// `program` (its loaded descriptor) at each return.
    pub fn attach(
        &mut self,
        name: &str,
        function: &str,
        program: BorrowedFd<'_>,
    ) -> anyhow::Result<()> {
        let group = group();
        let name = &event_name(name, self.set);
        let definition = format!("r{MAXACTIVE}:{group}/{name} {function}\n");
        self.events_file
            .write_all(definition.as_bytes())
            .with_context(|| format!("creating the return probe `{}`", definition.trim_end()))?;
        // From here on a failure still removes the event: it is in the set.
        let id_path = self.tracefs.join(format!("events/{group}/{name}/id"));
        let created = std::fs::read_to_string(&id_path)
            .with_context(|| format!("reading {}", id_path.display()))
            .and_then(|s| {
                s.trim()
                    .parse::<u64>()
                    .with_context(|| format!("{}: not a number", id_path.display()))
            })
            .and_then(open_tracepoint_event)
            .and_then(|perf| {
                run_program(&perf, program)
                    .with_context(|| format!("the return probe on {function}"))?;
                Ok(perf)
            });
        match created {
            Ok(perf) => {
                self.probes.push((name.to_owned(), perf));
                Ok(())
            }
            Err(e) => {
                // Its perf event, if any, is closed by now.
                self.remove(name);
                Err(e)
            }
        }
    }

    /// The removals for `teardown`'s child, which closes the probes'
    /// descriptors (its copies) first; this set then forgets its events.
    pub fn after_exit(&mut self) -> Option<AfterExit> {
        let file = self.events_file.as_fd().try_clone_to_owned().ok()?;
        let group = group();
        let removals = self
            .probes
            .iter()
            .map(|(name, _)| format!("-:{group}/{name}\n"))
            .collect::<String>()
            .into_bytes();
        // Whoever runs the removals closes the probes; dropping this set
        // must not remove them.
        let probes = self.probes.drain(..).map(|(_, fd)| fd).collect();
        Some(AfterExit {
            file,
            probes,
            removals,
        })
    }

    fn remove(&mut self, name: &str) {
        let line = format!("-:{}/{name}\n", group());
        if let Err(e) = self.events_file.write_all(line.as_bytes()) {
            log::warn!("removing the return probe {name}: {e}");
        }
    }
}

impl Drop for RetProbes {
    fn drop(&mut self) {
        for (name, perf) in std::mem::take(&mut self.probes) {
            // An event in use cannot be removed: close its perf event first.
            drop(perf);
            self.remove(&name);
        }
    }
}

/// Remove, through `events_file` (`path`, open for appending), the probe
/// events of gostw processes that are gone (killed before they could);
/// those of live ones are theirs.
fn remove_stale(path: &Path, events_file: &mut File) {
    let Ok(events) = std::fs::read_to_string(path) else {
        return;
    };
    let removals: String = stale_events(&events, |pid| Path::new(&format!("/proc/{pid}")).exists())
        .map(|e| format!("-:{e}\n"))
        .collect();
    if removals.is_empty() {
        return;
    }
    match events_file.write_all(removals.as_bytes()) {
        Ok(()) => log::info!("removed probe events left by gostw processes that are gone"),
        Err(e) => log::warn!("removing probe events left by gone gostw processes: {e}"),
    }
}

/// The `group/event` of every `kprobe_events` line whose group is
/// `gostw_<pid>` with `alive(pid)` false.
fn stale_events<'a>(
    events: &'a str,
    alive: impl Fn(u32) -> bool + 'a,
) -> impl Iterator<Item = &'a str> + 'a {
    events.lines().filter_map(move |line| {
        // "r4096:gostw_123/fault_kp_swap_ret do_swap_page"
        let (_, rest) = line.split_once(':')?;
        let event = rest.split_whitespace().next()?;
        let (group, _) = event.split_once('/')?;
        let pid: u32 = group.strip_prefix("gostw_")?.parse().ok()?;
        (!alive(pid)).then_some(event)
    })
}

/// Write `removals` (`-:group/event` lines) to the `kprobe_events` file
/// `fd`, one line at a time: an event whose perf event the kernel is still
/// releasing is busy, and is tried again (for up to a second).
/// Async-signal-safe: `teardown`'s forked child runs it.
pub fn remove_events(fd: RawFd, removals: &[u8]) {
    for line in removals.split_inclusive(|&b| b == b'\n') {
        for _ in 0..100 {
            // SAFETY: a write of a valid buffer to a descriptor we hold.
            let n = unsafe { libc::write(fd, line.as_ptr().cast(), line.len()) };
            if n >= 0 {
                break;
            }
            let pause = libc::timespec {
                tv_sec: 0,
                tv_nsec: 10_000_000,
            };
            // SAFETY: nanosleep with a valid request and no remainder.
            unsafe { libc::nanosleep(&pause, std::ptr::null_mut()) };
        }
    }
}

/// `_IOW('$', 8, u32)` and `_IO('$', 0)` (include/uapi/linux/perf_event.h).
const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
/// `PERF_FLAG_FD_CLOEXEC` (the same header).
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;

/// The first, 64-byte version of `struct perf_event_attr`
/// (`PERF_ATTR_SIZE_VER0`), which every kernel accepts: all a tracepoint
/// event for a BPF program needs.
#[repr(C)]
#[derive(Default)]
struct PerfEventAttrV0 {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

/// Have the perf event `perf` run the loaded kprobe program `program`
/// (`PERF_EVENT_IOC_SET_BPF`), and enable it.
fn run_program(perf: &OwnedFd, program: BorrowedFd<'_>) -> anyhow::Result<()> {
    // SAFETY: ioctls on a perf event descriptor we own, with a program
    // descriptor that outlives the call.
    if unsafe {
        libc::ioctl(
            perf.as_raw_fd(),
            PERF_EVENT_IOC_SET_BPF,
            program.as_raw_fd(),
        )
    } != 0
    {
        bail!("attaching the program: {}", std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::ioctl(perf.as_raw_fd(), PERF_EVENT_IOC_ENABLE, 0) } != 0 {
        bail!("enabling it: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Open the perf event of tracefs event `id`. A BPF program attached to a
/// tracepoint-type event runs on every CPU, so one event (on CPU 0) serves.
fn open_tracepoint_event(id: u64) -> anyhow::Result<OwnedFd> {
    const PERF_TYPE_TRACEPOINT: u32 = 2;
    let attr = PerfEventAttrV0 {
        type_: PERF_TYPE_TRACEPOINT,
        size: std::mem::size_of::<PerfEventAttrV0>() as u32,
        config: id,
        sample_period: 1,
        wakeup_events: 1,
        ..PerfEventAttrV0::default()
    };
    // SAFETY: a valid attribute struct whose size field is its size; pid -1
    // and CPU 0 (every process on that CPU), no group.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &raw const attr,
            -1,
            0,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        bail!(
            "perf_event_open on the return probe: {}",
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: a descriptor the kernel just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_is_the_first_abi_version() {
        assert_eq!(std::mem::size_of::<PerfEventAttrV0>(), 64);
    }

    #[test]
    fn stale_events_are_those_of_gone_gostw_processes() {
        let events = "r4096:gostw_10/fault_kp_swap_ret do_swap_page\n\
                      r4096:gostw_20/fault_kp_swap_ret do_swap_page\n\
                      p:kprobes/gostw_30 do_sys_openat2\n\
                      r:gostw_x/a b\n\
                      p:gostw_vm/do_swap_page do_swap_page\n\
                      r4096:gostw_30/fault_kp_lock_ret_30 __folio_lock_or_retry\n";
        let stale: Vec<_> = stale_events(events, |pid| pid == 20).collect();
        assert_eq!(
            stale,
            [
                "gostw_10/fault_kp_swap_ret",
                "gostw_30/fault_kp_lock_ret_30"
            ]
        );
    }
}
