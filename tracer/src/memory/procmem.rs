//! Reading a live process's memory (`/proc/PID/mem`) without changing it:
//! only pages that are resident are read. Reading a page that is in swap
//! would swap it back in, charged to the process: gostw would change the
//! very exposure it measures (and add I/O to a process under memory
//! pressure), so such reads are refused and reported instead.

use std::{cell::Cell, fs::File, os::unix::fs::FileExt as _};

use crate::procfs::pagemap::{PageCounts, Pagemap};

/// Why bytes were not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unread {
    /// Some page is in swap.
    InSwap,
    /// Some page is not in memory and not in swap (never touched, or a
    /// file page not in the page cache).
    NotPresent,
    /// The read failed (unmapped, or no access).
    Failed,
}

/// Reads a live process's resident memory.
pub struct ProcessMemory {
    file: File,
    pagemap: Pagemap,
    page_size: u64,
    /// Bytes that were not read because they were not resident.
    not_resident: Cell<u64>,
}

impl ProcessMemory {
    /// Open `/proc/PID/mem` and its pagemap (needs ptrace access: root or
    /// CAP_SYS_PTRACE).
    pub fn open(pid: u32, page_size: u64) -> std::io::Result<ProcessMemory> {
        Ok(ProcessMemory {
            file: File::open(format!("/proc/{pid}/mem"))?,
            pagemap: Pagemap::open(pid, page_size)?,
            page_size,
            not_resident: Cell::new(0),
        })
    }

    /// `len` bytes at `addr`, if every page they are on is resident.
    pub fn read(&self, addr: u64, len: usize) -> Result<Vec<u8>, Unread> {
        let end = addr.checked_add(len as u64).ok_or(Unread::Failed)?;
        let entries = self
            .pagemap
            .entries(addr..end)
            .map_err(|_| Unread::Failed)?;
        let c = PageCounts::of(&entries);
        if c.present != entries.len() as u64 {
            self.not_resident.set(self.not_resident.get() + len as u64);
            return Err(if c.swapped > 0 {
                Unread::InSwap
            } else {
                Unread::NotPresent
            });
        }
        let mut buf = vec![0u8; len];
        self.file
            .read_exact_at(&mut buf, addr)
            .map_err(|_| Unread::Failed)?;
        Ok(buf)
    }

    /// Little-endian u64s at `addr`.
    pub fn u64s(&self, addr: u64, n: usize) -> Result<Vec<u64>, Unread> {
        Ok(le_u64s(&self.read(addr, n * 8)?))
    }

    /// A little-endian u64 at `addr`.
    pub fn u64(&self, addr: u64) -> Result<u64, Unread> {
        Ok(self.u64s(addr, 1)?[0])
    }

    /// The resident u64s of `n` at `addr`, page by page; `None` for those
    /// on pages that could not be read.
    pub fn u64s_resident(&self, addr: u64, n: usize) -> Vec<Option<u64>> {
        let mut out = Vec::with_capacity(n);
        let end = addr + n as u64 * 8;
        let mut at = addr;
        while at < end {
            let next = ((at / self.page_size + 1) * self.page_size).min(end);
            let count = ((next - at) / 8) as usize;
            match self.u64s(at, count) {
                Ok(v) => out.extend(v.into_iter().map(Some)),
                Err(_) => out.extend(std::iter::repeat_n(None, count)),
            }
            at += count as u64 * 8;
        }
        out
    }

    /// Bytes refused so far because they were not resident.
    pub fn not_resident_bytes(&self) -> u64 {
        self.not_resident.get()
    }
}

fn le_u64s(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8-byte chunk")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_resident_memory_and_refuses_untouched_pages() {
        let page = crate::procfs::page_size();
        let mut buf = vec![0u8; 4 * page as usize];
        let base = (buf.as_ptr() as u64).div_ceil(page) * page;
        let off = (base - buf.as_ptr() as u64) as usize;
        buf[off..off + 8].copy_from_slice(&0x1122334455667788u64.to_le_bytes());
        let mem = ProcessMemory::open(std::process::id(), page).unwrap();
        assert_eq!(mem.u64(base), Ok(0x1122334455667788));
        let words = mem.u64s_resident(base, 2);
        assert_eq!(words, vec![Some(0x1122334455667788), Some(0)]);
        // A fresh anonymous mapping never touched: not resident, not read.
        // SAFETY: a private anonymous mapping of our own, unmapped below.
        let fresh = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(fresh, libc::MAP_FAILED);
        assert_eq!(mem.u64(fresh as u64), Err(Unread::NotPresent));
        assert_eq!(mem.not_resident_bytes(), 8);
        // SAFETY: unmapping the mapping made above.
        unsafe { libc::munmap(fresh, page as usize) };
        drop(buf);
    }
}
