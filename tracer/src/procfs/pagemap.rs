//! Per-page residency from `/proc/PID/pagemap`: where a class of Go memory
//! covers only part of a mapping, smaps' per-mapping totals are not fine
//! enough, and each page's present and swapped bits are counted instead.
//! (Those two bits are readable by anyone allowed to read the file; the
//! frame numbers beside them need root, and gostw does not use them.)

use std::{fs::File, io, ops::Range, os::unix::fs::FileExt as _};

/// Page is in memory.
const PRESENT: u64 = 1 << 63;
/// Page is in swap.
const SWAPPED: u64 = 1 << 62;
/// Page is a file page (or shared anonymous memory).
const FILE: u64 = 1 << 61;
/// Page is mapped by this process only.
const EXCLUSIVE: u64 = 1 << 56;

/// Whether a pagemap entry's page is in memory (reading it faults nothing
/// in: neither from swap nor from disk).
pub fn is_present(entry: u64) -> bool {
    entry & PRESENT != 0
}

/// Resident and swapped pages of an address range.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageCounts {
    /// In memory and counted in smaps' `Rss`: exclusively mapped anonymous
    /// pages and file pages. The shared zero page (mapped where a program
    /// read memory it never wrote) is present but not in `Rss`, nor here.
    pub present: u64,
    pub swapped: u64,
}

impl PageCounts {
    /// Count the pages of pagemap entries.
    pub fn of(entries: &[u64]) -> PageCounts {
        let mut c = PageCounts::default();
        for &e in entries {
            if e & PRESENT != 0 && e & (EXCLUSIVE | FILE) != 0 {
                c.present += 1;
            } else if e & PRESENT == 0 && e & SWAPPED != 0 {
                c.swapped += 1;
            }
        }
        c
    }
}

/// Counts pages of ranges of one process (pagemap in production, a fake
/// in tests).
pub trait PageSource {
    /// Present and swapped pages of each range, in order.
    fn counts(&self, ranges: &[Range<u64>]) -> io::Result<Vec<PageCounts>>;
}

/// An open `/proc/PID/pagemap`.
#[derive(Debug)]
pub struct Pagemap {
    file: File,
    page_size: u64,
}

/// Entries read per `pread` (512 KiB of entries: 256 MiB of address space
/// with 4 KiB pages).
const CHUNK: usize = 64 * 1024;

impl Pagemap {
    /// Open the pagemap of `pid`.
    pub fn open(pid: u32, page_size: u64) -> io::Result<Pagemap> {
        Ok(Pagemap {
            file: File::open(format!("/proc/{pid}/pagemap"))?,
            page_size,
        })
    }

    /// The entries of every page of `range` (page-aligned outward).
    pub fn entries(&self, range: Range<u64>) -> io::Result<Vec<u64>> {
        let first = range.start / self.page_size;
        let last = range.end.div_ceil(self.page_size);
        let mut out = Vec::with_capacity(last.saturating_sub(first) as usize);
        let mut buf = vec![0u8; CHUNK * 8];
        let mut page = first;
        while page < last {
            let n = ((last - page) as usize).min(CHUNK);
            let bytes = &mut buf[..n * 8];
            self.file.read_exact_at(bytes, page * 8)?;
            out.extend(
                bytes
                    .chunks_exact(8)
                    .map(|b| u64::from_ne_bytes(b.try_into().expect("8-byte chunk"))),
            );
            page += n as u64;
        }
        Ok(out)
    }

    /// Resident and swapped pages of `range`.
    pub fn count(&self, range: Range<u64>) -> io::Result<PageCounts> {
        Ok(PageCounts::of(&self.entries(range)?))
    }
}

impl PageSource for Pagemap {
    /// One read for the span of all `ranges` (the pieces of one mapping).
    fn counts(&self, ranges: &[Range<u64>]) -> io::Result<Vec<PageCounts>> {
        let (Some(first), Some(last)) = (ranges.first(), ranges.last()) else {
            return Ok(Vec::new());
        };
        let base = first.start / self.page_size;
        let entries = self.entries(first.start..last.end)?;
        Ok(ranges
            .iter()
            .map(|r| {
                let a = (r.start / self.page_size - base) as usize;
                let b = (r.end.div_ceil(self.page_size) - base) as usize;
                PageCounts::of(entries.get(a..b.min(entries.len())).unwrap_or(&[]))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_smaps_counts_as_rss_and_swap() {
        let pfn = 0x1234;
        let swap_entry = 0x55 << 5 | 1; // type 1, offset 0x55: no frame number
        let entries = [
            PRESENT | EXCLUSIVE | pfn,
            PRESENT | FILE, // a file page
            SWAPPED | swap_entry,
            0,       // never touched
            1 << 55, // soft-dirty only: not there
            PRESENT | EXCLUSIVE,
            PRESENT | pfn, // the shared zero page: read, never written
        ];
        assert_eq!(
            PageCounts::of(&entries),
            PageCounts {
                present: 3,
                swapped: 1
            }
        );
    }

    #[test]
    fn reads_this_process_pages() {
        let page = crate::procfs::page_size();
        let buf = vec![1u8; 16 * page as usize];
        let start = (buf.as_ptr() as u64).div_ceil(page) * page;
        let pm = Pagemap::open(std::process::id(), page).unwrap();
        let c = pm.count(start..start + 8 * page).unwrap();
        // Written a moment ago: all in memory, none in swap.
        assert_eq!(
            c,
            PageCounts {
                present: 8,
                swapped: 0
            }
        );
        drop(buf);
    }
}
