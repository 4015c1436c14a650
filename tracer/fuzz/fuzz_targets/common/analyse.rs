//! What every fuzz target does with a binary: every parser gostw runs on
//! one (ELF, buildinfo, pclntab, module data, DWARF, type descriptors), and
//! symbolization of the functions it finds. Errors are fine; panics,
//! overflows and out-of-bounds reads are the bugs.

use std::path::Path;

use tracer::binary::{GoBinary, OffsetSource, PROBED_FUNCTIONS};

/// Run every parser on `data`.
pub fn analyse(data: Vec<u8>) {
    let Ok(bin) = GoBinary::from_bytes(Path::new("fuzz"), data) else {
        return;
    };
    for name in PROBED_FUNCTIONS {
        let _ = bin.function(name);
    }
    let _ = bin.struct_offsets();
    let _ = bin.offsets_from(OffsetSource::TypeDescriptors);
    if let Ok(p) = bin.pclntab() {
        let entries: Vec<u64> = p.functions().map(|(_, entry, _)| entry).take(256).collect();
        for pc in entries {
            let _ = p.frames(pc);
            let _ = p.frames(pc.wrapping_add(3));
        }
    }
}
