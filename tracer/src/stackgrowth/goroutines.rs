//! How many goroutines a process has had at the same time, for the memory
//! a bigger starting stack would cost: `runtime.allglen`. Go never frees a
//! goroutine's `g`; `allgs` keeps one per goroutine that ever existed at once
//! (dead ones wait there for reuse), so its length is the peak goroutine
//! count (system goroutines included). Read from `/proc/PID/mem`; found by
//! the symbol table, or on stripped binaries from `runtime.allgadd`'s code
//! (`GoBinary::allglen`). Where it cannot be found the count is unknown:
//! the goroutines seen growing are not a count of goroutines alive at once.

use std::{fs::File, os::unix::fs::FileExt as _};

use super::ElfSymbols;

/// Where the count in a summary came from.
pub const SOURCE: &str = "runtime.allglen: peak goroutines";

/// Reads of a changing pair before giving up.
const ATTEMPTS: usize = 3;

/// The current `runtime.allglen` of process `pid`, if readable. Where
/// `len(allgs)` is known too, the two must agree (they do, but for the
/// instant inside `allgadd` between its two stores): a wrong address cannot
/// pass for a count.
pub fn peak_goroutines(pid: u32, symbols: &ElfSymbols) -> Option<u64> {
    let addr = symbols.allglen_address()?;
    let mem = File::open(format!("/proc/{pid}/mem")).ok()?;
    let read = |at: u64| {
        let mut buf = [0u8; 8];
        mem.read_exact_at(&mut buf, at).ok()?;
        Some(u64::from_le_bytes(buf))
    };
    for _ in 0..ATTEMPTS {
        let n = read(addr)?;
        // A garbage read (wrong bias) is not a goroutine count.
        if n == 0 || n >= 1 << 32 {
            return None;
        }
        match symbols.allgs_len_address() {
            None => return Some(n),
            Some(len_at) if read(len_at)? == n => return Some(n),
            Some(_) => {}
        }
    }
    None
}
