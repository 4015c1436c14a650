//! The Go version recorded in `.go.buildinfo`.

use object::ObjectSection as _;

/// A Go release, e.g. 1.22.10.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct GoVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl GoVersion {
    /// Parse "go1.22.10" (also "go1.21rc2", "go1.23.0 X:..."): the numeric prefix.
    pub fn parse(s: &str) -> Option<GoVersion> {
        let s = s.strip_prefix("go")?;
        let mut parts = s
            .split(|c: char| !c.is_ascii_digit())
            .filter(|p| !p.is_empty());
        Some(GoVersion {
            major: parts.next()?.parse().ok()?,
            minor: parts.next()?.parse().ok()?,
            patch: parts.next().and_then(|p| p.parse().ok()).unwrap_or(0),
        })
    }

    /// The compact form the kernel side uses: 1.22 -> 122.
    pub fn code(self) -> u32 {
        self.major * 100 + self.minor
    }
}

impl std::fmt::Display for GoVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "go{}.{}.{}", self.major, self.minor, self.patch)
    }
}

const MAGIC: &[u8] = b"\xff Go buildinf:";

/// The version string of a Go 1.18+ binary (inline strings, flag 0x02).
pub fn go_version<'a>(file: &impl object::Object<'a>) -> Option<GoVersion> {
    let data = file.section_by_name(".go.buildinfo")?.data().ok()?;
    if !data.starts_with(MAGIC) || data.len() < 32 {
        return None;
    }
    let flags = data[15];
    if flags & 0x02 == 0 {
        // Pre-1.18 layout (pointers to strings): not supported by gostw.
        return None;
    }
    let (len, n) = read_uvarint(&data[32..])?;
    let start = 32 + n;
    let bytes = data.get(start..start.checked_add(usize::try_from(len).ok()?)?)?;
    GoVersion::parse(std::str::from_utf8(bytes).ok()?)
}

/// Go's `binary.Uvarint`: value and bytes consumed.
fn read_uvarint(buf: &[u8]) -> Option<(u64, usize)> {
    let mut x = 0u64;
    for (i, &b) in buf.iter().enumerate().take(10) {
        x |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Some((x, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_release_and_prerelease_versions() {
        assert_eq!(
            GoVersion::parse("go1.22.10"),
            Some(GoVersion {
                major: 1,
                minor: 22,
                patch: 10
            })
        );
        assert_eq!(
            GoVersion::parse("go1.21rc2"),
            Some(GoVersion {
                major: 1,
                minor: 21,
                patch: 2
            })
        );
        assert_eq!(
            GoVersion::parse("go1.19"),
            Some(GoVersion {
                major: 1,
                minor: 19,
                patch: 0
            })
        );
        assert_eq!(GoVersion::parse("devel"), None);
    }

    #[test]
    fn uvarint_matches_go() {
        assert_eq!(read_uvarint(&[0x09]), Some((9, 1)));
        assert_eq!(read_uvarint(&[0xac, 0x02]), Some((300, 2)));
        assert_eq!(read_uvarint(&[0x80]), None);
    }
}
