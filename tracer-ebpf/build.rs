//! Rebuild the kernel programs when the `bpf-linker` binary changes. Missing
//! bpf-linker is not an error here: host-side `cargo check` of this crate's
//! (empty) library must work without it; the BPF build itself reports it.
//!
//! Also sets `bpf_target_arch` (which register layout `regs` reads) where
//! the build did not: aya-build passes it when gostw's build compiles these
//! programs; a direct build (clippy) takes it from `AYA_BPF_TARGET_ARCH`,
//! else from the host, as aya's own crates do.
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
    println!("cargo:rerun-if-env-changed=AYA_BPF_TARGET_ARCH");
    println!("cargo::rustc-check-cfg=cfg(bpf_target_arch, values(\"x86_64\", \"aarch64\"))");
    if std::env::var_os("CARGO_CFG_BPF_TARGET_ARCH").is_none() {
        let arch = std::env::var("AYA_BPF_TARGET_ARCH").unwrap_or_else(|_| {
            let host = std::env::var("HOST").unwrap_or_default();
            host.split('-').next().unwrap_or_default().to_owned()
        });
        println!("cargo:rustc-cfg=bpf_target_arch=\"{arch}\"");
    }
}
