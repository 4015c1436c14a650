//! The one `/proc/PID/maps` parser: every caller that needs where a file is
//! mapped (load bias, symbolization ranges, memory classification) reads
//! mappings through here.

use crate::binary::Segment;

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// `rwxp`-style permissions.
    pub perms: String,
    /// File offset of `start`.
    pub offset: u64,
    pub inode: u64,
    /// The path, `[heap]`-style name, or empty for anonymous memory.
    pub path: String,
}

/// Parse a maps text; malformed lines are skipped.
pub fn parse(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_line).collect()
}

/// One line of the maps format (also the header lines of `smaps`), or None.
pub fn parse_line(line: &str) -> Option<Mapping> {
    let mut f = line.split_whitespace();
    let (start, end) = f.next()?.split_once('-')?;
    let perms = f.next()?.to_owned();
    let offset = u64::from_str_radix(f.next()?, 16).ok()?;
    let _dev = f.next()?;
    let inode = f.next()?.parse().ok()?;
    // The path may contain spaces; it is the rest of the line.
    let path = f.collect::<Vec<_>>().join(" ");
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        perms,
        offset,
        inode,
        path,
    })
}

/// Read and parse the mappings of process `pid`.
pub fn read(pid: u32) -> std::io::Result<Vec<Mapping>> {
    Ok(parse(&std::fs::read_to_string(format!(
        "/proc/{pid}/maps"
    ))?))
}

/// How far the mapping of the file with inode `ino` (whose loadable
/// segments are `segments`) is from its link-time addresses: runtime address
/// = link-time address + bias. 0 for a non-PIE executable.
pub fn load_bias(maps: &[Mapping], ino: u64, segments: &[Segment]) -> Option<u64> {
    let (start, offset) = maps
        .iter()
        .filter(|m| m.inode == ino)
        .map(|m| (m.start, m.offset))
        .min()?;
    // The segment holding that file offset gives the link address mapped there.
    let seg = segments
        .iter()
        .filter(|s| s.offset <= offset.saturating_add(0xfff))
        .max_by_key(|s| s.offset)?;
    let linked = seg.vaddr.checked_add(offset)?.checked_sub(seg.offset)?;
    // Page-align as the kernel did when mapping.
    Some(start.wrapping_sub(linked & !0xfff))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(vaddr: u64, offset: u64, flags: u32) -> Segment {
        Segment {
            vaddr,
            memsz: 0x10000,
            offset,
            filesz: 0x10000,
            flags,
        }
    }

    #[test]
    fn lines_parse_with_and_without_paths() {
        let m = parse(
            "00400000-00401000 r-xp 00001000 fd:00 12 /bin/my app\n\
             00500000-00600000 rw-p 00000000 00:00 0\n\
             garbage\n",
        );
        assert_eq!(m.len(), 2);
        assert_eq!(
            (m[0].start, m[0].end, m[0].offset),
            (0x400000, 0x401000, 0x1000)
        );
        assert_eq!((m[0].inode, m[0].path.as_str()), (12, "/bin/my app"));
        assert_eq!(
            (m[1].inode, m[1].path.as_str(), m[1].perms.as_str()),
            (0, "", "rw-p")
        );
    }

    #[test]
    fn bias_of_pie_and_fixed_executables() {
        // Go's layout: text at 0x400000 from file offset 0, then rodata.
        let segments = [seg(0x400000, 0, 5), seg(0x529000, 0x129000, 4)];
        let pie = parse(
            "55d0aaa00000-55d0aab29000 r-xp 00000000 fd:01 1234 /srv/app\n\
             55d0aab29000-55d0aac76000 r--p 00129000 fd:01 1234 /srv/app\n\
             7f0000000000-7f0000001000 rw-p 00000000 00:00 0\n",
        );
        assert_eq!(
            load_bias(&pie, 1234, &segments),
            Some(0x55d0aaa00000 - 0x400000)
        );
        let fixed = parse("00400000-00529000 r-xp 00000000 fd:01 77 /srv/app\n");
        assert_eq!(load_bias(&fixed, 77, &segments), Some(0));
        // Only a later segment mapped (the first was unmapped): still right.
        let later = parse("55d0aab29000-55d0aac76000 r--p 00129000 fd:01 1234 /srv/app\n");
        assert_eq!(
            load_bias(&later, 1234, &segments),
            Some(0x55d0aaa00000 - 0x400000)
        );
        assert_eq!(load_bias(&pie, 999, &segments), None);
    }
}
