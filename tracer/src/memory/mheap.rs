//! What the Go runtime's own heap index says, read from the live process
//! (`/proc/PID/mem`) where the binary keeps symbols and DWARF: every heap
//! arena (`mheap_.allArenas`, or `heapArenas` + `userArenaArenas` from Go
//! 1.25), the arena index itself (`mheap_.arenas`, a 32 MiB array the
//! runtime maps outside its own statistics), each arena's `heapArena`
//! metadata (span map, page bitmaps, and before Go 1.22 the heap bitmap),
//! and every span structure (`mheap_.allspans`).

use std::{collections::BTreeMap, ops::Range};

use super::procmem::{ProcessMemory, Unread};
use crate::binary::{GoBinary, StructLayout};

/// The runtime structs that describe the heap, read from DWARF (only where
/// the binary keeps it, not `-w`): they change between releases and have no
/// runtime type descriptor.
pub const MHEAP: &str = "runtime.mheap";
pub const HEAP_ARENA: &str = "runtime.heapArena";
pub const MSPAN: &str = "runtime.mspan";

/// The heap structs found, by name.
pub type Layouts = BTreeMap<&'static str, StructLayout>;

/// The heap structs' layouts from `bin`'s DWARF (the one DWARF reader,
/// over the mapped file), `None` without DWARF.
pub fn heap_layouts(bin: &GoBinary) -> Option<Layouts> {
    if !bin.has_dwarf {
        return None;
    }
    bin.dwarf_structs(&[MHEAP, HEAP_ARENA, MSPAN])
}

/// Bytes of one heap arena on 64-bit Linux (`heapArenaBytes`).
pub const HEAP_ARENA_BYTES: u64 = 64 << 20;
/// Entries of the arena index's second level on linux/amd64 and arm64
/// (`1 << arenaL2Bits`: 48 address bits, 64 MiB arenas, no first level).
pub const ARENA_L2_ENTRIES: u64 = 1 << 22;
/// Slices of arena indices, by the names of the Go releases that have them.
const ARENA_LISTS: &[&str] = &["allArenas", "heapArenas", "userArenaArenas"];
/// Most span structures read (a 32 MiB pointer array); more are left out.
const MAX_SPANS: u64 = 1 << 22;

/// A metadata region the runtime's index locates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum MetadataPart {
    /// `mheap_.arenas`: the arena index (L2 map, `[1 << 22]*heapArena`).
    ArenaIndex,
    /// `heapArena` structs: span map, page bitmaps (and heap bitmaps
    /// before Go 1.22).
    ArenaMetadata,
    /// Pages holding `mspan` structures.
    SpanStructures,
}

impl MetadataPart {
    /// Every part, in order of precedence where they overlap.
    pub const ALL: [MetadataPart; 3] = [
        MetadataPart::ArenaIndex,
        MetadataPart::ArenaMetadata,
        MetadataPart::SpanStructures,
    ];

    /// A name for reports.
    pub fn name(self) -> &'static str {
        match self {
            MetadataPart::ArenaIndex => "arena index (mheap_.arenas)",
            MetadataPart::ArenaMetadata => "arena metadata (heapArena: span map, bitmaps)",
            MetadataPart::SpanStructures => "span structures (mspan)",
        }
    }
}

/// The runtime's view of its heap.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeHeap {
    /// Heap arenas, merged where contiguous.
    pub arenas: Vec<Range<u64>>,
    /// Metadata regions, page-aligned, by part.
    pub metadata: Vec<(Range<u64>, MetadataPart)>,
    /// What could not be read and was left out.
    pub notes: Vec<String>,
}

/// Where an arena index points: `arenaBase(i) = i * heapArenaBytes +
/// arenaBaseOffset` (amd64 offsets by the sign-extended upper half).
pub fn arena_base(idx: u64, amd64: bool) -> u64 {
    let offset = if amd64 { 0xffff_8000_0000_0000 } else { 0 };
    idx.wrapping_mul(HEAP_ARENA_BYTES).wrapping_add(offset)
}

/// Why the runtime's heap index could not be used.
fn unread(what: &str, why: Unread) -> String {
    match why {
        Unread::InSwap => {
            format!("{what} is in swap (reading it would swap it back in, so gostw does not)")
        }
        Unread::NotPresent => format!("{what} is not in memory"),
        Unread::Failed => format!("{what} could not be read"),
    }
}

/// Read the runtime's heap index of a process whose `runtime.mheap_` is at
/// `mheap` (run-time address), with the struct layouts of its DWARF. Only
/// resident memory is read; the error says what was missing.
pub fn read(
    mem: &ProcessMemory,
    mheap: u64,
    layouts: &Layouts,
    amd64: bool,
    page_size: u64,
) -> Result<RuntimeHeap, String> {
    let h = layouts.get(MHEAP).ok_or("DWARF has no runtime.mheap")?;
    let mut out = RuntimeHeap::default();
    let mut indices: Vec<u64> = Vec::new();
    for name in ARENA_LISTS {
        let Some(&off) = h.members.get(*name) else {
            continue;
        };
        let (ptr, len) = slice_header(mem, mheap + off).map_err(|w| unread("runtime.mheap_", w))?;
        if len > ARENA_L2_ENTRIES {
            return Err(format!("mheap_.{name} has an impossible length {len}"));
        }
        if len > 0 {
            let v = mem
                .u64s(ptr, len as usize)
                .map_err(|w| unread(&format!("the mheap_.{name} array"), w))?;
            indices.extend(v);
        }
    }
    if indices.is_empty() {
        return Err("runtime.mheap lists no arenas in DWARF or in memory".into());
    }
    indices.sort_unstable();
    indices.dedup();
    for &i in &indices {
        let base = arena_base(i, amd64);
        match out.arenas.last_mut() {
            Some(last) if last.end == base => last.end = base + HEAP_ARENA_BYTES,
            _ => out.arenas.push(base..base.wrapping_add(HEAP_ARENA_BYTES)),
        }
    }
    // The index: arenas[0] (no first level on these platforms).
    let l2 = match h.members.get("arenas").map(|&off| mem.u64(mheap + off)) {
        Some(Ok(p)) if p != 0 => p,
        Some(Err(w)) => {
            out.notes.push(unread("mheap_.arenas", w));
            return Ok(out);
        }
        _ => {
            out.notes.push("mheap_.arenas is missing or empty".into());
            return Ok(out);
        }
    };
    out.metadata
        .push((l2..l2 + ARENA_L2_ENTRIES * 8, MetadataPart::ArenaIndex));
    match layouts.get(HEAP_ARENA).and_then(|l| l.size) {
        Some(size) => {
            let mut missing = 0;
            for &i in &indices {
                match mem.u64(l2 + (i % ARENA_L2_ENTRIES) * 8) {
                    Ok(0) => {}
                    Ok(ha) => out.metadata.push((
                        page_range(ha..ha + size, page_size),
                        MetadataPart::ArenaMetadata,
                    )),
                    Err(_) => missing += 1,
                }
            }
            if missing > 0 {
                out.notes.push(format!(
                    "{missing} of {} arenas' metadata not located: their arena index entries are in swap",
                    indices.len()
                ));
            }
        }
        None => out
            .notes
            .push("runtime.heapArena has no size in DWARF: arena metadata not located".into()),
    }
    spans(mem, mheap, layouts, page_size, &mut out);
    out.metadata.sort_unstable_by_key(|(r, p)| (r.start, *p));
    Ok(out)
}

/// Pages holding span structures, from `mheap_.allspans`.
fn spans(mem: &ProcessMemory, mheap: u64, layouts: &Layouts, page: u64, out: &mut RuntimeHeap) {
    let (Some(&off), Some(size)) = (
        layouts.get(MHEAP).and_then(|h| h.members.get("allspans")),
        layouts.get(MSPAN).and_then(|s| s.size),
    ) else {
        out.notes.push(
            "mheap_.allspans or runtime.mspan missing from DWARF: span structures not located"
                .into(),
        );
        return;
    };
    let (ptr, len) = match slice_header(mem, mheap + off) {
        Ok(h) => h,
        Err(w) => {
            out.notes.push(unread("mheap_.allspans", w));
            return;
        }
    };
    if len > MAX_SPANS {
        out.notes.push(format!(
            "{len} spans: more than gostw reads ({MAX_SPANS}); span structures not located"
        ));
        return;
    }
    // Page by page: pages of the array in swap are left out, not swapped in.
    // (The array may also be replaced as the heap grows; a page that then
    // fails to read is left out the same way.)
    let words = mem.u64s_resident(ptr, len as usize);
    let unread_spans = words.iter().filter(|w| w.is_none()).count();
    if unread_spans > 0 {
        out.notes.push(format!(
            "{unread_spans} of {len} span pointers are on pages of mheap_.allspans in swap: those span structures are counted with other runtime allocations"
        ));
    }
    let mut pages: Vec<u64> = words
        .into_iter()
        .flatten()
        .filter(|&s| s != 0)
        .flat_map(|s| (s / page)..(s + size).div_ceil(page))
        .collect();
    pages.sort_unstable();
    pages.dedup();
    let mut ranges: Vec<Range<u64>> = Vec::new();
    for p in pages {
        match ranges.last_mut() {
            Some(r) if r.end == p * page => r.end += page,
            _ => ranges.push(p * page..(p + 1) * page),
        }
    }
    out.metadata.extend(
        ranges
            .into_iter()
            .map(|r| (r, MetadataPart::SpanStructures)),
    );
}

/// (data pointer, length) of the Go slice header at `addr`.
fn slice_header(mem: &ProcessMemory, addr: u64) -> Result<(u64, u64), Unread> {
    let h = mem.u64s(addr, 2)?;
    Ok((h[0], h[1]))
}

fn page_range(r: Range<u64>, page: u64) -> Range<u64> {
    (r.start / page * page)..r.end.div_ceil(page) * page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_indices_map_to_the_addresses_go_uses() {
        // Go's first amd64 arena hint, 0xc000000000, is index 0x203000
        // (the index counts from the bottom of the sign-extended half).
        let idx = (0xc0_0000_0000u64.wrapping_sub(0xffff_8000_0000_0000)) / HEAP_ARENA_BYTES;
        assert_eq!(idx, 0x203000);
        assert_eq!(arena_base(idx, true), 0xc0_0000_0000);
        assert_eq!(arena_base(3, false), 3 * HEAP_ARENA_BYTES);
    }

    #[test]
    fn pages_round_outward() {
        assert_eq!(page_range(4097..8193, 4096), 4096..12288);
        assert_eq!(page_range(4096..8192, 4096), 4096..8192);
    }
}
