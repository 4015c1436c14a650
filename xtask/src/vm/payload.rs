//! What the VM runs, built on the host: the kernel test binary (and the
//! `gostw` binary the tests may start), the Go workloads pre-built for one Go
//! version (the guest has no Go toolchain, and building Go under TCG would
//! take minutes), the shared libraries they need, and an initramfs holding
//! all of it with busybox and the `/init` of init.sh.
//!
//! The payload lives under one fixed guest directory, [`GUEST_ROOT`]: the
//! checkout's files the tests use under `/gostw/checkout`, binaries built
//! outside the checkout under `/gostw/bin`. The test binary carries host
//! paths compiled in (`env!("CARGO_BIN_EXE_gostw")`,
//! `env!("CARGO_MANIFEST_DIR")/../scripts`), so init.sh links each host path
//! to its guest copy once the guest's own file systems are mounted: a
//! checkout anywhere (under /tmp, which the guest mounts a tmpfs over, too)
//! means the same files in the guest.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use super::kernel::Kernel;
use crate::{
    arch::Arch,
    cmd::{cache_dir, exec, step, workspace_root},
    go,
};

/// Modules the guest loads for its swap disk (virtio-blk over virtio-pci).
pub const SWAP_MODULES: &[&str] = &["virtio_pci", "virtio_blk"];

/// Builds of every workload under scripts/workloads: (file name suffix,
/// `go build` arguments). This mirrors the `build_workload(name, go, variant,
/// args)` calls of tracer/tests/kernel: a test that builds a new variant adds
/// it here, or it fails in the VM naming the missing file.
pub const WORKLOAD_VARIANTS: &[(&str, &[&str])] = &[
    ("", &[]),
    ("-pie", &["-buildmode=pie"]),
    ("-stripped", &["-ldflags=-s -w"]),
];

/// The guest directory everything of the payload is under.
const GUEST_ROOT: &str = "/gostw";
/// Where the guest finds the pre-built workloads
/// (`GOSTW_PREBUILT_WORKLOADS`: `<dir>/<go version>/<workload><variant>`).
const GUEST_WORKLOADS: &str = "/gostw/workloads";
/// The guest copy of the checkout (the parts the tests read).
const GUEST_CHECKOUT: &str = "/gostw/checkout";
/// Binaries built outside the checkout (`CARGO_TARGET_DIR` elsewhere).
const GUEST_BIN: &str = "/gostw/bin";

/// Host-built binaries the guest runs, all of one architecture.
#[derive(Clone)]
pub struct Binaries {
    pub arch: Arch,
    /// The kernel test binary (`--test kernel`).
    pub tests: PathBuf,
    /// The `gostw` binary the tests name (`CARGO_BIN_EXE_gostw`): the
    /// static release `gostw` that `cargo xtask dist` ships, so the VM suite
    /// runs it on a userland that is not the one it was built on (busybox,
    /// no C library of its own).
    pub gostw: PathBuf,
}

/// The kernel test binary and `gostw` for `arch`, from the one test build
/// of this run (build.rs): for amd64 the host's own, for arm64 cross-built;
/// its gostw is the static release binary.
pub fn build_binaries(arch: Arch) -> anyhow::Result<Binaries> {
    let built = crate::build::tests(arch)?;
    Ok(Binaries {
        arch,
        tests: built.kernel,
        gostw: built.gostw,
    })
}

/// A static busybox for `arch`: the host's for amd64; Debian's
/// busybox-static for arm64, downloaded once into the cache.
fn busybox(arch: Arch) -> anyhow::Result<PathBuf> {
    if arch == Arch::Amd64 {
        let host = PathBuf::from("/bin/busybox");
        if !host.is_file() {
            bail!("/bin/busybox is missing: apt-get install busybox-static");
        }
        return Ok(host);
    }
    let dir = cache_dir().join(format!("vm/busybox-{}", arch.name()));
    let bin = dir.join("bin/busybox");
    if bin.is_file() {
        return Ok(bin);
    }
    let download = cache_dir().join(format!("vm/busybox-download-{}", std::process::id()));
    let _ = fs::remove_dir_all(&download);
    fs::create_dir_all(&download)?;
    exec(
        Command::new("apt-get")
            .args(["download", "-q"])
            .arg(format!("busybox-static:{}", arch.name()))
            .current_dir(&download),
    )
    .context("downloading Debian's busybox-static for the guest (`cargo xtask setup` adds the architecture)")?;
    let deb = fs::read_dir(&download)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .context("apt-get download left no .deb")?;
    let tmp = cache_dir().join(format!(
        "vm/busybox-{}.partial-{}",
        arch.name(),
        std::process::id()
    ));
    exec(Command::new("dpkg").arg("-x").arg(&deb).arg(&tmp))?;
    let _ = fs::remove_dir_all(&download);
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&tmp, &dir)?;
    if crate::dist::interpreter(&fs::read(&bin)?)?.is_some() {
        bail!("{} is not static", bin.display());
    }
    Ok(bin)
}

/// A guest binary of another architecture than the host's is static, or a
/// Go PIE, which asks for the dynamic loader but for no library (Go's own
/// linker): the host's `ldd` cannot read either, so the loaders they name are
/// taken from Debian's cross C library (libc6-dev-arm64-cross), under the
/// names they ask for. A binary that needed a library would fail in the
/// guest, naming it.
fn cross_loaders(arch: Arch, elves: &[PathBuf]) -> anyhow::Result<BTreeSet<(PathBuf, PathBuf)>> {
    let mut loaders = BTreeSet::new();
    for elf in elves {
        let interp = crate::dist::interpreter(&fs::read(elf)?)
            .with_context(|| format!("reading {}", elf.display()))?;
        let Some(interp) = interp else { continue };
        let name = Path::new(&interp)
            .file_name()
            .with_context(|| format!("{}: interpreter {interp:?}", elf.display()))?;
        let cross = Path::new("/usr")
            .join(format!("{}-linux-gnu/lib", arch.uname()))
            .join(name);
        if !cross.is_file() {
            bail!(
                "{} asks for {interp}, and {} is missing: apt-get install libc6-dev-{}-cross",
                elf.display(),
                cross.display(),
                arch.name()
            );
        }
        loaders.insert((PathBuf::from(interp), cross));
    }
    Ok(loaders)
}

/// Build every workload of scripts/workloads with `toolchain` for `arch`
/// into `out/<version>/`, in each variant of [`WORKLOAD_VARIANTS`].
pub fn build_workloads(toolchain: go::Toolchain, arch: Arch, out: &Path) -> anyhow::Result<()> {
    step(&format!(
        "pre-build the Go workloads with Go {} for {}",
        toolchain.version,
        arch.name()
    ));
    let dir = out.join(toolchain.version);
    fs::create_dir_all(&dir)?;
    let sources = workspace_root().join("scripts/workloads");
    let mut names: Vec<_> = fs::read_dir(&sources)?
        .filter_map(Result::ok)
        .filter(|e| e.path().join("go.mod").is_file())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    for name in &names {
        for (variant, args) in WORKLOAD_VARIANTS {
            let mut build = toolchain.build(name, args, &dir.join(format!("{name}{variant}")));
            build.env("GOARCH", arch.name());
            if arch != Arch::Amd64 {
                // Cross-built: Go's own linker, static (`ensure_static`).
                build.env("CGO_ENABLED", "0");
            }
            exec(&mut build).with_context(|| {
                format!("building workload {name} with Go {}", toolchain.version)
            })?;
        }
    }
    Ok(())
}

/// Everything the initramfs is made of.
pub struct Payload<'a> {
    pub kernel: &'a Kernel,
    pub binaries: &'a Binaries,
    /// `build_workloads`' output directory.
    pub workloads: &'a Path,
    /// The Go versions the workloads were built with.
    pub go_versions: &'a [&'a str],
    /// Arguments for the test binary after `--test-threads=1`.
    pub test_args: &'a [String],
    /// Name of the kernel (`--kernel`), passed to the tests as `GOSTW_VM`.
    pub kernel_name: &'a str,
    /// Seconds after which the guest, tests still running, prints where
    /// every task waits (before the host's deadline kills it).
    pub stall_secs: u64,
    /// How long the tests may print nothing before the guest's watchdog
    /// says it stalled.
    pub quiet_secs: u64,
}

/// Stage the guest's root file system in `stage` and pack it into the
/// uncompressed newc cpio archive `initrd` (no compression: the host would
/// spend longer compressing than QEMU spends loading it).
pub fn build_initramfs(p: &Payload, stage: &Path, initrd: &Path) -> anyhow::Result<()> {
    step("initramfs");
    let _ = fs::remove_dir_all(stage);
    fs::create_dir_all(stage.join("bin"))?;
    fs::create_dir_all(stage.join("lib/modules"))?;

    let arch = p.binaries.arch;
    let busybox = busybox(arch)?;
    fs::copy(&busybox, stage.join("bin/busybox"))?;

    let modules = p.kernel.modules_in_load_order(SWAP_MODULES)?;
    let mut module_files = Vec::new();
    for m in &modules {
        let file = m.rsplit('/').next().unwrap_or(m);
        let from = p.kernel.modules.join(m);
        // Newer kernels ship compressed modules (.ko.xz, .ko.zst); busybox's
        // insmod loads plain ones.
        let (file, unpack) = match file.rsplit_once('.') {
            Some((plain, "xz")) => (plain, Some("xz")),
            Some((plain, "zst")) => (plain, Some("zstd")),
            _ => (file, None),
        };
        let to = stage.join("lib/modules").join(file);
        match unpack {
            Some(tool) => {
                let out = std::process::Command::new(tool)
                    .arg("-dc")
                    .arg(&from)
                    .output()
                    .with_context(|| format!("running {tool} on module {m}"))?;
                if !out.status.success() {
                    bail!("{tool} -dc {m}: {}", String::from_utf8_lossy(&out.stderr));
                }
                fs::write(&to, out.stdout)?;
            }
            None => {
                fs::copy(&from, &to).with_context(|| format!("copying module {m}"))?;
            }
        }
        module_files.push(file.to_owned());
    }

    // Host binaries under the guest root, debug info stripped (it is most of
    // the test binary's size and the guest only needs symbols); each host
    // path a test may name gets a link to its guest copy.
    let root = workspace_root();
    let mut links = vec![(root.clone(), PathBuf::from(GUEST_CHECKOUT))];
    let mut elves = vec![busybox.clone()];
    let mut guest_tests = None;
    for bin in [&p.binaries.tests, &p.binaries.gostw] {
        let guest = guest_path(&root, bin)?;
        if !bin.starts_with(&root) {
            links.push((bin.clone(), guest.clone()));
        }
        let dest = in_stage(stage, &guest);
        fs::create_dir_all(dest.parent().unwrap())?;
        exec(
            Command::new(format!("{}strip", arch.binutils_prefix()))
                .arg("--strip-debug")
                .arg(bin)
                .arg("-o")
                .arg(&dest),
        )?;
        elves.push(bin.clone());
        guest_tests.get_or_insert(guest);
    }
    let guest_workloads = stage.join(GUEST_WORKLOADS.trim_start_matches('/'));
    copy_tree(p.workloads, &guest_workloads)?;
    for entry in walk(&guest_workloads)? {
        elves.push(entry);
    }
    // Scenario scripts and workload sources, where the tests expect them;
    // `tracer/` exists so that `CARGO_MANIFEST_DIR/../x` resolves.
    let checkout = stage.join(GUEST_CHECKOUT.trim_start_matches('/'));
    copy_tree(&root.join("scripts"), &checkout.join("scripts"))?;
    fs::create_dir_all(checkout.join("tracer"))?;

    // (guest path, host file) of each library and loader.
    let libs = if arch == Arch::Amd64 {
        shared_libraries(&elves)?
            .into_iter()
            .map(|l| (l.clone(), l))
            .collect()
    } else {
        cross_loaders(arch, &elves)?
    };
    for (guest, host) in libs {
        let dest = in_stage(stage, &guest);
        fs::create_dir_all(dest.parent().unwrap())?;
        fs::copy(&host, &dest).with_context(|| format!("copying {}", host.display()))?;
    }

    let env = [
        ("GOSTW_VM", p.kernel_name.to_owned()),
        (
            "GOSTW_GO_MATRIX",
            p.go_versions
                .iter()
                .map(|v| format!("{v}=prebuilt"))
                .collect::<Vec<_>>()
                .join(","),
        ),
        ("GOSTW_PREBUILT_WORKLOADS", GUEST_WORKLOADS.to_owned()),
        ("GOSTW_VM_QUIET_SECS", p.quiet_secs.to_string()),
        ("RUST_BACKTRACE", "1".to_owned()),
    ];
    let init = include_str!("init.sh")
        .replace("@MODULES@", &module_files.join(" "))
        .replace(
            "@ENV@",
            &format!(
                "env {}",
                env.iter()
                    .map(|(k, v)| shell_quote(&format!("{k}={v}")))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        )
        .replace("@LINKS@", &link_commands(&links)?)
        .replace("@STALL_SECS@", &p.stall_secs.to_string())
        .replace("@QUIET_SECS@", &p.quiet_secs.to_string())
        .replace(
            "@GOSTW_BIN@",
            &shell_quote(&guest_path(&root, &p.binaries.gostw)?.to_string_lossy()),
        )
        .replace(
            "@TEST_BIN@",
            &shell_quote(&guest_tests.expect("two binaries").to_string_lossy()),
        )
        .replace(
            "@TEST_ARGS@",
            &p.test_args
                .iter()
                .map(|a| shell_quote(a))
                .collect::<Vec<_>>()
                .join(" "),
        );
    let init_path = stage.join("init");
    fs::write(&init_path, init)?;
    exec(Command::new("chmod").arg("755").arg(&init_path))?;

    exec(
        Command::new("sh")
            .arg("-c")
            .arg(r#"cd "$1" && find . -print0 | cpio --null --create --format=newc --quiet > "$2""#)
            .arg("sh")
            .arg(stage)
            .arg(initrd),
    )
    .context("packing the initramfs (apt-get install cpio)")?;
    let size = fs::metadata(initrd)?.len();
    eprintln!("{} ({} MiB)", initrd.display(), size >> 20);
    Ok(())
}

/// `path` (absolute) inside the staged root.
fn in_stage(stage: &Path, path: &Path) -> PathBuf {
    stage.join(path.strip_prefix("/").unwrap_or(path))
}

/// Where the host binary `bin` goes in the guest: under the checkout copy at
/// its place in the checkout, else under [`GUEST_BIN`].
fn guest_path(root: &Path, bin: &Path) -> anyhow::Result<PathBuf> {
    Ok(match bin.strip_prefix(root) {
        Ok(rel) => Path::new(GUEST_CHECKOUT).join(rel),
        Err(_) => Path::new(GUEST_BIN).join(
            bin.file_name()
                .with_context(|| format!("{} has no file name", bin.display()))?,
        ),
    })
}

/// init.sh lines linking each host path to its guest copy (nothing where
/// they are the same path). A host path the guest cannot hold (under its
/// /proc, /sys or the payload itself) is refused here, with the reason.
fn link_commands(links: &[(PathBuf, PathBuf)]) -> anyhow::Result<String> {
    let mut out = String::new();
    for (host, guest) in links {
        if host == guest {
            continue;
        }
        if !host.is_absolute() {
            bail!("{} is not an absolute path", host.display());
        }
        for reserved in ["/proc", "/sys", GUEST_ROOT] {
            if host.starts_with(reserved) {
                bail!(
                    "{} is under {reserved}, which the VM's guest uses itself: \
                     move the checkout (or CARGO_TARGET_DIR) elsewhere",
                    host.display()
                );
            }
        }
        let parent = host.parent().unwrap_or(Path::new("/"));
        out.push_str(&format!(
            "link {} {} {}\n",
            shell_quote(&parent.to_string_lossy()),
            shell_quote(&guest.to_string_lossy()),
            shell_quote(&host.to_string_lossy()),
        ));
    }
    Ok(out)
}

/// Every shared library and dynamic loader `elves` need, per `ldd` (nothing
/// for static binaries such as Go's). Symlinks are followed: the guest gets
/// the library under the name the loader looks for.
fn shared_libraries(elves: &[PathBuf]) -> anyhow::Result<BTreeSet<PathBuf>> {
    let mut libs = BTreeSet::new();
    for elf in elves {
        let out = Command::new("ldd").arg(elf).output()?;
        // ldd exits 1 for static binaries ("not a dynamic executable").
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if line.contains("not found") {
                bail!("{}: {}", elf.display(), line.trim());
            }
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
            // "/lib64/ld-linux-x86-64.so.2 (0x...)".
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next(),
                None => line.split_whitespace().next(),
            };
            if let Some(path) = path.filter(|p| p.starts_with('/')) {
                libs.insert(PathBuf::from(path));
            }
        }
    }
    Ok(libs)
}

/// Copy the directory `from` to `to` (files and directories only).
fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    fs::create_dir_all(to)?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let dest = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &dest)?;
        } else if kind.is_file() {
            fs::copy(entry.path(), &dest)?;
        }
    }
    Ok(())
}

/// Every regular file under `dir`.
fn walk(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            files.extend(walk(&entry.path())?);
        } else {
            files.push(entry.path());
        }
    }
    Ok(files)
}

/// `s` as one single-quoted shell word.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_words_survive_quotes() {
        assert_eq!(shell_quote("stw_probe::"), "'stw_probe::'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn host_paths_link_to_the_fixed_guest_root() {
        let root = Path::new("/tmp/x");
        assert_eq!(
            guest_path(root, Path::new("/tmp/x/target/debug/gostw")).unwrap(),
            Path::new("/gostw/checkout/target/debug/gostw")
        );
        assert_eq!(
            guest_path(root, Path::new("/srv/t/debug/gostw")).unwrap(),
            Path::new("/gostw/bin/gostw")
        );
        let links = [
            (PathBuf::from("/tmp/x"), PathBuf::from(GUEST_CHECKOUT)),
            (PathBuf::from(GUEST_CHECKOUT), PathBuf::from(GUEST_CHECKOUT)),
        ];
        assert_eq!(
            link_commands(&links).unwrap(),
            "link '/tmp' '/gostw/checkout' '/tmp/x'\n"
        );
        for bad in ["/proc/1/cwd/x", "/gostw/elsewhere", "relative"] {
            let links = [(PathBuf::from(bad), PathBuf::from(GUEST_CHECKOUT))];
            assert!(link_commands(&links).is_err(), "{bad}");
        }
    }
}
