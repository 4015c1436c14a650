//! Reading a process's exposure: its mappings, its executable, what its
//! runtime's heap index says (or what its layout says), then the classes,
//! the cgroup and the host.

use std::ops::Range;

use super::{
    ArenaSummary, Exposure, HostMemory, MemoryError, MetadataReads, c_alloc,
    classes::{MemoryClass, Source, Usage},
    classify::{self, Context},
    executable::Executable,
    layout,
    mheap::{self, HEAP_ARENA_BYTES, RuntimeHeap},
    procmem::ProcessMemory,
    smaps::{self, Mapping},
};
use crate::{
    binary::GoBinary,
    clock::monotonic_ns,
    image::ProcessImage,
    memory::cgroup::CgroupMemory,
    procfs::{page_size, pagemap::Pagemap},
};

/// How much of the process gostw reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadOptions {
    /// Read the runtime's heap index from the process where the binary
    /// allows (symbols + DWARF); off: the mapping layout alone.
    pub runtime_index: bool,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            runtime_index: true,
        }
    }
}

/// The symbol of the runtime's heap.
const MHEAP_SYMBOL: &str = "runtime.mheap_";

pub(super) fn read(
    pid: u32,
    exe: &Executable,
    options: &ReadOptions,
) -> Result<Exposure, MemoryError> {
    if pid == 0 || !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        return Err(MemoryError::NoProcess { pid });
    }
    let at_ns = monotonic_ns();
    let page = page_size();
    let what = format!("/proc/{pid}/smaps");
    let text = std::fs::read_to_string(&what).map_err(|e| MemoryError::from_io(pid, &what, e))?;
    let mappings = smaps::parse(&text).map_err(|e| MemoryError::Malformed {
        pid,
        what: what.clone(),
        reason: e.to_string(),
    })?;
    if mappings.is_empty() {
        return Err(MemoryError::no_memory(pid));
    }
    let bin = exe.binary();
    let mut notes = Vec::new();
    let exe_inode = Some(exe.image.id.ino);
    // Through the one maps parser, as every front end reads the bias.
    let bias = match ProcessImage::new(pid, exe.image.clone()).resolve() {
        Some(b) => b,
        None => {
            notes.push("the executable's bss was not located: it is not mapped".into());
            0
        }
    };
    let mut ctx = Context {
        exe_inode,
        bss: layout::bss_ranges(bin.load_segments(), bias, page),
        c_runtime: layout::has_c_runtime(&mappings),
        go_names: layout::has_go_names(&mappings),
        ..Context::default()
    };
    let mem = ProcessMemory::open(pid, page).ok();
    let runtime = if options.runtime_index {
        runtime_heap(
            bin,
            exe.heap_layouts.as_ref(),
            bias,
            mem.as_ref(),
            page,
            &mut notes,
        )
    } else {
        None
    };
    let runtime = runtime.filter(|rt| covers_mappings(&rt.arenas, &mappings, &mut notes));
    // C's allocations, where a C runtime shares the address space and the
    // runtime did not name its own mappings.
    let c_known = ctx.c_runtime && !ctx.go_names;
    if let Some(mem) = mem.as_ref().filter(|_| c_known) {
        let go_arenas = runtime.as_ref().map(|rt| &rt.arenas[..]);
        ctx.c_heaps = c_alloc::glibc_heaps(&mappings, mem, go_arenas);
    }
    if let Some(rt) = runtime {
        ctx.arenas = rt.arenas;
        ctx.metadata = rt.metadata;
        ctx.arena_source = Some(Source::ArenaIndex);
        notes.extend(rt.notes);
    } else if ctx.go_names {
        ctx.arena_source = Some(Source::VmaName);
    } else {
        let c_heaps = ctx.c_heaps.clone();
        ctx.arenas = layout::arena_runs(&mappings, &|run: &[Mapping]| {
            let (start, end) = (run[0].start, run[run.len() - 1].end);
            c_heaps.iter().any(|h| h.start >= start && h.start < end)
        });
        ctx.arena_source = Some(Source::MappingLayout);
        if ctx.arenas.is_empty() {
            notes.push(
                "no 64 MiB-aligned arena reservation in the mapping layout: the heap is counted as GC metadata"
                    .into(),
            );
        }
    }
    if let Some(mem) = mem.as_ref().filter(|_| c_known) {
        let (chunks, unread) = c_alloc::glibc_mmap_chunks(&mappings, &ctx.arenas, mem);
        ctx.c_chunks = chunks;
        notes.push(format!(
            "a C runtime is mapped (cgo): glibc's heaps, mmap'd chunks and thread stacks are told apart by their headers and guard pages; other anonymous memory outside the arenas counts as GC metadata and may hold other C allocations{}",
            if unread > 0 {
                format!(
                    " ({} of anonymous mappings start on a page in swap, not read: C chunks among them count as GC metadata)",
                    crate::units::fmt_bytes(unread)
                )
            } else {
                String::new()
            }
        ));
    }
    let pagemap = Pagemap::open(pid, page).map_err(|e| MemoryError::from_io(pid, "pagemap", e))?;
    let classes = classify::classify(&mappings, &ctx, &pagemap, page)
        .map_err(|e| MemoryError::from_io(pid, "pagemap", e))?;
    let mut total = Usage::default();
    for c in &classes {
        total.add(&c.usage);
    }
    let host = host_memory();
    let get = |c: MemoryClass| classes.iter().find(|u| u.class == c).map(|u| u.usage);
    let gc_metadata_reads = MetadataReads::estimate(
        get(MemoryClass::GcMetadata).map_or(0, |u| u.swapped_bytes),
        get(MemoryClass::HeapArenas).map_or(0, |u| u.swapped_bytes),
        page,
        host.page_cluster,
    );
    let arenas = arena_summary(&ctx, &mappings);
    let cgroup = match CgroupMemory::read(pid) {
        Ok(c) => c,
        Err(e) => {
            notes.push(format!("the process's cgroup could not be read: {e}"));
            None
        }
    };
    Ok(Exposure {
        pid,
        exe: bin.path.display().to_string(),
        go_version: bin.version_string.clone(),
        symbols: bin.has_symtab,
        dwarf: bin.has_dwarf,
        c_runtime: ctx.c_runtime,
        page_size: page,
        at_ns,
        total,
        classes,
        arenas,
        gc_metadata_reads,
        cgroup,
        host,
        notes,
    })
}

/// The runtime's heap index, where symbols, DWARF and the process allow.
fn runtime_heap(
    bin: &GoBinary,
    layouts: Option<&mheap::Layouts>,
    bias: u64,
    mem: Option<&ProcessMemory>,
    page: u64,
    notes: &mut Vec<String>,
) -> Option<RuntimeHeap> {
    let unusable = if !bin.has_symtab {
        Some("no symbol table (stripped)".to_owned())
    } else if bin.symbol(MHEAP_SYMBOL).is_none() {
        Some(format!("no {MHEAP_SYMBOL} symbol"))
    } else if !bin.has_dwarf {
        Some("no DWARF (-w): the runtime's heap index cannot be decoded".to_owned())
    } else if layouts.is_none() {
        Some("the binary's DWARF has no runtime.mheap".to_owned())
    } else if mem.is_none() {
        Some("/proc/PID/mem cannot be read".to_owned())
    } else {
        None
    };
    if let Some(why) = unusable {
        notes.push(format!("{why}: the heap is found from the mapping layout"));
        return None;
    }
    let (Some(layouts), Some(mem)) = (layouts, mem) else {
        return None;
    };
    let addr = bin.symbol(MHEAP_SYMBOL)?.wrapping_add(bias);
    let amd64 = bin.arch == crate::binary::Arch::Amd64;
    match mheap::read(mem, addr, layouts, amd64, page) {
        Ok(heap) => Some(heap),
        Err(why) => {
            notes.push(format!(
                "the runtime's heap index was not used: {why}; the heap is found from the mapping layout"
            ));
            None
        }
    }
}

/// Whether every arena the index names lies in the process's mappings (a
/// check that the index was read right); says so when not.
fn covers_mappings(arenas: &[Range<u64>], mappings: &[Mapping], notes: &mut Vec<String>) -> bool {
    let inside = arenas.iter().all(|a| {
        mappings
            .iter()
            .any(|m| m.start < a.end && m.end > a.start && m.is_anonymous())
    });
    if !inside {
        notes.push(
            "the runtime's heap index names arenas outside the process's mappings: it was not used, the heap is found from the mapping layout"
                .into(),
        );
    }
    inside
}

fn arena_summary(ctx: &Context, mappings: &[Mapping]) -> ArenaSummary {
    let source = ctx.arena_source.unwrap_or(Source::MappingLayout);
    let ranges: Vec<Range<u64>> = if source == Source::VmaName {
        let mut v: Vec<Range<u64>> = Vec::new();
        for m in mappings.iter().filter(|m| {
            m.go_name()
                .is_some_and(|n| layout::go_name_class(n) == MemoryClass::HeapArenas)
        }) {
            match v.last_mut() {
                Some(r) if r.end == m.start => r.end = m.end,
                _ => v.push(m.range()),
            }
        }
        v
    } else {
        ctx.arenas.clone()
    };
    ArenaSummary {
        source,
        count: ranges
            .iter()
            .map(|r| (r.end - r.start).div_ceil(HEAP_ARENA_BYTES))
            .sum(),
        ranges: ranges
            .iter()
            .map(|r| format!("{:#x}-{:#x}", r.start, r.end))
            .collect(),
    }
}

fn host_memory() -> HostMemory {
    let sysctl = |name: &str| {
        std::fs::read_to_string(format!("/proc/sys/vm/{name}"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    };
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let h = super::HostSwap::parse("", &meminfo, 0);
    HostMemory {
        swap_total_bytes: h.swap_total_bytes,
        swap_free_bytes: h.swap_free_bytes,
        swappiness: sysctl("swappiness"),
        page_cluster: sysctl("page-cluster"),
    }
}
