//! Classification on captured layouts (smaps of real Go workloads, figures
//! trimmed), with page counts from a fake pagemap.

#![expect(
    clippy::single_range_in_vec_init,
    reason = "lists of address ranges that happen to hold one"
)]

use super::*;
use crate::{memory::smaps, procfs::pagemap::PageCounts};

const PAGE: u64 = 4096;

/// A pagemap that says every page of a range is resident, except the
/// pages of `swapped` ranges, which are in swap.
struct FakePages {
    swapped: Vec<Range<u64>>,
}

impl PageSource for FakePages {
    fn counts(&self, ranges: &[Range<u64>]) -> io::Result<Vec<PageCounts>> {
        Ok(ranges
            .iter()
            .map(|r| {
                let total = (r.end - r.start) / PAGE;
                let swapped: u64 = self
                    .swapped
                    .iter()
                    .map(|s| s.end.min(r.end).saturating_sub(s.start.max(r.start)) / PAGE)
                    .sum();
                PageCounts {
                    present: total - swapped,
                    swapped,
                }
            })
            .collect())
    }
}

fn class(classes: &[ClassUsage], c: MemoryClass) -> &ClassUsage {
    classes.iter().find(|u| u.class == c).unwrap()
}

fn part<'a>(u: &'a ClassUsage, name: &str) -> &'a Part {
    u.parts
        .iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("no part {name:?} in {:?}", u.parts))
}

/// Go 1.19, non-PIE, from its smaps after a page-out: the arena index
/// (32 MiB) lies inside a larger metadata mapping.
const GO119: &str = "\
00400000-004b7000 r-xp 00000000 fe:00 77 /srv/gcswap
Rss:                 732 kB
00577000-00592000 rw-p 00177000 fe:00 77 /srv/gcswap
Rss:                 108 kB
00592000-005c7000 rw-p 00000000 00:00 0 
Rss:                  72 kB
Swap:                 40 kB
c000000000-c006c00000 rw-p 00000000 00:00 0 
Rss:               10000 kB
Swap:              90000 kB
c006c00000-c008000000 ---p 00000000 00:00 0 
7fc1e0cc6000-7fc1e3400000 rw-p 00000000 00:00 0 
Rss:                2000 kB
Swap:               4256 kB
7fc208623000-7fc208683000 rw-p 00000000 00:00 0 
Rss:                  44 kB
7ffd86dbb000-7ffd86ddc000 rw-p 00000000 00:00 0                          [stack]
Rss:                  16 kB
";

fn go119_ctx() -> Context {
    let index = 0x7fc1e1400000u64;
    Context {
        exe_inode: Some(77),
        bss: vec![0x592000..0x5c7000],
        arenas: vec![0xc000000000..0xc008000000],
        arena_source: Some(Source::ArenaIndex),
        metadata: vec![(index..index + (32 << 20), MetadataPart::ArenaIndex)],
        ..Context::default()
    }
}

#[test]
fn runtime_index_splits_a_mapping_and_keeps_smaps_totals() {
    let maps = smaps::parse(GO119).unwrap();
    // 1 MiB of the arena index is in swap, the rest of that mapping's
    // 4256 KiB of swap lies below the index.
    let pages = FakePages {
        swapped: vec![
            0x7fc1e0cc6000..0x7fc1e0cc6000 + (3232 << 10),
            0x7fc1e1400000..0x7fc1e1500000,
        ],
    };
    let classes = classify(&maps, &go119_ctx(), &pages, PAGE).unwrap();
    let heap = class(&classes, MemoryClass::HeapArenas);
    assert_eq!(heap.source, Source::ArenaIndex);
    assert_eq!(heap.usage.mapped_bytes, 0x6c00000);
    assert_eq!(heap.usage.reserved_bytes, 0x1400000);
    assert_eq!(heap.usage.swapped_bytes, 90000 << 10);

    let meta = class(&classes, MemoryClass::GcMetadata);
    let index = part(meta, MetadataPart::ArenaIndex.name());
    assert_eq!(index.source, Source::ArenaIndex);
    assert_eq!(index.usage.mapped_bytes, 32 << 20);
    assert_eq!(index.usage.swapped_bytes, 1 << 20);
    // The rest of the mapping keeps what smaps counted, minus the index's share.
    let rest = part(meta, "other runtime allocations");
    assert_eq!(rest.usage.swapped_bytes, (4256 << 10) - (1 << 20));
    assert_eq!(meta.usage.swapped_bytes, 4256 << 10);
    assert_eq!(meta.usage.resident_bytes, (2000 + 44) << 10);

    let files = class(&classes, MemoryClass::FileBacked);
    assert_eq!(part(files, "executable bss").usage.swapped_bytes, 40 << 10);
    assert_eq!(
        part(files, "executable").usage.resident_bytes,
        (732 + 108) << 10
    );
    let other = class(&classes, MemoryClass::Other);
    assert_eq!(other.usage.resident_bytes, 16 << 10);
    assert_eq!(other.source, Source::KernelName);

    // Every byte of smaps is in exactly one class.
    let swap: u64 = classes.iter().map(|c| c.usage.swapped_bytes).sum();
    let rss: u64 = classes.iter().map(|c| c.usage.resident_bytes).sum();
    assert_eq!(swap, maps.iter().map(|m| m.swap).sum::<u64>());
    assert_eq!(rss, maps.iter().map(|m| m.rss).sum::<u64>());
}

#[test]
fn pagemap_figures_are_scaled_to_the_smaps_totals() {
    // pagemap and smaps differ by pages that moved between the two reads:
    // pieces keep their proportions, the mapping keeps smaps' total.
    assert_eq!(match_total(&[10, 30], 40, 1), vec![10, 30]);
    assert_eq!(match_total(&[10, 30], 20, 1), vec![5, 15]);
    assert_eq!(match_total(&[1, 1, 1], 4, 2), vec![1, 1, 2]);
    assert_eq!(match_total(&[0, 0], 3, 0), vec![3, 0]);
    assert_eq!(match_total(&[5, 0], 0, 0), vec![0, 0]);
}

#[test]
fn mapping_layout_alone_finds_the_same_heap() {
    let maps = smaps::parse(GO119).unwrap();
    let ctx = Context {
        arenas: layout::arena_runs(&maps, &|_| false),
        arena_source: Some(Source::MappingLayout),
        metadata: Vec::new(),
        ..go119_ctx()
    };
    let classes = classify(&maps, &ctx, &FakePages { swapped: vec![] }, PAGE).unwrap();
    let heap = class(&classes, MemoryClass::HeapArenas);
    assert_eq!(heap.source, Source::MappingLayout);
    assert_eq!(heap.usage.mapped_bytes, 0x6c00000);
    let meta = class(&classes, MemoryClass::GcMetadata);
    assert_eq!(meta.source, Source::MappingLayout);
    assert_eq!(meta.parts.len(), 1);
    assert_eq!(meta.usage.swapped_bytes, 4256 << 10);
}

/// A cgo process: libc, a C thread stack above its guard, the brk heap, a
/// glibc malloc arena.
const CGO: &str = "\
00400000-00500000 r-xp 00000000 fe:00 88 /srv/cgo
c000000000-c004000000 rw-p 00000000 00:00 0 
Rss:                4096 kB
55d0aab29000-55d0aac76000 rw-p 00000000 00:00 0                          [heap]
Rss:                 132 kB
7f0000000000-7f0000021000 rw-p 00000000 00:00 0 
Rss:                 132 kB
7f0000021000-7f0004000000 ---p 00000000 00:00 0 
7f1000000000-7f1000001000 ---p 00000000 00:00 0 
7f1000001000-7f1000801000 rw-p 00000000 00:00 0 
Rss:                  16 kB
7f2000000000-7f2000100000 rw-p 00000000 00:00 0 
Rss:                  64 kB
7f3000000000-7f3000100000 r-xp 00000000 fe:00 5 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                 800 kB
7f3000100000-7f3000102000 rw-p 00100000 fe:00 5 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                   8 kB
7f3000102000-7f300010f000 rw-p 00000000 00:00 0 
Rss:                  52 kB
";

#[test]
fn cgo_stacks_and_c_heaps_are_other() {
    let maps = smaps::parse(CGO).unwrap();
    let c_heap = 0x7f0000000000u64..0x7f0004000000;
    let ctx = Context {
        exe_inode: Some(88),
        arenas: layout::arena_runs(&maps, &|run| run[0].start == c_heap.start),
        arena_source: Some(Source::MappingLayout),
        c_heaps: vec![c_heap],
        c_runtime: layout::has_c_runtime(&maps),
        ..Context::default()
    };
    assert!(ctx.c_runtime);
    assert_eq!(ctx.arenas, vec![0xc000000000..0xc004000000]);
    let classes = classify(&maps, &ctx, &FakePages { swapped: vec![] }, PAGE).unwrap();
    let other = class(&classes, MemoryClass::Other);
    assert_eq!(
        part(other, "C thread stacks").usage.resident_bytes,
        16 << 10
    );
    assert_eq!(part(other, "C thread stacks").usage.reserved_bytes, 4096);
    assert_eq!(
        part(other, "C malloc arenas (glibc)").usage.resident_bytes,
        132 << 10
    );
    assert_eq!(
        part(other, "[heap] (C malloc)").usage.resident_bytes,
        132 << 10
    );
    // What is left could be Go's or C's; it is counted as Go's metadata.
    let meta = class(&classes, MemoryClass::GcMetadata);
    assert_eq!(meta.usage.resident_bytes, 64 << 10);
    let files = class(&classes, MemoryClass::FileBacked);
    assert_eq!(
        part(files, "libraries and other files")
            .usage
            .resident_bytes,
        808 << 10
    );
    assert_eq!(part(files, "libraries' bss").usage.resident_bytes, 52 << 10);
}

/// Go 1.25+ with mapping names.
const NAMED: &str = "\
1bac6c000000-1bac6f400000 ---p 00000000 00:00 0                          [anon: Go: heap reservation]
1bac6f400000-1bac76400000 rw-p 00000000 00:00 0                          [anon: Go: heap]
Rss:              100000 kB
Swap:               9000 kB
7fc94feb4000-7fc9503f8000 rw-p 00000000 00:00 0                          [anon: Go: immortal metadata]
Rss:                3484 kB
Swap:                100 kB
7fc950400000-7fc952400000 rw-p 00000000 00:00 0                          [anon: Go: heap index]
Rss:                   4 kB
7fc996c0f000-7fc996d0f000 rw-p 00000000 00:00 0 
Rss:                   8 kB
";

#[test]
fn go_names_decide_and_unnamed_memory_is_not_go() {
    let maps = smaps::parse(NAMED).unwrap();
    let ctx = Context {
        go_names: layout::has_go_names(&maps),
        ..Context::default()
    };
    let classes = classify(&maps, &ctx, &FakePages { swapped: vec![] }, PAGE).unwrap();
    let heap = class(&classes, MemoryClass::HeapArenas);
    assert_eq!(heap.source, Source::VmaName);
    assert_eq!(heap.usage.swapped_bytes, 9000 << 10);
    assert_eq!(heap.usage.reserved_bytes, 0x3400000);
    let meta = class(&classes, MemoryClass::GcMetadata);
    assert_eq!(meta.source, Source::VmaName);
    assert_eq!(
        part(meta, "immortal metadata").usage.swapped_bytes,
        100 << 10
    );
    assert_eq!(part(meta, "heap index").usage.mapped_bytes, 32 << 20);
    let other = class(&classes, MemoryClass::Other);
    assert_eq!(other.usage.resident_bytes, 8 << 10);
}

#[test]
fn overlapping_overrides_take_the_lower_rank() {
    let m = smaps::parse("1000-9000 rw-p 00000000 00:00 0 \n").unwrap();
    let ctx = Context {
        arenas: vec![0x2000..0x4000],
        metadata: vec![
            (0x3000..0x6000, MetadataPart::SpanStructures),
            (0x5000..0x7000, MetadataPart::ArenaIndex),
        ],
        ..Context::default()
    };
    let own = ctx.own_label(&m, 0);
    let p = pieces(&m[0], &own, &ctx.overlays());
    let got: Vec<(Range<u64>, &str)> = p
        .iter()
        .map(|(r, l)| (r.clone(), l.part.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (0x1000..0x2000, "other runtime allocations"),
            (0x2000..0x4000, "heap arenas"),
            (0x4000..0x5000, MetadataPart::SpanStructures.name()),
            (0x5000..0x7000, MetadataPart::ArenaIndex.name()),
            (0x7000..0x9000, "other runtime allocations"),
        ]
    );
}
