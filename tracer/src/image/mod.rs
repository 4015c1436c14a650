//! Executables and running processes as symbolization sees them: one
//! analysis per executable file (cached by device and inode), one frame type
//! (`Frame`, with its `inlined` flag), and the load bias of each process.
//! Faults, stack growth, the agent and inspect all symbolize through here.
//!
//! - `ExecutableImage`: an analysed Go executable (pclntab for names, files,
//!   lines and inlining; code bytes for frame sizes; `runtime.allglen`).
//! - `ProcessImage`: an executable as mapped by one process (its load bias).
//! - `maps`: the one `/proc/PID/maps` parser.
//! - `frames`: a function's own frame size, from its prologue.

pub mod frames;
pub mod maps;

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    path::Path,
    sync::{Arc, Mutex, OnceLock},
};

pub use crate::binary::Frame;
use crate::binary::{BinaryError, GoBinary, Pclntab};

/// Identity of an executable file: probes and analyses are per file, so
/// every path to one file (other mount namespaces, hard links) is one
/// executable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExeId {
    pub dev: u64,
    pub ino: u64,
}

impl ExeId {
    /// The identity of the file at `path` (following links, as
    /// `/proc/PID/exe` needs).
    pub fn of(path: &Path) -> std::io::Result<ExeId> {
        let m = std::fs::metadata(path)?;
        Ok(ExeId {
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}

/// One analysed Go executable, shared by every process that runs it.
pub struct ExecutableImage {
    pub id: ExeId,
    pub binary: GoBinary,
    pclntab: Option<Arc<Pclntab>>,
    /// (entry, end) of every function, sorted by entry (for frame sizes).
    functions: Vec<(u64, u64)>,
}

type Cache = HashMap<ExeId, Arc<ExecutableImage>>;
static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

impl ExecutableImage {
    /// Analyse `binary` (whose file is `id`) for symbolization.
    pub fn new(id: ExeId, binary: GoBinary) -> ExecutableImage {
        let pclntab = binary.pclntab().ok().cloned();
        let mut functions: Vec<(u64, u64)> = pclntab
            .iter()
            .flat_map(|p| p.functions().map(|(_, e, end)| (e, end)))
            .collect();
        functions.sort_unstable();
        ExecutableImage {
            id,
            binary,
            pclntab,
            functions,
        }
    }

    /// The image of the executable at `path`, analysed once per file.
    pub fn open(path: &Path) -> Result<Arc<ExecutableImage>, BinaryError> {
        let read_error = |source| BinaryError::Read {
            path: path.to_owned(),
            source,
        };
        let id = ExeId::of(path).map_err(read_error)?;
        Self::cached(id, || GoBinary::open(path))
    }

    /// The image of process `pid`'s executable (through `/proc/PID/exe`).
    pub fn of_pid(pid: u32) -> Result<Arc<ExecutableImage>, BinaryError> {
        let id = ExeId::of(Path::new(&format!("/proc/{pid}/exe"))).map_err(|e| {
            BinaryError::Process {
                pid,
                reason: if e.kind() == std::io::ErrorKind::NotFound {
                    "no such process".into()
                } else {
                    format!("cannot stat its executable: {e}")
                },
            }
        })?;
        Self::cached(id, || GoBinary::open_pid(pid))
    }

    /// Look `id` up in the cache, analysing it with `open` when missing.
    pub fn cached(
        id: ExeId,
        open: impl FnOnce() -> Result<GoBinary, BinaryError>,
    ) -> Result<Arc<ExecutableImage>, BinaryError> {
        if let Some(found) = lock().get_or_insert_with(HashMap::new).get(&id) {
            return Ok(found.clone());
        }
        let made = Arc::new(ExecutableImage::new(id, open()?));
        lock()
            .get_or_insert_with(HashMap::new)
            .insert(id, made.clone());
        Ok(made)
    }

    /// Drop the cached analysis of `id` (its last process exited).
    pub fn forget(id: ExeId) {
        if let Some(c) = lock().as_mut() {
            c.remove(&id);
        }
    }

    /// The frames of link-time address `pc`, innermost first (inlined calls
    /// first, each marked `inlined`); empty when unknown.
    pub fn frames(&self, pc: u64) -> Vec<Frame> {
        self.pclntab
            .as_ref()
            .map_or_else(Vec::new, |p| p.frames(pc))
    }

    /// The name of the function holding link-time address `pc`.
    pub fn function_name(&self, pc: u64) -> Option<&str> {
        self.pclntab.as_ref()?.function_name(pc)
    }

    /// The most stack the function holding `pc` takes for its own frame, from
    /// its prologue (Go's `funcMaxSPDelta`).
    pub fn max_frame(&self, pc: u64) -> Option<u64> {
        let i = self.functions.partition_point(|(entry, _)| *entry <= pc);
        let (entry, end) = *self.functions.get(i.checked_sub(1)?)?;
        if pc >= end {
            return None;
        }
        let len = usize::try_from(end - entry).ok()?;
        let code = self.binary.bytes_at(entry, len)?;
        frames::max_sp_delta(self.binary.arch, code, entry)
    }
}

fn lock() -> std::sync::MutexGuard<'static, Option<Cache>> {
    CACHE.lock().unwrap_or_else(|e| e.into_inner())
}

/// An executable as one process maps it.
pub struct ProcessImage {
    pub pid: u32,
    pub exe: Arc<ExecutableImage>,
    /// Runtime address = link-time address + bias; known once the process
    /// has mapped its executable (a `run` child is traced before its exec).
    bias: OnceLock<u64>,
}

impl ProcessImage {
    /// Process `pid` running `exe`; the bias is read when first needed.
    pub fn new(pid: u32, exe: Arc<ExecutableImage>) -> ProcessImage {
        let bias = OnceLock::new();
        if !exe.binary.pie {
            let _ = bias.set(0);
        }
        ProcessImage { pid, exe, bias }
    }

    /// The image of a running process.
    pub fn of_pid(pid: u32) -> Result<ProcessImage, BinaryError> {
        let p = ProcessImage::new(pid, ExecutableImage::of_pid(pid)?);
        p.read_bias()?;
        Ok(p)
    }

    /// Whether the process runs this executable now: not before its exec
    /// (a program started under gostw is a shell until it is let go, and a
    /// non-PIE image's addresses need no map to be computed).
    pub fn runs_exe(&self) -> bool {
        ExeId::of(Path::new(&format!("/proc/{}/exe", self.pid))).is_ok_and(|id| id == self.exe.id)
    }

    /// The load bias, if known: resolved by `resolve` (the engine's and
    /// the readers' part, while the process lives); the sinks that
    /// symbolize with it only read it, and never `/proc`.
    pub fn bias(&self) -> Option<u64> {
        self.bias.get().copied()
    }

    /// The load bias, reading `/proc/PID/maps` if it is not known yet (the
    /// process must have mapped its executable).
    pub fn resolve(&self) -> Option<u64> {
        self.read_bias().ok()
    }

    fn read_bias(&self) -> Result<u64, BinaryError> {
        if let Some(b) = self.bias.get() {
            return Ok(*b);
        }
        let pid = self.pid;
        let err = |reason: String| BinaryError::Process { pid, reason };
        let maps = maps::read(pid).map_err(|e| err(format!("cannot read its memory map: {e}")))?;
        let b = maps::load_bias(&maps, self.exe.id.ino, self.exe.binary.load_segments())
            .ok_or_else(|| err("its executable is not mapped".into()))?;
        Ok(*self.bias.get_or_init(|| b))
    }

    /// Frames of runtime address `pc` (an instruction address).
    pub fn frames(&self, pc: u64) -> Vec<Frame> {
        self.bias()
            .map_or_else(Vec::new, |b| self.exe.frames(pc.wrapping_sub(b)))
    }

    /// Frames of a return address (the call is the instruction before it).
    pub fn frames_of_return(&self, ret: u64) -> Vec<Frame> {
        self.frames(ret.wrapping_sub(1))
    }

    /// Frames of a stack walked from the innermost `pcs[0]` (an instruction
    /// address) outwards (return addresses), at most `max` frames; unknown
    /// addresses become a frame named by the hex address.
    pub fn stack(&self, pcs: &[u64], max: usize) -> Vec<Frame> {
        self.walk(pcs, max, true)
    }

    /// Frames of a stack of return addresses only (a saved caller chain),
    /// innermost first, at most `max` frames.
    pub fn return_stack(&self, rets: &[u64], max: usize) -> Vec<Frame> {
        self.walk(rets, max, false)
    }

    fn walk(&self, pcs: &[u64], max: usize, first_is_pc: bool) -> Vec<Frame> {
        pcs.iter()
            .enumerate()
            .flat_map(|(i, &pc)| {
                let frames = if i == 0 && first_is_pc {
                    self.frames(pc)
                } else {
                    self.frames_of_return(pc)
                };
                if frames.is_empty() {
                    vec![Frame::unknown(pc)]
                } else {
                    frames
                }
            })
            .take(max)
            .collect()
    }

    /// Frame size of the function holding return address `ret`.
    pub fn max_frame_of_return(&self, ret: u64) -> Option<u64> {
        self.exe
            .max_frame(ret.wrapping_sub(1).wrapping_sub(self.bias()?))
    }

    /// The runtime address of a link-time address (the bias applied).
    pub fn runtime_address(&self, link: u64) -> Option<u64> {
        Some(link.wrapping_add(self.bias()?))
    }
}
