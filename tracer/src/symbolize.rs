//! PC -> function, file:line (with inlined calls) for Go binaries, from the
//! binary's own function table (`.gopclntab`), so it works on stripped
//! binaries too.
//!
//! ```no_run
//! use tracer::{binary::GoBinary, symbolize::{ProcessSymbolizer, Symbolizer}};
//!
//! // A PC of the file (link-time address):
//! let bin = GoBinary::open("/usr/local/bin/server".as_ref())?;
//! let sym = Symbolizer::for_binary(&bin)?; // cached per binary, by build id
//! for frame in sym.symbolize(0x4642a0) {
//!     // innermost first: inlined callees, then the function holding the code
//!     println!("{} {}:{}", frame.function, frame.file, frame.line);
//! }
//!
//! // A PC seen in a live process (PIE or not): the load bias is subtracted.
//! let proc_sym = ProcessSymbolizer::for_pid(1234)?;
//! let frames = proc_sym.symbolize(0x55d0_0006_42a0);
//! # Ok::<(), tracer::binary::BinaryError>(())
//! ```
//!
//! - `symbolize(pc)` returns the frames for the instruction at `pc`, or an
//!   empty vector outside Go code. A return address from a stack walk points
//!   after the call: pass `ret - 1` (as Go's own tracebacks do), or use
//!   `symbolize_return_address`.
//! - Symbolizers are shared: `for_binary` returns the same `Arc` for every
//!   binary with the same build id, `for_pid` for every process running the
//!   same file.

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    sync::{Arc, Mutex},
};

pub use crate::binary::Frame;
use crate::binary::{BinaryError, GoBinary, Pclntab, Segment, running};

/// Symbolizes link-time PCs of one binary.
pub struct Symbolizer {
    pclntab: Arc<Pclntab>,
    build_id: Option<String>,
    segments: Vec<Segment>,
}

/// Symbolizers by build id.
static BY_BUILD_ID: Mutex<Option<HashMap<String, Arc<Symbolizer>>>> = Mutex::new(None);
/// Symbolizers by file identity (device, inode, size, mtime), so a process
/// whose executable was already read is not read again.
type FileKey = (u64, u64, u64, i64);
static BY_FILE: Mutex<Option<HashMap<FileKey, Arc<Symbolizer>>>> = Mutex::new(None);

impl Symbolizer {
    /// The symbolizer of `binary`, shared with every binary of the same build id.
    pub fn for_binary(binary: &GoBinary) -> Result<Arc<Symbolizer>, BinaryError> {
        let make = || -> Result<Arc<Symbolizer>, BinaryError> {
            Ok(Arc::new(Symbolizer {
                pclntab: binary.pclntab()?.clone(),
                build_id: binary.build_id().map(str::to_owned),
                segments: binary.load_segments().to_vec(),
            }))
        };
        let Some(id) = binary.build_id() else {
            return make();
        };
        let mut cache = BY_BUILD_ID.lock().unwrap_or_else(|e| e.into_inner());
        let cache = cache.get_or_insert_with(HashMap::new);
        if let Some(found) = cache.get(id) {
            return Ok(found.clone());
        }
        let made = make()?;
        cache.insert(id.to_owned(), made.clone());
        Ok(made)
    }

    /// The frames of the instruction at link-time address `pc`, innermost first.
    pub fn symbolize(&self, pc: u64) -> Vec<Frame> {
        self.pclntab.frames(pc)
    }

    /// The frames of the call that returns to `ret` (a return address).
    pub fn symbolize_return_address(&self, ret: u64) -> Vec<Frame> {
        self.pclntab.frames(ret.wrapping_sub(1))
    }

    /// Only the name of the function whose code holds `pc` (no inlining).
    pub fn function_name(&self, pc: u64) -> Option<&str> {
        self.pclntab.function_name(pc)
    }

    /// The build id this symbolizer is cached under.
    pub fn build_id(&self) -> Option<&str> {
        self.build_id.as_deref()
    }
}

/// Symbolizes PCs of a live process: subtracts its load bias first.
pub struct ProcessSymbolizer {
    pub pid: u32,
    /// Runtime address minus link-time address (0 unless PIE).
    pub load_bias: u64,
    pub symbolizer: Arc<Symbolizer>,
}

impl ProcessSymbolizer {
    /// For process `pid`; reads its executable unless a process running the
    /// same file was symbolized before.
    pub fn for_pid(pid: u32) -> Result<ProcessSymbolizer, BinaryError> {
        let meta =
            std::fs::metadata(format!("/proc/{pid}/exe")).map_err(|e| BinaryError::Process {
                pid,
                reason: if e.kind() == std::io::ErrorKind::NotFound {
                    "no such process".into()
                } else {
                    format!("cannot stat its executable: {e}")
                },
            })?;
        let key = (meta.dev(), meta.ino(), meta.size(), meta.mtime());
        let cached = BY_FILE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashMap::new)
            .get(&key)
            .cloned();
        let symbolizer = match cached {
            Some(s) => s,
            None => {
                let s = Symbolizer::for_binary(&GoBinary::open_pid(pid)?)?;
                BY_FILE
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert_with(HashMap::new)
                    .insert(key, s.clone());
                s
            }
        };
        Ok(ProcessSymbolizer {
            pid,
            load_bias: running::load_bias(pid, &symbolizer.segments)?,
            symbolizer,
        })
    }

    /// For process `pid` running `binary` (already analysed).
    pub fn for_process(pid: u32, binary: &GoBinary) -> Result<ProcessSymbolizer, BinaryError> {
        Ok(ProcessSymbolizer {
            pid,
            load_bias: running::load_bias(pid, binary.load_segments())?,
            symbolizer: Symbolizer::for_binary(binary)?,
        })
    }

    /// The frames of the instruction at runtime address `pc`, innermost first.
    pub fn symbolize(&self, pc: u64) -> Vec<Frame> {
        self.symbolizer.symbolize(pc.wrapping_sub(self.load_bias))
    }

    /// The frames of the call that returns to runtime address `ret`.
    pub fn symbolize_return_address(&self, ret: u64) -> Vec<Frame> {
        self.symbolizer
            .symbolize_return_address(ret.wrapping_sub(self.load_bias))
    }
}

/// The function symbols of an ELF symbol table, sorted: (start, end, name).
/// For code without pclntab (non-Go programs) and symtab fallbacks.
pub fn elf_text_symbols<'a>(file: &impl object::Object<'a>) -> Vec<(u64, u64, String)> {
    use object::ObjectSymbol as _;

    let mut functions: Vec<_> = file
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.address() != 0)
        .filter_map(|s| {
            let name = s.name().ok()?;
            Some((s.address(), s.address() + s.size().max(1), name.to_owned()))
        })
        .collect();
    functions.sort();
    functions
}
