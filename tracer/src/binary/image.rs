//! The ELF file as the rest of the analysis reads it: its bytes (mapped,
//! see `mapped`), its sections and loadable segments, and reads at link-time
//! virtual addresses.
//!
//! Every read is bounds-checked and returns `None` past the data: the input
//! may be truncated, corrupted, or not what it claims to be.

use object::{
    Object as _, elf,
    read::elf::{FileHeader as _, ProgramHeader as _, SectionHeader as _},
};

use super::{
    Arch,
    mapped::FileBytes,
    section::{Section, le_u32, le_u64},
    symtab::Symtab,
};

/// One `PT_LOAD` program header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub vaddr: u64,
    pub memsz: u64,
    pub offset: u64,
    pub filesz: u64,
    pub flags: u32,
}

/// A parsed 64-bit little-endian ELF file.
pub(crate) struct Image {
    pub data: FileBytes,
    pub arch: Arch,
    pub pie: bool,
    pub sections: Vec<Section>,
    pub segments: Vec<Segment>,
    /// The symbol table, read in place; `None` when stripped.
    pub symtab: Option<Symtab>,
    /// `R_*_RELATIVE` relocations (address patched, target), sorted by
    /// address. A PIE's pointers may be stored only there (the file holds 0).
    relative: Vec<(u64, u64)>,
    pub gnu_build_id: Option<String>,
}

const SHF_COMPRESSED: u64 = 0x800;

impl Image {
    /// Parse `data`; the error says why it is not an ELF file gostw can read.
    pub fn parse(data: FileBytes) -> Result<Image, String> {
        let file = object::read::elf::ElfFile64::<object::Endianness>::parse(&*data)
            .map_err(|e| e.to_string())?;
        let endian = file.endian();
        if !file.is_little_endian() {
            return Err("big-endian ELF".into());
        }
        let arch = match file.architecture() {
            object::Architecture::X86_64 => Arch::Amd64,
            object::Architecture::Aarch64 => Arch::Arm64,
            other => return Err(format!("unsupported architecture {other:?}")),
        };
        let header = file.elf_header();
        let pie = header.e_type(endian) == elf::ET_DYN;
        // A cut-off file may still parse (object reads lazily): check that
        // the section headers and every segment's bytes are present.
        let shoff = header.e_shoff(endian);
        let sh_end = u64::from(header.e_shnum(endian))
            .checked_mul(u64::from(header.e_shentsize(endian)))
            .and_then(|n| n.checked_add(shoff));
        if shoff != 0 && sh_end.is_none_or(|end| end > data.len() as u64) {
            return Err(format!(
                "section headers end past the end of the file ({} bytes)",
                data.len()
            ));
        }
        let segments: Vec<Segment> = file
            .elf_program_headers()
            .iter()
            .filter(|ph| ph.p_type(endian) == elf::PT_LOAD)
            .map(|ph| Segment {
                vaddr: ph.p_vaddr(endian),
                memsz: ph.p_memsz(endian),
                offset: ph.p_offset(endian),
                filesz: ph.p_filesz(endian),
                flags: ph.p_flags(endian),
            })
            .collect();
        if let Some(seg) = segments.iter().find(|s: &&Segment| {
            s.offset
                .checked_add(s.filesz)
                .is_none_or(|end| end > data.len() as u64)
        }) {
            return Err(format!(
                "the segment at {:#x} ends past the end of the file ({} bytes)",
                seg.vaddr,
                data.len()
            ));
        }
        let table = file.elf_section_table();
        let mut sections = Vec::new();
        for sh in table.iter() {
            let name = table
                .section_name(endian, sh)
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .unwrap_or_default();
            sections.push(Section {
                name,
                addr: sh.sh_addr(endian),
                size: sh.sh_size(endian),
                offset: sh.sh_offset(endian),
                kind: sh.sh_type(endian),
                flags: sh.sh_flags(endian),
                link: sh.sh_link(endian),
            });
        }
        if let Some((i, _)) = table.iter().enumerate().find(|(_, sh)| {
            sh.sh_type(endian) != elf::SHT_NOBITS
                && sh
                    .sh_offset(endian)
                    .checked_add(sh.sh_size(endian))
                    .is_none_or(|end| end > data.len() as u64)
        }) {
            return Err(format!(
                "section {i} ends past the end of the file ({} bytes)",
                data.len()
            ));
        }
        let symtab = Symtab::locate(&sections, data.len());
        let gnu_build_id = file.build_id().ok().flatten().map(hex);
        drop(file);
        let mut image = Image {
            arch,
            pie,
            sections,
            segments,
            symtab,
            relative: Vec::new(),
            gnu_build_id,
            data,
        };
        image.relative = image.relative_relocations();
        Ok(image)
    }

    /// The `R_*_RELATIVE` entries of every RELA section, sorted.
    fn relative_relocations(&self) -> Vec<(u64, u64)> {
        let relative_type = match self.arch {
            Arch::Amd64 => elf::R_X86_64_RELATIVE,
            Arch::Arm64 => elf::R_AARCH64_RELATIVE,
        };
        let mut out = Vec::new();
        for s in self.sections.iter().filter(|s| s.kind == elf::SHT_RELA) {
            let Some(bytes) = self.section_data(s) else {
                continue;
            };
            for rela in bytes.chunks_exact(24) {
                let r_offset = le_u64(&rela[0..8]);
                let r_info = le_u64(&rela[8..16]);
                let r_addend = le_u64(&rela[16..24]);
                if (r_info & 0xffff_ffff) as u32 == relative_type {
                    out.push((r_offset, r_addend));
                }
            }
        }
        out.sort_unstable();
        // One relocation per address; a corrupted file may repeat one.
        out.dedup_by_key(|&mut (at, _)| at);
        out
    }

    /// The first section called `name`.
    pub fn section(&self, name: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }

    /// The bytes of a section as stored in the file (possibly compressed).
    pub fn section_data(&self, s: &Section) -> Option<&[u8]> {
        if !s.has_file_data() {
            return None;
        }
        let start = usize::try_from(s.offset).ok()?;
        let len = usize::try_from(s.size).ok()?;
        self.data.get(start..start.checked_add(len)?)
    }

    /// The contents of a debug section, decompressed: `SHF_COMPRESSED`
    /// (Go 1.12+ writes zlib there) or the older `.zdebug_*` form.
    pub fn debug_section(&self, name: &str) -> Option<Vec<u8>> {
        if let Some(s) = self.section(name) {
            let raw = self.section_data(s)?;
            if s.flags & SHF_COMPRESSED == 0 {
                return Some(raw.to_vec());
            }
            // Elf64_Chdr: ch_type u32, reserved u32, ch_size u64, ch_addralign u64.
            let ch_type = le_u32(raw.get(0..4)?);
            let ch_size = le_u64(raw.get(8..16)?);
            if ch_type != elf::ELFCOMPRESS_ZLIB {
                return None;
            }
            return inflate(raw.get(24..)?, ch_size);
        }
        let zname = format!(".zdebug_{}", name.strip_prefix(".debug_")?);
        let raw = self.section_data(self.section(&zname)?)?;
        // "ZLIB" then the uncompressed size, big-endian.
        if raw.get(0..4)? != b"ZLIB" {
            return Some(raw.to_vec());
        }
        let size = u64::from_be_bytes(raw.get(4..12)?.try_into().ok()?);
        inflate(raw.get(12..)?, size)
    }

    /// `len` bytes at link-time address `vaddr`, from the file's loadable
    /// segments (or, failing that, from an allocated section).
    pub fn bytes_at(&self, vaddr: u64, len: usize) -> Option<&[u8]> {
        let len64 = len as u64;
        let from_segments = self.segments.iter().find_map(|seg| {
            let rel = vaddr.checked_sub(seg.vaddr)?;
            if rel.checked_add(len64)? > seg.filesz {
                return None;
            }
            let start = usize::try_from(seg.offset.checked_add(rel)?).ok()?;
            self.data.get(start..start.checked_add(len)?)
        });
        from_segments.or_else(|| {
            self.sections.iter().find_map(|s| {
                if s.addr == 0 || !s.has_file_data() {
                    return None;
                }
                let rel = vaddr.checked_sub(s.addr)?;
                if rel.checked_add(len64)? > s.size {
                    return None;
                }
                let start = usize::try_from(s.offset.checked_add(rel)?).ok()?;
                self.data.get(start..start.checked_add(len)?)
            })
        })
    }

    pub fn u64_at(&self, vaddr: u64) -> Option<u64> {
        self.bytes_at(vaddr, 8).map(le_u64)
    }

    /// A pointer stored at `vaddr`, as the loader would leave it before
    /// adding the load bias: the relocation's addend where there is one.
    pub fn ptr_at(&self, vaddr: u64) -> Option<u64> {
        match self.relative.binary_search_by_key(&vaddr, |&(at, _)| at) {
            Ok(i) => Some(self.relative[i].1),
            Err(_) => self.u64_at(vaddr),
        }
    }

    /// Addresses patched by a RELATIVE relocation that points at `target`.
    pub fn relocations_to(&self, target: u64) -> impl Iterator<Item = u64> + '_ {
        self.relative
            .iter()
            .filter(move |&&(_, t)| t == target)
            .map(|&(at, _)| at)
    }

    /// A `.symtab` symbol called `name`: (address, size).
    pub fn symbol(&self, name: &str) -> Option<(u64, u64)> {
        let s = self.symtab?.find(&self.data, name)?;
        Some((s.value, s.size))
    }

    /// The first of `names` that is a `.symtab` function: (address, size).
    pub fn function_symbol(&self, names: &[&str]) -> Option<(u64, u64)> {
        let mut found: Vec<Option<(u64, u64)>> = vec![None; names.len()];
        for s in self.symtab?.iter(&self.data).filter(|s| s.is_function()) {
            if let Some(i) = names.iter().position(|n| n.as_bytes() == s.name) {
                found[i].get_or_insert((s.value, s.size));
            }
        }
        found.into_iter().flatten().next()
    }

    /// Call `f` with (address, word) for each aligned 8-byte word of
    /// `section`, until it returns true; the scanned pages are released
    /// behind the scan, so a large section never stays resident.
    pub fn scan_words(&self, section: &Section, mut f: impl FnMut(u64, u64) -> bool) -> bool {
        const WINDOW: usize = 4 << 20;
        let Some(bytes) = self.section_data(section) else {
            return false;
        };
        let Some(first) = section.addr.checked_next_multiple_of(8) else {
            return false;
        };
        let skip = usize::try_from(first - section.addr).unwrap_or(usize::MAX);
        let Some(bytes) = bytes.get(skip..) else {
            return false;
        };
        let start = section.offset as usize + skip;
        for (w, window) in bytes.chunks(WINDOW).enumerate() {
            let base = first + (w * WINDOW) as u64;
            let hit = window
                .chunks_exact(8)
                .enumerate()
                .any(|(i, word)| f(base + i as u64 * 8, le_u64(word)));
            self.data.release(start + w * WINDOW, window.len());
            if hit {
                return true;
            }
        }
        false
    }

    /// Drop this process's references to every page of the file (see
    /// `mapped`): what analysis touched is not kept resident.
    pub fn release_all(&self) {
        self.data.release_all();
    }

    /// The file offset of `vaddr` inside an executable segment (what a
    /// uprobe takes).
    pub fn exec_file_offset(&self, vaddr: u64) -> Option<u64> {
        self.segments
            .iter()
            .filter(|s| s.flags & elf::PF_X != 0)
            .find(|s| vaddr >= s.vaddr && vaddr - s.vaddr < s.memsz)
            .map(|s| vaddr - s.vaddr + s.offset)
    }

    /// Go's own build id, from the `Go` note (`.note.go.buildid`).
    pub fn go_build_id(&self) -> Option<String> {
        let s = self
            .sections
            .iter()
            .find(|s| s.name == ".note.go.buildid")?;
        let note = self.section_data(s)?;
        let namesz = le_u32(note.get(0..4)?) as usize;
        let descsz = le_u32(note.get(4..8)?) as usize;
        let kind = le_u32(note.get(8..12)?);
        let name = note.get(12..12usize.checked_add(namesz)?)?;
        const GO_BUILDID_NOTE: u32 = 4;
        if kind != GO_BUILDID_NOTE || !name.starts_with(b"Go\0") {
            return None;
        }
        let desc_start = 12 + namesz.next_multiple_of(4);
        let desc = note.get(desc_start..desc_start.checked_add(descsz)?)?;
        Some(String::from_utf8_lossy(desc).into_owned())
    }
}

/// Inflate a zlib stream, refusing to grow past the size it declares.
fn inflate(compressed: &[u8], declared: u64) -> Option<Vec<u8>> {
    // Go's debug sections are a few hundred MiB at most; a larger claim is corruption.
    const LIMIT: u64 = 1 << 30;
    let limit = usize::try_from(declared.min(LIMIT)).ok()?;
    miniz_oxide::inflate::decompress_to_vec_zlib_with_limit(compressed, limit).ok()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
