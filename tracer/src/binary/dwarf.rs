//! Runtime struct layouts from DWARF: the member offsets of `runtime.g`,
//! `runtime.m`, `runtime.gobuf` and `runtime.stack` in `.debug_info`, and
//! the size and members of any runtime struct asked for (the heap's, for
//! `memory`). The one DWARF reader.
//!
//! Go compresses `.debug_info` with zlib, and a large binary's is hundreds
//! of MB once inflated: it is inflated one compilation unit at a time, each
//! dropped once read, and the search stops when the four structs are found.

use std::collections::BTreeMap;

use gimli::{AttributeValue, DebugAbbrev, DebugInfo, DebugStr, EndianSlice, LittleEndian};
use miniz_oxide::inflate::stream::{InflateState, inflate};
use object::elf;

use super::{
    image::Image,
    offsets::StructLayouts,
    section::{Section, le_u32, le_u64},
};

/// The structs whose members gostw needs.
const WANTED: &[&str] = &["runtime.g", "runtime.m", "runtime.gobuf", "runtime.stack"];

/// One struct's size and member offsets, from DWARF.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StructLayout {
    pub size: Option<u64>,
    /// Member name -> byte offset.
    pub members: BTreeMap<String, u64>,
}

/// Member offsets of the wanted structs, or `None` without usable DWARF.
pub(crate) fn struct_layouts(image: &Image) -> Option<StructLayouts> {
    let found = structs(image, WANTED)?;
    let out: StructLayouts = found
        .into_iter()
        .filter(|(_, l)| !l.members.is_empty())
        .map(|(name, l)| (name, l.members))
        .collect();
    (!out.is_empty()).then_some(out)
}

/// The size and members of each struct of `wanted` that `image`'s DWARF
/// describes, or `None` without usable DWARF.
pub(crate) fn structs(
    image: &Image,
    wanted: &[&'static str],
) -> Option<BTreeMap<&'static str, StructLayout>> {
    let info = image
        .section(".debug_info")
        .or(image.section(".zdebug_info"))?;
    let mut units = UnitStream::new(image, info)?;
    // The small sections units refer to, inflated whole.
    let abbrev = image.debug_section(".debug_abbrev")?;
    let strings = image.debug_section(".debug_str").unwrap_or_default();
    let sections = Sections {
        abbrev: DebugAbbrev::new(&abbrev, LittleEndian),
        strings: DebugStr::new(&strings, LittleEndian),
    };
    let mut out = BTreeMap::new();
    let complete = |out: &BTreeMap<&'static str, StructLayout>| {
        wanted
            .iter()
            .all(|w| out.get(w).is_some_and(|l| !l.members.is_empty()))
    };
    while let Some(unit_bytes) = units.next_unit() {
        read_units(
            &sections,
            DebugInfo::new(unit_bytes, LittleEndian),
            wanted,
            &mut out,
        );
        if complete(&out) {
            break;
        }
    }
    units.release();
    (!out.is_empty()).then_some(out)
}

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// What the entries of a unit refer to: abbreviations and (`DW_FORM_strp`)
/// strings. Only these: a full `gimli::Dwarf` unit would also read the
/// line program, which gostw does not need.
struct Sections<'a> {
    abbrev: DebugAbbrev<Slice<'a>>,
    strings: DebugStr<Slice<'a>>,
}

impl<'a> Sections<'a> {
    /// A name attribute's bytes: inline (what Go writes) or in `.debug_str`.
    fn string(&self, value: AttributeValue<Slice<'a>>) -> Option<Slice<'a>> {
        match value {
            AttributeValue::String(s) => Some(s),
            AttributeValue::DebugStrRef(offset) => self.strings.get_str(offset).ok(),
            _ => None,
        }
    }
}

/// Add the sizes and members of the `wanted` structs in `info`'s units to
/// `out` (the first definition with members of each).
fn read_units<'a>(
    dwarf: &Sections<'a>,
    info: DebugInfo<Slice<'a>>,
    wanted: &[&'static str],
    out: &mut BTreeMap<&'static str, StructLayout>,
) {
    let mut units = info.units();
    while let Ok(Some(header)) = units.next() {
        let Ok(abbrevs) = header.abbreviations(&dwarf.abbrev) else {
            continue;
        };
        let mut entries = header.entries(&abbrevs);
        // The struct being read, and the depth of its members.
        let mut current: Option<(&'static str, isize)> = None;
        while let Ok(Some(entry)) = entries.next_dfs() {
            let depth = entry.depth();
            if let Some((name, member_depth)) = current {
                if depth == member_depth && entry.tag() == gimli::DW_TAG_member {
                    let member = entry
                        .attr_value(gimli::DW_AT_name)
                        .and_then(|v| dwarf.string(v))
                        .map(|s| String::from_utf8_lossy(s.slice()).into_owned());
                    let offset = entry
                        .attr_value(gimli::DW_AT_data_member_location)
                        .and_then(|v| v.udata_value());
                    if let (Some(member), Some(offset)) = (member, offset) {
                        out.entry(name).or_default().members.insert(member, offset);
                    }
                    continue;
                }
                if depth < member_depth {
                    current = None;
                }
            }
            if entry.tag() == gimli::DW_TAG_structure_type {
                let name = entry
                    .attr_value(gimli::DW_AT_name)
                    .and_then(|v| dwarf.string(v));
                if let Some(&found) =
                    name.and_then(|n| wanted.iter().find(|w| w.as_bytes() == n.slice()))
                    && out.get(found).is_none_or(|l| l.members.is_empty())
                {
                    let size = entry
                        .attr_value(gimli::DW_AT_byte_size)
                        .and_then(|v| v.udata_value());
                    out.insert(
                        found,
                        StructLayout {
                            size,
                            members: BTreeMap::new(),
                        },
                    );
                    current = Some((found, depth + 1));
                }
            }
        }
        if wanted
            .iter()
            .all(|w| out.get(w).is_some_and(|l| !l.members.is_empty()))
        {
            break;
        }
    }
}

/// `.debug_info` one unit at a time: sliced from the file when stored
/// plain, inflated a piece at a time when compressed.
struct UnitStream<'a> {
    image: &'a Image,
    /// File offset of the section (for releasing the pages read).
    file_offset: usize,
    /// The section's bytes after any compression header.
    input: &'a [u8],
    input_start: usize,
    pos: usize,
    inflater: Option<Box<InflateState>>,
    /// Inflated bytes not yet handed out start at `start`.
    buf: Vec<u8>,
    start: usize,
    finished: bool,
    released: usize,
}

/// Bytes inflated per step.
const INFLATE_STEP: usize = 256 << 10;
/// A larger unit is corruption (Go's largest, runtime's, is a few MB).
const MAX_UNIT: usize = 256 << 20;

impl<'a> UnitStream<'a> {
    fn new(image: &'a Image, section: &Section) -> Option<UnitStream<'a>> {
        let raw = image.section_data(section)?;
        let (skip, compressed) = if section.flags & SHF_COMPRESSED != 0 {
            // Elf64_Chdr: ch_type u32, reserved u32, ch_size u64, ch_addralign u64.
            if le_u32(raw.get(0..4)?) != elf::ELFCOMPRESS_ZLIB {
                return None;
            }
            (24, true)
        } else if section.name.starts_with(".zdebug_") && raw.starts_with(b"ZLIB") {
            // "ZLIB", then the uncompressed size, big-endian.
            (12, true)
        } else {
            (0, false)
        };
        Some(UnitStream {
            image,
            file_offset: usize::try_from(section.offset).ok()?,
            input: raw.get(skip..)?,
            input_start: skip,
            pos: 0,
            inflater: compressed.then(|| InflateState::new_boxed(miniz_oxide::DataFormat::Zlib)),
            buf: Vec::new(),
            start: 0,
            finished: false,
            released: 0,
        })
    }

    /// The next whole unit, header included; `None` at the end (or at the
    /// first sign of corruption).
    fn next_unit(&mut self) -> Option<&[u8]> {
        self.fill(4);
        let len = match le_u32(self.rest().get(..4)?) {
            0xffff_ffff => {
                self.fill(12);
                let n = le_u64(self.rest().get(4..12)?);
                usize::try_from(n).ok()?.checked_add(12)?
            }
            n if n >= 0xffff_fff0 => return None,
            n => n as usize + 4,
        };
        if len > MAX_UNIT {
            return None;
        }
        self.fill(len);
        if self.rest().len() < len {
            return None;
        }
        let at = self.start;
        self.start += len;
        self.bytes().get(at..at + len)
    }

    /// The bytes units are cut from: the file's, or those inflated so far.
    fn bytes(&self) -> &[u8] {
        match self.inflater {
            Some(_) => &self.buf,
            None => self.input,
        }
    }

    /// The bytes not handed out yet.
    fn rest(&self) -> &[u8] {
        self.bytes().get(self.start..).unwrap_or_default()
    }

    /// Inflate until `need` bytes are available (or the stream ends).
    fn fill(&mut self, need: usize) {
        let Some(mut state) = self.inflater.take() else {
            return;
        };
        while self.buf.len() - self.start < need && !self.finished {
            if self.start > 0 {
                self.buf.drain(..self.start);
                self.start = 0;
            }
            let old = self.buf.len();
            self.buf.resize(old + INFLATE_STEP, 0);
            let r = inflate(
                &mut state,
                &self.input[self.pos..],
                &mut self.buf[old..],
                miniz_oxide::MZFlush::None,
            );
            self.buf.truncate(old + r.bytes_written);
            self.pos += r.bytes_consumed;
            let progress = r.bytes_written > 0 || r.bytes_consumed > 0;
            if !matches!(r.status, Ok(miniz_oxide::MZStatus::Ok)) || !progress {
                self.finished = true;
            }
            if self.pos - self.released >= INFLATE_STEP * 16 {
                self.release_input(self.pos);
            }
        }
        self.inflater = Some(state);
    }

    /// Drop the pages of the section read so far from the resident set.
    fn release(&mut self) {
        let read = if self.inflater.is_some() {
            self.pos
        } else {
            self.start
        };
        self.release_input(read);
    }

    fn release_input(&mut self, read: usize) {
        self.image
            .data
            .release(self.file_offset + self.input_start, read);
        self.released = read;
    }
}

const SHF_COMPRESSED: u64 = 0x800;
