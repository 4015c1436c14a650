//! Every measured figure in the book names its source.
//!
//! The rule, as the tests apply it:
//!
//! - A *figure* is a number followed by a unit of time (`ns`, `us`, `µs`,
//!   `ms`, `s`, `seconds`, `min`, `minutes`, `hours`), of size (`B`, `KB`,
//!   `kB`, `KiB`, `MB`, `MiB`, `GB`, `GiB`) or a percent, in prose: fenced
//!   code blocks, inline code spans and HTML comments hold none.
//! - A *block* is a paragraph, a list item (each item on its own, nested ones
//!   too), a table row or a heading. A table row is covered by the sources
//!   (or the settings mark) of the block just before its table, the
//!   table's caption, as well as by its own.
//! - A block that holds a figure must carry at least one *source*, and every
//!   source a block carries must resolve in the tree:
//!   - a kernel test, `` `module::test_name` ``: `tracer/tests/kernel/module.rs`
//!     exists and has a `#[test] fn test_name` (a source path that would
//!     read as one, such as `formats::debug_pprof`, is written with its
//!     crate, `tracer::formats::debug_pprof`);
//!   - a unit test, `` `path::tests::test_name` `` (a segment before the name
//!     ends in `tests`): a `#[test] fn test_name` in `tracer/src` or
//!     `xtask/src`;
//!   - a bench, `cargo xtask bench NAME`: `NAME` is one of the names
//!     `xtask/src/bench.rs` runs;
//!   - the tasks that measure and print, `cargo xtask soak-agent` and
//!     `cargo xtask fuzz`, and the step times of `` `cargo xtask test`'s
//!     summary ``: a task of `xtask/src/main.rs`;
//!   - history, `history, commit HASH` (or `history, commits HASH, HASH
//!     and HASH`), for a figure kept although no code in the tree prints it
//!     any more, measured at that commit: git finds each commit (where git
//!     or the repository is unavailable, the form alone is checked).
//! - A block whose figures are settings, not measurements (a flag's default,
//!   a workload's parameters, a constant of the code or of Go, an output's
//!   wording shown as an example), says so with `<!-- settings: WHAT -->`
//!   (WHAT not empty, hidden in the rendered book); it needs no source. A
//!   block that mixes settings with measured figures names a source instead.
//! - Pages exempt as a whole are in [`EXEMPT`] (generated settings only);
//!   pages not yet brought under the check are in [`NOT_YET_CHECKED`], each
//!   with why.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::LazyLock,
};

use regex::Regex;

/// Pages whose figures are all settings, by construction.
pub const EXEMPT: &[(&str, &str)] = &[(
    "docs/reference/cli.md",
    "generated from clap: every figure is a flag's default, in code blocks",
)];

/// Pages still to be brought under the check: remove a page from here once
/// its figures name their sources.
pub const NOT_YET_CHECKED: &[(&str, &str)] = &[];

static FIGURE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?:^|[^\w.])\d+(?:[.,]\d+)*\s?(ns|us|µs|ms|s|seconds?|min|minutes?|hours?|B|KB|kB|KiB|MB|MiB|GB|GiB|%)(?:[^\w]|$)",
    )
    .unwrap()
});
static CODE_SPAN: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"`[^`]*`").unwrap());
static COMMENT: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"<!--.*?-->").unwrap());
static TEST_PATH: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"`((?:[a-z_][a-z0-9_]*::)+)([a-z_][a-z0-9_]*)`").unwrap());
static BENCH: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"cargo xtask bench ([a-z][a-z0-9-]*)").unwrap());
static TASK: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"cargo xtask (soak-agent|fuzz)\b|`cargo xtask (test)`'s summary").unwrap()
});
static HISTORY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\bhistory, commits? ([0-9a-f]{7,40}(?:(?:, | and )[0-9a-f]{7,40})*)\b").unwrap()
});
static SETTINGS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"<!-- settings: *(\S[^>]*?) *-->").unwrap());

/// The page's blocks, with the line each begins on.
pub fn blocks(page: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut cur: Option<(usize, String)> = None;
    let mut fence = false;
    for (i, line) in page.lines().enumerate() {
        let s = line.trim();
        let starts_fence = s.starts_with("```") || s.starts_with("~~~");
        let item = s.starts_with("- ")
            || s.starts_with("* ")
            || s.split_once(". ")
                .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        let alone = s.starts_with('|') || s.starts_with('#');
        if fence || starts_fence || s.is_empty() || item || alone {
            out.extend(cur.take());
        }
        if starts_fence {
            fence = !fence;
            continue;
        }
        if fence || s.is_empty() {
            continue;
        }
        match &mut cur {
            Some((_, text)) => {
                text.push(' ');
                text.push_str(s);
            }
            None => cur = Some((i + 1, s.to_owned())),
        }
        if alone {
            out.extend(cur.take());
        }
    }
    out.extend(cur);
    out
}

/// The figures of a block, as written (code spans and comments left out).
pub fn figures(block: &str) -> Vec<String> {
    let prose = CODE_SPAN.replace_all(block, " ");
    let prose = COMMENT.replace_all(&prose, " ");
    FIGURE
        .captures_iter(&prose)
        .map(|c| {
            c[0].trim_matches(|c: char| !c.is_alphanumeric() && c != '%')
                .to_owned()
        })
        .collect()
}

/// Where sources resolve: the workspace's files, and git for history.
pub struct Tree {
    root: PathBuf,
}

impl Tree {
    pub fn workspace() -> Self {
        Self::at(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."))
    }

    /// A tree rooted elsewhere (the tests' copy with a bench removed).
    pub fn at(root: PathBuf) -> Self {
        Self { root }
    }

    fn read(&self, path: impl AsRef<Path>) -> Option<String> {
        std::fs::read_to_string(self.root.join(path)).ok()
    }

    fn kernel_module(&self, module: &str) -> Option<String> {
        self.read(format!("tracer/tests/kernel/{module}.rs"))
    }

    /// `#[test] fn name` in any Rust file under `dir`.
    fn has_unit_test(&self, dir: &str, name: &str) -> bool {
        fn walk(dir: &Path, found: &mut dyn FnMut(&str) -> bool) -> bool {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return false;
            };
            entries.flatten().any(|e| {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, found)
                } else {
                    p.extension().is_some_and(|x| x == "rs")
                        && std::fs::read_to_string(&p).is_ok_and(|t| found(&t))
                }
            })
        }
        walk(&self.root.join(dir), &mut |text| is_test(text, name))
    }

    fn bench_exists(&self, name: &str) -> bool {
        self.read("xtask/src/bench.rs")
            .is_some_and(|t| t.contains(&format!("\"{name}\" =>")))
    }

    fn xtask_task_exists(&self, name: &str) -> bool {
        let camel: String = name
            .split('-')
            .map(|w| {
                let mut c = w.chars();
                c.next()
                    .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                    .unwrap_or_default()
            })
            .collect();
        self.read("xtask/src/main.rs")
            .is_some_and(|t| t.contains(&format!("    {camel}(")))
    }

    fn commit_exists(&self, hash: &str) -> bool {
        let out = Command::new("git")
            .arg("-C")
            .arg(&self.root)
            .args(["cat-file", "-e", &format!("{hash}^{{commit}}")])
            .output();
        match out {
            Ok(o) if o.status.success() => true,
            // git runs and the repository is there, the commit is not.
            Ok(_) if self.in_git() => false,
            _ => true,
        }
    }

    fn in_git(&self) -> bool {
        Command::new("git")
            .arg("-C")
            .arg(&self.root)
            .args(["rev-parse", "--git-dir"])
            .output()
            .is_ok_and(|o| o.status.success())
    }
}

/// `text` has `fn name(` with `#[test]` among the attributes above it. A
/// name ending in `_` is a test filter, as the VM's coverage table writes
/// them (libtest matches substrings): some test's name starts with it.
fn is_test(text: &str, name: &str) -> bool {
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let decl = if name.ends_with('_') {
        format!("fn {name}")
    } else {
        format!("fn {name}(")
    };
    lines.iter().enumerate().any(|(i, l)| {
        l.starts_with(&decl)
            && lines[..i]
                .iter()
                .rev()
                .take_while(|a| a.starts_with("#[") || a.starts_with("//"))
                .any(|a| *a == "#[test]")
    })
}

/// The sources a block names, each resolved (`Err`: why it does not).
pub fn sources(block: &str, tree: &Tree) -> Vec<Result<String, String>> {
    let mut found = Vec::new();
    for c in TEST_PATH.captures_iter(block) {
        let path = &c[1];
        let name = &c[2];
        let segments: Vec<&str> = path.trim_end_matches("::").split("::").collect();
        let marker = format!("{path}{name}");
        if segments.len() == 1 && tree.kernel_module(segments[0]).is_some() {
            let text = tree.kernel_module(segments[0]).unwrap_or_default();
            found.push(if is_test(&text, name) {
                Ok(marker)
            } else {
                Err(format!(
                    "`{marker}`: no #[test] fn {name} in tracer/tests/kernel/{}.rs",
                    segments[0]
                ))
            });
        } else if segments.iter().any(|s| s.ends_with("tests")) {
            found.push(
                if tree.has_unit_test("tracer/src", name) || tree.has_unit_test("xtask/src", name) {
                    Ok(marker)
                } else {
                    Err(format!(
                        "`{marker}`: no #[test] fn {name} in tracer/src or xtask/src"
                    ))
                },
            );
        }
    }
    for c in BENCH.captures_iter(block) {
        let name = &c[1];
        found.push(if tree.bench_exists(name) {
            Ok(format!("cargo xtask bench {name}"))
        } else {
            Err(format!(
                "`cargo xtask bench {name}`: no such bench in xtask/src/bench.rs"
            ))
        });
    }
    for c in TASK.captures_iter(block) {
        let name = c.get(1).or_else(|| c.get(2)).map_or("", |m| m.as_str());
        found.push(if tree.xtask_task_exists(name) {
            Ok(format!("cargo xtask {name}"))
        } else {
            Err(format!(
                "`cargo xtask {name}`: no such task in xtask/src/main.rs"
            ))
        });
    }
    for c in HISTORY.captures_iter(block) {
        for hash in c[1]
            .split([',', ' '])
            .filter(|h| !h.is_empty() && *h != "and")
        {
            found.push(if tree.commit_exists(hash) {
                Ok(format!("history {hash}"))
            } else {
                Err(format!("history, commit {hash}: git has no such commit"))
            });
        }
    }
    found
}

/// What is wrong with a page's figures, one line each (empty: nothing).
pub fn check(name: &str, page: &str, tree: &Tree) -> Vec<String> {
    let mut problems = Vec::new();
    // The block before the current table (its caption), and whether it
    // names a source or says its figures are settings.
    let mut caption = (false, false);
    for (line, block) in blocks(page) {
        let figures = figures(&block);
        let sources = sources(&block, tree);
        for s in &sources {
            if let Err(why) = s {
                problems.push(format!("{name}:{line}: {why}"));
            }
        }
        let sourced = sources.iter().any(Result::is_ok);
        let settings = SETTINGS.is_match(&CODE_SPAN.replace_all(&block, " "));
        let row = block.starts_with('|');
        let inherited = row && (caption.0 || caption.1);
        if !row {
            caption = (sourced, settings);
        }
        if figures.is_empty() || settings || inherited {
            continue;
        }
        if !sourced {
            problems.push(format!(
                "{name}:{line}: figures {figures:?} name no source (a test, \
                 `cargo xtask bench NAME`, `history, commit HASH`, or \
                 `<!-- settings: WHAT -->` for settings)"
            ));
        }
    }
    problems
}

/// The book's pages under the check: README.md and every page in docs/
/// but those exempt or not yet checked, as workspace-relative paths.
pub fn checked_pages(tree: &Tree) -> Vec<String> {
    fn walk(dir: &Path, rel: &str, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            let name = format!("{rel}/{}", e.file_name().to_string_lossy());
            if p.is_dir() {
                walk(&p, &name, out);
            } else if name.ends_with(".md") {
                out.push(name);
            }
        }
    }
    let mut pages = vec!["README.md".to_owned()];
    walk(&tree.root.join("docs"), "docs", &mut pages);
    pages.retain(|p| !EXEMPT.iter().chain(NOT_YET_CHECKED).any(|(e, _)| e == p));
    pages.sort();
    pages
}

/// The text of a workspace-relative page.
pub fn read_page(tree: &Tree, page: &str) -> String {
    tree.read(page).unwrap_or_default()
}
