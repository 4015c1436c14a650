//! `cargo xtask book`: (re)write the book's generated reference pages
//! (`docs/reference/cli.md`, from gostw's clap definitions) and build the
//! book with MkDocs. The tracer's unit tests (`reference::tests`) render the
//! same pages and fail when a checked-in one differs, or when a metric or a
//! JSON field is missing from its reference page.

use std::{path::PathBuf, process::Command};

use anyhow::bail;

use crate::cmd::{cache_dir, exec, step, succeeds, workspace_root};

/// MkDocs, pinned: `mkdocs build --strict` fails on a broken link.
pub const MKDOCS_VERSION: &str = "1.6.1";

/// The environment variable that has the reference tests write the pages
/// they render instead of comparing them.
const WRITE_ENV: &str = "GOSTW_WRITE_BOOK";

#[derive(clap::Args)]
pub struct Options {
    /// Only rewrite the generated pages; do not build the book.
    #[arg(long)]
    pub no_build: bool,
}

pub fn run(opts: &Options) -> anyhow::Result<()> {
    step("the book's generated reference pages");
    exec(
        Command::new("cargo")
            .current_dir(workspace_root())
            .args(["test", "--package", "tracer", "--lib", "reference::"])
            .env(WRITE_ENV, "1"),
    )?;
    if opts.no_build {
        return Ok(());
    }
    install_mkdocs()?;
    build(&workspace_root().join("target/book"))
}

/// Where setup installs MkDocs (a `pip --target` folder).
fn mkdocs_dir() -> PathBuf {
    cache_dir().join("mkdocs").join(MKDOCS_VERSION)
}

/// `python3 -m mkdocs` from the installed folder.
fn mkdocs() -> Command {
    let mut c = Command::new("python3");
    c.current_dir(workspace_root())
        .args(["-m", "mkdocs"])
        .env("PYTHONPATH", mkdocs_dir());
    c
}

/// MkDocs, from the Python package index (idempotent).
pub fn install_mkdocs() -> anyhow::Result<()> {
    step(&format!("MkDocs {MKDOCS_VERSION} (the book)"));
    let installed = || {
        let out = mkdocs().arg("--version").output();
        matches!(out, Ok(o) if o.status.success()
            && String::from_utf8_lossy(&o.stdout).contains(&format!("version {MKDOCS_VERSION}")))
    };
    if installed() {
        eprintln!("already installed in {}", mkdocs_dir().display());
        return Ok(());
    }
    crate::cmd::pip_install(&format!("mkdocs=={MKDOCS_VERSION}"), &mkdocs_dir())?;
    if !installed() {
        bail!("mkdocs=={MKDOCS_VERSION} installed but `python3 -m mkdocs` does not run");
    }
    Ok(())
}

/// `mkdocs build --strict` into `site`: fails on a broken link or a page
/// missing from the nav.
pub fn build(site: &std::path::Path) -> anyhow::Result<()> {
    step(&format!("mkdocs build --strict (into {})", site.display()));
    if !succeeds(mkdocs().arg("--version")) {
        bail!("MkDocs is not installed: run `cargo xtask setup`");
    }
    exec(mkdocs().args(["build", "--strict", "--site-dir"]).arg(site))
}
