//! Readers of `/proc` files that more than one part of gostw needs, below
//! all of them: the page size, `/proc/PID/pagemap` (which pages are in
//! memory, in swap or file-backed) and, on it, which of a process's
//! addresses can be read without faulting a page back in; the kernel's
//! function names (`/proc/kallsyms`).

pub mod kallsyms;
pub mod pagemap;
pub mod resident;

/// The system page size.
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 { n as u64 } else { 4096 }
}
