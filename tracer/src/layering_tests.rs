//! The library's layers, held against its code: every top-level module of
//! `tracer/src` has a layer, and its code (tests aside) names only modules
//! of lower layers. Modules of one layer stay independent of each other.
//! Test code may reach higher (the tracker's tests read its failures
//! through the metrics sink); the code it tests may not.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

/// Lowest first.
const LAYERS: &[&[&str]] = &[
    &["units", "privilege", "procfs", "bpf_stats", "clock"],
    &["binary"],
    &["image"],
    &["stackgrowth"],
    &["memory"],
    // The records every stage shares (it carries the readings of the
    // readers below it).
    &["model"],
    &["targets", "formats"],
    &["kernel"],
    &["engine", "check", "inspect"],
    &["sink"],
    &["agent"],
    &["cli"],
    &["reference"],
    &["main"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The code of a file without comments and `#[cfg(test)]` items.
fn production_code(text: &str) -> String {
    let no_comments: String = text
        .lines()
        .map(|l| match l.find("//") {
            // `//` inside a string ("http://") is rare enough in this crate's
            // import-bearing lines; a cut string only hides names.
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = String::new();
    let mut rest = no_comments.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        // The item the attribute applies to ends at its `;` or its block.
        let semi = after.find(';').unwrap_or(after.len());
        let brace = after.find('{').unwrap_or(after.len());
        rest = if semi < brace {
            &after[(semi + 1).min(after.len())..]
        } else {
            match closing(after, brace) {
                Some(end) => &after[end + 1..],
                None => "",
            }
        };
    }
    out.push_str(rest);
    out
}

/// The index of the `}` closing the `{` at `open`.
fn closing(s: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in s[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

/// The crate's top-level modules a piece of code names (`crate::x`,
/// `tracer::x`, and the items of `crate::{x, y::z}`).
fn named_modules(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for root in ["crate::", "tracer::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(root) {
            let at = from + i;
            from = at + root.len();
            // `tracer_common::`, `my_crate::`: not this crate.
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let tail = &code[from..];
            if tail.starts_with('{') {
                let Some(end) = closing(tail, 0) else {
                    continue;
                };
                for item in top_level_items(&tail[1..end]) {
                    found.extend(ident(item));
                }
            } else {
                found.extend(ident(tail));
            }
        }
    }
    found
}

/// `a::b, c::{d, e}, f` -> ["a::b", "c::{d, e}", "f"].
fn top_level_items(s: &str) -> Vec<&str> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(s[start..].trim());
    items.into_iter().filter(|i| !i.is_empty()).collect()
}

/// The module an item starts with; none for a macro (`crate::say!`).
fn ident(s: &str) -> Option<String> {
    let s = s.trim_start();
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    let name = &s[..end];
    (!name.is_empty() && !s[end..].starts_with('!') && name != "self").then(|| name.to_owned())
}

/// Every import of `module`'s code that breaks the layering.
fn violations(module: &str, code: &str) -> Vec<String> {
    let Some(own) = layer_of(module) else {
        return vec![format!("{module} has no layer in LAYERS")];
    };
    named_modules(code)
        .into_iter()
        .filter(|m| m != module)
        .filter_map(|m| match layer_of(&m) {
            Some(l) if l < own => None,
            Some(l) if l == own => Some(format!("{module} uses {m}, of its own layer")),
            Some(_) => Some(format!("{module} uses {m}, a layer above it")),
            None => Some(format!("{module} uses {m}, which has no layer in LAYERS")),
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every non-test source file of `tracer/src` as (top-level module, path
/// under src, code without comments and tests).
fn modules_code() -> Vec<(String, PathBuf, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .iter()
        .filter_map(|f| {
            let rel = f.strip_prefix(&src).unwrap().to_owned();
            let name = rel.file_name().unwrap().to_string_lossy();
            // Test files (`#[path = "x_tests.rs"]`, `tests.rs`) are test code.
            if name == "lib.rs" || name == "tests.rs" || name.ends_with("_tests.rs") {
                return None;
            }
            let first = rel.components().next()?.as_os_str().to_string_lossy();
            let module = first.trim_end_matches(".rs").to_owned();
            let code = production_code(&std::fs::read_to_string(f).unwrap());
            Some((module, rel, code))
        })
        .collect()
}

#[test]
fn no_module_imports_from_a_layer_above_it() {
    let mut broken = Vec::new();
    let mut checked = BTreeSet::new();
    for (module, rel, code) in modules_code() {
        broken.extend(
            violations(&module, &code)
                .into_iter()
                .map(|v| format!("{}: {v}", rel.display())),
        );
        checked.insert(module);
    }
    assert!(checked.len() >= 20, "found only {checked:?}");
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// What reading `/proc` looks like in this crate's code: a path, a
/// process's image or exposure read by pid, the `/proc` readers.
fn reads_proc(code: &str) -> bool {
    // `resolve`: a process image's load bias read from its memory map.
    [
        "\"/proc",
        "of_pid(",
        "procfs::",
        "Exposure::read",
        ".resolve(",
    ]
    .iter()
    .any(|p| code.contains(p))
}

/// Sinks are functions of the observed stream: the engine symbolizes and
/// reads what they need, so a recorded stream gives the same output later.
#[test]
fn no_sink_reads_proc() {
    let readers: Vec<String> = modules_code()
        .into_iter()
        .filter(|(m, _, code)| m == "sink" && reads_proc(code))
        .map(|(_, rel, _)| rel.display().to_string())
        .collect();
    assert!(readers.is_empty(), "sink files reading /proc: {readers:?}");
    // The check itself.
    assert!(reads_proc("std::fs::read(\"/proc/self/maps\")"));
    assert!(reads_proc("let image = ProcessImage::of_pid(pid)?;"));
    assert!(reads_proc(
        "let _ = info.image.as_ref().map(|i| i.resolve());"
    ));
    assert!(!reads_proc(&production_code("// \"/proc\"\nlet x = 1;")));
}

/// What symbolizing with a process's image looks like: its frame, stack
/// and frame-size look-ups.
fn symbolizes(code: &str) -> bool {
    [
        "frames_of_return(",
        "max_frame_of_return(",
        "return_stack(",
        "image.stack(",
        "image.frames(",
        "Symbolizer for ProcessImage",
    ]
    .iter()
    .any(|p| code.contains(p))
}

/// The engine names every address once (`engine::code`, fault stacks in
/// the stream): a sink looks names up in the stream and never in an image.
#[test]
fn no_sink_symbolizes() {
    let symbolizers: Vec<String> = modules_code()
        .into_iter()
        .filter(|(m, _, code)| (m == "sink" || m == "stackgrowth") && symbolizes(code))
        .map(|(_, rel, _)| rel.display().to_string())
        .collect();
    assert!(
        symbolizers.is_empty(),
        "sink files symbolizing with an image: {symbolizers:?}"
    );
    // The check itself.
    assert!(symbolizes(
        "let f = image.and_then(|i| i.frames_of_return(pc).into_iter().next());"
    ));
    assert!(symbolizes(
        "w.agg.summary(&**image, n)) // impl Symbolizer for ProcessImage"
    ));
    assert!(!symbolizes("let f = code.return_frames(pc);"));
}

/// The check itself, on code that breaks the rule in each way it can.
#[test]
fn an_import_from_above_fails_the_check() {
    let up = "use crate::{\n    image::Frame,\n    sink::Sink,\n};";
    assert_eq!(
        violations("model", up),
        ["model uses sink, a layer above it"]
    );
    assert_eq!(
        violations("targets", "let x = crate::formats::pprof();"),
        ["targets uses formats, of its own layer"]
    );
    assert_eq!(
        violations("kernel", "tracer::nowhere::f()"),
        ["kernel uses nowhere, which has no layer in LAYERS"]
    );
    assert_eq!(violations("newmod", ""), ["newmod has no layer in LAYERS"]);
    // What the check must not count: lower layers, other crates, macros,
    // comments and test code.
    let fine = "use crate::{binary::X, image::{a, b}};\nuse tracer_common::pause::P;\n\
                crate::say!(\"x\");\n// crate::agent::y\n\
                #[cfg(test)]\nmod tests {\n    use crate::agent::Z;\n}\n\
                #[cfg(test)]\nuse crate::cli::W;\n";
    assert_eq!(
        violations("model", &production_code(fine)),
        Vec::<String>::new()
    );
}

/// Whether `code` defines or derives command-line parsing.
fn defines_clap(code: &str) -> bool {
    code.contains("clap::") || code.contains("ValueEnum") || code.contains("#[arg(")
}

/// Every clap definition is in `cli/`: the library's types know nothing of
/// the command line (`reference` reads the definitions, `main` parses).
#[test]
fn clap_lives_in_cli() {
    let outside: Vec<String> = modules_code()
        .into_iter()
        .filter(|(m, _, code)| {
            !matches!(m.as_str(), "cli" | "reference" | "main") && defines_clap(code)
        })
        .map(|(_, rel, _)| rel.display().to_string())
        .collect();
    assert!(outside.is_empty(), "clap outside cli/: {outside:?}");
    // The check itself.
    assert!(defines_clap(
        "#[derive(Clone, clap::ValueEnum)]\nenum M { A }"
    ));
    assert!(defines_clap(
        "#[derive(clap::Args)]\nstruct A {\n    #[arg(long)]\n    x: u8,\n}"
    ));
    assert!(!defines_clap(
        "#[derive(Clone, serde::Serialize)]\nenum M { A }"
    ));
}
