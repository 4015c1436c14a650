//! How many goroutines a process has had at the same time, for the memory
//! a bigger starting stack would cost: `runtime.allglen`. Go never frees a
//! goroutine's `g`; `allgs` keeps one per goroutine that ever existed at once
//! (dead ones wait there for reuse), so its length is the peak goroutine
//! count (system goroutines included). Read from `/proc/PID/mem`.

use std::{fs::File, os::unix::fs::FileExt as _};

use crate::image::ProcessImage;

/// Where the count in a summary came from.
pub const SOURCE: &str = "runtime.allglen: peak goroutines";

/// The current `runtime.allglen` of the process, if readable.
pub fn peak_goroutines(process: &ProcessImage) -> Option<u64> {
    let link = process.exe.binary.symbol("runtime.allglen")?;
    let addr = process.runtime_address(link)?;
    let mem = File::open(format!("/proc/{}/mem", process.pid)).ok()?;
    let mut buf = [0u8; 8];
    mem.read_exact_at(&mut buf, addr).ok()?;
    let n = u64::from_le_bytes(buf);
    // A garbage read (wrong bias) is not a goroutine count.
    (n > 0 && n < 1 << 32).then_some(n)
}
