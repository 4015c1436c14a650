//! ELF section headers and the little-endian reads every table parser
//! shares (symbol table, pclntab, DWARF), apart from the file they come
//! from so those parsers do not depend on each other.

use object::elf;

/// One section header.
#[derive(Clone, Debug)]
pub(crate) struct Section {
    pub name: String,
    pub addr: u64,
    pub size: u64,
    pub offset: u64,
    pub kind: u32,
    pub flags: u64,
    /// `sh_link` (for a symbol table: its string table).
    pub link: u32,
}

impl Section {
    /// Does the section take space in the file (not `.bss`)?
    pub(super) fn has_file_data(&self) -> bool {
        self.kind != elf::SHT_NOBITS
    }
}

/// The little-endian u32 at the start of `b` (0 if `b` is shorter).
pub(crate) fn le_u32(b: &[u8]) -> u32 {
    b.get(..4)
        .and_then(|w| w.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

/// The little-endian u64 at the start of `b` (0 if `b` is shorter).
pub(crate) fn le_u64(b: &[u8]) -> u64 {
    b.get(..8)
        .and_then(|w| w.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}
