//! Runtime struct offsets from the runtime's own type descriptors, which
//! stay in the binary after `-s -w` (the garbage collector and reflection
//! need them).
//!
//! An `abi.StructType` (Go 1.16-1.27, 64-bit) is the common `abi.Type`
//! (48 bytes: size, ptrdata, hash, tflag, align, fieldAlign, kind at +23,
//! equal, gcdata, str, ptrToThis), then `PkgPath` (a name pointer) and
//! `Fields` (a slice of `{Name *byte, Typ *Type, Offset uintptr}`). The
//! descriptor's own name is an offset from a module base that stripped
//! binaries do not record, so gostw recognizes `runtime.g` and `runtime.m`
//! by their field names instead, and follows the field types to
//! `runtime.gobuf` and `runtime.stack`.

use std::collections::BTreeMap;

use object::elf;

use super::{image::Image, offsets::StructLayouts};

const KIND_STRUCT: u8 = 25;
const KIND_MASK: u8 = 0x1f;
const TYPE_SIZE: u64 = 48;
/// More fields than this is not a runtime struct gostw reads.
const MAX_FIELDS: u64 = 512;

/// A struct's fields: name -> (offset, field type descriptor address).
type Fields = BTreeMap<String, (u64, u64)>;

/// Member offsets of `runtime.g`, `runtime.m`, `runtime.gobuf`,
/// `runtime.stack`; `None` if the descriptors cannot be found or disagree.
/// `types` is the module data's `[types, etypes)`, where every descriptor
/// is; without it every read-only and data section is searched.
pub(crate) fn struct_layouts(image: &Image, types: Option<(u64, u64)>) -> Option<StructLayouts> {
    let mut found = Found::default();
    match types {
        Some((start, end)) => {
            let first = start.checked_next_multiple_of(8)?;
            let bytes = image.bytes_at(start, usize::try_from(end - start).ok()?)?;
            let skip = (first - start) as usize;
            for off in (skip..bytes.len()).step_by(8) {
                if bytes
                    .get(off + 23)
                    .is_some_and(|k| k & KIND_MASK == KIND_STRUCT)
                {
                    found.consider(image, start + off as u64)?;
                }
            }
        }
        None => {
            for s in image.sections.iter().filter(|s| {
                s.kind == elf::SHT_PROGBITS
                    && s.flags & u64::from(elf::SHF_ALLOC) != 0
                    && s.flags & u64::from(elf::SHF_EXECINSTR) == 0
                    && !s.name.ends_with("gopclntab")
            }) {
                let Some(bytes) = image.section_data(s) else {
                    continue;
                };
                let Some(first) = s.addr.checked_next_multiple_of(8) else {
                    continue;
                };
                let skip = (first - s.addr) as usize;
                for off in (skip..bytes.len()).step_by(8) {
                    if off % RELEASE_WINDOW < 8 && off >= RELEASE_WINDOW {
                        // Drop the window behind the scan from the resident set.
                        image
                            .data
                            .release(s.offset as usize + off - RELEASE_WINDOW, RELEASE_WINDOW);
                    }
                    if bytes
                        .get(off + 23)
                        .is_some_and(|k| k & KIND_MASK == KIND_STRUCT)
                    {
                        found.consider(image, s.addr + off as u64)?;
                    }
                }
            }
        }
    }
    let (g, m) = (found.g?, found.m?);
    let gobuf = struct_fields(image, g.get("sched")?.1)?;
    let stack = struct_fields(image, g.get("stack")?.1)?;
    let offsets = |f: &Fields| f.iter().map(|(k, &(off, _))| (k.clone(), off)).collect();
    Some(BTreeMap::from([
        ("runtime.g", offsets(&g)),
        ("runtime.m", offsets(&m)),
        ("runtime.gobuf", offsets(&gobuf)),
        ("runtime.stack", offsets(&stack)),
    ]))
}

/// Bytes scanned between releases of the pages behind a section scan.
const RELEASE_WINDOW: usize = 4 << 20;

/// The `runtime.g` and `runtime.m` descriptors seen so far.
#[derive(Default)]
struct Found {
    g: Option<Fields>,
    m: Option<Fields>,
}

impl Found {
    /// Look at the struct descriptor candidate at `at`; `None` if it is a
    /// second, different `runtime.g` or `runtime.m` (the search is wrong).
    fn consider(&mut self, image: &Image, at: u64) -> Option<()> {
        let Some(fields) = struct_fields(image, at) else {
            return Some(());
        };
        let has = |names: &[&str]| names.iter().all(|n| fields.contains_key(*n));
        let slot = if has(&["stack", "stackguard0", "m", "sched", "goid"]) {
            &mut self.g
        } else if has(&["g0", "morebuf", "procid", "curg", "preemptoff"]) {
            &mut self.m
        } else {
            return Some(());
        };
        if slot.as_ref().is_some_and(|prev| *prev != fields) {
            return None;
        }
        *slot = Some(fields);
        Some(())
    }
}

/// The fields of the struct type descriptor at `at`, if it looks like one.
fn struct_fields(image: &Image, at: u64) -> Option<Fields> {
    let kind = *image.bytes_at(at.checked_add(23)?, 1)?.first()?;
    if kind & KIND_MASK != KIND_STRUCT {
        return None;
    }
    let size = image.u64_at(at)?;
    let fields_at = at.checked_add(TYPE_SIZE + 8)?;
    let ptr = image.ptr_at(fields_at)?;
    let len = image.u64_at(fields_at.wrapping_add(8))?;
    let cap = image.u64_at(fields_at.wrapping_add(16))?;
    if len == 0 || len != cap || len > MAX_FIELDS {
        return None;
    }
    let mut fields = Fields::new();
    let mut last_offset = 0;
    for i in 0..len {
        let field = ptr.checked_add(i * 24)?;
        let name = name_at(image, image.ptr_at(field)?)?;
        let typ = image.ptr_at(field.wrapping_add(8))?;
        let offset = image.u64_at(field.wrapping_add(16))?;
        // Fields are laid out in order inside the struct.
        if offset < last_offset || offset > size {
            return None;
        }
        last_offset = offset;
        fields.insert(name, (offset, typ));
    }
    Some(fields)
}

/// An `abi.Name`: a flags byte, a varint length, the bytes (Go 1.17+).
fn name_at(image: &Image, at: u64) -> Option<String> {
    let mut len = 0usize;
    let mut n = 0usize;
    for i in 0..4usize {
        let b = *image.bytes_at(at.checked_add(1 + i as u64)?, 1)?.first()?;
        len |= usize::from(b & 0x7f) << (7 * i);
        n = i + 1;
        if b & 0x80 == 0 {
            break;
        }
    }
    if len == 0 || len > 256 {
        return None;
    }
    let bytes = image.bytes_at(at.checked_add(1 + n as u64)?, len)?;
    std::str::from_utf8(bytes).ok().map(str::to_owned)
}
