//! The Go version recorded in `.go.buildinfo` (without it, see `buildversion`).

use super::image::Image;

/// A Go release, e.g. 1.22.10.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct GoVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl GoVersion {
    /// Parse "go1.22.10" (also "go1.21rc2", "go1.23.0 X:...", "devel
    /// go1.24-abcdef ..."): the numeric prefix.
    pub fn parse(s: &str) -> Option<GoVersion> {
        let s = s.strip_prefix("devel ").unwrap_or(s);
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

/// The version string recorded by the Go linker, e.g. "go1.22.10".
///
/// Go 1.18+ stores it inline (flag 0x02: a varint length and the bytes at
/// offset 32); 1.13-1.17 store a pointer to the `runtime.buildVersion`
/// string header at offset 16.
pub(crate) fn version_string(image: &Image) -> Option<String> {
    let (addr, data) = buildinfo(image)?;
    let flags = *data.get(15)?;
    if flags & 0x02 != 0 {
        let (len, n) = read_uvarint(data.get(32..)?)?;
        let start = 32 + n;
        let bytes = data.get(start..start.checked_add(usize::try_from(len).ok()?)?)?;
        return Some(String::from_utf8_lossy(bytes).into_owned());
    }
    let ptr_size = *data.get(14)?;
    if ptr_size != 8 || flags & 0x01 != 0 {
        return None; // 32-bit or big-endian: not an architecture gostw traces
    }
    let header = image.ptr_at(addr.checked_add(16)?)?;
    let str_ptr = image.ptr_at(header)?;
    let len = usize::try_from(image.u64_at(header.checked_add(8)?)?).ok()?;
    if len > 1024 {
        return None;
    }
    let bytes = image.bytes_at(str_ptr, len)?;
    Some(String::from_utf8_lossy(bytes).into_owned())
}

/// The build information (its address and the bytes from there to the end
/// of its section): the `.go.buildinfo` section, else, in a file without
/// section headers, the first 16-byte-aligned magic in a writable segment,
/// as Go's own debug/buildinfo searches (the pages read are released as the
/// search goes: a segment may hold hundreds of MB of embedded data).
fn buildinfo(image: &Image) -> Option<(u64, &[u8])> {
    const WINDOW: usize = 4 << 20;
    let found = match image.section(".go.buildinfo") {
        Some(s) => Some((s.addr, image.section_data(s)?)),
        None if !image.sections.is_empty() => None,
        None => image
            .segments
            .iter()
            .filter(|seg| seg.flags & object::elf::PF_W != 0)
            .find_map(|seg| {
                let start = usize::try_from(seg.offset).ok()?;
                let end = start.checked_add(usize::try_from(seg.filesz).ok()?)?;
                let bytes = image.data.get(start..end.min(image.data.len()))?;
                let at = bytes.chunks(16).enumerate().position(|(i, chunk)| {
                    if i > 0 && (i * 16) % WINDOW == 0 {
                        image.data.release(start + i * 16 - WINDOW, WINDOW);
                    }
                    chunk.starts_with(MAGIC)
                })? * 16;
                Some((seg.vaddr.wrapping_add(at as u64), bytes.get(at..)?))
            }),
    };
    found.filter(|(_, d)| d.starts_with(MAGIC) && d.len() >= 32)
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
