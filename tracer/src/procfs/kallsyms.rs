//! Kernel addresses to function names, from `/proc/kallsyms` (read once, on
//! the first kernel stack to name). Addresses read as zero when the kernel
//! hides them (`kernel.kptr_restrict`, a reader without CAP_SYSLOG): then
//! nothing is named, never named wrongly. The names live in one string
//! (120 000 text symbols here: about 4.5 MB in all, where a `String` each
//! took twice that).

use std::sync::OnceLock;

/// What is lost where the host hides the addresses (the warning at start,
/// and `gostw check`).
pub const HIDDEN: &str = "kernel frames are not named: /proc/kallsyms shows no addresses \
     (kernel.kptr_restrict, or not root); every kernel wait is of kind unknown";

/// The kernel's text symbols, sorted by address.
#[derive(Debug, Default)]
pub struct KernelSymbols {
    /// (address, where its name starts in `names`), by address.
    symbols: Vec<(u64, u32)>,
    names: String,
}

impl KernelSymbols {
    /// This host's, read once.
    pub fn host() -> &'static KernelSymbols {
        static HOST: OnceLock<KernelSymbols> = OnceLock::new();
        HOST.get_or_init(|| {
            std::fs::File::open("/proc/kallsyms")
                .map(|f| KernelSymbols::parse(std::io::BufReader::new(f)))
                .unwrap_or_default()
        })
    }

    /// Start reading this host's in the background, so that naming the
    /// first kernel stack does not stall the caller for the read (50 ms in
    /// an optimized build here, ten times that in a debug one). Whether the
    /// host hides the addresses is known at once from [`addresses_hidden`].
    pub fn preload() {
        std::thread::spawn(|| KernelSymbols::host().is_empty());
    }

    /// From `/proc/kallsyms`: `address type name [module]` lines, text
    /// symbols only (`t`/`T`), hidden (zero) addresses dropped. Read line by
    /// line (the file is 7 MB), as bytes, not `str`: 120 000 lines took a
    /// debug build of the tests half a second that way.
    pub fn parse(text: impl std::io::BufRead) -> KernelSymbols {
        let mut s = KernelSymbols::default();
        for line in text.split(b'\n').map_while(Result::ok) {
            let mut it = line.split(|&b| b == b' ' || b == b'\t');
            let (Some(addr), Some(kind), Some(name)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            let Some(addr) = hex(addr) else {
                continue;
            };
            if addr == 0 || !matches!(kind, b"t" | b"T") {
                continue;
            }
            let (Ok(name), Ok(at)) = (std::str::from_utf8(name), u32::try_from(s.names.len()))
            else {
                continue;
            };
            s.names.push_str(name);
            s.names.push('\n');
            s.symbols.push((addr, at));
        }
        s.symbols.sort_unstable_by_key(|&(a, _)| a);
        s.symbols.shrink_to_fit();
        s.names.shrink_to_fit();
        s
    }

    /// The function containing `addr` (the last symbol at or below it).
    pub fn name(&self, addr: u64) -> Option<&str> {
        let i = self.symbols.partition_point(|&(a, _)| a <= addr);
        let at = self.symbols.get(i.checked_sub(1)?)?.1 as usize;
        self.names[at..].split('\n').next()
    }

    /// Whether any address is known (false where the kernel hides them).
    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }
}

/// Whether this host hides kernel addresses from gostw: the first text
/// symbol of `/proc/kallsyms` reads as zero (or the file cannot be read).
/// Cheap enough to ask before tracing begins, unlike reading every symbol.
pub fn host_addresses_hidden() -> bool {
    std::fs::File::open("/proc/kallsyms")
        .map(|f| addresses_hidden(std::io::BufReader::new(f)))
        .unwrap_or(true)
}

/// The first text symbol's address is zero, or there is none. Per-CPU
/// symbols (type `A`) lead the file at address zero even where nothing is
/// hidden, so only `t`/`T` lines count.
fn addresses_hidden(text: impl std::io::BufRead) -> bool {
    for line in text.split(b'\n').map_while(Result::ok) {
        let mut it = line.split(|&b| b == b' ' || b == b'\t');
        if let (Some(addr), Some(b"t" | b"T")) = (it.next(), it.next()) {
            return hex(addr).is_none_or(|a| a == 0);
        }
    }
    true
}

/// A hexadecimal number of up to 16 digits.
fn hex(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        let v = (d as char).to_digit(16)?;
        Some(n << 4 | u64::from(v))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_named_by_the_symbol_at_or_below_it() {
        let s = KernelSymbols::parse(
            "ffffffff81000000 T _stext\n\
             ffffffff81100000 t rwsem_down_read_slowpath\n\
             ffffffff81100400 D some_data\n\
             ffffffff81100800 T down_read_killable\n\
             ffffffffc0000000 t nf_hook\t[nf_tables]\n\
             zzzz T not_an_address\n"
                .as_bytes(),
        );
        assert_eq!(s.name(0xffffffff81100000), Some("rwsem_down_read_slowpath"));
        // Data symbols are not functions: the text symbol below still holds.
        assert_eq!(s.name(0xffffffff811004ff), Some("rwsem_down_read_slowpath"));
        assert_eq!(s.name(0xffffffff81100801), Some("down_read_killable"));
        assert_eq!(s.name(0xffffffffc0000010), Some("nf_hook"));
        assert_eq!(s.name(0x1000), None);
    }

    #[test]
    fn hidden_addresses_name_nothing() {
        let s = KernelSymbols::parse(
            "0000000000000000 T _stext\n0000000000000000 t rwsem_down_read_slowpath\n".as_bytes(),
        );
        assert!(s.is_empty());
        assert_eq!(s.name(0xffffffff81100000), None);
    }

    #[test]
    fn hidden_is_told_by_the_first_text_symbol_not_the_per_cpu_ones() {
        let shown = "0000000000000000 A fixed_percpu_data\n\
                     0000000000001000 A cpu_debug_store\n\
                     ffffffff81000000 T _stext\n";
        assert!(!addresses_hidden(shown.as_bytes()));
        let hidden = "0000000000000000 A fixed_percpu_data\n\
                      0000000000000000 T _stext\n";
        assert!(addresses_hidden(hidden.as_bytes()));
        assert!(addresses_hidden("".as_bytes()));
    }
}
