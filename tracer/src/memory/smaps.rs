//! The mappings of a process as `/proc/PID/smaps` gives them: address range,
//! permissions, what backs it, and the kernel's own resident and swapped
//! byte counts per mapping.

use std::ops::Range;

/// What backs a mapping, from the last column of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backing {
    /// A file (the executable, a library, a mapped data file, a memfd).
    File(String),
    /// `[heap]`: the brk heap (C's malloc; Go never uses it on Linux).
    Brk,
    /// `[stack]`: the main thread's stack.
    MainStack,
    /// `[vdso]`, `[vvar]`, `[vsyscall]` and the like: the kernel's own.
    Kernel(String),
    /// `[anon:NAME]`: an anonymous mapping a program named with
    /// `prctl(PR_SET_VMA_ANON_NAME)` (Go 1.25+ names its own ` Go: ...`).
    Named(String),
    /// An anonymous mapping with no name.
    Anonymous,
}

/// One mapping (a VMA) with the figures gostw uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub readable: bool,
    pub writable: bool,
    pub executable: bool,
    /// Private (copy-on-write) rather than shared.
    pub private: bool,
    /// Offset in the backing file.
    pub offset: u64,
    pub inode: u64,
    pub backing: Backing,
    /// `Rss:` in bytes: pages of this mapping in memory now.
    pub rss: u64,
    /// `Swap:` in bytes: pages of this mapping in swap now.
    pub swap: u64,
}

impl Mapping {
    /// The address range.
    pub fn range(&self) -> Range<u64> {
        self.start..self.end
    }

    /// Bytes of address space.
    pub fn size(&self) -> u64 {
        self.end - self.start
    }

    /// No access at all: a reservation (`---p`), never resident.
    pub fn is_reservation(&self) -> bool {
        !self.readable && !self.writable && !self.executable
    }

    /// Anonymous private memory the program allocated (named or not).
    pub fn is_anonymous(&self) -> bool {
        self.private && matches!(self.backing, Backing::Anonymous | Backing::Named(_))
    }

    /// The name Go 1.25+ gave this mapping (` Go: heap` -> `heap`).
    pub fn go_name(&self) -> Option<&str> {
        match &self.backing {
            Backing::Named(n) => n.trim_start().strip_prefix("Go: "),
            _ => None,
        }
    }
}

/// Why an smaps text could not be read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct ParseError {
    pub line: usize,
    pub reason: String,
}

/// Parse the text of `/proc/PID/smaps`.
pub fn parse(text: &str) -> Result<Vec<Mapping>, ParseError> {
    let mut out: Vec<Mapping> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let err = |reason: &str| ParseError {
            line: i + 1,
            reason: reason.to_owned(),
        };
        if let Some(m) = header(line) {
            out.push(m.map_err(|r| err(&r))?);
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        if key != "Rss" && key != "Swap" {
            continue;
        }
        let mapping = out
            .last_mut()
            .ok_or_else(|| err("a field before the first mapping"))?;
        let bytes = kib(value).ok_or_else(|| err("bad kB value"))?;
        if key == "Rss" {
            mapping.rss = bytes;
        } else {
            mapping.swap = bytes;
        }
    }
    Ok(out)
}

/// `"   820 kB"` -> 839680.
fn kib(value: &str) -> Option<u64> {
    let mut f = value.split_whitespace();
    let n: u64 = f.next()?.parse().ok()?;
    (f.next()? == "kB").then_some(n * 1024)
}

/// A mapping header line (`start-end perms offset dev inode [path]`, read by
/// the one maps parser), or `None` for a field line.
fn header(line: &str) -> Option<Result<Mapping, String>> {
    // Field lines are `Key:   value`; a header starts with an address range.
    let (range, _) = line.split_once(' ')?;
    let (start, end) = range.split_once('-')?;
    u64::from_str_radix(start, 16).ok()?;
    u64::from_str_radix(end, 16).ok()?;
    let Some(m) = crate::image::maps::parse_line(line) else {
        return Some(Err("malformed mapping line".into()));
    };
    if m.end < m.start {
        return Some(Err("end before start".into()));
    }
    let p = m.perms.as_bytes();
    if p.len() != 4 {
        return Some(Err("bad permissions".into()));
    }
    Some(Ok(Mapping {
        start: m.start,
        end: m.end,
        readable: p[0] == b'r',
        writable: p[1] == b'w',
        executable: p[2] == b'x',
        private: p[3] == b'p',
        offset: m.offset,
        inode: m.inode,
        backing: backing(m.path.trim()),
        rss: 0,
        swap: 0,
    }))
}

fn backing(path: &str) -> Backing {
    match path {
        "" => Backing::Anonymous,
        "[heap]" => Backing::Brk,
        "[stack]" => Backing::MainStack,
        _ => {
            if let Some(name) = path
                .strip_prefix("[anon:")
                .and_then(|n| n.strip_suffix(']'))
            {
                Backing::Named(name.to_owned())
            } else if path.starts_with('[') {
                Backing::Kernel(path.to_owned())
            } else {
                Backing::File(path.to_owned())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
00400000-004dd000 r-xp 00000000 fe:00 10322000                           /tmp/mem/gcswap
Size:                884 kB
Rss:                 820 kB
Swap:                  0 kB
SwapPss:               0 kB
VmFlags: rd ex mr mw me
00602000-00638000 rw-p 00000000 00:00 0 
Size:                216 kB
Rss:                  84 kB
Swap:                 12 kB
SwapPss:              12 kB
35befc000000-35beff800000 ---p 00000000 00:00 0 
Rss:                   0 kB
7fa30b480000-7fa30b530000 rw-p 00000000 00:00 0                          [anon: Go: gc bits]
Rss:                 260 kB
Swap:                100 kB
7fa35247b000-7fa35247f000 r--p 00000000 00:00 0                          [vvar]
Rss:                   0 kB
7ffd58a3f000-7ffd58a60000 rw-p 00000000 00:00 0                          [stack]
Rss:                  20 kB
55d0aab29000-55d0aac76000 rw-p 00000000 00:00 0                          [heap]
Rss:                   8 kB
7f0000000000-7f0000001000 rw-s 00000000 00:01 77                         /memfd:x (deleted)
Rss:                   4 kB
";

    #[test]
    fn parses_ranges_backing_and_counts() {
        let m = parse(SMAPS).unwrap();
        assert_eq!(m.len(), 8);
        assert_eq!(m[0].backing, Backing::File("/tmp/mem/gcswap".into()));
        assert!(m[0].executable && !m[0].writable && m[0].private);
        assert_eq!((m[0].rss, m[0].swap), (820 << 10, 0));
        // SwapPss is not Swap.
        assert_eq!((m[1].rss, m[1].swap), (84 << 10, 12 << 10));
        assert_eq!(m[1].backing, Backing::Anonymous);
        assert!(m[1].is_anonymous());
        assert!(m[2].is_reservation());
        assert_eq!(m[2].start, 0x35befc000000);
        assert_eq!(m[3].go_name(), Some("gc bits"));
        assert_eq!(m[4].backing, Backing::Kernel("[vvar]".into()));
        assert_eq!(m[5].backing, Backing::MainStack);
        assert_eq!(m[6].backing, Backing::Brk);
        assert_eq!(m[7].backing, Backing::File("/memfd:x (deleted)".into()));
        assert!(!m[7].private && !m[7].is_anonymous());
    }

    #[test]
    fn rejects_garbage_instead_of_guessing() {
        assert!(parse("Rss: 4 kB\n").is_err());
        assert!(parse("00400000-00401000 rw-p zz 00:00 0\n").is_err());
        assert!(parse("00400000-00401000 rw-p 0 00:00 0\nRss: many kB\n").is_err());
        assert_eq!(parse("").unwrap(), vec![]);
    }
}
