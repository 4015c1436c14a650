//! The ELF symbol table (`.symtab`), read in place: a name is found by a
//! scan of the table rather than by loading every symbol into a map, so the
//! hundreds of thousands of symbols of a large unstripped binary cost no
//! memory of gostw's own (a scan of 300k symbols takes a few milliseconds,
//! and analysis looks up a handful of names).

use object::elf;

use super::section::{Section, le_u32, le_u64};

/// Size of one `Elf64_Sym`.
const ENTRY: usize = 24;

/// Where the symbol table and its string table are in the file.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Symtab {
    /// File offset of the first entry, and the number of entries.
    entries: usize,
    count: usize,
    /// File range of the string table.
    strings: usize,
    strings_len: usize,
}

/// One symbol, borrowed from the file.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Symbol<'a> {
    pub name: &'a [u8],
    pub value: u64,
    pub size: u64,
    /// `STT_*`.
    pub kind: u8,
}

impl Symbol<'_> {
    /// A function (what probes may target).
    pub fn is_function(&self) -> bool {
        matches!(self.kind, elf::STT_FUNC | elf::STT_GNU_IFUNC)
    }
}

impl Symtab {
    /// The `SHT_SYMTAB` section of `sections` and the string table it links
    /// to; `None` when stripped (or the table does not fit in `file_len`).
    pub fn locate(sections: &[Section], file_len: usize) -> Option<Symtab> {
        let table = sections.iter().find(|s| s.kind == elf::SHT_SYMTAB)?;
        let strings = sections.get(usize::try_from(table.link).ok()?)?;
        let fits = |s: &Section| {
            s.offset
                .checked_add(s.size)
                .is_some_and(|e| e <= file_len as u64)
        };
        if !fits(table) || !fits(strings) || strings.kind != elf::SHT_STRTAB {
            return None;
        }
        let count = usize::try_from(table.size).ok()? / ENTRY;
        (count > 1).then_some(Symtab {
            entries: usize::try_from(table.offset).ok()?,
            count,
            strings: usize::try_from(strings.offset).ok()?,
            strings_len: usize::try_from(strings.size).ok()?,
        })
    }

    /// Every named symbol of the table in `data` (the whole file).
    pub fn iter<'a>(&self, data: &'a [u8]) -> impl Iterator<Item = Symbol<'a>> + 'a {
        let strings = data
            .get(self.strings..self.strings + self.strings_len)
            .unwrap_or_default();
        let entries = data
            .get(self.entries..self.entries + self.count * ENTRY)
            .unwrap_or_default();
        entries.chunks_exact(ENTRY).filter_map(move |e| {
            let name_off = le_u32(e) as usize;
            let rest = strings.get(name_off..)?;
            let name = &rest[..rest.iter().position(|&b| b == 0)?];
            (!name.is_empty()).then(|| Symbol {
                name,
                value: le_u64(&e[8..]),
                size: le_u64(&e[16..]),
                kind: e[4] & 0xf,
            })
        })
    }

    /// The first symbol called `name`.
    pub fn find<'a>(&self, data: &'a [u8], name: &str) -> Option<Symbol<'a>> {
        self.iter(data).find(|s| s.name == name.as_bytes())
    }
}
