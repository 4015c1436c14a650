//! Distro kernels for the VM: which Debian package each `--kernel` name means,
//! fetching and unpacking it once into the cache, and resolving the modules
//! the guest loads (with their dependencies, from the package's own tree).

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::{
    arch::Arch,
    cmd::{cache_dir, exec, output, step},
};

/// A kernel the VM suite can boot, named for `--kernel`.
#[derive(Clone, Copy, Debug)]
pub struct KernelSpec {
    /// What `--kernel` takes, e.g. "debian-6.1".
    pub name: &'static str,
    /// The architecture it runs (`--arch`).
    pub arch: Arch,
    /// The package tested so far (the kernel image; with the modules too
    /// unless `split`); used while the archive still serves it.
    pub package: &'static str,
    /// Package names of the same series start with this and end with
    /// `suffix`: the newest of them replaces `package` once the archive
    /// drops it (a point release or security update renames it).
    pub series_prefix: &'static str,
    pub suffix: &'static str,
    /// Newer Debian kernels ship the image in `linux-binary-*` and the
    /// modules in `linux-modules-*` of the same name: both are unpacked.
    pub split: bool,
}

/// Debian's cloud flavour: small, KVM/virtio drivers as modules, kprobes, BTF.
const PACKAGE_SUFFIX: &str = "-cloud-amd64-unsigned";
const ARM64_SUFFIX: &str = "-cloud-arm64-unsigned";

/// The kernels of the matrix: Debian 11's 5.10 LTS (the oldest gostw
/// supports; its own suite, see `cargo xtask setup`), Debian 12's 6.1 LTS
/// (the distro default) and the 6.12 LTS it ships as an update, and the
/// newest kernel Debian builds for amd64 (Debian 13's backports); for arm64,
/// Debian 12's 6.1 and the newest build (Debian's arm64 packages, taken from
/// its archive once `dpkg --add-architecture arm64` is set).
pub const KERNELS: &[KernelSpec] = &[
    KernelSpec {
        name: "debian-5.10",
        arch: Arch::Amd64,
        package: "linux-image-5.10.0-32-cloud-amd64-unsigned",
        series_prefix: "linux-image-5.10.0-",
        suffix: PACKAGE_SUFFIX,
        split: false,
    },
    KernelSpec {
        name: "debian-6.1",
        arch: Arch::Amd64,
        package: "linux-image-6.1.0-50-cloud-amd64-unsigned",
        series_prefix: "linux-image-6.1.0-",
        suffix: PACKAGE_SUFFIX,
        split: false,
    },
    KernelSpec {
        name: "debian-6.12",
        arch: Arch::Amd64,
        package: "linux-image-6.12.115+deb12-cloud-amd64-unsigned",
        series_prefix: "linux-image-6.12.",
        suffix: PACKAGE_SUFFIX,
        split: false,
    },
    KernelSpec {
        name: "debian-7.3",
        arch: Arch::Amd64,
        package: "linux-binary-7.3.4+deb13-cloud-amd64",
        series_prefix: "linux-binary-7.",
        suffix: "-cloud-amd64",
        split: true,
    },
    KernelSpec {
        name: "debian-6.1",
        arch: Arch::Arm64,
        package: "linux-image-6.1.0-57-cloud-arm64-unsigned",
        series_prefix: "linux-image-6.1.0-",
        suffix: ARM64_SUFFIX,
        split: false,
    },
    KernelSpec {
        name: "debian-7.3",
        arch: Arch::Arm64,
        package: "linux-binary-7.3.4+deb13-cloud-arm64",
        series_prefix: "linux-binary-7.",
        suffix: "-cloud-arm64",
        split: true,
    },
];

/// `linux-binary-X` -> `linux-modules-X`.
fn modules_package(binary: &str) -> String {
    binary.replacen("linux-binary-", "linux-modules-", 1)
}

/// The kernel `name` names for `arch`, or an error listing the known names.
pub fn spec(name: &str, arch: Arch) -> anyhow::Result<KernelSpec> {
    KERNELS
        .iter()
        .copied()
        .find(|k| k.name == name && k.arch == arch)
        .with_context(|| {
            let names: Vec<_> = KERNELS
                .iter()
                .filter(|k| k.arch == arch)
                .map(|k| k.name)
                .collect();
            format!(
                "unknown kernel {name:?} for {}; known: {}",
                arch.name(),
                names.join(", ")
            )
        })
}

impl KernelSpec {
    /// `package` as apt names it here: qualified with the architecture
    /// where it is not the host's.
    fn apt_name(&self, package: &str) -> String {
        match self.arch {
            Arch::Amd64 => package.to_owned(),
            arch => format!("{package}:{}", arch.name()),
        }
    }
}

/// An unpacked kernel package.
pub struct Kernel {
    /// The package it came from.
    pub package: String,
    /// `uname -r` of the kernel, e.g. "6.1.0-50-cloud-amd64".
    pub release: String,
    /// The compressed kernel image QEMU boots.
    pub vmlinuz: PathBuf,
    /// `lib/modules/<release>` of the package, with a `modules.dep`.
    pub modules: PathBuf,
}

/// The unpacked kernel of `spec`, downloading it on first use.
pub fn fetch(spec: KernelSpec) -> anyhow::Result<Kernel> {
    step(&format!("kernel {}", spec.name));
    let root = cache_dir().join("vm/kernels");
    // A package unpacked before is used even after the archive moved on, so
    // runs stay reproducible and offline once the cache is warm.
    if let Some(k) = unpacked(&root.join(spec.package), spec.package)? {
        eprintln!("cached: {}", k.vmlinuz.display());
        return Ok(k);
    }
    let package = available_package(spec)?;
    let dir = root.join(&package);
    if let Some(k) = unpacked(&dir, &package)? {
        eprintln!("cached: {}", k.vmlinuz.display());
        return Ok(k);
    }
    // Scratch names per process and package: other worktrees, and guests
    // of this run booting side by side, may fetch at the same time.
    let download = root.join(format!("download-{}-{package}", std::process::id()));
    let _ = fs::remove_dir_all(&download);
    fs::create_dir_all(&download)?;
    let mut packages = vec![spec.apt_name(&package)];
    if spec.split {
        packages.push(spec.apt_name(&modules_package(&package)));
    }
    exec(
        Command::new("apt-get")
            .args(["download", "-q"])
            .args(&packages)
            .current_dir(&download),
    )
    .with_context(|| {
        format!(
            "downloading {} (Debian's archive must be reachable)",
            packages.join(" ")
        )
    })?;
    let debs: Vec<PathBuf> = fs::read_dir(&download)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    if debs.len() != packages.len() {
        bail!(
            "apt-get download left {} .deb file(s) in {} for {} package(s)",
            debs.len(),
            download.display(),
            packages.len()
        );
    }
    let tmp = root.join(format!("{package}.partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    for deb in &debs {
        exec(Command::new("dpkg").arg("-x").arg(deb).arg(&tmp))?;
    }
    // Newer packages (Debian 13's) ship merged-/usr paths: the modules and
    // the kernel image under usr/lib/modules/<release>.
    if !tmp.join("lib").exists() && tmp.join("usr/lib/modules").is_dir() {
        std::os::unix::fs::symlink("usr/lib", tmp.join("lib"))?;
    }
    let release = release_of(&tmp)?;
    // The package ships no modules.dep (its postinst runs depmod): make one.
    exec(Command::new("depmod").arg("-b").arg(&tmp).arg(&release))
        .context("depmod (package kmod) is needed to resolve module dependencies")?;
    fs::write(tmp.join("gostw-release"), &release)?;
    let _ = fs::remove_dir_all(&download);
    if unpacked(&dir, &package)?.is_some() {
        // Another run finished first.
        let _ = fs::remove_dir_all(&tmp);
    } else {
        let _ = fs::remove_dir_all(&dir);
        fs::rename(&tmp, &dir)?;
    }
    unpacked(&dir, &package)?.context("unpacked kernel is incomplete")
}

/// The kernel unpacked in `dir`, if a previous run finished unpacking it.
fn unpacked(dir: &Path, package: &str) -> anyhow::Result<Option<Kernel>> {
    let Ok(release) = fs::read_to_string(dir.join("gostw-release")) else {
        return Ok(None);
    };
    let release = release.trim().to_owned();
    let modules = dir.join(format!("lib/modules/{release}"));
    // In boot/, or beside the modules in merged-/usr packages.
    let vmlinuz = [
        dir.join(format!("boot/vmlinuz-{release}")),
        modules.join("vmlinuz"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .unwrap_or_default();
    if !vmlinuz.is_file() || !modules.join("modules.dep").is_file() {
        return Ok(None);
    }
    Ok(Some(Kernel {
        package: package.to_owned(),
        release,
        vmlinuz,
        modules,
    }))
}

/// The one `lib/modules/<release>` directory of an unpacked package.
fn release_of(dir: &Path) -> anyhow::Result<String> {
    let mut releases = fs::read_dir(dir.join("lib/modules"))
        .with_context(|| format!("{} holds no lib/modules", dir.display()))?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok());
    let release = releases
        .next()
        .context("no kernel release in lib/modules")?;
    if releases.next().is_some() {
        bail!("more than one kernel release in {}", dir.display());
    }
    Ok(release)
}

/// `spec.package` if the archive serves it, else the newest package of the
/// same series that it does serve.
fn available_package(spec: KernelSpec) -> anyhow::Result<String> {
    if candidate(&spec.apt_name(spec.package))?.is_none() {
        // The suite may not be configured yet, or the package lists are
        // missing or stale (a fresh machine).
        if !crate::setup::kernel_suites()? {
            exec(Command::new("apt-get").args(["update", "-q"]))?;
        }
    }
    if candidate(&spec.apt_name(spec.package))?.is_some() {
        return Ok(spec.package.to_owned());
    }
    let names = output(Command::new("apt-cache").args(["pkgnames", spec.series_prefix]))?;
    let mut best: Option<(String, String)> = None;
    for name in names
        .lines()
        .filter(|n| n.ends_with(spec.suffix) && !n.contains("-dbg"))
    {
        let Some(version) = candidate(&spec.apt_name(name))? else {
            continue;
        };
        let newer = match &best {
            None => true,
            Some((_, v)) => Command::new("dpkg")
                .args(["--compare-versions", &version, "gt", v])
                .status()
                .is_ok_and(|s| s.success()),
        };
        if newer {
            best = Some((name.to_owned(), version));
        }
    }
    let (name, version) = best.with_context(|| {
        format!(
            "kernel {}: neither {} nor any {}*{} is available from apt \
             (check /etc/apt/sources.list*, then update KERNELS in xtask/src/vm/kernel.rs)",
            spec.name, spec.package, spec.series_prefix, spec.suffix
        )
    })?;
    eprintln!(
        "note: {} is no longer in the archive; using {name} {version} \
         (pin it in xtask/src/vm/kernel.rs)",
        spec.package
    );
    Ok(name)
}

/// The version apt would install of `package`, if any.
fn candidate(package: &str) -> anyhow::Result<Option<String>> {
    let out = output(Command::new("apt-cache").args(["policy", package]))?;
    Ok(out
        .lines()
        .find_map(|l| l.trim().strip_prefix("Candidate: "))
        .filter(|v| *v != "(none)")
        .map(str::to_owned))
}

impl Kernel {
    /// Module files (relative to `self.modules`) to load, in load order, so
    /// that `wanted` (module names such as "virtio_blk") and all their
    /// dependencies are loaded, each once. Modules built into the kernel are
    /// skipped; a module the kernel has in neither form is an error.
    pub fn modules_in_load_order(&self, wanted: &[&str]) -> anyhow::Result<Vec<String>> {
        let dep = fs::read_to_string(self.modules.join("modules.dep"))?;
        // Debian 13's split packages ship no modules.builtin: there a module
        // missing from modules.dep is taken as built in (the guest reports
        // its swap and kprobes either way).
        let builtin = fs::read_to_string(self.modules.join("modules.builtin")).ok();
        let deps: HashMap<&str, Vec<&str>> = dep
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(m, d)| (m, d.split_whitespace().collect()))
            .collect();
        let path_of =
            |name: &str| -> Option<&str> { deps.keys().copied().find(|p| module_name(p) == name) };
        let mut order = Vec::new();
        for name in wanted {
            match path_of(name) {
                Some(path) => visit(path, &deps, &mut order),
                None if builtin
                    .as_deref()
                    .is_none_or(|b| b.lines().any(|p| module_name(p) == *name)) => {}
                None => bail!("kernel {} has no module {name}", self.release),
            }
        }
        Ok(order)
    }
}

/// Depth first: dependencies before the module that needs them.
fn visit(path: &str, deps: &HashMap<&str, Vec<&str>>, order: &mut Vec<String>) {
    if order.iter().any(|p| p == path) {
        return;
    }
    for d in deps.get(path).into_iter().flatten() {
        visit(d, deps, order);
    }
    order.push(path.to_owned());
}

/// "kernel/drivers/block/virtio_blk.ko(.xz)" -> "virtio_blk" (modprobe
/// treats '-' and '_' alike; so do we).
fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependencies_load_first_and_once() {
        let dir = std::env::temp_dir().join(format!("gostw-vm-deps-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("modules.dep"),
            "kernel/v/virtio_ring.ko:\n\
             kernel/v/virtio.ko: kernel/v/virtio_ring.ko\n\
             kernel/v/virtio_pci.ko: kernel/v/virtio_ring.ko kernel/v/virtio.ko\n\
             kernel/b/virtio_blk.ko: kernel/v/virtio_ring.ko kernel/v/virtio.ko\n",
        )
        .unwrap();
        fs::write(dir.join("modules.builtin"), "kernel/fs/ext4.ko\n").unwrap();
        let k = Kernel {
            package: "p".into(),
            release: "r".into(),
            vmlinuz: dir.join("vmlinuz"),
            modules: dir.clone(),
        };
        let order = k
            .modules_in_load_order(&["virtio_pci", "virtio_blk", "ext4"])
            .unwrap();
        assert_eq!(
            order,
            [
                "kernel/v/virtio_ring.ko",
                "kernel/v/virtio.ko",
                "kernel/v/virtio_pci.ko",
                "kernel/b/virtio_blk.ko"
            ]
        );
        assert!(k.modules_in_load_order(&["zram"]).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
