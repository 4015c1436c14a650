//! The pieces of gostw's reproduction scenarios, shared by the kernel tests
//! (tracer/tests/kernel) and `cargo xtask demo`/`scenario`, so there is one
//! way to make a Go process's pauses take major faults: a swap file, a
//! memory cgroup, pushing the process's anonymous memory to swap between GCs
//! and dropping the swap cache that leaves behind, and the `gcswap`
//! workload's stdin/stdout protocol (scripts/workloads/gcswap). Also what
//! every test and bench of the agent's HTTP uses: a free port, one GET, the
//! samples of /metrics (`loopback`), and the check every test of /metrics
//! makes (`promtool_check`); and a writer keeping a memory cgroup's page
//! cache dirty (`DirtyWriter`), for reclaim that waits on writeback.
//!
//! Everything that changes the machine is undone on drop, also when the
//! caller fails. Errors are `std::io::Error`s whose text names what failed.

mod cgroup;
mod gcswap;
pub mod loopback;
mod pageout;
mod promtool;
mod swap;
mod writer;

pub use cgroup::MemCgroup;
pub use gcswap::{GcSwapControl, PAGEOUT_ARGS, PAGEOUT_ENV, PAGEOUT_ROUNDS};
pub use pageout::{majflt, page_out, page_out_ranges, swap_out};
pub use promtool::promtool_check;
pub use swap::SwapFile;
pub use writer::DirtyWriter;

/// `s` with the regular expression metacharacters escaped (for the agent's
/// `--match`; xtask has no regex crate and needs no more than this).
pub fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `e` with `what` in front of its message (same kind).
fn context(what: impl std::fmt::Display, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes_a_path_for_match() {
        assert_eq!(
            super::regex_escape("/tmp/a.b/c+d[1]"),
            r"/tmp/a\.b/c\+d\[1\]"
        );
    }
}
