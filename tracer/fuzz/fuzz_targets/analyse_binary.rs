//! Feed arbitrary bytes to every binary parser: ELF, buildinfo, pclntab,
//! module data, DWARF and type descriptors. Seed the corpus with real Go
//! binaries (e.g. target/go-workloads/*/inspect-*) for deep coverage.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use tracer::binary::{GoBinary, OffsetSource, PROBED_FUNCTIONS};

fuzz_target!(|data: &[u8]| {
    let Ok(bin) = GoBinary::from_bytes(Path::new("fuzz"), data.to_vec()) else {
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
});
