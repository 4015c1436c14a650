//! The Go version of a binary that has no `.go.buildinfo` (some projects
//! strip it, `objcopy --remove-section .go.buildinfo`, to keep builds
//! reproducible): the runtime's own `runtime.buildVersion` string, which the
//! linker sets and which `runtime.Version()` returns.
//!
//! With a symbol table the variable is found by name. Without one it is
//! found through the runtime's code: `runtime.schedinit` checks
//! `buildVersion == ""` on every Go version (1.5-1.27: "this code just
//! serves to ensure runtime·buildVersion is kept in the resulting binary"),
//! so among the variables schedinit's instructions address is the string
//! header `{ptr, len}` of buildVersion. Each address schedinit refers to is
//! tried as a string header; only one whose bytes are a Go version string
//! counts, and only if it is the one such string and agrees with the
//! function table's format (1.16-1.17, 1.18-1.19, 1.20+). This method names
//! the variable exactly: a scan of the data for any `go1.N` string could
//! also find a program's own constants (a Go tool that embeds the version
//! it supports), and it works the same on PIE (pointers through their
//! relocations), externally linked and arm64 binaries.

use super::{GoVersion, PclnFormat, Pclntab, coderefs::data_refs, image::Image};

/// Where the Go version of a binary came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VersionSource {
    /// `.go.buildinfo` (what `go version` reads).
    Buildinfo,
    /// The `runtime.buildVersion` string, found by the symbol table.
    BuildVersionSymbol,
    /// The `runtime.buildVersion` string, found as the variable
    /// `runtime.schedinit`'s code checks (no symbol table).
    BuildVersionCode,
}

impl std::fmt::Display for VersionSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            VersionSource::Buildinfo => ".go.buildinfo",
            VersionSource::BuildVersionSymbol => "runtime.buildVersion (symbol table)",
            VersionSource::BuildVersionCode => {
                "runtime.buildVersion (the string runtime.schedinit checks)"
            }
        })
    }
}

const BUILD_VERSION: &str = "runtime.buildVersion";
const SCHEDINIT: &str = "runtime.schedinit";
/// Longer is not a version string ("go1.22.10 X:nocoverageredesign" is 30).
const MAX_LEN: u64 = 128;

/// The version in `runtime.buildVersion`, and how the variable was found.
pub(crate) fn from_build_version(
    image: &Image,
    pclntab: Option<&Pclntab>,
) -> Option<(String, VersionSource)> {
    let format = pclntab.map(|p| p.format);
    let fits = |v: &String| agrees_with(v, format);
    if let Some((addr, _)) = image.symbol(BUILD_VERSION)
        && let Some(v) = version_string_at(image, addr).filter(fits)
    {
        return Some((v, VersionSource::BuildVersionSymbol));
    }
    let pclntab = pclntab?;
    let (entry, end) = pclntab
        .lookup(SCHEDINIT)
        .into_iter()
        .max_by_key(|&(e, end)| end.saturating_sub(e))?;
    let code = image.bytes_at(entry, usize::try_from(end.checked_sub(entry)?).ok()?)?;
    let mut found: Vec<String> = data_refs(image.arch, entry, code)
        .into_iter()
        .filter_map(|r| version_string_at(image, r.target))
        .filter(fits)
        .collect();
    found.sort();
    found.dedup();
    match found.as_slice() {
        [one] => Some((one.clone(), VersionSource::BuildVersionCode)),
        // None, or more than one: no version gostw could stand behind.
        _ => None,
    }
}

/// The string whose header `{ptr, len}` is at `header`, if it is a Go
/// version string ("go1.22.10", "go1.21rc2", "devel go1.24-abcdef ...").
fn version_string_at(image: &Image, header: u64) -> Option<String> {
    let ptr = image.ptr_at(header)?;
    let len = image.u64_at(header.checked_add(8)?)?;
    if len == 0 || len > MAX_LEN {
        return None;
    }
    let bytes = image.bytes_at(ptr, usize::try_from(len).ok()?)?;
    let s = std::str::from_utf8(bytes).ok()?;
    let looks_like =
        (s.starts_with("go1.") || s.starts_with("devel go1.")) && !s.chars().any(char::is_control);
    (looks_like && GoVersion::parse(s).is_some()).then(|| s.to_owned())
}

/// Does version `v` fit a function table of `format` (if known)?
fn agrees_with(v: &str, format: Option<PclnFormat>) -> bool {
    let Some(version) = GoVersion::parse(v) else {
        return false;
    };
    let minor = version.minor;
    if version.major != 1 {
        return false;
    }
    match format {
        None => true,
        Some(PclnFormat::Go116) => (16..=17).contains(&minor),
        Some(PclnFormat::Go118) => (18..=19).contains(&minor),
        Some(PclnFormat::Go120) => minor >= 20,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_must_fit_the_function_table() {
        assert!(agrees_with("go1.19.8", Some(PclnFormat::Go118)));
        assert!(!agrees_with("go1.19.8", Some(PclnFormat::Go120)));
        assert!(agrees_with(
            "go1.27.3 X:nocoverageredesign",
            Some(PclnFormat::Go120)
        ));
        assert!(agrees_with("go1.17", Some(PclnFormat::Go116)));
        assert!(agrees_with("go1.22.1", None));
        assert!(!agrees_with("unknown", None));
    }
}
