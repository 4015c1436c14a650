//! What the mapping layout alone tells about a Go process, for binaries
//! without symbols or DWARF (and to check the runtime's own index):
//!
//! - Go reserves its heap in whole 64 MiB arenas at 64 MiB-aligned
//!   addresses (hints at 0xc000000000 and up before Go 1.26, random
//!   aligned addresses after), maps them in as the heap grows and never
//!   unmaps them: a run of adjacent anonymous mappings that starts and ends
//!   on a 64 MiB boundary is heap arenas.
//! - Everything else Go maps (`sysAlloc`, `persistentalloc`) is anonymous
//!   memory outside the arenas: GC and runtime metadata, where no C runtime
//!   shares the address space.
//! - With a C runtime (cgo): glibc's malloc arenas are 64 MiB-aligned too but
//!   start with a `heap_info` header, and C thread stacks sit right above a
//!   guard page; both are C's.
//! - Go 1.25+ names its mappings (`[anon: Go: heap]`) where the kernel can
//!   (`CONFIG_ANON_VMA_NAME`); then unnamed anonymous memory is not Go's.

use std::ops::Range;

use super::{
    classes::MemoryClass,
    mheap::HEAP_ARENA_BYTES,
    smaps::{Backing, Mapping},
};
use crate::binary::Segment;

/// Guard pages glibc puts below a thread stack are at most this large
/// (`pthread_attr_setguardsize`; the default is one page).
const MAX_THREAD_GUARD: u64 = 64 << 10;

/// Whether a C library is mapped (glibc or musl: cgo, or a C host
/// program). The dynamic loader alone (a PIE Go binary) does not count: it
/// makes only a few small allocations of its own.
pub fn has_c_runtime(mappings: &[Mapping]) -> bool {
    mappings.iter().any(|m| match &m.backing {
        Backing::File(p) => {
            let file = p.rsplit('/').next().unwrap_or(p);
            file.starts_with("libc.so") || file.starts_with("libc-") || file.starts_with("ld-musl")
        }
        _ => false,
    })
}

/// Whether the runtime named its mappings (Go 1.25+ on a kernel that allows it).
pub fn has_go_names(mappings: &[Mapping]) -> bool {
    mappings.iter().any(|m| m.go_name().is_some())
}

/// The class of a mapping Go named ` Go: NAME`.
pub fn go_name_class(name: &str) -> MemoryClass {
    match name {
        // "unused"/"used": arena pages remapped by the runtime's fallbacks
        // (no madvise, GODEBUG=harddecommit).
        "heap" | "heap reservation" | "user arena chunk" | "unused" | "used" => {
            MemoryClass::HeapArenas
        }
        _ => MemoryClass::GcMetadata,
    }
}

/// The executable's bss (zero-filled, anonymous once mapped): the part of
/// each loadable segment past its file contents, at run-time addresses.
pub fn bss_ranges(segments: &[Segment], bias: u64, page: u64) -> Vec<Range<u64>> {
    segments
        .iter()
        .filter(|s| s.memsz > s.filesz)
        .map(|s| {
            let start = s.vaddr.wrapping_add(bias).wrapping_add(s.filesz);
            let end = s.vaddr.wrapping_add(bias).wrapping_add(s.memsz);
            start.div_ceil(page) * page..end.div_ceil(page) * page
        })
        .filter(|r| r.start < r.end)
        .collect()
}

/// Unnamed anonymous private memory: what the mapping layout classifies.
fn plain_anonymous(m: &Mapping) -> bool {
    m.private && m.backing == Backing::Anonymous
}

/// Heap arena reservations by layout: maximal runs of adjacent plain
/// anonymous mappings whose start and end are 64 MiB-aligned. `is_c_heap`
/// rejects runs that are C's (given the run's mappings).
pub fn arena_runs(mappings: &[Mapping], is_c_heap: &dyn Fn(&[Mapping]) -> bool) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < mappings.len() {
        if !plain_anonymous(&mappings[i]) {
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < mappings.len()
            && plain_anonymous(&mappings[j])
            && mappings[j].start == mappings[j - 1].end
        {
            j += 1;
        }
        let (start, end) = (mappings[i].start, mappings[j - 1].end);
        let aligned =
            start.is_multiple_of(HEAP_ARENA_BYTES) && end.is_multiple_of(HEAP_ARENA_BYTES);
        // A run of reservations only has nothing of the heap in it yet.
        let any_mapped = mappings[i..j].iter().any(|m| !m.is_reservation());
        if aligned && any_mapped && !is_c_heap(&mappings[i..j]) {
            out.push(start..end);
        }
        i = j;
    }
    out
}

/// Whether the first words of a 64 MiB run, `heap_info { ar_ptr, prev,
/// size, mprotect_size }`, are glibc's: `mprotect_size` is the length of the
/// run's first (read-write) mapping and `size` does not exceed it.
pub fn is_glibc_heap_header(words: [u64; 4], first_rw_len: u64) -> bool {
    let [ar_ptr, _prev, size, mprotect_size] = words;
    ar_ptr != 0 && size > 0 && size <= mprotect_size && mprotect_size == first_rw_len
}

/// Whether mapping `i` is a C thread stack: read-write, right above a small
/// no-access guard mapping.
pub fn is_thread_stack(mappings: &[Mapping], i: usize) -> bool {
    let m = &mappings[i];
    let Some(guard) = i.checked_sub(1).map(|g| &mappings[g]) else {
        return false;
    };
    plain_anonymous(m)
        && m.writable
        && plain_anonymous(guard)
        && guard.is_reservation()
        && guard.end == m.start
        && guard.size() <= MAX_THREAD_GUARD
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::smaps;

    fn maps(text: &str) -> Vec<Mapping> {
        smaps::parse(text).unwrap()
    }

    /// Go 1.26 (randomized heap base): the reservation starts with no access.
    const GO126: &str = "\
00400000-004dd000 r-xp 00000000 fe:00 10 /srv/app
00602000-00638000 rw-p 00000000 00:00 0
35befc000000-35beff800000 ---p 00000000 00:00 0
35beff800000-35bf06800000 rw-p 00000000 00:00 0
35bf06800000-35bf08000000 ---p 00000000 00:00 0
7fa30b480000-7fa30b530000 rw-p 00000000 00:00 0
7fa30ba00000-7fa30da00000 rw-p 00000000 00:00 0
7fa30da00000-7fa32457d000 ---p 00000000 00:00 0
";

    /// Go 1.19: the first hint, mapped in three pieces.
    const GO119: &str = "\
c000000000-c000200000 rw-p 00000000 00:00 0
c000200000-c000a00000 rw-p 00000000 00:00 0
c000a00000-c006c00000 rw-p 00000000 00:00 0
c006c00000-c008000000 ---p 00000000 00:00 0
7fc1e0cc6000-7fc1e3400000 rw-p 00000000 00:00 0
";

    #[test]
    fn aligned_runs_are_arenas() {
        let none = |_: &[Mapping]| false;
        assert_eq!(
            arena_runs(&maps(GO126), &none),
            vec![0x35befc000000..0x35bf08000000]
        );
        assert_eq!(
            arena_runs(&maps(GO119), &none),
            vec![0xc000000000..0xc008000000]
        );
        // A pure reservation, or one that is not aligned at both ends, is not.
        let reservation = "c000000000-c004000000 ---p 00000000 00:00 0\n";
        assert!(arena_runs(&maps(reservation), &none).is_empty());
        let unaligned = "c000000000-c003000000 rw-p 00000000 00:00 0\n";
        assert!(arena_runs(&maps(unaligned), &none).is_empty());
        // The C check can veto a run.
        assert!(arena_runs(&maps(GO119), &|_| true).is_empty());
    }

    #[test]
    fn glibc_heaps_and_thread_stacks() {
        // heap_info of a thread arena: ar_ptr just past it, 132 KiB used of
        // 132 KiB made read-write.
        let base = 0x7f00_0000_0000u64;
        assert!(is_glibc_heap_header(
            [base + 0x20, 0, 0x21000, 0x21000],
            0x21000
        ));
        // Go heap objects at the start of an arena do not look like that.
        assert!(!is_glibc_heap_header([0xc000010000, 0, 0, 0], 0x200000));
        assert!(!is_glibc_heap_header([1, 2, 3, 4], 0x200000));
        let text = "\
7f0000000000-7f0000001000 ---p 00000000 00:00 0
7f0000001000-7f0000801000 rw-p 00000000 00:00 0
7f0000801000-7f0000900000 rw-p 00000000 00:00 0
7fa30da00000-7fa32457d000 ---p 00000000 00:00 0
7fa32457d000-7fa32457f000 rw-p 00000000 00:00 0
";
        let m = maps(text);
        assert!(is_thread_stack(&m, 1));
        assert!(!is_thread_stack(&m, 2), "no guard below");
        assert!(!is_thread_stack(&m, 4), "a large reservation is no guard");
        assert!(!is_thread_stack(&m, 0));
    }

    #[test]
    fn bss_follows_the_file_contents() {
        let seg = |vaddr, filesz, memsz| Segment {
            vaddr,
            memsz,
            offset: 0,
            filesz,
            flags: 6,
        };
        let segs = [
            seg(0x400000, 0xdc000, 0xdc000),
            seg(0x5f1000, 0x10400, 0x46000),
        ];
        assert_eq!(bss_ranges(&segs, 0, 4096), vec![0x602000..0x637000]);
        assert_eq!(
            bss_ranges(&segs, 0x5500_0000_0000, 4096),
            vec![0x5500_0060_2000..0x5500_0063_7000]
        );
    }

    #[test]
    fn c_runtime_and_go_names() {
        let cgo =
            "7f0000000000-7f0000100000 r-xp 00000000 fe:00 5 /usr/lib/x86_64-linux-gnu/libc.so.6\n";
        assert!(has_c_runtime(&maps(cgo)));
        let pie = "7f0000000000-7f0000100000 r-xp 00000000 fe:00 6 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2\n";
        assert!(!has_c_runtime(&maps(pie)));
        assert!(!has_c_runtime(&maps(GO126)));
        let named = "7f0000000000-7f0000100000 rw-p 00000000 00:00 0 [anon: Go: heap]\n";
        assert!(has_go_names(&maps(named)));
        assert!(!has_go_names(&maps(GO126)));
        assert_eq!(go_name_class("heap"), MemoryClass::HeapArenas);
        assert_eq!(go_name_class("gc bits"), MemoryClass::GcMetadata);
        assert_eq!(go_name_class("heap index"), MemoryClass::GcMetadata);
    }
}
