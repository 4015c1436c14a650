//! Splitting a process's mappings into classes: each mapping gets a class
//! from what backs it and the layout rules, address ranges the runtime's
//! own index (or the bss, or the arena layout) places override that, and a
//! mapping cut by such ranges is counted page by page from pagemap, with
//! smaps' totals for the mapping kept exact.

use std::{
    collections::{BTreeMap, HashMap},
    io,
    ops::Range,
};

use crate::procfs::pagemap::PageSource;

use super::{
    classes::{ClassUsage, MemoryClass, Part, Source, Usage},
    layout,
    mheap::MetadataPart,
    smaps::{Backing, Mapping},
};

/// What a piece of memory is.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Label {
    pub class: MemoryClass,
    pub part: String,
    pub source: Source,
}

impl Label {
    fn new(class: MemoryClass, part: &str, source: Source) -> Label {
        Label {
            class,
            part: part.to_owned(),
            source,
        }
    }
}

/// Everything known about the process's layout besides its mappings.
#[derive(Clone, Debug, Default)]
pub struct Context {
    /// Inode of the executable (its file mappings are "executable").
    pub exe_inode: Option<u64>,
    /// The executable's bss.
    pub bss: Vec<Range<u64>>,
    /// Heap arenas, and how they were found.
    pub arenas: Vec<Range<u64>>,
    pub arena_source: Option<Source>,
    /// Metadata regions the runtime's index located.
    pub metadata: Vec<(Range<u64>, MetadataPart)>,
    /// glibc malloc arenas and mmap'd chunks, found by their headers.
    pub c_heaps: Vec<Range<u64>>,
    pub c_chunks: Vec<Range<u64>>,
    pub c_runtime: bool,
    pub go_names: bool,
}

/// A range that overrides a mapping's own class; lower rank wins.
struct Overlay {
    range: Range<u64>,
    rank: usize,
    label: Label,
}

impl Context {
    fn overlays(&self) -> Vec<Overlay> {
        let mut v = Vec::new();
        let mut push = |ranges: &mut dyn Iterator<Item = (Range<u64>, Label)>, rank| {
            v.extend(ranges.map(|(range, label)| Overlay { range, rank, label }));
        };
        let bss = Label::new(MemoryClass::FileBacked, "executable bss", Source::File);
        push(&mut self.bss.iter().map(|r| (r.clone(), bss.clone())), 0);
        let arenas = Label::new(
            MemoryClass::HeapArenas,
            "heap arenas",
            self.arena_source.unwrap_or(Source::MappingLayout),
        );
        push(
            &mut self.arenas.iter().map(|r| (r.clone(), arenas.clone())),
            1,
        );
        for part in MetadataPart::ALL {
            let l = Label::new(MemoryClass::GcMetadata, part.name(), Source::ArenaIndex);
            push(
                &mut self
                    .metadata
                    .iter()
                    .filter(|(_, p)| *p == part)
                    .map(|(r, _)| (r.clone(), l.clone())),
                2 + part as usize,
            );
        }
        let rank = 2 + MetadataPart::ALL.len();
        for (ranges, part) in [
            (&self.c_heaps, "C malloc arenas (glibc)"),
            (&self.c_chunks, "C malloc mmap'd chunks (glibc)"),
        ] {
            let c = Label::new(MemoryClass::Other, part, Source::MappingLayout);
            push(&mut ranges.iter().map(|r| (r.clone(), c.clone())), rank);
        }
        v.sort_by_key(|o| o.range.start);
        v
    }

    /// Whether anonymous mapping `i` starts where a library's writable data
    /// ends: the dynamic loader maps a library's bss there.
    fn follows_library_data(&self, mappings: &[Mapping], i: usize) -> bool {
        let Some(prev) = i.checked_sub(1).map(|p| &mappings[p]) else {
            return false;
        };
        matches!(prev.backing, Backing::File(_))
            && prev.writable
            && prev.private
            && prev.end == mappings[i].start
            && Some(prev.inode) != self.exe_inode
    }

    /// The class of mapping `i` from what backs it and the layout rules.
    fn own_label(&self, mappings: &[Mapping], i: usize) -> Label {
        let m = &mappings[i];
        let kernel = |part| Label::new(MemoryClass::Other, part, Source::KernelName);
        match &m.backing {
            Backing::File(_) if Some(m.inode) == self.exe_inode => {
                Label::new(MemoryClass::FileBacked, "executable", Source::File)
            }
            Backing::File(_) => Label::new(
                MemoryClass::FileBacked,
                "libraries and other files",
                Source::File,
            ),
            Backing::Brk => kernel("[heap] (C malloc)"),
            Backing::MainStack => kernel("[stack] (main thread)"),
            Backing::Kernel(_) => kernel("kernel ([vdso], [vvar])"),
            _ if !m.private => kernel("shared anonymous"),
            Backing::Named(_) => match m.go_name() {
                Some(name) => Label::new(layout::go_name_class(name), name, Source::VmaName),
                None => Label::new(MemoryClass::Other, "named by the program", Source::VmaName),
            },
            Backing::Anonymous if self.follows_library_data(mappings, i) => {
                Label::new(MemoryClass::FileBacked, "libraries' bss", Source::File)
            }
            Backing::Anonymous => {
                let guard_of_stack = mappings
                    .get(i + 1)
                    .is_some_and(|_| layout::is_thread_stack(mappings, i + 1));
                if self.c_runtime && (layout::is_thread_stack(mappings, i) || guard_of_stack) {
                    Label::new(MemoryClass::Other, "C thread stacks", Source::MappingLayout)
                } else if self.go_names {
                    Label::new(
                        MemoryClass::Other,
                        "unnamed anonymous (not the Go runtime's: C, cgo)",
                        Source::VmaName,
                    )
                } else {
                    Label::new(
                        MemoryClass::GcMetadata,
                        "other runtime allocations",
                        Source::MappingLayout,
                    )
                }
            }
        }
    }
}

/// The pieces of a mapping with one label each, in address order.
fn pieces(m: &Mapping, own: &Label, overlays: &[Overlay]) -> Vec<(Range<u64>, Label)> {
    let anonymous = m.is_anonymous();
    let relevant: Vec<&Overlay> = overlays
        .iter()
        .filter(|o| anonymous && o.range.start < m.end && o.range.end > m.start)
        .collect();
    let mut bounds: Vec<u64> = vec![m.start, m.end];
    for o in &relevant {
        bounds.push(o.range.start.clamp(m.start, m.end));
        bounds.push(o.range.end.clamp(m.start, m.end));
    }
    bounds.sort_unstable();
    bounds.dedup();
    // Sweep: the overlays active at each elementary interval, by rank.
    let mut starts: Vec<&Overlay> = relevant.clone();
    starts.sort_by_key(|o| o.range.start);
    let mut active: BTreeMap<(usize, usize), &Overlay> = BTreeMap::new();
    let mut next = 0;
    let mut out: Vec<(Range<u64>, Label)> = Vec::new();
    for w in bounds.windows(2) {
        let (a, b) = (w[0], w[1]);
        while next < starts.len() && starts[next].range.start <= a {
            active.insert((starts[next].rank, next), starts[next]);
            next += 1;
        }
        active.retain(|_, o| o.range.end > a);
        let label = active.values().next().map_or(own, |o| &o.label).clone();
        match out.last_mut() {
            Some((r, l)) if *l == label && r.end == a => r.end = b,
            _ => out.push((a..b, label)),
        }
    }
    out
}

/// The classes of a process's memory.
pub fn classify(
    mappings: &[Mapping],
    ctx: &Context,
    pages: &dyn PageSource,
    page_size: u64,
) -> io::Result<Vec<ClassUsage>> {
    let overlays = ctx.overlays();
    let mut by_label: HashMap<Label, (Usage, u64)> = HashMap::new();
    for (i, m) in mappings.iter().enumerate() {
        let own = ctx.own_label(mappings, i);
        let parts = pieces(m, &own, &overlays);
        let usages = if parts.len() == 1 {
            vec![usage_of(m, m.size(), m.rss, m.swap)]
        } else {
            split_usage(m, &parts, pages, page_size)?
        };
        for ((_, label), u) in parts.into_iter().zip(usages) {
            let e = by_label.entry(label).or_default();
            e.0.add(&u);
            e.1 += 1;
        }
    }
    Ok(MemoryClass::ALL
        .iter()
        .map(|&class| class_usage(class, &by_label))
        .collect())
}

fn usage_of(m: &Mapping, size: u64, rss: u64, swap: u64) -> Usage {
    let (mapped_bytes, reserved_bytes) = if m.is_reservation() {
        (0, size)
    } else {
        (size, 0)
    };
    Usage {
        mapped_bytes,
        reserved_bytes,
        resident_bytes: rss,
        swapped_bytes: swap,
    }
}

/// Usage of each piece of a mapping from pagemap, scaled so the pieces add
/// up to smaps' figures for the mapping (they differ only by pages that
/// changed between the two reads; what rounding leaves goes to the largest).
fn split_usage(
    m: &Mapping,
    parts: &[(Range<u64>, Label)],
    pages: &dyn PageSource,
    page_size: u64,
) -> io::Result<Vec<Usage>> {
    let ranges: Vec<Range<u64>> = parts.iter().map(|(r, _)| r.clone()).collect();
    let counts = pages.counts(&ranges)?;
    let largest = (0..parts.len())
        .max_by_key(|&k| ranges[k].end - ranges[k].start)
        .unwrap_or(0);
    let present: Vec<u64> = counts.iter().map(|c| c.present).collect();
    let swapped: Vec<u64> = counts.iter().map(|c| c.swapped).collect();
    let rss = match_total(&present, m.rss / page_size, largest);
    let swap = match_total(&swapped, m.swap / page_size, largest);
    Ok((0..parts.len())
        .map(|k| {
            let size = ranges[k].end - ranges[k].start;
            usage_of(m, size, rss[k] * page_size, swap[k] * page_size)
        })
        .collect())
}

/// `counts` scaled to add up to `total`; the rounding rest goes to `largest`.
fn match_total(counts: &[u64], total: u64, largest: usize) -> Vec<u64> {
    let sum: u64 = counts.iter().sum();
    if sum == total {
        return counts.to_vec();
    }
    let mut out: Vec<u64> = if sum == 0 {
        vec![0; counts.len()]
    } else {
        counts
            .iter()
            .map(|&c| (c as u128 * total as u128 / sum as u128) as u64)
            .collect()
    };
    let rest = total - out.iter().sum::<u64>();
    out[largest] += rest;
    out
}

fn class_usage(class: MemoryClass, by_label: &HashMap<Label, (Usage, u64)>) -> ClassUsage {
    let mut usage = Usage::default();
    let mut mappings = 0;
    let mut parts: BTreeMap<(String, Source), Usage> = BTreeMap::new();
    for (label, (u, n)) in by_label.iter().filter(|(l, _)| l.class == class) {
        usage.add(u);
        mappings += n;
        parts
            .entry((label.part.clone(), label.source))
            .or_default()
            .add(u);
    }
    let mut parts: Vec<Part> = parts
        .into_iter()
        .map(|((name, source), usage)| Part {
            name,
            source,
            usage,
        })
        .collect();
    // Largest first by what is held (resident or swapped), then by space.
    let weight = |u: &Usage| (u.touched_bytes(), u.mapped_bytes + u.reserved_bytes);
    parts.sort_by_key(|p| std::cmp::Reverse(weight(&p.usage)));
    let mut by_source: BTreeMap<Source, (u64, u64)> = BTreeMap::new();
    for p in &parts {
        let e = by_source.entry(p.source).or_default();
        let (held, space) = weight(&p.usage);
        *e = (e.0 + held, e.1 + space);
    }
    let source = by_source
        .into_iter()
        .max_by_key(|&(_, n)| n)
        .map_or(default_source(class), |(s, _)| s);
    ClassUsage {
        class,
        source,
        usage,
        mappings,
        parts,
    }
}

fn default_source(class: MemoryClass) -> Source {
    match class {
        MemoryClass::FileBacked => Source::File,
        MemoryClass::Other => Source::KernelName,
        _ => Source::MappingLayout,
    }
}

#[cfg(test)]
#[path = "classify_tests.rs"]
mod tests;
