//! What a process's memory is used for, as gostw reports it: four classes,
//! each with its resident and swapped bytes, the parts it is made of, and
//! how each figure was found.

/// What Go uses a piece of memory for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryClass {
    /// Go heap arenas: spans of objects, goroutine stacks, free and released pages.
    HeapArenas,
    /// GC and runtime metadata outside the arenas: span structures, mark and
    /// heap bitmaps, the arena index, page allocator, other persistent allocations.
    GcMetadata,
    /// The executable (with its bss), shared libraries, other mapped files.
    FileBacked,
    /// Everything else: C heap, cgo and C thread stacks, the main thread's
    /// stack, the kernel's vdso.
    Other,
}

impl MemoryClass {
    /// Every class, in report order.
    pub const ALL: [MemoryClass; 4] = [
        MemoryClass::HeapArenas,
        MemoryClass::GcMetadata,
        MemoryClass::FileBacked,
        MemoryClass::Other,
    ];

    /// A name for people.
    pub fn title(self) -> &'static str {
        match self {
            MemoryClass::HeapArenas => "heap arenas",
            MemoryClass::GcMetadata => "GC metadata",
            MemoryClass::FileBacked => "binary and files",
            MemoryClass::Other => "other",
        }
    }
}

/// How gostw found that memory belongs where it says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The runtime's own heap index (`runtime.mheap_`), read from the
    /// process at the address the symbol table gives, with DWARF layouts.
    ArenaIndex,
    /// The runtime's own mapping names (`[anon: Go: heap]`, Go 1.25+ on
    /// kernels with `CONFIG_ANON_VMA_NAME`).
    VmaName,
    /// The mapping layout: 64 MiB-aligned arena reservations, and what
    /// anonymous memory is left outside them.
    MappingLayout,
    /// The file a mapping maps (the executable's bss from its ELF segments).
    File,
    /// A mapping the kernel names (`[heap]`, `[stack]`, `[vdso]`).
    KernelName,
}

impl Source {
    /// A short phrase for people.
    pub fn describe(self) -> &'static str {
        match self {
            Source::ArenaIndex => "the runtime's heap index (symbols + DWARF)",
            Source::VmaName => "the runtime's own mapping names",
            Source::MappingLayout => "the mapping layout",
            Source::File => "mapped files",
            Source::KernelName => "kernel-named mappings",
        }
    }
}

/// Byte counts of some memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    /// Address space that can be accessed (mapped read, write or execute).
    pub mapped_bytes: u64,
    /// Address space reserved with no access (`---p`): never resident.
    pub reserved_bytes: u64,
    /// In memory now (smaps `Rss`, or pagemap present pages).
    pub resident_bytes: u64,
    /// In swap now (smaps `Swap`, or pagemap swapped pages).
    pub swapped_bytes: u64,
}

impl Usage {
    /// Add another usage.
    pub fn add(&mut self, o: &Usage) {
        self.mapped_bytes += o.mapped_bytes;
        self.reserved_bytes += o.reserved_bytes;
        self.resident_bytes += o.resident_bytes;
        self.swapped_bytes += o.swapped_bytes;
    }

    /// Pages ever touched and still held: resident or swapped.
    pub fn touched_bytes(&self) -> u64 {
        self.resident_bytes + self.swapped_bytes
    }
}

/// One part of a class (e.g. "span structures (mspan)").
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Part {
    pub name: String,
    pub source: Source,
    #[serde(flatten)]
    pub usage: Usage,
}

/// One class of a process's memory.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ClassUsage {
    pub class: MemoryClass,
    /// How most of the bytes it holds (resident or swapped; address space
    /// when it holds none) were found.
    pub source: Source,
    #[serde(flatten)]
    pub usage: Usage,
    /// Mappings (or pieces of mappings) in the class.
    pub mappings: u64,
    /// Its parts, largest first (bytes held, then address space).
    pub parts: Vec<Part>,
}
