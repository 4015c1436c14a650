//! Which of a set of another process's addresses are on pages in memory,
//! from `/proc/PID/pagemap` (8 bytes a page): a read of the others through
//! `/proc/PID/mem` or `process_vm_readv` would fault them back in from swap
//! (or from disk), changing the memory state gostw is there to observe.

use std::{io, ops::Range};

use super::pagemap::{Pagemap, is_present};

/// Pages closer than this are looked up in one pagemap read (the gap's
/// entries are read and thrown away: 128 bytes at most).
const GAP: u64 = 16;

/// Which addresses can be read without faulting a page in.
#[derive(Debug, PartialEq, Eq)]
pub struct Presence {
    /// For each address (and the `len` bytes from it): all its pages are
    /// in memory.
    pub readable: Vec<bool>,
    /// Distinct pages left unread: not in memory (in swap, on disk, or
    /// never touched).
    pub absent_pages: u64,
}

/// The pagemap of one process, for `Presence`.
#[derive(Debug)]
pub struct Resident {
    pagemap: Pagemap,
    page: u64,
}

impl Resident {
    /// Open the pagemap of `pid`.
    pub fn open(pid: u32) -> io::Result<Resident> {
        let page = super::page_size();
        Ok(Resident {
            pagemap: Pagemap::open(pid, page)?,
            page,
        })
    }

    /// Which of the `len`-byte reads at `addrs` touch only present pages.
    pub fn presence(&self, addrs: &[u64], len: u64) -> io::Result<Presence> {
        presence(addrs, len, self.page, |r| self.pagemap.entries(r))
    }

    /// Whether the `len` bytes at `at` are all on present pages.
    pub fn readable(&self, at: u64, len: u64) -> io::Result<bool> {
        Ok(self.presence(&[at], len)?.absent_pages == 0)
    }
}

/// `Presence` of the `len`-byte reads at `addrs` with pages of `page`
/// bytes, the pagemap entries of an address range from `entries`.
pub fn presence(
    addrs: &[u64],
    len: u64,
    page: u64,
    mut entries: impl FnMut(Range<u64>) -> io::Result<Vec<u64>>,
) -> io::Result<Presence> {
    let span = |a: u64| a / page..=a.saturating_add(len.max(1) - 1) / page;
    let mut pages: Vec<u64> = addrs.iter().flat_map(|&a| span(a)).collect();
    pages.sort_unstable();
    pages.dedup();
    // (page, present) for every page read, sorted by page.
    let mut known: Vec<(u64, bool)> = Vec::with_capacity(pages.len());
    let mut i = 0;
    while i < pages.len() {
        let mut j = i + 1;
        while j < pages.len() && pages[j] - pages[j - 1] <= GAP {
            j += 1;
        }
        let (first, last) = (pages[i], pages[j - 1]);
        let got = entries(first * page..(last + 1) * page)?;
        for &p in &pages[i..j] {
            let e = got.get((p - first) as usize).copied().unwrap_or(0);
            known.push((p, is_present(e)));
        }
        i = j;
    }
    let present = |p: u64| {
        known
            .binary_search_by_key(&p, |&(q, _)| q)
            .is_ok_and(|k| known[k].1)
    };
    Ok(Presence {
        readable: addrs.iter().map(|&a| span(a).all(present)).collect(),
        absent_pages: known.iter().filter(|(_, p)| !p).count() as u64,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const PRESENT: u64 = 1 << 63;
    const SWAPPED: u64 = 1 << 62;

    #[test]
    fn only_reads_on_present_pages_are_readable() {
        // Pages 1, 2 and 100 present; 3 in swap; the rest never touched.
        let map: HashMap<u64, u64> = HashMap::from([
            (1, PRESENT | 7),
            (2, PRESENT),
            (3, SWAPPED | 9),
            (100, PRESENT),
        ]);
        let mut reads = Vec::new();
        let got = presence(
            &[
                4096 + 8,     // page 1
                2 * 4096 - 4, // pages 1 and 2
                3 * 4096 - 4, // pages 2 and 3: 3 in swap
                3 * 4096 + 1, // page 3
                100 * 4096,   // page 100
                500 * 4096,   // page 500: never touched
            ],
            8,
            4096,
            |r: Range<u64>| {
                reads.push(r.clone());
                Ok((r.start / 4096..r.end / 4096)
                    .map(|p| map.get(&p).copied().unwrap_or(0))
                    .collect())
            },
        )
        .unwrap();
        assert_eq!(got.readable, [true, true, false, false, true, false]);
        // Page 3 (swapped) and page 500 (never touched) are not read.
        assert_eq!(got.absent_pages, 2);
        // Near pages in one pagemap read, far ones apart.
        assert_eq!(
            reads,
            [
                4096..4 * 4096,
                100 * 4096..101 * 4096,
                500 * 4096..501 * 4096
            ]
        );
    }

    #[test]
    fn a_short_pagemap_read_leaves_pages_absent() {
        let got = presence(&[0, 4096], 4, 4096, |_| Ok(vec![PRESENT])).unwrap();
        assert_eq!(got.readable, [true, false]);
        assert_eq!(got.absent_pages, 1);
    }

    #[test]
    fn this_process_written_memory_is_present() {
        let buf = vec![1u8; 64 << 10];
        let r = Resident::open(std::process::id()).unwrap();
        let a = buf.as_ptr() as u64;
        assert!(r.readable(a, buf.len() as u64).unwrap());
        // Page zero is never mapped.
        assert!(!r.readable(8, 8).unwrap());
    }
}
