//! Runtime struct offsets from DWARF: the member offsets of `runtime.g`,
//! `runtime.m`, `runtime.gobuf` and `runtime.stack` in `.debug_info` (Go
//! compresses it with zlib; `Image::debug_section` inflates it).

use std::{borrow::Cow, collections::BTreeMap};

use gimli::{DwarfSections, EndianSlice, LittleEndian};

use super::{image::Image, offsets::StructLayouts};

/// The structs whose members gostw needs.
const WANTED: &[&str] = &["runtime.g", "runtime.m", "runtime.gobuf", "runtime.stack"];

/// Member offsets of the wanted structs, or `None` without usable DWARF.
pub(crate) fn struct_layouts(image: &Image) -> Option<StructLayouts> {
    image
        .section(".debug_info")
        .or(image.section(".zdebug_info"))?;
    let sections = DwarfSections::load(|id| -> Result<Cow<'_, [u8]>, gimli::Error> {
        Ok(image
            .debug_section(id.name())
            .map_or(Cow::Borrowed(&[][..]), Cow::Owned))
    })
    .ok()?;
    let dwarf = sections.borrow(|s| EndianSlice::new(s, LittleEndian));
    let mut out: StructLayouts = BTreeMap::new();
    let mut units = dwarf.units();
    while let Ok(Some(header)) = units.next() {
        let Ok(unit) = dwarf.unit(header) else {
            continue;
        };
        let mut entries = unit.entries();
        // The struct being read, and the depth of its members.
        let mut current: Option<(&'static str, isize)> = None;
        while let Ok(Some(entry)) = entries.next_dfs() {
            let depth = entry.depth();
            if let Some((name, member_depth)) = current {
                if depth == member_depth && entry.tag() == gimli::DW_TAG_member {
                    let member = entry
                        .attr_value(gimli::DW_AT_name)
                        .and_then(|v| dwarf.attr_string(&unit, v).ok())
                        .map(|s| String::from_utf8_lossy(s.slice()).into_owned());
                    let offset = entry
                        .attr_value(gimli::DW_AT_data_member_location)
                        .and_then(|v| v.udata_value());
                    if let (Some(member), Some(offset)) = (member, offset) {
                        out.entry(name).or_default().insert(member, offset);
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
                    .and_then(|v| dwarf.attr_string(&unit, v).ok());
                if let Some(&wanted) =
                    name.and_then(|n| WANTED.iter().find(|w| w.as_bytes() == n.slice()))
                    && !out.contains_key(wanted)
                {
                    current = Some((wanted, depth + 1));
                }
            }
        }
        if WANTED.iter().all(|w| out.contains_key(w)) {
            break;
        }
    }
    (!out.is_empty()).then_some(out)
}
