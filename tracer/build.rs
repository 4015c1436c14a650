//! Builds the kernel programs (`tracer-ebpf`) for the BPF target and leaves
//! the object in OUT_DIR, where `src/ebpf.rs` embeds it.
//!
//! With AYA_BUILD_SKIP=1 (clippy, `cargo check` on a machine without
//! bpf-linker) an empty stub object is written instead; loading it fails at
//! run time with a message that says how the binary was built.
use std::{env, fs, path::PathBuf};

use anyhow::Context as _;

const EBPF_BIN: &str = "gostw-ebpf";

fn main() -> anyhow::Result<()> {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR not set")?);
    let ebpf_dir = manifest_dir.join("../tracer-ebpf");
    let ebpf_dir = ebpf_dir.to_str().context("non-UTF-8 path")?;

    // `cargo xtask setup` installs bpf-linker into CARGO_HOME/bin; make sure the
    // nested BPF build finds it even when that directory is not on PATH.
    if let Some(cargo_home) = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
    {
        let mut paths = vec![cargo_home.join("bin")];
        paths.extend(env::split_paths(&env::var_os("PATH").unwrap_or_default()));
        // SAFETY: build scripts are single-threaded at this point.
        unsafe { env::set_var("PATH", env::join_paths(paths)?) };
    }

    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
        fs::write(out_dir.join(EBPF_BIN), [])?;
        return Ok(());
    }
    // aya-build relays every line the nested cargo prints as a build warning;
    // keep it to errors.
    // SAFETY: as above.
    unsafe { env::set_var("CARGO_TERM_QUIET", "true") };
    // The programs depend only on the target architecture, not on the
    // profile or the host crate's features: one nested build per
    // architecture under the workspace's target directory, which the debug,
    // test and release builds of that architecture share (aya-build puts its
    // own under OUT_DIR, one per build of this crate, each compiling `core`
    // for BPF anew). The nested cargo locks that directory itself.
    let arch = env::var("CARGO_CFG_TARGET_ARCH").context("CARGO_CFG_TARGET_ARCH not set")?;
    let shared = shared_ebpf_dir(&out_dir, &arch);
    fs::create_dir_all(&shared)?;
    // SAFETY: as above.
    unsafe { env::set_var("OUT_DIR", &shared) };
    let built = aya_build::build_ebpf(
        [aya_build::Package {
            name: "tracer-ebpf",
            root_dir: ebpf_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
    .context("building the eBPF programs failed; `cargo xtask setup` installs nightly rust-src and bpf-linker");
    // SAFETY: as above.
    unsafe { env::set_var("OUT_DIR", &out_dir) };
    built?;
    fs::copy(shared.join(EBPF_BIN), out_dir.join(EBPF_BIN))
        .with_context(|| format!("copying {EBPF_BIN} from {}", shared.display()))?;
    Ok(())
}

/// `TARGET/ebpf/ARCH`, where TARGET is the outermost directory above
/// `out_dir` (`TARGET/[TRIPLE/]PROFILE/build/tracer-HASH/out`) that cargo
/// tagged with CACHEDIR.TAG: each TRIPLE directory has a tag too. OUT_DIR
/// itself where no tag is found.
fn shared_ebpf_dir(out_dir: &std::path::Path, arch: &str) -> PathBuf {
    out_dir
        .ancestors()
        .filter(|d| d.join("CACHEDIR.TAG").is_file())
        .last()
        .map_or_else(
            || out_dir.to_owned(),
            |target| target.join("ebpf").join(arch),
        )
}
