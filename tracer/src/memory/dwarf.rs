//! The sizes and member offsets of the runtime structs that describe the Go
//! heap (`runtime.mheap`, `runtime.heapArena`, `runtime.mspan`), from the
//! executable's DWARF. Only where the binary keeps DWARF (not `-w`): these
//! structs change between releases and have no runtime type descriptor.

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap},
};

use gimli::{DwarfSections, EndianSlice, LittleEndian};
use object::{CompressionFormat, Object as _, ObjectSection as _};

/// The structs read.
pub const MHEAP: &str = "runtime.mheap";
pub const HEAP_ARENA: &str = "runtime.heapArena";
pub const MSPAN: &str = "runtime.mspan";
const WANTED: &[&str] = &[MHEAP, HEAP_ARENA, MSPAN];

/// One struct's layout.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StructLayout {
    pub size: Option<u64>,
    /// Member name -> byte offset.
    pub members: BTreeMap<String, u64>,
}

/// The wanted structs found, by name.
pub type Layouts = HashMap<&'static str, StructLayout>;

/// Layouts of the heap structs in the ELF file `data`, or `None` when it has
/// no readable DWARF.
pub fn heap_layouts(data: &[u8]) -> Option<Layouts> {
    let file = object::File::parse(data).ok()?;
    file.section_by_name(".debug_info")?;
    // Only Go binaries have the runtime: skip the DWARF of anything else.
    file.section_by_name(".gopclntab")
        .or_else(|| file.section_by_name(".data.rel.ro.gopclntab"))?;
    let sections = DwarfSections::load(|id| -> Result<Cow<'_, [u8]>, gimli::Error> {
        Ok(section(&file, id.name()).unwrap_or(Cow::Borrowed(&[][..])))
    })
    .ok()?;
    let dwarf = sections.borrow(|s| EndianSlice::new(s, LittleEndian));
    let mut out = Layouts::new();
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
                        out.entry(name).or_default().members.insert(member, offset);
                    }
                    continue;
                }
                if depth < member_depth {
                    current = None;
                }
            }
            if entry.tag() != gimli::DW_TAG_structure_type {
                continue;
            }
            let name = entry
                .attr_value(gimli::DW_AT_name)
                .and_then(|v| dwarf.attr_string(&unit, v).ok());
            let Some(&wanted) =
                name.and_then(|n| WANTED.iter().find(|w| w.as_bytes() == n.slice()))
            else {
                continue;
            };
            if out.contains_key(wanted) {
                continue;
            }
            let size = entry
                .attr_value(gimli::DW_AT_byte_size)
                .and_then(|v| v.udata_value());
            out.insert(
                wanted,
                StructLayout {
                    size,
                    members: BTreeMap::new(),
                },
            );
            current = Some((wanted, depth + 1));
        }
        if WANTED.iter().all(|w| out.contains_key(w)) {
            break;
        }
    }
    (!out.is_empty()).then_some(out)
}

/// A debug section's contents, inflated when Go compressed it (zlib,
/// `SHF_COMPRESSED`, as every Go release since 1.12 writes it).
fn section<'a>(file: &object::File<'a>, name: &str) -> Option<Cow<'a, [u8]>> {
    let compressed = file.section_by_name(name)?.compressed_data().ok()?;
    match compressed.format {
        CompressionFormat::None => Some(Cow::Borrowed(compressed.data)),
        CompressionFormat::Zlib => {
            // Go's debug sections are a few hundred MiB at most.
            let limit = usize::try_from(compressed.uncompressed_size.min(1 << 30)).ok()?;
            miniz_oxide::inflate::decompress_to_vec_zlib_with_limit(compressed.data, limit)
                .ok()
                .map(Cow::Owned)
        }
        _ => None,
    }
}
