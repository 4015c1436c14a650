//! The two architectures gostw is built for, and what each means to the
//! tasks: Rust's target, Go's GOARCH, Debian's architecture, and the cross
//! tools this amd64 machine builds arm64 with (Debian's cross packages).

use std::process::Command;

/// A machine architecture, named as Go and Debian name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    Amd64,
    Arm64,
}

impl Arch {
    /// Go's GOARCH and Debian's architecture name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// The Rust target gostw is built for (glibc, linked statically).
    pub fn rust_target(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64-unknown-linux-gnu",
            Arch::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// The kernel's name (`uname -m`), used in artifact names.
    pub fn uname(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64",
            Arch::Arm64 => "aarch64",
        }
    }

    /// The binutils prefix of the tools that read this architecture's ELF
    /// files (`strip`, `objcopy`): the host's own for amd64.
    pub fn binutils_prefix(self) -> &'static str {
        match self {
            Arch::Amd64 => "",
            Arch::Arm64 => "aarch64-linux-gnu-",
        }
    }

    /// A command that runs `program`, built for this architecture, on this
    /// amd64 host: itself, or under QEMU's user-mode emulator (Debian's
    /// qemu-user) for arm64.
    pub fn command(self, program: &std::path::Path) -> Command {
        match self {
            Arch::Amd64 => Command::new(program),
            Arch::Arm64 => {
                let mut cmd = Command::new("qemu-aarch64");
                cmd.arg(program);
                cmd
            }
        }
    }

    /// `cargo build --target` for this architecture, statically linked: the
    /// target's own RUSTFLAGS (the eBPF build that tracer's build script
    /// runs, for another target, must not get crt-static) and, for arm64,
    /// Debian's cross linker. The eBPF programs follow the target: aya-build
    /// builds them for `CARGO_CFG_TARGET_ARCH` (tracer-ebpf's `regs.rs`).
    pub fn cargo_static(self, cmd: &mut Command) -> &mut Command {
        let var = self.rust_target().to_uppercase().replace('-', "_");
        cmd.args(["--target", self.rust_target()]).env(
            format!("CARGO_TARGET_{var}_RUSTFLAGS"),
            "-C target-feature=+crt-static",
        );
        if self == Arch::Arm64 {
            cmd.env(
                format!("CARGO_TARGET_{var}_LINKER"),
                "aarch64-linux-gnu-gcc",
            );
        }
        cmd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arm64_builds_with_the_cross_linker_and_static() {
        let mut cmd = Command::new("cargo");
        Arch::Arm64.cargo_static(&mut cmd);
        let envs: Vec<(String, String)> = cmd
            .get_envs()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.unwrap().to_string_lossy().into_owned(),
                )
            })
            .collect();
        assert!(envs.contains(&(
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER".into(),
            "aarch64-linux-gnu-gcc".into()
        )));
        assert!(envs.contains(&(
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS".into(),
            "-C target-feature=+crt-static".into()
        )));
        let mut cmd = Command::new("cargo");
        Arch::Amd64.cargo_static(&mut cmd);
        assert_eq!(cmd.get_envs().count(), 1);
    }
}
