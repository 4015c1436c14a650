//! `runtime.firstmoduledata`, the linker's record of where the program's
//! tables are. Stripped binaries have no `runtime.text` or `go:func.*`
//! symbol, but this structure holds both: `text` (Go 1.26+ writes 0 as
//! pclntab's textStart, and with external linking `.text` starts with C code)
//! and `gofunc` (the base of funcdata offsets, where inline trees are); and
//! `types`..`etypes`, the range of the runtime's type descriptors.

use super::{GoVersion, image::Image};

/// Where the module data is, and the field every Go version keeps at the
/// same place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ModuleData {
    pub addr: u64,
    pub text: u64,
}

/// Word index of `text`: after pcHeader, six slices, findfunctab, minpc,
/// maxpc (the same in Go 1.16-1.27).
const TEXT_WORD: u64 = 22;
const MINPC_WORD: u64 = 20;

/// Word indices of `types`, `etypes` and `gofunc`, by Go version (fields
/// were added before them in 1.20, covctrs, and 1.27, typedesclen between
/// types and etypes, then itaboffset and itabsize).
fn words(version: GoVersion) -> Option<(u64, u64, u64)> {
    match (version.major, version.minor) {
        (1, 18..=19) => Some((35, 36, 38)),
        (1, 20..=26) => Some((37, 38, 40)),
        (1, 27..) => Some((37, 39, 43)),
        _ => None,
    }
}

impl ModuleData {
    fn word(&self, image: &Image, i: u64) -> Option<u64> {
        image.ptr_at(self.addr.checked_add(i * 8)?)
    }

    /// `gofunc`, for a binary of Go `version`.
    pub fn gofunc(&self, image: &Image, version: GoVersion) -> Option<u64> {
        let (_, _, gofunc) = words(version)?;
        self.word(image, gofunc)
            .filter(|&g| image.bytes_at(g, 1).is_some())
    }

    /// `[types, etypes)`, the runtime's type descriptors, for a binary of Go
    /// `version`.
    pub fn types(&self, image: &Image, version: GoVersion) -> Option<(u64, u64)> {
        let (types, etypes, _) = words(version)?;
        let (start, end) = (self.word(image, types)?, self.word(image, etypes)?);
        let len = usize::try_from(end.checked_sub(start)?).ok()?;
        // Both ends must be in the file's data.
        (len > 0 && image.bytes_at(start, len).is_some()).then_some((start, end))
    }
}

/// Find the module data: its first word points at the pclntab header, its
/// second at the function name table (`pclntab + funcnameOffset`). Where
/// the symbol table names it, that is it; else the relocations (PIE) and
/// the data sections are searched, the first match winning, so a large
/// data section is read only as far as needed.
pub(crate) fn find(image: &Image, pclntab_addr: u64, funcnametab_addr: u64) -> Option<ModuleData> {
    let is_moduledata = |addr: u64| {
        image.ptr_at(addr) == Some(pclntab_addr)
            && addr
                .checked_add(8)
                .and_then(|a| image.ptr_at(a))
                .is_some_and(|p| p == funcnametab_addr)
    };
    let mut candidates: Vec<u64> = image
        .symbol("runtime.firstmoduledata")
        .map(|(a, _)| a)
        .into_iter()
        .collect();
    let mut reloc: Vec<u64> = image.relocations_to(pclntab_addr).collect();
    reloc.sort_unstable();
    candidates.extend(reloc);
    let mut addr = candidates.into_iter().find(|&a| is_moduledata(a));
    for name in [".go.module", ".noptrdata", ".data"] {
        if addr.is_some() {
            break;
        }
        let Some(s) = image.section(name) else {
            continue;
        };
        image.scan_words(s, |at, word| {
            let hit = word == pclntab_addr && is_moduledata(at);
            if hit {
                addr = Some(at);
            }
            hit
        });
    }
    let md = ModuleData {
        addr: addr?,
        text: 0,
    };
    let text = md.word(image, TEXT_WORD)?;
    let minpc = md.word(image, MINPC_WORD)?;
    (text <= minpc).then_some(ModuleData { text, ..md })
}
