//! Real Go binaries with bytes changed, through every binary parser. A
//! whole binary as the fuzz input would be megabytes per corpus entry (the
//! corpus outgrows memory in minutes); here the input is small: its first
//! byte picks one of the seed binaries (the files of `GOSTW_FUZZ_SEEDS`, in
//! name order: `cargo xtask fuzz` builds them reproducibly), and each
//! following 5 bytes set one byte (little-endian u32 offset, modulo the
//! length; the value). With `GOSTW_FUZZ_WRITE=FILE` the patched binary is
//! also written to FILE, so a crasher becomes a whole binary that
//! analyse_binary reproduces without the seeds.

#![no_main]

#[path = "common/analyse.rs"]
mod analyse;

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();

fn seeds() -> Vec<Vec<u8>> {
    let dir = std::env::var_os("GOSTW_FUZZ_SEEDS")
        .expect("GOSTW_FUZZ_SEEDS names the directory of seed binaries (cargo xtask fuzz sets it)");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .expect("reading GOSTW_FUZZ_SEEDS")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    paths.sort();
    let seeds: Vec<_> = paths
        .iter()
        .map(|p| std::fs::read(p).expect("reading a seed binary"))
        .filter(|b| !b.is_empty())
        .collect();
    assert!(!seeds.is_empty(), "no seed binaries in GOSTW_FUZZ_SEEDS");
    seeds
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, patches)) = data.split_first() else {
        return;
    };
    let seeds = SEEDS.get_or_init(seeds);
    let mut bin = seeds[pick as usize % seeds.len()].clone();
    for p in patches.chunks_exact(5) {
        let offset = u32::from_le_bytes([p[0], p[1], p[2], p[3]]) as usize % bin.len();
        bin[offset] = p[4];
    }
    if let Some(out) = std::env::var_os("GOSTW_FUZZ_WRITE") {
        std::fs::write(out, &bin).expect("writing GOSTW_FUZZ_WRITE");
    }
    analyse::analyse(bin);
});
