//! `cargo xtask dist`: what people install, in `target/dist`. A static
//! `gostw` for x86_64 and one for aarch64 (the eBPF programs, built for the
//! same architecture, are embedded in it, so it is the whole tool), each
//! with its SHA-256 and a `.deb` with the agent's systemd unit, and the
//! agent's container image (image.rs, x86_64). The static binary is also the
//! release `gostw` every other command builds (`build::gostw`): the tests,
//! benches and the VM suite run what people install.
//!
//! Static by glibc's `crt-static` on the gnu target rather than musl: this
//! machine's toolchains carry no musl standard library, and gostw calls
//! nothing of glibc's that needs its shared parts at run time (no name
//! service lookups: listen addresses are IP literals). Each artifact is
//! checked before it is called done: the binary has no program interpreter
//! and runs alone in an empty root (the aarch64 one: under qemu-aarch64,
//! outside it); the package's own copy answers `--version`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail, ensure};

use crate::{
    arch::Arch,
    cmd::{exec, output, step, workspace_root},
    setup,
};

mod image;

const UNIT: &str = "deploy/systemd/gostw-agent.service";

#[derive(clap::Args)]
pub struct Options {
    /// Skip the set-up step (the toolchains are already there).
    #[arg(long)]
    pub no_setup: bool,
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    if !opts.no_setup {
        setup::run(&setup::Options { minimal: true })?;
        setup::cross_tools()?;
    }
    let builds = [Arch::Amd64, Arch::Arm64]
        .into_iter()
        .map(|arch| Ok((arch, crate::build::gostw(arch)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    artifacts(&builds)
}

/// From each static build of `builds`: the named binary run alone, its
/// checksum and its `.deb`, and from the amd64 one the image, each checked,
/// in `target/dist`.
pub fn artifacts(builds: &[(Arch, PathBuf)]) -> anyhow::Result<()> {
    let root = workspace_root();
    let dist = root.join("target/dist");
    fs::create_dir_all(&dist)?;
    let mut made = Vec::new();
    for (arch, built) in builds {
        let arch = *arch;
        step(&format!("dist: the {} binary alone", arch.uname()));
        let version = version_of(arch, built)?;
        let name = format!("gostw-{version}-{}-linux", arch.uname());
        let binary = dist.join(&name);
        fs::copy(built, &binary)?;
        runs_alone(arch, &binary, &dist.join("empty-root"))?;

        step("checksum");
        let sum = output(Command::new("sha256sum").arg(&name).current_dir(&dist))?;
        fs::write(dist.join(format!("{name}.sha256")), &sum)?;
        eprint!("{sum}");

        step(&format!(".deb ({})", arch.name()));
        made.push(deb(arch, &root, &dist, &binary, &version)?);
        step(&format!(
            "container image ({}: buildah, deploy/Dockerfile)",
            arch.name()
        ));
        made.push(image::build_and_check(&dist, &binary, &version, arch)?);
        made.push(binary);
    }
    let made: Vec<String> = made.iter().map(|p| p.display().to_string()).collect();
    eprintln!("\ndist: {}", made.join(", "));
    Ok(())
}

/// `gostw --version`'s version, of a binary built for `arch`.
fn version_of(arch: Arch, binary: &Path) -> anyhow::Result<String> {
    let out = output(arch.command(binary).arg("--version"))?;
    out.split_whitespace()
        .nth(1)
        .map(str::to_owned)
        .with_context(|| format!("no version in {out:?}"))
}

/// Run the binary in a root that holds nothing else (no C library, no
/// loader): the proof that it needs none. One of another architecture
/// cannot run in a root without its emulator: it is checked to ask for no
/// program interpreter and run under qemu-aarch64.
fn runs_alone(arch: Arch, binary: &Path, empty: &Path) -> anyhow::Result<()> {
    if arch != Arch::Amd64 {
        ensure!(
            interpreter(&fs::read(binary)?)?.is_none(),
            "{} asks for a program interpreter: not static",
            binary.display()
        );
        let out = output(arch.command(binary).arg("--version"))?;
        eprintln!("static, and under qemu-aarch64: {}", out.trim());
        return Ok(());
    }
    let _ = fs::remove_dir_all(empty);
    fs::create_dir_all(empty)?;
    fs::copy(binary, empty.join("gostw"))?;
    if !setup::is_root() {
        eprintln!("dist: not root, so not run in an empty root (chroot needs root)");
        return Ok(());
    }
    let out = output(
        Command::new("chroot")
            .arg(empty)
            .args(["/gostw", "--version"]),
    )?;
    eprintln!("in an empty root: {}", out.trim());
    fs::remove_dir_all(empty)?;
    Ok(())
}

/// `gostw_VERSION_ARCH.deb`: the binary in /usr/bin, the agent's unit
/// (not enabled: it opens a port) in /lib/systemd/system.
fn deb(
    arch: Arch,
    root: &Path,
    dist: &Path,
    binary: &Path,
    version: &str,
) -> anyhow::Result<PathBuf> {
    let tree = dist.join(format!("gostw_{version}_{}", arch.name()));
    let _ = fs::remove_dir_all(&tree);
    for dir in ["DEBIAN", "usr/bin", "lib/systemd/system"] {
        fs::create_dir_all(tree.join(dir))?;
    }
    fs::copy(binary, tree.join("usr/bin/gostw"))?;
    let unit = fs::read_to_string(root.join(UNIT))?;
    ensure!(
        unit.contains("/usr/local/bin/gostw"),
        "{UNIT} no longer runs /usr/local/bin/gostw"
    );
    fs::write(
        tree.join("lib/systemd/system/gostw-agent.service"),
        unit.replace("/usr/local/bin/gostw", "/usr/bin/gostw"),
    )?;
    let size_kib = fs::metadata(binary)?.len().div_ceil(1024);
    fs::write(
        tree.join("DEBIAN/control"),
        control(arch, version, size_kib),
    )?;
    let deb = dist.join(format!("gostw_{version}_{}.deb", arch.name()));
    exec(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "--build"])
            .arg(&tree)
            .arg(&deb),
    )?;
    fs::remove_dir_all(&tree)?;

    // dpkg installs it into an empty root of its own (its own package
    // database), where the installed gostw runs alone.
    let root = dist.join("deb-check");
    let _ = fs::remove_dir_all(&root);
    let admin = root.join("var/lib/dpkg");
    fs::create_dir_all(admin.join("info"))?;
    fs::create_dir_all(admin.join("updates"))?;
    fs::write(admin.join("status"), "")?;
    // The package database's architectures: ours, and the package's.
    fs::write(admin.join("arch"), format!("amd64\n{}\n", arch.name()))?;
    if setup::is_root() {
        exec(
            Command::new("dpkg")
                .arg(format!("--root={}", root.display()))
                .arg(format!("--admindir={}", admin.display()))
                .arg("--install")
                .arg(&deb),
        )?;
        let out = if arch == Arch::Amd64 {
            output(
                Command::new("chroot")
                    .arg(&root)
                    .args(["/usr/bin/gostw", "--version"]),
            )?
        } else {
            output(arch.command(&root.join("usr/bin/gostw")).arg("--version"))?
        };
        ensure!(
            out.split_whitespace().nth(1) == Some(version),
            "the installed gostw says {out:?}, not {version}"
        );
        eprintln!("installed by dpkg into an empty root: {}", out.trim());
    } else {
        eprintln!("dist: not root, so the package is unpacked, not installed");
        exec(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
        let v = version_of(arch, &root.join("usr/bin/gostw"))?;
        ensure!(v == version, "the package's gostw says {v}, not {version}");
    }
    ensure!(
        root.join("lib/systemd/system/gostw-agent.service").exists(),
        "the package has no unit"
    );
    fs::remove_dir_all(&root)?;
    Ok(deb)
}

/// The package's control file.
fn control(arch: Arch, version: &str, size_kib: u64) -> String {
    let arch = arch.name();
    format!(
        "Package: gostw\n\
         Version: {version}\n\
         Architecture: {arch}\n\
         Maintainer: gostw developers <gostw@localhost>\n\
         Installed-Size: {size_kib}\n\
         Section: utils\n\
         Priority: optional\n\
         Description: explain Go stop-the-world pauses on live processes\n \
         gostw attaches to running Go programs with eBPF and says why each\n \
         slow stop-the-world pause was slow: the goroutine that held it, page\n \
         faults, reclaim, CPU throttling; and what goroutine stack growth costs.\n \
         One static binary (the eBPF programs embedded) and the node agent's\n \
         systemd unit (gostw-agent.service, not enabled).\n"
    )
}

/// The program interpreter an ELF64 little-endian executable asks for
/// (`PT_INTERP`), or none: a static binary has none.
pub fn interpreter(elf: &[u8]) -> anyhow::Result<Option<String>> {
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        elf.get(at..at + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let u64_at = |at: usize| {
        elf.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    };
    if elf.get(..6) != Some(b"\x7fELF\x02\x01") {
        bail!("not an ELF64 little-endian file");
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        bail!("truncated ELF header");
    };
    for i in 0..usize::from(phnum) {
        let ph = usize::try_from(phoff)? + i * usize::from(phentsize);
        if u32_at(ph).context("truncated program header")? != PT_INTERP {
            continue;
        }
        let (Some(offset), Some(size)) = (u64_at(ph + 8), u64_at(ph + 32)) else {
            bail!("truncated program header");
        };
        let path = elf
            .get(usize::try_from(offset)?..usize::try_from(offset + size)?)
            .context("PT_INTERP past the end of the file")?;
        return Ok(Some(
            String::from_utf8_lossy(path)
                .trim_end_matches('\0')
                .to_owned(),
        ));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_executable_names_its_interpreter_and_a_static_one_none() {
        // The host's shell is dynamic: it names glibc's loader. (This test
        // binary is not: the tests are built static, xtask/src/build.rs.)
        let me = fs::read(fs::canonicalize("/bin/sh").unwrap()).unwrap();
        let interp = interpreter(&me).unwrap().expect("a dynamic /bin/sh");
        assert!(interp.contains("ld-linux"), "{interp}");
        // The same header with its PT_INTERP turned into PT_NULL has none.
        let mut stripped = me.clone();
        let phoff = u64::from_le_bytes(me[0x20..0x28].try_into().unwrap()) as usize;
        let phentsize = usize::from(u16::from_le_bytes([me[0x36], me[0x37]]));
        let phnum = usize::from(u16::from_le_bytes([me[0x38], me[0x39]]));
        for i in 0..phnum {
            let ph = phoff + i * phentsize;
            if u32::from_le_bytes(me[ph..ph + 4].try_into().unwrap()) == 3 {
                stripped[ph..ph + 4].copy_from_slice(&0u32.to_le_bytes());
            }
        }
        assert_eq!(interpreter(&stripped).unwrap(), None);
        assert!(interpreter(b"#!/bin/sh\n").is_err());
        assert!(interpreter(b"\x7fELF\x02\x01").is_err());
    }
}
