//! What the exposure needs of a process's executable: the analysed Go
//! binary and the layouts of the runtime's heap structs from its DWARF.
//! Both are per executable, not per process: the tracing engine and the
//! agent build one `Executable` per binary and reuse it for every read.

use std::sync::Arc;

use super::{MemoryError, PlainSummary, dwarf, smaps};
use crate::binary::{BinaryError, GoBinary, running};

/// A Go executable, ready for `Exposure::read_with`.
pub struct Executable {
    pub binary: Arc<GoBinary>,
    /// `runtime.mheap`, `runtime.heapArena`, `runtime.mspan` from DWARF;
    /// `None` without DWARF (`-w`, `-s -w`).
    pub heap_layouts: Option<dwarf::Layouts>,
}

impl Executable {
    /// Analyse the executable of process `pid`. A process that is not Go
    /// gets `MemoryError::NotGo`, with what its smaps alone tells.
    pub fn of_process(pid: u32) -> Result<Executable, MemoryError> {
        // No executable: gone, a zombie or a kernel thread, which says which.
        let exe = running::process_exe(pid).map_err(|_| MemoryError::no_memory(pid))?;
        let data = std::fs::read(format!("/proc/{pid}/exe"))
            .map_err(|e| MemoryError::from_io(pid, "its executable", e))?;
        // Before the binary takes the bytes; cheap where there is no DWARF.
        let heap_layouts = dwarf::heap_layouts(&data);
        match GoBinary::from_bytes(&exe.host_path, data) {
            Ok(binary) => Ok(Executable {
                binary: Arc::new(binary),
                heap_layouts,
            }),
            Err(BinaryError::NotGo { .. } | BinaryError::NotElf { .. }) => {
                Err(MemoryError::NotGo {
                    pid,
                    exe: exe.exe.display().to_string(),
                    summary: plain_summary(pid),
                })
            }
            Err(source) => Err(MemoryError::Binary { pid, source }),
        }
    }

    /// An executable already analysed (`binary`, e.g. from a process image
    /// cache); its DWARF is read from `/proc/PID/exe` of a process running it
    /// when it has some.
    pub fn from_binary(binary: Arc<GoBinary>, pid: u32) -> Result<Executable, MemoryError> {
        let heap_layouts = if binary.has_dwarf {
            let data = std::fs::read(format!("/proc/{pid}/exe"))
                .map_err(|e| MemoryError::from_io(pid, "its executable", e))?;
            dwarf::heap_layouts(&data)
        } else {
            None
        };
        Ok(Executable {
            binary,
            heap_layouts,
        })
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
