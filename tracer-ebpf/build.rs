//! Rebuild the kernel programs when the `bpf-linker` binary changes. Missing
//! bpf-linker is not an error here: host-side `cargo check` of this crate's
//! (empty) library must work without it; the BPF build itself reports it.
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
