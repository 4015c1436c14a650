//! Go binary analysis: what gostw needs to know about an executable before it
//! can probe it (Go version, where the runtime functions are, where they
//! return).

mod buildinfo;
pub mod offsets;
mod rets;

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use object::{Object as _, ObjectSymbol as _, elf, read::elf::ProgramHeader as _};

pub use buildinfo::GoVersion;
pub use offsets::{OffsetSource, StructOffsets};

/// Runtime functions gostw probes.
pub const STOP_THE_WORLD: &str = "runtime.stopTheWorldWithSema";
pub const START_THE_WORLD: &str = "runtime.startTheWorldWithSema";
pub const NEWSTACK: &str = "runtime.newstack";
pub const COPYSTACK: &str = "runtime.copystack";

/// Why a binary cannot be analysed; every variant says what the user can do.
#[derive(Debug, thiserror::Error)]
pub enum BinaryError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not an ELF executable: {reason}")]
    NotElf { path: PathBuf, reason: String },
    #[error("{path} is not a Go program (no Go build information)")]
    NotGo { path: PathBuf },
    #[error("{path}: function {name} not found")]
    MissingFunction { path: PathBuf, name: String },
    #[error("{path}: {reason}")]
    Malformed { path: PathBuf, reason: String },
}

/// Architectures gostw understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Amd64,
    Arm64,
}

/// A probed function: where it is in memory and in the file.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct GoFunction {
    pub name: String,
    /// Link-time virtual address of the entry.
    pub address: u64,
    pub size: u64,
    /// Offset of the entry in the file (what uprobes take).
    pub file_offset: u64,
    /// File offsets of every RET instruction inside the function.
    pub ret_file_offsets: Vec<u64>,
}

/// One analysed Go executable.
pub struct GoBinary {
    pub path: PathBuf,
    pub arch: Arch,
    pub pie: bool,
    pub version: GoVersion,
    pub has_symtab: bool,
    pub has_dwarf: bool,
    data: Vec<u8>,
    /// Function name -> (address, size), from the symbol table.
    symbols: BTreeMap<String, (u64, u64)>,
    /// Executable PT_LOAD segments: (vaddr, memsz, file offset).
    exec_segments: Vec<(u64, u64, u64)>,
}

impl GoBinary {
    /// Read and analyse the executable at `path`.
    pub fn open(path: &Path) -> Result<GoBinary, BinaryError> {
        let data = fs::read(path).map_err(|source| BinaryError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, data)
    }

    fn parse(path: &Path, data: Vec<u8>) -> Result<GoBinary, BinaryError> {
        let not_elf = |reason: String| BinaryError::NotElf {
            path: path.to_owned(),
            reason,
        };
        let file = object::read::elf::ElfFile64::<object::Endianness>::parse(&*data)
            .map_err(|e| not_elf(e.to_string()))?;
        let arch = match file.architecture() {
            object::Architecture::X86_64 => Arch::Amd64,
            object::Architecture::Aarch64 => Arch::Arm64,
            other => return Err(not_elf(format!("unsupported architecture {other:?}"))),
        };
        let pie = file.elf_header().e_type.get(file.endian()) == elf::ET_DYN;
        let version = buildinfo::go_version(&file).ok_or_else(|| BinaryError::NotGo {
            path: path.to_owned(),
        })?;
        let mut symbols = BTreeMap::new();
        for sym in file.symbols() {
            if sym.kind() == object::SymbolKind::Text
                && let Ok(name) = sym.name()
            {
                // The ABI0 wrappers share names with the real functions in
                // pclntab; the symtab spells them "*.abi0", so plain names are
                // the ABIInternal bodies we want.
                symbols.insert(name.to_owned(), (sym.address(), sym.size()));
            }
        }
        let endian = file.endian();
        let exec_segments = file
            .elf_program_headers()
            .iter()
            .filter(|ph| ph.p_type(endian) == elf::PT_LOAD && ph.p_flags(endian) & elf::PF_X != 0)
            .map(|ph| (ph.p_vaddr(endian), ph.p_memsz(endian), ph.p_offset(endian)))
            .collect();
        let has_dwarf = file.section_by_name(".debug_info").is_some()
            || file.section_by_name(".zdebug_info").is_some();
        Ok(GoBinary {
            path: path.to_owned(),
            arch,
            pie,
            version,
            has_symtab: !symbols.is_empty(),
            has_dwarf,
            data,
            symbols,
            exec_segments,
        })
    }

    /// The runtime struct offsets of this binary, with their sources.
    pub fn struct_offsets(&self) -> Result<StructOffsets, BinaryError> {
        StructOffsets::from_version_table(self.version).ok_or_else(|| BinaryError::Malformed {
            path: self.path.clone(),
            reason: format!(
                "{} is outside gostw's offset table and the binary has no DWARF or type descriptors gostw can read",
                self.version
            ),
        })
    }

    /// Convert a link-time virtual address to a file offset.
    pub fn file_offset(&self, vaddr: u64) -> Option<u64> {
        self.exec_segments
            .iter()
            .find(|(start, size, _)| vaddr >= *start && vaddr < start + size)
            .map(|(start, _, off)| vaddr - start + off)
    }

    /// Locate function `name`, with the file offsets of its RETs.
    pub fn function(&self, name: &str) -> Result<GoFunction, BinaryError> {
        let missing = || BinaryError::MissingFunction {
            path: self.path.clone(),
            name: name.to_owned(),
        };
        let &(address, size) = self.symbols.get(name).ok_or_else(missing)?;
        let file_offset = self
            .file_offset(address)
            .ok_or_else(|| BinaryError::Malformed {
                path: self.path.clone(),
                reason: format!("{name} at {address:#x} is outside every executable segment"),
            })?;
        let code = usize::try_from(file_offset)
            .ok()
            .and_then(|start| {
                self.data
                    .get(start..start.checked_add(usize::try_from(size).ok()?)?)
            })
            .ok_or_else(|| BinaryError::Malformed {
                path: self.path.clone(),
                reason: format!("{name} extends past the end of the file"),
            })?;
        let ret_file_offsets = rets::ret_offsets(self.arch, address, code)
            .into_iter()
            .map(|off| file_offset + off)
            .collect();
        Ok(GoFunction {
            name: name.to_owned(),
            address,
            size,
            file_offset,
            ret_file_offsets,
        })
    }
}
