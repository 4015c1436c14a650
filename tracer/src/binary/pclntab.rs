//! Go's function table, `.gopclntab`: every function's entry, name, and the
//! PC-value tables that map a PC to its file, line and inlining. It survives
//! `-s -w`, so it is how gostw finds functions in stripped binaries and how
//! it symbolizes PCs.
//!
//! Formats (magic): 0xfffffffa Go 1.16-1.17, 0xfffffff0 Go 1.18-1.19,
//! 0xfffffff1 Go 1.20+ (adds `startLine` to `_func`). The layout follows
//! `runtime/symtab.go` and `cmd/link/internal/ld/pcln.go`.

use std::sync::Arc;

use super::{
    GoVersion,
    image::Image,
    moduledata::{self, ModuleData},
    section::{le_u32, le_u64},
};

/// Layout generation of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PclnFormat {
    /// Go 1.16-1.17: absolute entry PCs in the function table.
    Go116,
    /// Go 1.18-1.19: entries as 32-bit offsets from the text start.
    Go118,
    /// Go 1.20+: as 1.18, `_func` gains `startLine`.
    Go120,
}

/// Where a PC comes from in the source; innermost inlined call first when a
/// PC yields several.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Frame {
    pub function: String,
    /// Empty when unknown.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub file: String,
    /// 0 when unknown.
    #[serde(skip_serializing_if = "is_zero")]
    pub line: u32,
    /// Inlined into the frame that follows it.
    pub inlined: bool,
    /// Line of the function's `func` keyword (Go 1.20+ tables; 0 when
    /// unknown): pprof's `Function.start_line`, which Go's PGO keys on.
    #[serde(skip)]
    pub start_line: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Frame {
    /// A frame for an address no table knows: named by the address.
    pub fn unknown(pc: u64) -> Frame {
        Frame {
            function: format!("{pc:#x}"),
            file: String::new(),
            line: 0,
            inlined: false,
            start_line: 0,
        }
    }
}

/// `function (file:line)`, or just the function when the place is unknown.
impl std::fmt::Display for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.function)?;
        if !self.file.is_empty() {
            write!(f, " ({}", self.file)?;
            if self.line != 0 {
                write!(f, ":{}", self.line)?;
            }
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// The parsed header of a function table and what it needs to resolve
/// addresses.
pub struct Pclntab {
    image: Arc<Image>,
    /// Link-time address of the header.
    pub addr: u64,
    /// File offsets of the table's bytes.
    start: usize,
    end: usize,
    pub format: PclnFormat,
    /// PC quantum: 1 on amd64, 4 on arm64.
    quantum: u64,
    nfunc: usize,
    /// Link-time address function entries are offsets from.
    pub text_start: u64,
    /// Base of funcdata offsets (`go:func.*`), if known (after `set_version`).
    gofunc: Option<u64>,
    /// The linker's module data, if found.
    md: Option<ModuleData>,
    funcname: usize,
    cutab: usize,
    filetab: usize,
    pctab: usize,
    pcln: usize,
}

/// One `_func` record.
#[derive(Clone, Copy, Debug)]
struct Func {
    entry: u64,
    /// Entry of the next function (the end of this one's code).
    end: u64,
    name_off: u32,
    pcfile: u32,
    pcln: u32,
    npcdata: u32,
    cu_offset: u32,
    /// Go 1.20+ only; 0 before.
    start_line: u32,
    nfuncdata: u32,
    /// Table offset of the pcdata array that follows the record.
    data: usize,
}

const PCDATA_INL_TREE_INDEX: u32 = 2;
const FUNCDATA_INL_TREE: u32 = 3;
/// Deeper inlining than this is corruption (Go's budget keeps it shallow).
const MAX_INLINE_DEPTH: usize = 64;

impl Pclntab {
    /// Parse the function table of `image`. Functions can be looked up at
    /// once; inlined frames need `set_version` (the Go version says where
    /// the module data keeps `gofunc`).
    pub(crate) fn parse(image: Arc<Image>) -> Result<Pclntab, String> {
        let (addr, start, end) = locate(&image).ok_or("no Go function table (.gopclntab)")?;
        let bytes = &image.data[start..end];
        let word = |i: usize| -> Result<usize, String> {
            let at = 8 + 8 * i;
            let w = le_u64(
                bytes
                    .get(at..at + 8)
                    .ok_or(".gopclntab header is truncated")?,
            );
            usize::try_from(w).map_err(|e| e.to_string())
        };
        let magic = le_u32(bytes.get(0..4).ok_or(".gopclntab is empty")?);
        let format = match magic {
            0xffff_fffa => PclnFormat::Go116,
            0xffff_fff0 => PclnFormat::Go118,
            0xffff_fff1 => PclnFormat::Go120,
            0xffff_fffb => return Err("pclntab of Go 1.2-1.15: too old for gostw".into()),
            other => return Err(format!("unknown pclntab magic {other:#x}")),
        };
        let (quantum, ptr_size) = (bytes.get(6).copied(), bytes.get(7).copied());
        if ptr_size != Some(8) || !matches!(quantum, Some(1 | 2 | 4)) {
            return Err("pclntab is not for a 64-bit architecture".into());
        }
        let nfunc = word(0)?;
        let (header_text, offsets) = match format {
            PclnFormat::Go116 => (0, [word(2)?, word(3)?, word(4)?, word(5)?, word(6)?]),
            _ => (
                word(2)? as u64,
                [word(3)?, word(4)?, word(5)?, word(6)?, word(7)?],
            ),
        };
        let [funcname, cutab, filetab, pctab, pcln] = offsets;
        if offsets.iter().any(|&o| o > bytes.len()) {
            return Err(".gopclntab header offsets point past the table".into());
        }
        // The function table must fit: nfunc+1 entries.
        let entry_size = if format == PclnFormat::Go116 { 16 } else { 8 };
        if nfunc
            .checked_add(1)
            .and_then(|n| n.checked_mul(entry_size))
            .and_then(|n| n.checked_add(pcln))
            .is_none_or(|e| e > bytes.len())
        {
            return Err(".gopclntab function table is truncated".into());
        }
        let md = moduledata::find(&image, addr, addr.wrapping_add(funcname as u64));
        // Go 1.26+ write 0 as textStart: take it from the symbol table or
        // the module data, else the .text section (right for internal
        // linking only: external linking puts C code first).
        let text_start = if header_text != 0 {
            header_text
        } else if let Some((addr, _)) = image.symbol("runtime.text") {
            addr
        } else if let Some(md) = md {
            md.text
        } else {
            image.section(".text").map_or(0, |s| s.addr)
        };
        Ok(Pclntab {
            addr,
            start,
            end,
            format,
            quantum: u64::from(quantum.unwrap_or(1)),
            nfunc,
            text_start,
            gofunc: None,
            md,
            funcname,
            cutab,
            filetab,
            pctab,
            pcln,
            image,
        })
    }

    /// Find the base of funcdata (inline trees) for a binary of Go
    /// `version`: the `go:func.*` symbol, else the module data's `gofunc`,
    /// else the `.go.func` section.
    pub(crate) fn set_version(&mut self, version: GoVersion) {
        let image = &self.image;
        self.gofunc = ["go:func.*", "go.func.*"]
            .iter()
            .find_map(|n| image.symbol(n).map(|(a, _)| a))
            .or_else(|| self.md.and_then(|m| m.gofunc(image, version)))
            .or_else(|| image.section(".go.func").map(|s| s.addr));
    }

    /// The linker's module data, if it was found.
    pub(crate) fn moduledata(&self) -> Option<ModuleData> {
        self.md
    }

    fn bytes(&self) -> &[u8] {
        &self.image.data[self.start..self.end]
    }

    fn u32_at(&self, off: usize) -> Option<u32> {
        Some(le_u32(self.bytes().get(off..off.checked_add(4)?)?))
    }

    fn u64_at(&self, off: usize) -> Option<u64> {
        Some(le_u64(self.bytes().get(off..off.checked_add(8)?)?))
    }

    /// Number of functions in the table.
    pub fn len(&self) -> usize {
        self.nfunc
    }

    /// Is the table empty?
    pub fn is_empty(&self) -> bool {
        self.nfunc == 0
    }

    /// Entry PC of function `i` (`i == len()` gives the end of the text).
    fn entry(&self, i: usize) -> Option<u64> {
        match self.format {
            PclnFormat::Go116 => self.u64_at(self.pcln.checked_add(i.checked_mul(16)?)?),
            _ => {
                let off = self.u32_at(self.pcln.checked_add(i.checked_mul(8)?)?)?;
                Some(self.text_start.wrapping_add(u64::from(off)))
            }
        }
    }

    /// The `_func` record of function `i`.
    fn func(&self, i: usize) -> Option<Func> {
        if i >= self.nfunc {
            return None;
        }
        let funcoff = match self.format {
            PclnFormat::Go116 => usize::try_from(self.u64_at(self.pcln + i * 16 + 8)?).ok()?,
            _ => self.u32_at(self.pcln + i * 8 + 4)? as usize,
        };
        let f = self.pcln.checked_add(funcoff)?;
        // Field offsets past the entry: Go 1.16 has an 8-byte entry PC.
        let (base, header_len) = match self.format {
            PclnFormat::Go116 => (f + 8, 44),
            PclnFormat::Go118 => (f + 4, 40),
            PclnFormat::Go120 => (f + 4, 44),
        };
        let field = |k: usize| self.u32_at(base + 4 * k);
        let nfuncdata = *self.bytes().get(f + header_len - 1)?;
        Some(Func {
            entry: self.entry(i)?,
            end: self.entry(i + 1)?,
            name_off: field(0)?,
            pcfile: field(4)?,
            pcln: field(5)?,
            npcdata: field(6)?,
            cu_offset: field(7)?,
            start_line: match self.format {
                PclnFormat::Go120 => field(8)?,
                _ => 0,
            },
            nfuncdata: u32::from(nfuncdata),
            data: f + header_len,
        })
    }

    /// A NUL-terminated string at `off` in the table region starting at `base`.
    fn cstr(&self, base: usize, off: usize) -> Option<&str> {
        let start = base.checked_add(off)?;
        let rest = self.bytes().get(start..)?;
        let len = rest.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&rest[..len]).ok()
    }

    fn func_name(&self, name_off: u32) -> Option<&str> {
        self.cstr(self.funcname, name_off as usize)
    }

    /// Every function: (name, entry, end). Names may repeat: Go lists ABI0
    /// wrappers under the same name as the function they wrap.
    pub fn functions(&self) -> impl Iterator<Item = (&str, u64, u64)> + '_ {
        (0..self.nfunc).filter_map(|i| {
            let f = self.func(i)?;
            Some((self.func_name(f.name_off)?, f.entry, f.end))
        })
    }

    /// Entries and ends of the functions called `name`.
    pub fn lookup(&self, name: &str) -> Vec<(u64, u64)> {
        self.functions()
            .filter(|(n, _, _)| *n == name)
            .map(|(_, entry, end)| (entry, end))
            .collect()
    }

    /// Index of the function whose code holds `pc`.
    fn find(&self, pc: u64) -> Option<usize> {
        if self.nfunc == 0 || pc < self.entry(0)? || pc >= self.entry(self.nfunc)? {
            return None;
        }
        // Binary search for the last entry <= pc.
        let (mut lo, mut hi) = (0usize, self.nfunc);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.entry(mid)? <= pc {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Some(lo)
    }

    /// The name of the function containing `pc`.
    pub fn function_name(&self, pc: u64) -> Option<&str> {
        let f = self.func(self.find(pc)?)?;
        self.func_name(f.name_off)
    }

    /// Value of the PC-value table at `table` for `pc` in a function
    /// starting at `entry` (`runtime.pcvalue`).
    fn pcvalue(&self, table: u32, entry: u64, pc: u64) -> Option<i32> {
        if table == 0 {
            return None;
        }
        let data = self
            .bytes()
            .get(self.pctab.checked_add(table as usize)?..)?;
        let mut p = 0usize;
        let (mut cur_pc, mut val, mut first) = (entry, -1i32, true);
        loop {
            let (uvdelta, n) = read_varint(data.get(p..)?)?;
            if uvdelta == 0 && !first {
                return None;
            }
            p += n;
            let vdelta = ((uvdelta >> 1) as i32) ^ -((uvdelta & 1) as i32);
            let (pcdelta, n) = read_varint(data.get(p..)?)?;
            p += n;
            cur_pc = cur_pc.checked_add(u64::from(pcdelta) * self.quantum)?;
            val = val.wrapping_add(vdelta);
            if pc < cur_pc {
                return Some(val);
            }
            first = false;
        }
    }

    /// The file name of file number `fileno` of `f`'s compilation unit.
    fn file(&self, f: &Func, fileno: i32) -> Option<&str> {
        let idx = usize::try_from(fileno).ok()?;
        let slot = self
            .cutab
            .checked_add((f.cu_offset as usize).checked_add(idx)?.checked_mul(4)?)?;
        let off = self.u32_at(slot)?;
        if off == u32::MAX {
            return None;
        }
        self.cstr(self.filetab, off as usize)
    }

    /// Offset of pcdata table `k` of `f`, if it has one.
    fn pcdata(&self, f: &Func, k: u32) -> Option<u32> {
        if k >= f.npcdata {
            return None;
        }
        self.u32_at(f.data.checked_add(4 * k as usize)?)
    }

    /// Address of funcdata `k` of `f` (Go 1.18+: an offset from `gofunc`).
    fn funcdata(&self, f: &Func, k: u32) -> Option<u64> {
        if k >= f.nfuncdata || self.format == PclnFormat::Go116 {
            return None;
        }
        let off = self.u32_at(f.data.checked_add(4 * (f.npcdata as usize + k as usize))?)?;
        if off == u32::MAX {
            return None;
        }
        Some(self.gofunc?.wrapping_add(u64::from(off)))
    }

    /// The source positions of `pc` (a link-time address), innermost
    /// inlined call first and the function that holds the code last; empty
    /// outside Go code. Give a return address minus one to get its call.
    pub fn frames(&self, pc: u64) -> Vec<Frame> {
        let Some(f) = self.find(pc).and_then(|i| self.func(i)) else {
            return Vec::new();
        };
        let position = |pc: u64| {
            let file = self
                .pcvalue(f.pcfile, f.entry, pc)
                .and_then(|n| self.file(&f, n))
                .unwrap_or("?")
                .to_owned();
            let line = self
                .pcvalue(f.pcln, f.entry, pc)
                .map_or(0, |l| u32::try_from(l).unwrap_or(0));
            (file, line)
        };
        let mut frames = Vec::new();
        let mut pc = pc;
        let inltree = self.funcdata(&f, FUNCDATA_INL_TREE);
        if let (Some(tree), Some(index_table)) = (inltree, self.pcdata(&f, PCDATA_INL_TREE_INDEX)) {
            // Go 1.18-1.19 inlinedCall: parent i16, funcID u8, pad, file
            // i32, line i32, func_ i32, parentPc i32. Go 1.20+: funcID u8,
            // pad [3], nameOff i32, parentPc i32, startLine i32.
            let (size, name_at, parent_pc_at, start_line_at) = match self.format {
                PclnFormat::Go118 => (20u64, 12u64, 16u64, None),
                _ => (16, 4, 8, Some(12usize)),
            };
            while frames.len() < MAX_INLINE_DEPTH {
                let Some(ix) = self.pcvalue(index_table, f.entry, pc) else {
                    break;
                };
                let Ok(ix) = u64::try_from(ix) else { break };
                let Some(call) = ix
                    .checked_mul(size)
                    .and_then(|o| tree.checked_add(o))
                    .and_then(|at| self.image.bytes_at(at, size as usize))
                else {
                    break;
                };
                let name_off = le_u32(&call[name_at as usize..]);
                let parent_pc = le_u32(&call[parent_pc_at as usize..]);
                let (file, line) = position(pc);
                frames.push(Frame {
                    function: self.func_name(name_off).unwrap_or("?").to_owned(),
                    file,
                    line,
                    inlined: true,
                    start_line: start_line_at.map_or(0, |at| le_u32(&call[at..])),
                });
                pc = f.entry.wrapping_add(u64::from(parent_pc));
            }
        }
        let (file, line) = position(pc);
        frames.push(Frame {
            function: self.func_name(f.name_off).unwrap_or("?").to_owned(),
            file,
            line,
            inlined: false,
            start_line: f.start_line,
        });
        frames
    }
}

/// Where the table is: (link-time address, file start, file end). Its
/// section is `.gopclntab`, or `.data.rel.ro.gopclntab` in PIEs before Go
/// 1.26; without section headers, the first header-like magic in a
/// loadable segment (to the segment's end).
fn locate(image: &Image) -> Option<(u64, usize, usize)> {
    if let Some(s) = image
        .section(".gopclntab")
        .or_else(|| image.section(".data.rel.ro.gopclntab"))
    {
        let bytes = image.section_data(s)?;
        let start = usize::try_from(s.offset).ok()?;
        return Some((s.addr, start, start + bytes.len()));
    }
    if !image.sections.is_empty() {
        return None;
    }
    image.segments.iter().find_map(|seg| {
        let start = usize::try_from(seg.offset).ok()?;
        let end = start
            .checked_add(usize::try_from(seg.filesz).ok()?)?
            .min(image.data.len());
        let bytes = image.data.get(start..end)?;
        let at = (0..bytes.len().saturating_sub(8)).step_by(8).find(|&i| {
            let h = &bytes[i..i + 8];
            matches!(h[..4], [0xf0 | 0xf1 | 0xfa, 0xff, 0xff, 0xff])
                && h[4] == 0
                && h[5] == 0
                && matches!(h[6], 1 | 2 | 4)
                && h[7] == 8
        })?;
        Some((seg.vaddr.wrapping_add(at as u64), start + at, end))
    })
}

/// Go's `readvarint` (at most 5 bytes for 32 bits): value and bytes read.
fn read_varint(p: &[u8]) -> Option<(u32, usize)> {
    let mut v = 0u32;
    for (i, &b) in p.iter().enumerate().take(5) {
        v |= u32::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_and_zigzag_match_go() {
        assert_eq!(read_varint(&[0x02]), Some((2, 1)));
        assert_eq!(read_varint(&[0x96, 0x01]), Some((150, 2)));
        assert_eq!(read_varint(&[0x80, 0x80]), None);
        let zigzag = |u: u32| ((u >> 1) as i32) ^ -((u & 1) as i32);
        assert_eq!(zigzag(0), 0);
        assert_eq!(zigzag(1), -1);
        assert_eq!(zigzag(2), 1);
        assert_eq!(zigzag(3), -2);
    }
}
