//! Symbolizing user stacks of faults: Go programs through the pclntab
//! symbolizer (`crate::symbolize`: works on stripped binaries, expands
//! inlined calls); other executables through their ELF `.symtab`.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::Context as _;
use object::{Object as _, ObjectSegment as _};

/// Turns a link-time address of one executable into a function name.
pub trait Symbolizer: Send + Sync {
    fn function(&self, addr: u64) -> Option<&str>;
}

/// Function symbols of an ELF executable, sorted by address.
pub struct ElfSymtab {
    /// (start, end, name)
    functions: Vec<(u64, u64, String)>,
    /// Lowest PT_LOAD virtual address (page aligned), for the PIE load bias.
    pub base_vaddr: u64,
}

impl ElfSymtab {
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let data = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let file =
            object::File::parse(&*data).with_context(|| format!("parsing {}", path.display()))?;
        let functions = crate::symbolize::elf_text_symbols(&file);
        let base_vaddr = file.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff;
        Ok(ElfSymtab {
            functions,
            base_vaddr,
        })
    }
}

impl Symbolizer for ElfSymtab {
    fn function(&self, addr: u64) -> Option<&str> {
        let i = self
            .functions
            .partition_point(|f| f.0 <= addr)
            .checked_sub(1)?;
        let (start, end, name) = &self.functions[i];
        (addr >= *start && addr < *end).then_some(name.as_str())
    }
}

/// One traced process's executable: its symbols and where it is mapped.
pub struct ProcessImage {
    pub exe: PathBuf,
    symbols: Arc<dyn Symbolizer>,
    /// Mapped address ranges of the executable, and the load bias
    /// (runtime address - link address; 0 unless PIE).
    ranges: Vec<(u64, u64)>,
    bias: u64,
}

impl ProcessImage {
    /// Read `/proc/PID/exe` and `/proc/PID/maps` (call while the process lives).
    pub fn of_process(pid: u32) -> anyhow::Result<Self> {
        let exe = fs::read_link(format!("/proc/{pid}/exe"))
            .with_context(|| format!("pid {pid}: reading /proc/{pid}/exe"))?;
        let maps = fs::read_to_string(format!("/proc/{pid}/maps"))
            .with_context(|| format!("pid {pid}: reading /proc/{pid}/maps"))?;
        // Read the file through the process's root so containers work.
        let path =
            PathBuf::from(format!("/proc/{pid}/root")).join(exe.strip_prefix("/").unwrap_or(&exe));
        let table = ElfSymtab::open(&path).or_else(|_| ElfSymtab::open(&exe))?;
        let (ranges, first_start) = exe_ranges(&maps, &exe.to_string_lossy());
        let bias = first_start.map_or(0, |s| s.saturating_sub(table.base_vaddr));
        Ok(ProcessImage {
            exe,
            symbols: Arc::new(table),
            ranges,
            bias,
        })
    }

    /// The function containing runtime address `pc`, if it is in the executable.
    pub fn function(&self, pc: u64) -> Option<&str> {
        if !self.ranges.iter().any(|&(s, e)| pc >= s && pc < e) {
            return None;
        }
        self.symbols.function(pc - self.bias)
    }
}

/// Ranges of `/proc/PID/maps` lines that map `exe`, and the start of the
/// mapping at file offset 0.
fn exe_ranges(maps: &str, exe: &str) -> (Vec<(u64, u64)>, Option<u64>) {
    let mut ranges = Vec::new();
    let mut first = None;
    for line in maps.lines() {
        let mut it = line.split_whitespace();
        let (Some(range), Some(_perms), Some(offset)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        let path = it.nth(2).unwrap_or("");
        if path != exe {
            continue;
        }
        let Some((s, e)) = range.split_once('-') else {
            continue;
        };
        let (Ok(s), Ok(e)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16)) else {
            continue;
        };
        if u64::from_str_radix(offset, 16) == Ok(0) && first.is_none() {
            first = Some(s);
        }
        ranges.push((s, e));
    }
    (ranges, first)
}

/// How one process's PCs are named.
enum Image {
    Go(crate::symbolize::ProcessSymbolizer),
    Elf(ProcessImage),
}

impl Image {
    fn of_process(pid: u32) -> anyhow::Result<Image> {
        match crate::symbolize::ProcessSymbolizer::for_pid(pid) {
            Ok(s) => Ok(Image::Go(s)),
            Err(e) => {
                log::debug!("pid {pid}: no Go symbolizer ({e}); using the ELF symbol table");
                Ok(Image::Elf(ProcessImage::of_process(pid)?))
            }
        }
    }

    /// Function names for the frame at `pc` (innermost first: inlined
    /// calls, then the function holding the code); `return_address` for
    /// every frame but the faulting one.
    fn names(&self, pc: u64, return_address: bool) -> Vec<String> {
        match self {
            Image::Go(s) => {
                let frames = if return_address {
                    s.symbolize_return_address(pc)
                } else {
                    s.symbolize(pc)
                };
                frames
                    .into_iter()
                    .map(|f| {
                        if f.inlined {
                            format!("{}{INLINED}", f.function)
                        } else {
                            f.function
                        }
                    })
                    .collect()
            }
            Image::Elf(img) => {
                let at = if return_address {
                    pc.saturating_sub(1)
                } else {
                    pc
                };
                img.function(at).map(str::to_owned).into_iter().collect()
            }
        }
    }
}

/// Symbolized stacks, cached by (process, stack id).
#[derive(Default)]
pub struct StackSymbolizer {
    images: HashMap<u32, Option<Image>>,
    cache: HashMap<(u32, i32), Arc<[String]>>,
}

/// Suffix of a frame inlined into the one that follows it.
pub const INLINED: &str = " (inlined)";

/// Most frames kept per stack.
pub const MAX_FRAMES: usize = 24;

impl StackSymbolizer {
    /// Remember process `pid`'s executable now (before it can exit).
    pub fn add_process(&mut self, pid: u32) -> anyhow::Result<()> {
        let image = Image::of_process(pid)?;
        self.images.insert(pid, Some(image));
        Ok(())
    }

    /// The symbolized stack `stack_id` of process `tgid`; `frames` reads the
    /// raw instruction pointers (innermost first) on a cache miss.
    pub fn stack(
        &mut self,
        tgid: u32,
        stack_id: i32,
        frames: impl FnOnce() -> Vec<u64>,
    ) -> Arc<[String]> {
        if stack_id < 0 {
            return Arc::from(Vec::new());
        }
        if let Some(s) = self.cache.get(&(tgid, stack_id)) {
            return s.clone();
        }
        let image = self
            .images
            .entry(tgid)
            .or_insert_with(|| Image::of_process(tgid).ok());
        let names: Arc<[String]> = frames()
            .into_iter()
            .enumerate()
            .flat_map(|(i, pc)| {
                // Outer frames are return addresses: name the call.
                let names = image
                    .as_ref()
                    .map(|img| img.names(pc, i > 0))
                    .unwrap_or_default();
                if names.is_empty() {
                    vec![format!("{pc:#x}")]
                } else {
                    names
                }
            })
            .take(MAX_FRAMES)
            .collect();
        self.cache.insert((tgid, stack_id), names.clone());
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_of_the_executable() {
        let maps = "\
00400000-00401000 r--p 00000000 fd:00 12 /bin/x
00401000-00500000 r-xp 00001000 fd:00 12 /bin/x
00500000-00600000 rw-p 00000000 00:00 0
7f0000000000-7f0000001000 r-xp 00000000 fd:00 13 /lib/libc.so
";
        let (r, first) = exe_ranges(maps, "/bin/x");
        assert_eq!(r, vec![(0x400000, 0x401000), (0x401000, 0x500000)]);
        assert_eq!(first, Some(0x400000));
    }

    #[test]
    fn own_test_binary_symbolizes_its_functions() {
        let exe = std::env::current_exe().unwrap();
        let t = ElfSymtab::open(&exe).unwrap();
        assert!(!t.functions.is_empty());
        let (start, _, name) = &t.functions[t.functions.len() / 2];
        assert_eq!(t.function(*start), Some(name.as_str()));
    }
}
