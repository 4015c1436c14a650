//! Rebuild the kernel programs when the `bpf-linker` binary changes. Missing
//! bpf-linker is not an error here: host-side `cargo check` of this crate's
//! (empty) library must work without it; the BPF build itself reports it.
//!
//! Also sets `bpf_target_arch` (which register layout `regs` reads) where
//! the build did not, as aya's own crates do: aya-build passes it when
//! gostw's build compiles these programs; a direct build (clippy) takes it
//! from `AYA_BPF_TARGET_ARCH`, else from the host.
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
    aya_build::emit_bpf_target_arch_cfg().expect("bpf_target_arch");
}
