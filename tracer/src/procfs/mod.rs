//! Readers of `/proc` files that more than one part of gostw needs, below
//! all of them: the page size, `/proc/PID/pagemap` (which pages are in
//! memory, in swap or file-backed) and, on it, which of a process's
//! addresses can be read without faulting a page back in; the kernel's
//! function names (`/proc/kallsyms`); the host's name.

pub mod kallsyms;
pub mod pagemap;
pub mod resident;

/// The host's name (`/proc/sys/kernel/hostname`; "" if unreadable): in a
/// pod with `hostNetwork`, the node's.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default()
}

/// The system page size.
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 { n as u64 } else { 4096 }
}
