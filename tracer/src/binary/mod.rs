//! Go binary analysis: what gostw needs to know about an executable before it
//! can probe it — Go version, where the runtime functions are and where they
//! return, the layout of the runtime structs — for plain, PIE, stripped
//! (`-s -w`), DWARF-less (`-w`) and externally linked (cgo) binaries, and
//! for the executable of a running process, container or not.
//!
//! ```no_run
//! # use tracer::binary::{GoBinary, START_THE_WORLD};
//! let bin = GoBinary::open("/usr/local/bin/server".as_ref())?;
//! let start = bin.function(START_THE_WORLD)?; // entry, file offset, RETs
//! let offsets = bin.struct_offsets()?; // DWARF, else type descriptors, else table
//! # Ok::<(), tracer::binary::BinaryError>(())
//! ```
//!
//! Sources, in order of preference: the version from `.go.buildinfo`, else
//! the runtime's `runtime.buildVersion` string; functions from `.symtab`,
//! else `.gopclntab` (always present); struct offsets from DWARF, else the
//! runtime's type descriptors (present after `-s -w`), else a per-version
//! table.
//!
//! The file is mapped, not read (see `mapped`): what analysis touches is
//! page cache, dropped from this process's resident set after each step.

mod allglen;
mod arm64;
mod buildinfo;
mod buildversion;
mod coderefs;
mod dwarf;
mod image;
mod mapped;
mod moduledata;
pub mod offsets;
pub mod pclntab;
mod probe_point;
pub use probe_point::frame_drop as prologue_frame_drop;
mod rets;
pub mod running;
mod section;
mod symtab;
#[cfg(test)]
mod tests;
mod typedesc;

use std::{
    path::{Path, PathBuf},
    sync::{Arc, OnceLock},
};

pub use allglen::{Allglen, AllglenSource};
pub use buildinfo::GoVersion;
pub use buildversion::VersionSource;
pub use dwarf::StructLayout;
pub(crate) use image::Image;
pub use image::Segment;
pub(crate) use mapped::FileBytes;
pub use offsets::{OffsetSource, StructOffsets};
pub use pclntab::{Frame, PclnFormat, Pclntab};

/// Runtime functions gostw probes.
pub const STOP_THE_WORLD: &str = "runtime.stopTheWorldWithSema";
pub const START_THE_WORLD: &str = "runtime.startTheWorldWithSema";
pub const NEWSTACK: &str = "runtime.newstack";
pub const COPYSTACK: &str = "runtime.copystack";
/// Records a duration in one of the runtime's time histograms; called by
/// `stopTheWorldWithSema` (Go 1.22+) with its stopping time, once the last
/// P stopped.
pub const TIME_HISTOGRAM_RECORD: &str = "runtime.(*timeHistogram).record";
pub const MORESTACK: &str = "runtime.morestack";

/// Every function `gostw inspect` reports.
pub const PROBED_FUNCTIONS: &[&str] = &[
    STOP_THE_WORLD,
    START_THE_WORLD,
    NEWSTACK,
    COPYSTACK,
    MORESTACK,
];

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
    #[error("{path} is not a Go program (no Go build information or function table)")]
    NotGo { path: PathBuf },
    #[error("{path}: function {name} not found")]
    MissingFunction { path: PathBuf, name: String },
    #[error("{path}: {reason}")]
    Malformed { path: PathBuf, reason: String },
    #[error("process {pid}: {reason}")]
    Process { pid: u32, reason: String },
}

/// Architectures gostw understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Amd64,
    Arm64,
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        })
    }
}

/// Where a function's address came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FunctionSource {
    Symtab,
    Pclntab,
}

/// A probed function: where it is in memory and in the file.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct GoFunction {
    pub name: String,
    /// Link-time virtual address of the entry.
    pub address: u64,
    /// Bytes of code (from pclntab: up to the next function, padding included).
    pub size: u64,
    /// Offset of the entry in the file (what uprobes take).
    pub file_offset: u64,
    /// File offset an entry probe goes on: the prologue's stack-bound
    /// branch, where the kernel emulates the instruction (one trap), when
    /// the prologue is Go's usual one, else `file_offset` (see
    /// `probe_point`).
    pub entry_probe_offset: u64,
    /// File offsets of every RET instruction inside the function.
    pub ret_file_offsets: Vec<u64>,
    pub source: FunctionSource,
}

/// One analysed Go executable.
pub struct GoBinary {
    /// The path it was opened by (for a process: as the host sees it).
    pub path: PathBuf,
    pub arch: Arch,
    pub pie: bool,
    pub version: GoVersion,
    /// The version as the linker wrote it, e.g. "go1.22.10 X:nocoverageredesign".
    pub version_string: String,
    /// Where the version was found.
    pub version_source: VersionSource,
    pub has_symtab: bool,
    pub has_dwarf: bool,
    /// Go's build id (`.note.go.buildid`).
    pub go_build_id: Option<String>,
    /// The GNU build id (`.note.gnu.build-id`), hex.
    pub gnu_build_id: Option<String>,
    image: Arc<Image>,
    pclntab: Result<Arc<Pclntab>, String>,
    offsets: OnceLock<Result<StructOffsets, String>>,
    allglen: OnceLock<Option<Allglen>>,
}

impl GoBinary {
    /// Map and analyse the executable at `path`.
    pub fn open(path: &Path) -> Result<GoBinary, BinaryError> {
        let data = FileBytes::map(path).map_err(|source| BinaryError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_file(path, data)
    }

    /// Analyse an executable already in memory; `path` names it in errors.
    pub fn from_bytes(path: &Path, data: Vec<u8>) -> Result<GoBinary, BinaryError> {
        Self::from_file(path, FileBytes::Owned(data))
    }

    pub(crate) fn from_file(path: &Path, data: FileBytes) -> Result<GoBinary, BinaryError> {
        let malformed = |reason: String| BinaryError::Malformed {
            path: path.to_owned(),
            reason,
        };
        let is_elf = data.starts_with(b"\x7fELF");
        let image = Image::parse(data).map_err(|reason| {
            if is_elf {
                malformed(format!("truncated or corrupted ELF file ({reason})"))
            } else {
                BinaryError::NotElf {
                    path: path.to_owned(),
                    reason,
                }
            }
        })?;
        let image = Arc::new(image);
        let has_pclntab = image.section(".gopclntab").is_some()
            || image.section(".data.rel.ro.gopclntab").is_some();
        let mut pclntab = Pclntab::parse(image.clone());
        let found = buildinfo::version_string(&image)
            .map(|v| (v, VersionSource::Buildinfo))
            .or_else(|| buildversion::from_build_version(&image, pclntab.as_ref().ok()));
        let (version_string, version_source) = match found {
            Some(found) => found,
            None if has_pclntab || pclntab.is_ok() => {
                image.release_all();
                return Err(malformed(
                    "has a Go function table but no Go version: no .go.buildinfo, and no \
                     runtime.buildVersion string found"
                        .into(),
                ));
            }
            None => {
                image.release_all();
                return Err(BinaryError::NotGo {
                    path: path.to_owned(),
                });
            }
        };
        let version = GoVersion::parse(&version_string).ok_or_else(|| {
            malformed(format!("unrecognised Go version string {version_string:?}"))
        })?;
        if let Ok(p) = &mut pclntab {
            p.set_version(version);
        }
        let has_dwarf =
            image.section(".debug_info").is_some() || image.section(".zdebug_info").is_some();
        image.release_all();
        Ok(GoBinary {
            path: path.to_owned(),
            arch: image.arch,
            pie: image.pie,
            version,
            version_string,
            version_source,
            has_symtab: image.symtab.is_some(),
            has_dwarf,
            go_build_id: image.go_build_id(),
            gnu_build_id: image.gnu_build_id.clone(),
            pclntab: pclntab.map(Arc::new),
            image,
            offsets: OnceLock::new(),
            allglen: OnceLock::new(),
        })
    }

    /// The id that names this build: Go's build id, else the GNU one.
    pub fn build_id(&self) -> Option<&str> {
        self.go_build_id.as_deref().or(self.gnu_build_id.as_deref())
    }

    /// The function table; the error says why it cannot be read.
    pub fn pclntab(&self) -> Result<&Arc<Pclntab>, BinaryError> {
        self.pclntab
            .as_ref()
            .map_err(|reason| BinaryError::Malformed {
                path: self.path.clone(),
                reason: reason.clone(),
            })
    }

    /// Link-time address of the lowest loadable segment with file offset 0
    /// (what a process's load bias is measured from).
    pub fn link_base(&self) -> u64 {
        self.image
            .segments
            .iter()
            .filter(|s| s.offset == 0)
            .map(|s| s.vaddr)
            .min()
            .unwrap_or(0)
    }

    /// The size and members of each of the runtime structs `names` that the
    /// binary's DWARF describes (`None` without DWARF), read from the mapped
    /// file and its pages released after.
    pub fn dwarf_structs(
        &self,
        names: &[&'static str],
    ) -> Option<std::collections::BTreeMap<&'static str, StructLayout>> {
        let found = dwarf::structs(&self.image, names);
        self.image.release_all();
        found
    }

    /// The loadable (`PT_LOAD`) segments.
    pub fn load_segments(&self) -> &[Segment] {
        &self.image.segments
    }

    /// The runtime struct offsets of this binary, each from the best source
    /// that has it: DWARF, the type descriptors, the per-version table.
    pub fn struct_offsets(&self) -> Result<StructOffsets, BinaryError> {
        self.offsets
            .get_or_init(|| {
                let merged = [
                    OffsetSource::Dwarf,
                    OffsetSource::TypeDescriptors,
                    OffsetSource::VersionTable,
                ]
                .into_iter()
                .filter_map(|s| self.offsets_from(s))
                .fold(StructOffsets::default(), |acc, o| acc.or(&o));
                let missing = merged.missing_struct_fields();
                self.image.release_all();
                if missing.is_empty() {
                    Ok(merged)
                } else {
                    Err(format!(
                        "{} is outside gostw's offset table and neither DWARF nor the runtime type descriptors give {}",
                        self.version,
                        missing.join(", ")
                    ))
                }
            })
            .clone()
            .map_err(|reason| BinaryError::Malformed {
                path: self.path.clone(),
                reason,
            })
    }

    /// The offsets one source gives on its own (`None` if it gives none).
    pub fn offsets_from(&self, source: OffsetSource) -> Option<StructOffsets> {
        let offsets = match source {
            OffsetSource::Dwarf => StructOffsets::from_layouts(
                &dwarf::struct_layouts(&self.image)?,
                OffsetSource::Dwarf,
            ),
            OffsetSource::TypeDescriptors => {
                let types = self
                    .pclntab
                    .as_ref()
                    .ok()
                    .and_then(|p| p.moduledata())
                    .and_then(|md| md.types(&self.image, self.version));
                StructOffsets::from_layouts(
                    &typedesc::struct_layouts(&self.image, types)?,
                    OffsetSource::TypeDescriptors,
                )
            }
            OffsetSource::VersionTable => StructOffsets::from_version_table(self.version)?,
        };
        (!offsets.fields.is_empty()).then_some(offsets)
    }

    /// Convert a link-time virtual address to a file offset.
    pub fn file_offset(&self, vaddr: u64) -> Option<u64> {
        self.image.exec_file_offset(vaddr)
    }

    /// Locate function `name`, with the file offsets of its RETs: from the
    /// symbol table if there is one, else from pclntab, where the largest
    /// of same-named entries is the function (the others are ABI0 wrappers).
    pub fn function(&self, name: &str) -> Result<GoFunction, BinaryError> {
        let missing = || BinaryError::MissingFunction {
            path: self.path.clone(),
            name: name.to_owned(),
        };
        // Assembly functions are ABI0 only; the symtab says so in the name.
        let from_symtab = self
            .image
            .function_symbol(&[name, &format!("{name}.abi0")])
            .map(|(address, size)| (address, size, FunctionSource::Symtab));
        let (address, size, source) = match from_symtab {
            Some(found) => found,
            None => {
                let pclntab = self.pclntab()?;
                let (entry, end) = pclntab
                    .lookup(name)
                    .into_iter()
                    .max_by_key(|&(entry, end)| end.saturating_sub(entry))
                    .ok_or_else(missing)?;
                (entry, end.saturating_sub(entry), FunctionSource::Pclntab)
            }
        };
        let malformed = |reason: String| BinaryError::Malformed {
            path: self.path.clone(),
            reason,
        };
        let file_offset = self.file_offset(address).ok_or_else(|| {
            malformed(format!(
                "{name} at {address:#x} is outside every executable segment"
            ))
        })?;
        let code = usize::try_from(file_offset)
            .ok()
            .and_then(|start| {
                self.image
                    .data
                    .get(start..start.checked_add(usize::try_from(size).ok()?)?)
            })
            .ok_or_else(|| malformed(format!("{name} extends past the end of the file")))?;
        let ret_file_offsets = rets::ret_offsets(self.arch, address, code)
            .into_iter()
            .map(|off| file_offset + off)
            .collect();
        let entry_probe_offset =
            file_offset + probe_point::entry_probe_offset(self.arch, address, code);
        self.image.release_all();
        Ok(GoFunction {
            name: name.to_owned(),
            address,
            size,
            file_offset,
            entry_probe_offset,
            ret_file_offsets,
            source,
        })
    }

    /// File offsets of the direct calls from function `caller` to function
    /// `callee` (amd64; empty elsewhere, or where there is none).
    pub fn calls(&self, caller: &str, callee: &str) -> Result<Vec<u64>, BinaryError> {
        let f = self.function(caller)?;
        let target = self.function(callee)?.address;
        let code = usize::try_from(f.size)
            .ok()
            .and_then(|len| self.bytes_at(f.address, len))
            .ok_or_else(|| BinaryError::Malformed {
                path: self.path.clone(),
                reason: format!("{caller} extends past the end of the file"),
            })?;
        let calls = probe_point::call_offsets(self.arch, f.address, code, target)
            .into_iter()
            .map(|off| f.file_offset + off)
            .collect();
        self.image.release_all();
        Ok(calls)
    }

    /// How far function `name`'s prologue moves RSP down (see
    /// `probe_point::frame_drop`).
    pub fn frame_drop(&self, name: &str) -> Result<Option<u64>, BinaryError> {
        let f = self.function(name)?;
        let len = usize::try_from(f.size.min(64)).unwrap_or(0);
        let drop = self
            .bytes_at(f.address, len)
            .and_then(|code| probe_point::frame_drop(self.arch, f.address, code));
        self.image.release_all();
        Ok(drop)
    }

    /// `len` bytes of the file's contents at link-time address `vaddr`.
    pub fn bytes_at(&self, vaddr: u64, len: usize) -> Option<&[u8]> {
        self.image.bytes_at(vaddr, len)
    }

    /// A `.symtab` symbol's address, if the binary has one by that name.
    pub fn symbol(&self, name: &str) -> Option<u64> {
        self.image.symbol(name).map(|(addr, _)| addr)
    }

    /// Where `runtime.allglen` (the peak goroutine count) is, if it can be
    /// found: by the symbol table, else from `runtime.allgadd`'s code (amd64).
    pub fn allglen(&self) -> Option<Allglen> {
        *self.allglen.get_or_init(|| {
            let found = allglen::find(&self.image, self.pclntab.as_deref().ok());
            self.image.release_all();
            found
        })
    }
}
