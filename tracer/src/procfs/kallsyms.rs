//! Kernel addresses to function names, from `/proc/kallsyms` (read once, on
//! the first kernel stack to name). Addresses read as zero when the kernel
//! hides them (`kernel.kptr_restrict`, a reader without CAP_SYSLOG): then
//! nothing is named, never named wrongly.

use std::sync::OnceLock;

/// The kernel's text symbols, sorted by address.
#[derive(Debug, Default)]
pub struct KernelSymbols {
    symbols: Vec<(u64, String)>,
}

impl KernelSymbols {
    /// This host's, read once.
    pub fn host() -> &'static KernelSymbols {
        static HOST: OnceLock<KernelSymbols> = OnceLock::new();
        HOST.get_or_init(|| {
            std::fs::read_to_string("/proc/kallsyms")
                .map(|text| KernelSymbols::parse(&text))
                .unwrap_or_default()
        })
    }

    /// From the text of `/proc/kallsyms`: `address type name [module]`,
    /// text symbols only (`t`/`T`), hidden (zero) addresses dropped.
    pub fn parse(text: &str) -> KernelSymbols {
        let mut symbols: Vec<(u64, String)> = text
            .lines()
            .filter_map(|line| {
                let mut it = line.split_whitespace();
                let addr = u64::from_str_radix(it.next()?, 16).ok()?;
                let kind = it.next()?;
                let name = it.next()?;
                (addr != 0 && matches!(kind, "t" | "T")).then(|| (addr, name.to_owned()))
            })
            .collect();
        symbols.sort_unstable_by_key(|&(a, _)| a);
        KernelSymbols { symbols }
    }

    /// The function containing `addr` (the last symbol at or below it).
    pub fn name(&self, addr: u64) -> Option<&str> {
        let i = self.symbols.partition_point(|&(a, _)| a <= addr);
        (i > 0).then(|| self.symbols[i - 1].1.as_str())
    }

    /// Whether any address is known (false where the kernel hides them).
    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }
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
             ffffffffc0000000 t nf_hook [nf_tables]\n",
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
            "0000000000000000 T _stext\n0000000000000000 t rwsem_down_read_slowpath\n",
        );
        assert!(s.is_empty());
        assert_eq!(s.name(0xffffffff81100000), None);
    }
}
