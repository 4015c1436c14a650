//! What the exposure needs of a process's executable: its analysis from
//! the one process image service (`image::ExecutableImage`, cached per
//! file) and the layouts of the runtime's heap structs from its DWARF.
//! Both are per executable, not per process: the engine and the agent keep
//! one `Executable` per binary and reuse it for every read.

use std::{cell::Cell, path::Path, sync::Arc};

use super::{MemoryError, PlainSummary, mheap, smaps};
use crate::{
    binary::{BinaryError, FileBytes, GoBinary, running},
    image::{ExeId, ExecutableImage},
};

/// A Go executable, ready for `Exposure::read_with`.
pub struct Executable {
    pub image: Arc<ExecutableImage>,
    /// `runtime.mheap`, `runtime.heapArena`, `runtime.mspan` from DWARF;
    /// `None` without DWARF (`-w`, `-s -w`).
    pub heap_layouts: Option<mheap::Layouts>,
}

impl Executable {
    /// The executable of process `pid`, through the image cache (the file
    /// mapped, not read). A process that is not Go gets
    /// `MemoryError::NotGo`, with what its smaps alone tells.
    pub fn of_process(pid: u32) -> Result<Executable, MemoryError> {
        // No executable: gone, a zombie or a kernel thread, which says which.
        let exe = running::process_exe(pid).map_err(|_| MemoryError::no_memory(pid))?;
        let path = format!("/proc/{pid}/exe");
        let id = ExeId::of(Path::new(&path)).map_err(|_| MemoryError::no_memory(pid))?;
        let not_go = Cell::new(false);
        let image = ExecutableImage::cached(id, || {
            let data = FileBytes::map(Path::new(&path)).map_err(|e| BinaryError::Process {
                pid,
                reason: format!("cannot read its executable: {e}"),
            })?;
            GoBinary::from_file(&exe.host_path, data).inspect_err(|e| {
                not_go.set(matches!(
                    e,
                    BinaryError::NotGo { .. } | BinaryError::NotElf { .. }
                ))
            })
        });
        match image {
            Ok(image) => Ok(Executable::for_image(image)),
            Err(_) if not_go.get() => Err(MemoryError::NotGo {
                pid,
                exe: exe.exe.display().to_string(),
                summary: plain_summary(pid),
            }),
            Err(source) => Err(MemoryError::Binary { pid, source }),
        }
    }

    /// An executable the image service already analysed; the heap structs'
    /// layouts come from its DWARF, read from the file it maps.
    pub fn for_image(image: Arc<ExecutableImage>) -> Executable {
        let heap_layouts = mheap::heap_layouts(&image.binary);
        Executable {
            image,
            heap_layouts,
        }
    }

    /// The analysed binary.
    pub fn binary(&self) -> &GoBinary {
        &self.image.binary
    }
}

/// What smaps alone says of a process (for the error of a non-Go one).
fn plain_summary(pid: u32) -> PlainSummary {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut s = PlainSummary::default();
    for m in smaps::parse(&text).unwrap_or_default() {
        s.resident += m.rss;
        s.swapped += m.swap;
        if matches!(m.backing, smaps::Backing::File(_)) {
            s.file_resident += m.rss;
        } else {
            s.anon_resident += m.rss;
            s.anon_swapped += m.swap;
        }
    }
    s
}
