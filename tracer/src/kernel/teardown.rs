//! Leaving fast. Detaching a probe costs the kernel tens of milliseconds per
//! perf event here (every tracepoint, per-CPU perf event and uprobe waits
//! for an RCU grace period), so a short `gostw run` would spend most of its
//! time closing them. Instead a forked child holds the same file
//! descriptors until gostw has exited, then exits itself: the kernel tears
//! the probes down in that child, and nobody waits for it. The traced set is
//! emptied before, so the probes left for that moment filter everything out.
//! Probe events gostw made in tracefs (`retprobe`) outlive every descriptor:
//! the child removes them (`AfterExit`) once it has closed its copies.

use std::os::fd::{AsRawFd as _, RawFd};

use super::retprobe::{AfterExit, remove_events};

/// Keep `holder` (what owns the kernel objects) alive in a background child
/// until this process exits; this process then forgets it. The child then
/// closes them and writes `after`'s removals. Falls back to dropping both
/// here if the child cannot be made.
pub fn detach_after_exit<T>(holder: T, after: Option<AfterExit>) {
    // Every descriptor the child will have, listed now: it may not
    // allocate after the fork.
    let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let mut fds: [RawFd; 2] = [0; 2];
    // SAFETY: valid array of two fds.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        drop(holder);
        if let Some(a) = after {
            a.remove_now();
        }
        return;
    }
    let (read_end, write_end) = (fds[0], fds[1]);
    // The write end must be the last descriptor this process closes when it
    // exits (the kernel closes them in ascending order): by then every probe
    // fd of this process is closed, and the child holds the only references.
    // SAFETY: plain fcntl on a descriptor we own.
    let high = unsafe { libc::fcntl(write_end, libc::F_DUPFD_CLOEXEC, 1 << 16) };
    let write_end = if high >= 0 {
        // SAFETY: closing our own duplicate.
        unsafe { libc::close(fds[1]) };
        high
    } else {
        write_end
    };
    // SAFETY: the child only calls async-signal-safe functions (close, read,
    // _exit) before it exits.
    match unsafe { libc::fork() } {
        0 => {
            // SAFETY: async-signal-safe calls on descriptors we own.
            unsafe {
                // Do not hold the caller's pipes open (`$(gostw ...)`).
                for fd in 0..3 {
                    libc::close(fd);
                }
                libc::close(write_end);
                let mut b = 0u8;
                while libc::read(read_end, (&raw mut b).cast(), 1) > 0 {}
                if let Some(a) = &after {
                    let keep = a.file.as_raw_fd();
                    for &fd in &open {
                        if fd > 2 && fd != keep && fd != read_end {
                            libc::close(fd);
                        }
                    }
                    remove_events(keep, &a.removals);
                }
                libc::_exit(0);
            }
        }
        pid if pid > 0 => {
            // SAFETY: closing our copy of the read end.
            unsafe { libc::close(read_end) };
            std::mem::forget(holder);
            // The child holds the probes and removes their events.
            std::mem::forget(after);
        }
        _ => {
            // SAFETY: closing both ends of our own pipe.
            unsafe {
                libc::close(read_end);
                libc::close(write_end);
            }
            drop(holder);
            if let Some(a) = after {
                a.remove_now();
            }
        }
    }
}
