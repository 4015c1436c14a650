//! C's allocations in a cgo process, told apart from Go's by glibc's own
//! headers (read only where resident):
//!
//! - a malloc arena of a thread (`new_heap`): a 64 MiB-aligned, 64 MiB
//!   reservation starting with `heap_info { ar_ptr, prev, size,
//!   mprotect_size }`, `mprotect_size` being its read-write length;
//! - a large allocation malloc served with its own `mmap`: a chunk header
//!   `{ prev_size: 0, size: length | IS_MMAPPED }` at the start of the
//!   mapping (adjacent chunks the kernel merged into one mapping follow one
//!   another).

use std::ops::Range;

use super::{
    layout,
    mheap::HEAP_ARENA_BYTES,
    procmem::{ProcessMemory, Unread},
    smaps::{Backing, Mapping},
};

/// glibc's "this chunk has its own mmap" bit of a chunk size.
const IS_MMAPPED: u64 = 0x2;
/// The flag bits of a chunk size.
const SIZE_BITS: u64 = 0x7;

/// glibc malloc arenas of threads: 64 MiB (`HEAP_MAX_SIZE`) from each
/// 64 MiB-aligned read-write mapping whose first page holds a `heap_info`
/// header. (Adjacent heaps and thread stacks may merge into one run of
/// mappings, so heaps are found by their start, not by runs.) Where the
/// header is in swap and the runtime's own index says where Go's arenas
/// are (`go_arenas`), a heap's shape outside them is enough: read-write
/// then no access up to exactly 64 MiB, which Go makes only for arenas.
pub fn glibc_heaps(
    mappings: &[Mapping],
    mem: &ProcessMemory,
    go_arenas: Option<&[Range<u64>]>,
) -> Vec<Range<u64>> {
    (0..mappings.len())
        .filter(|&i| plain_rw(&mappings[i]) && mappings[i].start.is_multiple_of(HEAP_ARENA_BYTES))
        .filter(|&i| {
            let m = &mappings[i];
            match mem.u64s(m.start, 4) {
                Ok(w) => layout::is_glibc_heap_header([w[0], w[1], w[2], w[3]], m.size()),
                Err(Unread::InSwap) => go_arenas.is_some_and(|a| {
                    !a.iter().any(|a| a.start < m.end && a.end > m.start) && heap_shape(mappings, i)
                }),
                Err(_) => false,
            }
        })
        .map(|i| mappings[i].start..mappings[i].start + HEAP_ARENA_BYTES)
        .collect()
}

/// Mapping `i` and the no-access mappings right after it span exactly 64 MiB.
fn heap_shape(mappings: &[Mapping], i: usize) -> bool {
    let start = mappings[i].start;
    let mut end = mappings[i].end;
    for m in &mappings[i + 1..] {
        if m.start != end || !m.is_reservation() || !m.is_anonymous() {
            break;
        }
        end = m.end;
    }
    end - start == HEAP_ARENA_BYTES
}

fn plain_rw(m: &Mapping) -> bool {
    m.private && m.backing == Backing::Anonymous && m.writable
}

/// Whether `[prev_size, size]` heads a chunk of its own mmap of at most
/// `room` bytes (a multiple of `page`).
pub fn is_mmapped_chunk(words: [u64; 2], room: u64, page: u64) -> Option<u64> {
    let [prev_size, size] = words;
    let len = size & !SIZE_BITS;
    (prev_size == 0
        && size & IS_MMAPPED != 0
        && len >= page
        && len.is_multiple_of(page)
        && len <= room)
        .then_some(len)
}

/// glibc mmap'd chunks: walked from the start of each plain anonymous
/// read-write mapping outside the Go arenas. Returns them and the bytes of
/// the mappings whose first page was in swap (not read: C chunks among them
/// are counted as Go's).
pub fn glibc_mmap_chunks(
    mappings: &[Mapping],
    arenas: &[Range<u64>],
    mem: &ProcessMemory,
) -> (Vec<Range<u64>>, u64) {
    let page = crate::procfs::page_size();
    let mut out = Vec::new();
    let mut unread = 0;
    for m in mappings {
        if !plain_rw(m) || arenas.iter().any(|a| a.start < m.end && a.end > m.start) {
            continue;
        }
        let mut at = m.start;
        while at < m.end {
            let words = match mem.u64s(at, 2) {
                Ok(w) => [w[0], w[1]],
                Err(why) => {
                    if why == Unread::InSwap && at == m.start {
                        unread += m.size();
                    }
                    break;
                }
            };
            let Some(len) = is_mmapped_chunk(words, m.end - at, page) else {
                break;
            };
            out.push(at..at + len);
            at += len;
        }
    }
    (out, unread)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mmapped_chunk_headers() {
        let page = 4096;
        // malloc(8 MiB): 8 MiB + 4 KiB mapped, size with IS_MMAPPED.
        let len = (8 << 20) + 4096;
        assert_eq!(is_mmapped_chunk([0, len | 2], len, page), Some(len));
        // Not mmapped, not page-sized, larger than the mapping, or a Go
        // persistent chunk (its first word links the previous chunk).
        assert_eq!(is_mmapped_chunk([0, len | 1], len, page), None);
        assert_eq!(is_mmapped_chunk([0, 0x1800 | 2], len, page), None);
        assert_eq!(is_mmapped_chunk([0, (2 * len) | 2], len, page), None);
        assert_eq!(
            is_mmapped_chunk([0x7f00_0000_0000, len | 2], len, page),
            None
        );
        assert_eq!(is_mmapped_chunk([0, 0], len, page), None);
    }
}
