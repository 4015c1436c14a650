//! Feed arbitrary bytes to every binary parser: ELF, buildinfo, pclntab,
//! module data, DWARF and type descriptors. `cargo xtask fuzz` runs the
//! crashers committed under crashers/analyse_binary through it.

#![no_main]

#[path = "common/analyse.rs"]
mod analyse;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| analyse::analyse(data.to_vec()));
