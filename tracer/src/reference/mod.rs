//! The book's reference pages that cannot drift from the code: the CLI page
//! is rendered from the clap definitions (`cargo xtask book` writes it), and
//! the unit tests check that every metric the agent registers and every
//! field of the JSON records is named on its page. `figures` (tests only)
//! checks that every measured figure in the book names the test or bench
//! that prints it.

use std::{collections::BTreeSet, fmt::Write as _};

use clap::CommandFactory as _;

use crate::cli::command::Cli;

/// `docs/reference/cli.md`: each command's `--help`, as gostw prints it.
pub fn cli_markdown() -> String {
    let mut cmd = Cli::command();
    cmd.build();
    let mut out = String::from(
        "# Command line\n\n\
         <!-- Generated from gostw's clap definitions by `cargo xtask book`; \
         do not edit (a unit test fails when this page differs). -->\n\n\
         Every command's `--help`, as gostw prints it. The user guide explains \
         what each does.\n\n",
    );
    let _ = write!(
        out,
        "## gostw\n\n```text\n{}\n```\n",
        cmd.render_long_help().to_string().trim_end()
    );
    for sub in cmd.get_subcommands_mut() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        let name = sub.get_name().to_owned();
        let help = sub.render_long_help().to_string();
        let _ = write!(
            out,
            "\n## gostw {name}\n\n```text\n{}\n```\n",
            help.trim_end()
        );
    }
    out
}

/// The words a reference page names in code spans: every run of letters,
/// digits and `_` inside backticks (so `` `{function, via}` `` names both).
pub fn named_words(doc: &str) -> BTreeSet<String> {
    let mut words = BTreeSet::new();
    for (i, span) in doc.split('`').enumerate() {
        if i % 2 == 1 {
            words.extend(
                span.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .filter(|w| !w.is_empty())
                    .map(str::to_owned),
            );
        }
    }
    words
}

/// The metric families a text exposition declares (`# TYPE name type`),
/// as a scraper sees them: counters with their `_total`, info with `_info`.
pub fn metric_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (name, kind) = (it.next()?, it.next()?);
            Some(match kind {
                "counter" if !name.ends_with("_total") => format!("{name}_total"),
                "info" => format!("{name}_info"),
                _ => name.to_owned(),
            })
        })
        .collect()
}

/// Every object key in `v`, recursively (through arrays too).
pub fn json_keys(v: &serde_json::Value, keys: &mut BTreeSet<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                keys.insert(k.clone());
                json_keys(v, keys);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| json_keys(v, keys)),
        _ => {}
    }
}

/// The names a page does not mention, sorted.
pub fn missing<'a>(doc: &str, names: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    let words = named_words(doc);
    names
        .into_iter()
        .filter(|n| !words.contains(*n))
        .cloned()
        .collect()
}

#[cfg(test)]
mod figures;
#[cfg(test)]
mod help_tests;
#[cfg(test)]
mod tests;
