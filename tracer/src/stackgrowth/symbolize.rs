//! Turning sampled PCs into code locations, and telling how much stack a
//! function's frame takes. The `Symbolizer` trait is what the aggregation
//! sees; `GoSymbols` (the binary's pclntab: function, file:line, also for
//! stripped binaries) is the one to use, `ElfSymbols` (the ELF `.symtab`:
//! names only) the fallback it is built on for code bytes and variables.

use std::{
    path::Path,
    sync::{Arc, Mutex},
};

use object::{Object as _, ObjectSymbol as _, elf, read::elf::ProgramHeader as _};

use crate::binary::{Allglen, AllglenSource, FileBytes, GoBinary, Image, Pclntab};

/// One symbolized code location.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CodeLocation {
    /// Go function name, e.g. `main.deep19k`; `0x...` when unknown.
    pub function: String,
    /// Source file, when the symbolizer knows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
}

impl CodeLocation {
    /// A location known only by its address.
    pub fn unknown(pc: u64) -> CodeLocation {
        CodeLocation {
            function: format!("{pc:#x}"),
            file: None,
            line: None,
        }
    }
}

impl std::fmt::Display for CodeLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.function)?;
        if let Some(file) = &self.file {
            write!(f, " ({file}")?;
            if let Some(line) = self.line {
                write!(f, ":{line}")?;
            }
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// Maps a PC of the traced process to a code location.
pub trait Symbolizer {
    /// Symbolize `pc`, a link-time address (the load bias already removed).
    /// Return addresses should be looked up as `pc - 1` by the caller's
    /// convention: `symbolize_return_address` does that.
    fn symbolize(&self, pc: u64) -> Option<CodeLocation>;

    /// Symbolize a return address (the call instruction is just before it).
    fn symbolize_return_address(&self, pc: u64) -> CodeLocation {
        self.symbolize(pc.saturating_sub(1))
            .unwrap_or_else(|| CodeLocation::unknown(pc))
    }

    /// The most stack the function containing `pc` takes for its own frame
    /// (Go's `funcMaxSPDelta`), if known.
    fn max_frame(&self, _pc: u64) -> Option<u64> {
        None
    }
}

/// A symbolizer that knows nothing (addresses are printed as hex).
pub struct NoSymbols;

impl Symbolizer for NoSymbols {
    fn symbolize(&self, _pc: u64) -> Option<CodeLocation> {
        None
    }
}

/// Function symbols from an ELF `.symtab`.
pub struct ElfSymbols {
    /// (start, end, name), sorted by start.
    functions: Vec<(u64, u64, String)>,
    /// Subtracted from runtime PCs (non-zero for PIE).
    bias: u64,
    /// Lowest `p_vaddr - p_offset` of the PT_LOADs: the address file offset 0
    /// is linked at.
    link_base: u64,
    /// The file, for reading function prologues.
    data: FileData,
    /// Executable PT_LOADs: (vaddr, filesz, file offset).
    exec_segments: Vec<(u64, u64, u64)>,
    /// Where `runtime.allglen` is (link-time addresses).
    allglen: Option<Allglen>,
    /// Offset of `g.atomicstatus`, for telling dead goroutines apart.
    g_status: Option<u16>,
    /// The goroutine-count sampler of the traced process (see `goroutines`).
    pub(super) walk: Mutex<Option<super::goroutines::Sampler>>,
}

/// The bytes of the executable: its own (mapped by `ElfSymbols::open`), or
/// the mapping of an analysed Go binary (shared, not copied).
enum FileData {
    Own(FileBytes),
    Shared(Arc<Image>),
}

impl FileData {
    fn bytes(&self) -> &[u8] {
        match self {
            FileData::Own(b) => b,
            FileData::Shared(image) => &image.data,
        }
    }
}

impl ElfSymbols {
    /// Read the function symbols of the executable at `path` (mapped).
    pub fn open(path: &Path) -> anyhow::Result<ElfSymbols> {
        Self::from_file_bytes(FileBytes::map(path)?)
    }

    /// Parse an ELF image.
    pub fn parse(data: Vec<u8>) -> anyhow::Result<ElfSymbols> {
        Self::from_file_bytes(FileBytes::Owned(data))
    }

    fn from_file_bytes(data: FileBytes) -> anyhow::Result<ElfSymbols> {
        let file = object::read::elf::ElfFile64::<object::Endianness>::parse(&*data)?;
        let functions = crate::symbolize::elf_text_symbols(&file);
        let symbol = |name: &str| {
            file.symbols()
                .find(|s| s.name() == Ok(name))
                .map(|s| s.address())
        };
        let allglen = symbol("runtime.allglen").map(|address| Allglen {
            address,
            allgs_len: symbol("runtime.allgs").map(|a| a + 8),
            source: AllglenSource::Symtab,
        });
        let endian = file.endian();
        let link_base = file
            .elf_program_headers()
            .iter()
            .filter(|ph| ph.p_type(endian) == elf::PT_LOAD)
            .map(|ph| ph.p_vaddr(endian).wrapping_sub(ph.p_offset(endian)))
            .min()
            .unwrap_or(0);
        let exec_segments = file
            .elf_program_headers()
            .iter()
            .filter(|ph| ph.p_type(endian) == elf::PT_LOAD && ph.p_flags(endian) & elf::PF_X != 0)
            .map(|ph| (ph.p_vaddr(endian), ph.p_filesz(endian), ph.p_offset(endian)))
            .collect();
        drop(file);
        Ok(ElfSymbols {
            functions,
            bias: 0,
            link_base,
            data: FileData::Own(data),
            exec_segments,
            allglen,
            g_status: None,
            walk: Mutex::default(),
        })
    }

    /// The symbols of an analysed Go binary, sharing its mapped file: the
    /// `.symtab` functions outside the Go code that `pclntab` covers (`go`
    /// ranges: C code of a cgo binary), and `runtime.allglen` as
    /// `GoBinary::allglen` finds it (stripped binaries too).
    pub fn from_binary(binary: &GoBinary, go: Option<(u64, u64)>) -> ElfSymbols {
        let image = binary.image().clone();
        let outside_go = |addr: u64| go.is_none_or(|(lo, hi)| addr < lo || addr >= hi);
        let mut functions: Vec<(u64, u64, String)> = image
            .symtab
            .iter()
            .flat_map(|t| t.iter(&image.data))
            .filter(|s| s.is_function() && s.value != 0 && outside_go(s.value))
            .map(|s| {
                let name = String::from_utf8_lossy(s.name).into_owned();
                (s.value, s.value + s.size.max(1), name)
            })
            .collect();
        functions.sort();
        let segments = binary.load_segments();
        let link_base = segments
            .iter()
            .map(|s| s.vaddr.wrapping_sub(s.offset))
            .min()
            .unwrap_or(0);
        let exec_segments = segments
            .iter()
            .filter(|s| s.flags & elf::PF_X != 0)
            .map(|s| (s.vaddr, s.filesz, s.offset))
            .collect();
        image.release_all();
        ElfSymbols {
            functions,
            bias: 0,
            link_base,
            data: FileData::Shared(image),
            exec_segments,
            allglen: binary.allglen(),
            g_status: binary
                .struct_offsets()
                .ok()
                .and_then(|o| o.get("g.atomicstatus")),
            walk: Mutex::default(),
        }
    }

    /// Number of function symbols (0 for a stripped binary).
    pub fn len(&self) -> usize {
        self.functions.len()
    }

    /// Whether the binary had no function symbols.
    pub fn is_empty(&self) -> bool {
        self.functions.is_empty()
    }

    /// The address of `runtime.allglen` in a process (load bias applied).
    pub fn allglen_address(&self) -> Option<u64> {
        self.allglen.map(|a| a.address.wrapping_add(self.bias))
    }

    /// The address of `len(runtime.allgs)` in a process (load bias
    /// applied), which equals allglen outside `runtime.allgadd`.
    pub fn allgs_len_address(&self) -> Option<u64> {
        self.allglen?.allgs_len.map(|a| a.wrapping_add(self.bias))
    }

    /// Where `runtime.allglen` is and how it was found.
    pub fn allglen(&self) -> Option<Allglen> {
        self.allglen
    }

    /// The address of the `runtime.allgs` slice header in a process.
    pub fn allgs_address(&self) -> Option<u64> {
        self.allgs_len_address().map(|a| a - 8)
    }

    /// The offset of `g.atomicstatus`, if known.
    pub fn g_status_offset(&self) -> Option<u16> {
        self.g_status
    }

    /// Set the load bias from where file offset 0 is mapped in the process.
    pub fn set_mapping_start(&mut self, start: u64) {
        self.bias = start.wrapping_sub(self.link_base);
    }

    /// Set the load bias of process `pid` from `/proc/PID/maps` (0 for a
    /// non-PIE binary, whose mapping starts at its link address).
    pub fn set_bias_from_process(&mut self, pid: u32) -> anyhow::Result<()> {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))?;
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
        let start = mapping_start(&maps, &exe.to_string_lossy())
            .ok_or_else(|| anyhow::anyhow!("pid {pid}: no mapping of {}", exe.display()))?;
        self.set_mapping_start(start);
        Ok(())
    }
}

/// Start address of the mapping of `path` at file offset 0 in a
/// `/proc/PID/maps` text.
pub fn mapping_start(maps: &str, path: &str) -> Option<u64> {
    maps.lines().find_map(|line| {
        let mut cols = line.split_whitespace();
        let range = cols.next()?;
        let offset = cols.nth(1)?;
        let pathname = cols.nth(2)?;
        if pathname != path || u64::from_str_radix(offset, 16).ok()? != 0 {
            return None;
        }
        u64::from_str_radix(range.split('-').next()?, 16).ok()
    })
}

impl ElfSymbols {
    /// The load bias set for the traced process.
    pub fn bias(&self) -> u64 {
        self.bias
    }

    /// The prologue frame size of the function whose code is [start, end)
    /// (link-time addresses).
    pub fn prologue_frame(&self, start: u64, end: u64) -> Option<u64> {
        let &(vaddr, filesz, offset) = self
            .exec_segments
            .iter()
            .find(|(v, sz, _)| start >= *v && start < v + sz)?;
        let from = usize::try_from(start - vaddr + offset).ok()?;
        let len = usize::try_from((end - start).min(vaddr + filesz - start)).ok()?;
        let code = self.data.bytes().get(from..from.checked_add(len)?)?;
        super::frames::prologue_max_sp_delta(code, start)
    }

    /// The function (start, end, name) containing link-time address `pc`.
    fn function_at(&self, pc: u64) -> Option<&(u64, u64, String)> {
        let i = self.functions.partition_point(|(start, _, _)| *start <= pc);
        let f = self.functions.get(i.checked_sub(1)?)?;
        (pc < f.1).then_some(f)
    }
}

impl Symbolizer for ElfSymbols {
    fn symbolize(&self, pc: u64) -> Option<CodeLocation> {
        let (_, _, name) = self.function_at(pc.wrapping_sub(self.bias))?;
        Some(CodeLocation {
            function: name.clone(),
            file: None,
            line: None,
        })
    }

    fn max_frame(&self, pc: u64) -> Option<u64> {
        let &(start, end, _) = self.function_at(pc.wrapping_sub(1).wrapping_sub(self.bias))?;
        self.prologue_frame(start, end)
    }
}

/// The symbolizer for Go binaries: names, files and lines from pclntab
/// (present even in stripped binaries), frame sizes from prologues.
pub struct GoSymbols {
    pclntab: Arc<Pclntab>,
    /// (entry, end) of every function, sorted by entry.
    functions: Vec<(u64, u64)>,
    /// Code bytes, `runtime.allglen`, and the load bias.
    pub elf: ElfSymbols,
}

impl GoSymbols {
    /// Symbols of an analysed binary (its mapped file is shared, not read
    /// again).
    pub fn new(binary: &GoBinary) -> anyhow::Result<GoSymbols> {
        let pclntab = binary.pclntab()?.clone();
        let mut functions: Vec<(u64, u64)> =
            pclntab.functions().map(|(_, e, end)| (e, end)).collect();
        functions.sort_unstable();
        let go = functions
            .first()
            .zip(functions.iter().map(|&(_, end)| end).max())
            .map(|(&(lo, _), hi)| (lo, hi));
        Ok(GoSymbols {
            pclntab,
            functions,
            elf: ElfSymbols::from_binary(binary, go),
        })
    }

    /// The function [entry, end) holding link-time address `pc`.
    fn function_at(&self, pc: u64) -> Option<(u64, u64)> {
        let i = self.functions.partition_point(|(entry, _)| *entry <= pc);
        let f = *self.functions.get(i.checked_sub(1)?)?;
        (pc < f.1).then_some(f)
    }
}

impl Symbolizer for GoSymbols {
    fn symbolize(&self, pc: u64) -> Option<CodeLocation> {
        // Innermost first: where the instruction is in the source, inlined
        // calls included.
        match self
            .pclntab
            .frames(pc.wrapping_sub(self.elf.bias()))
            .into_iter()
            .next()
        {
            Some(f) => Some(CodeLocation {
                function: f.function,
                file: Some(f.file),
                line: Some(f.line),
            }),
            None => self.elf.symbolize(pc),
        }
    }

    fn max_frame(&self, pc: u64) -> Option<u64> {
        let (entry, end) = self.function_at(pc.wrapping_sub(1).wrapping_sub(self.elf.bias()))?;
        self.elf.prologue_frame(entry, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_line_gives_the_offset_zero_mapping() {
        let maps = "\
00400000-00401000 r--p 00001000 08:01 12 /bin/x
00555000-00556000 r--p 00000000 08:01 12 /bin/y
00600000-00700000 r-xp 00000000 08:01 12 /bin/x
";
        assert_eq!(mapping_start(maps, "/bin/x"), Some(0x600000));
        assert_eq!(mapping_start(maps, "/bin/z"), None);
    }

    #[test]
    fn lookup_respects_bounds_and_bias() {
        let mut s = ElfSymbols {
            functions: vec![(0x1000, 0x1100, "a".into()), (0x1200, 0x1300, "b".into())],
            bias: 0,
            link_base: 0x0,
            data: FileData::Own(FileBytes::Owned(Vec::new())),
            exec_segments: Vec::new(),
            allglen: None,
            g_status: None,
            walk: Mutex::default(),
        };
        assert_eq!(s.symbolize(0x1050).unwrap().function, "a");
        assert!(s.symbolize(0x1150).is_none());
        assert!(s.symbolize(0x10).is_none());
        assert_eq!(s.symbolize_return_address(0x1100).function, "a");
        s.set_mapping_start(0x5000_0000);
        assert_eq!(s.symbolize(0x5000_1250).unwrap().function, "b");
    }
}
