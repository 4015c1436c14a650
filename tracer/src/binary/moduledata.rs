//! `runtime.firstmoduledata`, the linker's record of where the program's
//! tables are. Stripped binaries have no `runtime.text` or `go:func.*`
//! symbol, but this structure holds both: `text` (Go 1.26+ writes 0 as
//! pclntab's textStart, and with external linking `.text` starts with C code)
//! and `gofunc` (the base of funcdata offsets, where inline trees are).

use super::{GoVersion, image::Image};

/// The fields gostw reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ModuleData {
    pub addr: u64,
    pub text: u64,
    pub gofunc: Option<u64>,
}

/// Word index of `text`: after pcHeader, six slices, findfunctab, minpc,
/// maxpc (the same in Go 1.16-1.27).
const TEXT_WORD: u64 = 22;
const MINPC_WORD: u64 = 20;

/// Word index of `gofunc`, by Go version (fields were added before it in
/// 1.20, covctrs, and 1.27, typedesclen/itaboffset/itabsize).
fn gofunc_word(version: GoVersion) -> Option<u64> {
    match (version.major, version.minor) {
        (1, 18..=19) => Some(38),
        (1, 20..=26) => Some(40),
        (1, 27..) => Some(43),
        _ => None,
    }
}

/// Find the module data: its first word points at the pclntab header, its
/// second at the function name table (`pclntab + funcnameOffset`).
pub(crate) fn find(
    image: &Image,
    pclntab_addr: u64,
    funcnametab_addr: u64,
    version: GoVersion,
) -> Option<ModuleData> {
    let is_moduledata = |addr: u64| {
        image.ptr_at(addr) == Some(pclntab_addr)
            && addr
                .checked_add(8)
                .and_then(|a| image.ptr_at(a))
                .is_some_and(|p| p == funcnametab_addr)
    };
    let mut candidates: Vec<u64> = image.relocations_to(pclntab_addr).collect();
    for name in [".go.module", ".noptrdata", ".data"] {
        let Some(s) = image.section(name) else {
            continue;
        };
        let Some(bytes) = image.section_data(s) else {
            continue;
        };
        let want = pclntab_addr.to_le_bytes();
        candidates.extend(
            bytes
                .chunks_exact(8)
                .enumerate()
                .filter(|(_, w)| *w == want)
                .map(|(i, _)| s.addr.wrapping_add(i as u64 * 8)),
        );
    }
    candidates.sort_unstable();
    let addr = candidates.into_iter().find(|&a| is_moduledata(a))?;
    let word = |i: u64| image.ptr_at(addr.checked_add(i * 8)?);
    let text = word(TEXT_WORD)?;
    let minpc = word(MINPC_WORD)?;
    if text > minpc {
        return None;
    }
    let gofunc = gofunc_word(version)
        .and_then(word)
        .filter(|&g| image.bytes_at(g, 1).is_some());
    Some(ModuleData { addr, text, gofunc })
}
