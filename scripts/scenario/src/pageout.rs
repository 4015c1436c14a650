//! Pushing a process's anonymous memory to swap from outside it.

use std::{fs, io, time::Duration};

use crate::{MemCgroup, context};

/// Push `pid`'s anonymous memory to swap, let the swap writes finish, then
/// drop the clean swap cache they leave behind (or the next touch is only a
/// minor fault): `pid` must be in `cgroup`. Returns the bytes advised.
pub fn swap_out(pid: u32, cgroup: &MemCgroup) -> io::Result<u64> {
    let bytes = page_out(pid)?;
    std::thread::sleep(Duration::from_millis(300));
    cgroup.force_empty()?;
    Ok(bytes)
}

/// Push every private, writable, anonymous mapping of `pid` to swap with
/// `process_madvise(MADV_PAGEOUT)` (root). Returns the bytes advised.
pub fn page_out(pid: u32) -> io::Result<u64> {
    let maps_file = format!("/proc/{pid}/maps");
    let maps = fs::read_to_string(&maps_file).map_err(|e| context(&maps_file, e))?;
    page_out_ranges(pid, &anonymous_writable(&maps))
}

/// Push the memory of `pid` in `ranges` (start, end) to swap with
/// `process_madvise(MADV_PAGEOUT)`. Returns the bytes advised.
pub fn page_out_ranges(pid: u32, ranges: &[(u64, u64)]) -> io::Result<u64> {
    // SAFETY: plain syscall.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if pidfd < 0 {
        return Err(context(
            format!("pidfd_open({pid})"),
            io::Error::last_os_error(),
        ));
    }
    let mut total = 0u64;
    for &(start, end) in ranges {
        let iov = libc::iovec {
            iov_base: start as *mut libc::c_void,
            iov_len: (end - start) as usize,
        };
        // SAFETY: the iovec points at a live local; the kernel reads only it.
        let r = unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                pidfd,
                &iov as *const libc::iovec,
                1,
                libc::MADV_PAGEOUT,
                0,
            )
        };
        if r > 0 {
            total += r as u64;
        }
    }
    // SAFETY: closing the fd opened above.
    unsafe { libc::close(pidfd as libc::c_int) };
    Ok(total)
}

/// The private, writable, anonymous (or `[heap]`) ranges of a maps file.
fn anonymous_writable(maps: &str) -> Vec<(u64, u64)> {
    maps.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (range, perms) = (f.first()?, f.get(1)?);
            let path = f.get(5).copied().unwrap_or("");
            if !perms.starts_with("rw")
                || !perms.ends_with('p')
                || !(path.is_empty() || path == "[heap]")
            {
                return None;
            }
            let (s, e) = range.split_once('-')?;
            Some((
                u64::from_str_radix(s, 16).ok()?,
                u64::from_str_radix(e, 16).ok()?,
            ))
        })
        .collect()
}

/// Major faults of `pid` (`/proc/PID/stat` field 12: the whole process,
/// exited threads included).
pub fn majflt(pid: u32) -> io::Result<u64> {
    let file = format!("/proc/{pid}/stat");
    let stat = fs::read_to_string(&file).map_err(|e| context(&file, e))?;
    stat.rfind(')')
        .and_then(|i| stat.get(i + 2..)?.split_whitespace().nth(9)?.parse().ok())
        .ok_or_else(|| io::Error::other(format!("{file}: no majflt field in {stat:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_private_writable_anonymous_ranges() {
        let maps = "\
00400000-00500000 r-xp 00000000 08:01 12 /usr/bin/x
00500000-00510000 rw-p 00100000 08:01 12 /usr/bin/x
00510000-00530000 rw-p 00000000 00:00 0 [heap]
c000000000-c004000000 rw-p 00000000 00:00 0
7f0000000000-7f0000001000 rw-s 00000000 00:01 5 /dev/zero (deleted)
7f0000002000-7f0000003000 ---p 00000000 00:00 0
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
";
        assert_eq!(
            anonymous_writable(maps),
            [(0x510000, 0x530000), (0xc000000000, 0xc004000000)]
        );
    }

    #[test]
    fn majflt_of_this_process() {
        assert!(majflt(std::process::id()).is_ok());
        assert!(majflt(u32::MAX).is_err());
    }
}
