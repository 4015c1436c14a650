//! Tests of the analysis on synthetic files (no Go toolchain needed): a
//! hand-made ELF holding a tiny Go function table and build information,
//! bad inputs, and property tests that mutate both. The real-binary checks
//! against the Go toolchain are in tests/kernel/binary_analysis.rs.

use std::path::Path;

use proptest::prelude::*;

use super::*;

const BASE: u64 = 0x400000;
const TEXT: u64 = 0x401000;

/// A minimal little-endian x86-64 ELF executable: one RX segment mapping the
/// whole file at `BASE`, and the given sections (name, type, flags, bytes),
/// each at the next 16-byte boundary from file offset 0x1000 (see
/// `placed_at`). A `.symtab` links to the `.strtab`.
fn elf(sections: &[(&str, u32, u64, &[u8])]) -> Vec<u8> {
    let mut out = vec![0u8; 0x1000];
    let mut placed = Vec::new();
    for (name, kind, flags, data) in sections {
        let off = out.len().next_multiple_of(16);
        out.resize(off, 0);
        out.extend_from_slice(data);
        placed.push((*name, *kind, *flags, off as u64, data.len() as u64));
    }
    // Section name table.
    let mut shstrtab = vec![0u8];
    let mut names = Vec::new();
    for name in sections.iter().map(|s| s.0).chain([".shstrtab"]) {
        names.push(shstrtab.len() as u32);
        shstrtab.extend_from_slice(name.as_bytes());
        shstrtab.push(0);
    }
    let shstr_off = out.len() as u64;
    out.extend_from_slice(&shstrtab);
    let shoff = out.len().next_multiple_of(8);
    out.resize(shoff, 0);
    // Section header index of the string table a symbol table links to.
    let strtab = sections
        .iter()
        .position(|s| s.0 == ".strtab")
        .map_or(0, |i| i as u32 + 1);
    let shdr = |name: u32, kind: u32, flags: u64, addr: u64, off: u64, size: u64| {
        let mut h = Vec::new();
        h.extend_from_slice(&name.to_le_bytes());
        h.extend_from_slice(&kind.to_le_bytes());
        h.extend_from_slice(&flags.to_le_bytes());
        h.extend_from_slice(&addr.to_le_bytes());
        h.extend_from_slice(&off.to_le_bytes());
        h.extend_from_slice(&size.to_le_bytes());
        let link = if kind == 2 { strtab } else { 0 };
        h.extend_from_slice(&link.to_le_bytes());
        h.extend_from_slice(&[0u8; 20]); // info, addralign, entsize
        h
    };
    out.extend_from_slice(&shdr(0, 0, 0, 0, 0, 0));
    for (i, (_, kind, flags, off, size)) in placed.iter().enumerate() {
        out.extend_from_slice(&shdr(names[i], *kind, *flags, BASE + off, *off, *size));
    }
    out.extend_from_slice(&shdr(
        names[placed.len()],
        3,
        0,
        0,
        shstr_off,
        shstrtab.len() as u64,
    ));
    let shnum = placed.len() as u16 + 2;
    let file_len = out.len() as u64;
    // ELF header.
    out[0..4].copy_from_slice(b"\x7fELF");
    out[4] = 2; // 64-bit
    out[5] = 1; // little-endian
    out[6] = 1;
    out[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    out[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86-64
    out[20..24].copy_from_slice(&1u32.to_le_bytes());
    out[24..32].copy_from_slice(&TEXT.to_le_bytes());
    out[32..40].copy_from_slice(&64u64.to_le_bytes()); // phoff
    out[40..48].copy_from_slice(&(shoff as u64).to_le_bytes());
    out[52..54].copy_from_slice(&64u16.to_le_bytes());
    out[54..56].copy_from_slice(&56u16.to_le_bytes());
    out[56..58].copy_from_slice(&1u16.to_le_bytes());
    out[58..60].copy_from_slice(&64u16.to_le_bytes());
    out[60..62].copy_from_slice(&shnum.to_le_bytes());
    out[62..64].copy_from_slice(&(shnum - 1).to_le_bytes());
    // One PT_LOAD, R+X, the whole file at BASE.
    let mut ph = Vec::new();
    ph.extend_from_slice(&1u32.to_le_bytes());
    ph.extend_from_slice(&5u32.to_le_bytes());
    for v in [0, BASE, BASE, file_len, file_len, 0x1000] {
        ph.extend_from_slice(&v.to_le_bytes());
    }
    out[64..120].copy_from_slice(&ph);
    out
}

/// The link-time address `elf` places section `i` of sections of these
/// lengths at.
fn placed_at(lengths: &[usize], i: usize) -> u64 {
    let mut off = 0x1000usize;
    for (j, len) in lengths.iter().enumerate() {
        off = off.next_multiple_of(16);
        if j == i {
            break;
        }
        off += len;
    }
    BASE + off as u64
}

/// Go 1.18+ build information with an inline version string.
fn buildinfo(version: &str) -> Vec<u8> {
    let mut b = b"\xff Go buildinf:".to_vec();
    b.push(8); // pointer size
    b.push(2); // flags: inline strings
    b.resize(32, 0);
    b.push(version.len() as u8);
    b.extend_from_slice(version.as_bytes());
    b.push(0); // empty module info
    b
}

/// A function table of `format`: `main.a` at TEXT (0x10 bytes, lines 10
/// then 11 from +8, file a.go) and `main.b` at TEXT+0x10 (0x10 bytes, no
/// tables).
fn pclntab(format: PclnFormat) -> Vec<u8> {
    pclntab_named(format, "main.a")
}

/// `pclntab`, with the first function called `first` (6 bytes or more).
fn pclntab_named(format: PclnFormat, first: &str) -> Vec<u8> {
    let funcnames = format!("{first}\0main.b\0");
    let funcnames = funcnames.as_bytes();
    let second_name = first.len() as u32 + 1;
    let cutab = 0u32.to_le_bytes();
    let filetab = b"a.go\0";
    // pctab: offset 0 means "no table", so start with a pad byte.
    // pcfile: -1 -> 0 (zigzag 2) for 0x10 bytes; pcln: -1 -> 10 (zigzag 22)
    // for 8 bytes, then +1 (2) for 8 bytes.
    let pctab = [0u8, 2, 0x10, 0, 22, 8, 2, 8, 0];
    let (pcfile_table, pcln_table) = (1u32, 4u32);
    let (magic, words) = match format {
        PclnFormat::Go116 => (0xffff_fffau32, 7),
        PclnFormat::Go118 => (0xffff_fff0, 8),
        PclnFormat::Go120 => (0xffff_fff1, 8),
    };
    let funcname_off = 8 + 8 * words;
    let cu_off = funcname_off + funcnames.len();
    let filetab_off = cu_off + cutab.len();
    let pctab_off = filetab_off + filetab.len();
    let pcln_off = (pctab_off + pctab.len()).next_multiple_of(8);
    let mut t = Vec::new();
    t.extend_from_slice(&magic.to_le_bytes());
    t.extend_from_slice(&[0, 0, 1, 8]);
    t.extend_from_slice(&2u64.to_le_bytes());
    t.extend_from_slice(&1u64.to_le_bytes());
    if format != PclnFormat::Go116 {
        t.extend_from_slice(&TEXT.to_le_bytes());
    }
    for w in [funcname_off, cu_off, filetab_off, pctab_off, pcln_off] {
        t.extend_from_slice(&(w as u64).to_le_bytes());
    }
    t.extend_from_slice(funcnames);
    t.extend_from_slice(&cutab);
    t.extend_from_slice(filetab);
    t.extend_from_slice(&pctab);
    t.resize(pcln_off, 0);
    // functab: 3 entries of {entry, funcoff}, then the two _func records.
    let (entry_size, func_size) = match format {
        PclnFormat::Go116 => (16u64, 44u64),
        PclnFormat::Go118 => (8, 40),
        PclnFormat::Go120 => (8, 44),
    };
    let func0 = 3 * entry_size;
    let func1 = func0 + func_size;
    for (entry, f) in [(0u64, func0), (0x10, func1), (0x20, 0)] {
        if format == PclnFormat::Go116 {
            t.extend_from_slice(&(TEXT + entry).to_le_bytes());
            t.extend_from_slice(&f.to_le_bytes());
        } else {
            t.extend_from_slice(&(entry as u32).to_le_bytes());
            t.extend_from_slice(&(f as u32).to_le_bytes());
        }
    }
    let func = |entry: u64, name: u32, pcfile: u32, pcln: u32| {
        let mut f = Vec::new();
        if format == PclnFormat::Go116 {
            f.extend_from_slice(&(TEXT + entry).to_le_bytes());
        } else {
            f.extend_from_slice(&(entry as u32).to_le_bytes());
        }
        // nameOff, args, deferreturn, pcsp, pcfile, pcln, npcdata, cuOffset.
        for w in [name, 0, 0, 0, pcfile, pcln, 0, 0] {
            f.extend_from_slice(&w.to_le_bytes());
        }
        match format {
            PclnFormat::Go116 => f.extend_from_slice(&[0, 0, 0, 0]), // funcID, pad, nfuncdata
            PclnFormat::Go118 => f.extend_from_slice(&[0, 0, 0, 0]), // funcID, flag, pad, nfuncdata
            PclnFormat::Go120 => {
                f.extend_from_slice(&1u32.to_le_bytes()); // startLine
                f.extend_from_slice(&[0, 0, 0, 0]);
            }
        }
        assert_eq!(f.len() as u64, func_size);
        f
    };
    t.extend(func(0, 0, pcfile_table, pcln_table));
    t.extend(func(0x10, second_name, 0, 0));
    t
}

fn synthetic_with(version: &str, format: PclnFormat) -> Vec<u8> {
    elf(&[
        (".gopclntab", 1, 2, &pclntab(format)),
        (".go.buildinfo", 1, 2, &buildinfo(version)),
    ])
}

fn synthetic(version: &str) -> Vec<u8> {
    synthetic_with(version, PclnFormat::Go120)
}

#[test]
fn synthetic_binary_gives_functions_and_lines() {
    let bin = GoBinary::from_bytes(Path::new("synthetic"), synthetic("go1.22.3")).unwrap();
    assert_eq!(bin.version.code(), 122);
    assert!(!bin.has_symtab && !bin.has_dwarf && !bin.pie);
    let p = bin.pclntab().unwrap();
    assert_eq!(p.format, PclnFormat::Go120);
    assert_eq!(p.len(), 2);
    assert_eq!(p.lookup("main.b"), vec![(TEXT + 0x10, TEXT + 0x20)]);
    let frame = |pc| p.frames(pc).into_iter().next().unwrap();
    assert_eq!(
        frame(TEXT + 3),
        Frame {
            function: "main.a".into(),
            file: "a.go".into(),
            line: 10,
            inlined: false,
            start_line: 1,
        }
    );
    assert_eq!(frame(TEXT + 9).line, 11);
    assert_eq!(frame(TEXT + 0x11).function, "main.b");
    assert_eq!(frame(TEXT + 0x11).file, "?");
    assert!(p.frames(TEXT + 0x20).is_empty());
    assert!(p.frames(TEXT - 1).is_empty());
    let f = bin.function("main.a").unwrap();
    assert_eq!(
        (f.address, f.size, f.source),
        (TEXT, 0x10, FunctionSource::Pclntab)
    );
    assert_eq!(f.file_offset, TEXT - BASE);
    // No DWARF, no type descriptors: the table alone gives the offsets.
    let offsets = bin.struct_offsets().unwrap();
    assert_eq!(offsets.fields["g.goid"].source, OffsetSource::VersionTable);
}

/// How a binary without `.go.buildinfo` leads to its version string.
#[derive(Clone, Copy)]
enum VersionRoute {
    /// A `runtime.buildVersion` symbol names the string header.
    Symtab,
    /// `runtime.schedinit`'s code loads from the string header.
    Schedinit,
}

/// A binary without `.go.buildinfo` whose `runtime.buildVersion` holds
/// `version`, found by `route`.
fn without_buildinfo(version: &str, route: VersionRoute) -> Vec<u8> {
    let table = pclntab_named(PclnFormat::Go120, "runtime.schedinit");
    let lengths = [0x20, table.len(), 16, version.len()];
    let (header, string) = (placed_at(&lengths, 2), placed_at(&lengths, 3));
    // mov rax, [rip+disp] at TEXT, then INT3 padding.
    let mut code = vec![0x48, 0x8b, 0x05];
    code.extend_from_slice(&((header as i64 - (TEXT as i64 + 7)) as i32).to_le_bytes());
    code.resize(0x20, 0xcc);
    if let VersionRoute::Symtab = route {
        code.fill(0xcc); // nothing refers to the variable: only its name finds it
    }
    let mut data = string.to_le_bytes().to_vec();
    data.extend_from_slice(&(version.len() as u64).to_le_bytes());
    let mut sections: Vec<(&str, u32, u64, Vec<u8>)> = vec![
        (".text", 1, 6, code),
        (".gopclntab", 1, 2, table),
        (".data", 1, 3, data),
        (".rodata", 1, 2, version.as_bytes().to_vec()),
    ];
    if let VersionRoute::Symtab = route {
        // Elf64_Sym: the null symbol, then runtime.buildVersion (STT_OBJECT).
        let mut symtab = vec![0u8; 24];
        symtab.extend_from_slice(&1u32.to_le_bytes());
        symtab.extend_from_slice(&[1, 0, 0, 0]);
        symtab.extend_from_slice(&header.to_le_bytes());
        symtab.extend_from_slice(&16u64.to_le_bytes());
        sections.push((".symtab", 2, 0, symtab));
        sections.push((".strtab", 3, 0, b"\0runtime.buildVersion\0".to_vec()));
    }
    let refs: Vec<(&str, u32, u64, &[u8])> = sections
        .iter()
        .map(|(n, k, f, d)| (*n, *k, *f, d.as_slice()))
        .collect();
    elf(&refs)
}

#[test]
fn version_without_buildinfo_comes_from_runtime_build_version() {
    let p = Path::new("no-buildinfo");
    for (route, source) in [
        (VersionRoute::Symtab, VersionSource::BuildVersionSymbol),
        (VersionRoute::Schedinit, VersionSource::BuildVersionCode),
    ] {
        let bin = GoBinary::from_bytes(p, without_buildinfo("go1.22.3", route)).unwrap();
        assert_eq!(bin.version_source, source);
        assert_eq!(bin.version_string, "go1.22.3");
        assert_eq!(bin.version.code(), 122);
        assert_eq!(bin.has_symtab, matches!(route, VersionRoute::Symtab));
        assert_eq!(
            bin.function("runtime.schedinit").unwrap().source,
            FunctionSource::Pclntab
        );
        // A version the function table's format rules out is no version.
        let err = GoBinary::from_bytes(p, without_buildinfo("go1.19.8", route))
            .err()
            .unwrap();
        assert!(err.to_string().contains("no Go version"), "{err}");
        // Nor is a string that is not a version.
        let err = GoBinary::from_bytes(p, without_buildinfo("hello, world", route))
            .err()
            .unwrap();
        assert!(err.to_string().contains("no Go version"), "{err}");
    }
    let with = GoBinary::from_bytes(p, synthetic("go1.22.3")).unwrap();
    assert_eq!(with.version_source, VersionSource::Buildinfo);
}

#[test]
fn every_pclntab_format_is_read() {
    for (version, format) in [
        ("go1.16.15", PclnFormat::Go116),
        ("go1.19.8", PclnFormat::Go118),
        ("go1.27.3", PclnFormat::Go120),
    ] {
        let bin =
            GoBinary::from_bytes(Path::new("synthetic"), synthetic_with(version, format)).unwrap();
        let p = bin.pclntab().unwrap();
        assert_eq!(p.format, format);
        assert_eq!(
            p.lookup("main.b"),
            vec![(TEXT + 0x10, TEXT + 0x20)],
            "{format:?}"
        );
        let frames = p.frames(TEXT + 9);
        assert_eq!(frames.len(), 1);
        assert_eq!(
            (
                frames[0].function.as_str(),
                frames[0].file.as_str(),
                frames[0].line
            ),
            ("main.a", "a.go", 11),
            "{format:?}"
        );
    }
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let p = Path::new("input");
    assert!(matches!(
        GoBinary::from_bytes(p, Vec::new()),
        Err(BinaryError::NotElf { .. })
    ));
    assert!(matches!(
        GoBinary::from_bytes(p, b"#!/bin/sh\necho hi\n".to_vec()),
        Err(BinaryError::NotElf { .. })
    ));
    // An ELF with no Go sections.
    assert!(matches!(
        GoBinary::from_bytes(p, elf(&[(".data", 1, 2, b"hello")])),
        Err(BinaryError::NotGo { .. })
    ));
    // Truncated: the section headers are gone.
    let data = synthetic("go1.22.3");
    let err = GoBinary::from_bytes(p, data[..data.len() - 10].to_vec())
        .err()
        .unwrap();
    assert!(err.to_string().contains("truncated or corrupted"), "{err}");
    // A version outside the table with nothing else to take offsets from.
    let err = GoBinary::from_bytes(p, synthetic("go1.99.0"))
        .unwrap()
        .struct_offsets()
        .unwrap_err();
    assert!(
        err.to_string().contains("outside gostw's offset table"),
        "{err}"
    );
    // Unparsable version string.
    assert!(GoBinary::from_bytes(p, synthetic("weird")).is_err());
    if Path::new("/bin/ls").exists() {
        assert!(matches!(
            GoBinary::open(Path::new("/bin/ls")),
            Err(BinaryError::NotGo { .. })
        ));
    }
}

#[test]
fn compressed_debug_sections_are_inflated() {
    let payload: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    let z = miniz_oxide::deflate::compress_to_vec_zlib(&payload, 6);
    // GNU style: ".zdebug_*", "ZLIB", big-endian size.
    let mut gnu = b"ZLIB".to_vec();
    gnu.extend_from_slice(&(payload.len() as u64).to_be_bytes());
    gnu.extend_from_slice(&z);
    // ELF style (what Go writes): SHF_COMPRESSED and an Elf64_Chdr.
    let mut chdr = Vec::new();
    chdr.extend_from_slice(&1u32.to_le_bytes());
    chdr.extend_from_slice(&0u32.to_le_bytes());
    chdr.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    chdr.extend_from_slice(&1u64.to_le_bytes());
    chdr.extend_from_slice(&z);
    let image = image::Image::parse(mapped::FileBytes::Owned(elf(&[
        (".zdebug_info", 1, 0, &gnu),
        (".debug_abbrev", 1, 0x800, &chdr),
        (".debug_line", 1, 0, b"plain"),
        (".debug_str", 1, 0x800, b"not a compressed section"),
    ])))
    .unwrap();
    assert_eq!(image.debug_section(".debug_info"), Some(payload.clone()));
    assert_eq!(image.debug_section(".debug_abbrev"), Some(payload));
    assert_eq!(
        image.debug_section(".debug_line").as_deref(),
        Some(&b"plain"[..])
    );
    assert_eq!(image.debug_section(".debug_str"), None);
    assert_eq!(image.debug_section(".debug_ranges"), None);
}

/// Run every parser over `data`, without panicking.
/// How far the analysis of `data` went: parsed as a Go binary, and its
/// pclntab read. A PC past every function never symbolizes.
fn analyse(data: Vec<u8>) -> (bool, bool) {
    let Ok(bin) = GoBinary::from_bytes(Path::new("fuzzed"), data) else {
        return (false, false);
    };
    let _ = bin.function("main.a");
    let _ = bin.function(NEWSTACK);
    let _ = bin.struct_offsets();
    let _ = bin.offsets_from(OffsetSource::TypeDescriptors);
    let Ok(p) = bin.pclntab() else {
        return (true, false);
    };
    let _ = p.functions().count();
    for pc in [0, TEXT, TEXT + 5, TEXT + 0x12] {
        let _ = p.frames(pc);
    }
    assert!(
        p.frames(u64::MAX).is_empty(),
        "a PC past every function symbolized"
    );
    (true, true)
}

/// The control of the mutation tests: the binaries they mutate analyse all
/// the way (so mutations reach the deep paths, not only the ELF check).
#[test]
fn unmutated_binaries_analyse_all_the_way() {
    assert_eq!(analyse(synthetic("go1.22.3")), (true, true));
    for route in [VersionRoute::Symtab, VersionRoute::Schedinit] {
        assert_eq!(analyse(without_buildinfo("go1.22.3", route)), (true, true));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_are_an_error_never_a_panic(data in prop::collection::vec(any::<u8>(), 0..4096)) {
        prop_assert_eq!(analyse(data), (false, false));
    }

    #[test]
    fn mutated_binaries_without_buildinfo_never_panic(
        writes in prop::collection::vec((0usize..0x1400, any::<u8>()), 1..32),
        symtab in any::<bool>(),
    ) {
        let route = if symtab { VersionRoute::Symtab } else { VersionRoute::Schedinit };
        let mut data = without_buildinfo("go1.22.3", route);
        let len = data.len();
        for (at, byte) in writes {
            data[at % len] = byte;
        }
        analyse(data);
    }

    #[test]
    fn mutated_synthetic_binaries_never_panic(
        writes in prop::collection::vec((0usize..0x1400, any::<u8>()), 1..32),
        cut in prop::option::of(0usize..0x1400),
    ) {
        let mut data = synthetic("go1.22.3");
        let len = data.len();
        for (at, byte) in writes {
            // Mostly the Go sections (after the first page), sometimes the headers.
            data[at % len] = byte;
        }
        if let Some(cut) = cut {
            data.truncate(cut.min(len));
        }
        analyse(data);
    }
}
