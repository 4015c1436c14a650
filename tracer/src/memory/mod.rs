//! Memory and swap exposure of a Go process now: what is resident and what
//! is swapped out, split by what Go uses it for (heap arenas, GC metadata
//! outside them, binary and files, other), how much of the next GC's
//! metadata reads would fault, the process's memory cgroup and the host's
//! swap traffic, and advice from what was measured.
//!
//! Wiring: `Exposure::read(pid)` at any time (it only reads /proc), or
//! `Exposure::read_with(pid, &exe, &options)` with an `Executable` kept per
//! binary (`Executable::for_image(Arc<ExecutableImage>)`);
//! `HostSwap::snapshot()` at trace start and end, `HostSwap::delta(&a, &b)`;
//! `advice(&exposure, &Evidence { host_swap, pauses, stack_growth,
//! throttling })`; `MemoryReport` (serde) or `render_text`.
//!
//! - `smaps`: the kernel's per-mapping figures (per page: `procfs::pagemap`).
//! - `executable`, `mheap`, `procmem`: the runtime's own heap index (its
//!   layouts from the binary's DWARF), read from the process's resident
//!   memory (never from swap).
//! - `layout`: what the mapping layout alone tells (stripped binaries);
//!   `c_alloc`: C's allocations in cgo processes, by glibc's headers.
//! - `classify`: mappings and ranges into classes.
//! - `cgroup`, `vmstat`: cgroup (v1, v2) and host context.
//! - `advice`, `render`: findings and the text report.
//! - `watch`: the exposure of traced processes over a trace, off the
//!   event loop.

pub mod advice;
pub mod c_alloc;
pub mod cgroup;
pub mod classes;
pub mod classify;
pub mod executable;
pub mod layout;
pub mod mheap;
pub mod procmem;
mod read;
pub mod render;
pub mod smaps;
pub mod vmstat;
pub mod watch;

pub use self::{
    advice::{
        Advice, AdviceKind, Evidence, PauseEvidence, SLOW_PAUSE_NS, StackGrowthEvidence, StackSite,
        ThrottlingEvidence, advice,
    },
    cgroup::{CgroupMemory, CgroupVersion, Limit, PageCache},
    classes::{ClassUsage, MemoryClass, Part, Source, Usage},
    executable::Executable,
    read::ReadOptions,
    render::{render_advice, render_exposure, render_text},
    vmstat::{HostSwap, HostSwapDelta},
};
use std::io;

use crate::{binary::BinaryError, units::fmt_bytes};

/// Why a process's memory could not be read; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("process {pid}: no such process")]
    NoProcess { pid: u32 },
    #[error("process {pid} has exited (no memory left to read)")]
    Gone { pid: u32 },
    #[error(
        "process {pid}: cannot read {what}: permission denied (gostw memory needs root or CAP_SYS_PTRACE)"
    )]
    Permission { pid: u32, what: String },
    #[error("process {pid}: reading {what}: {source}")]
    Read {
        pid: u32,
        what: String,
        source: std::io::Error,
    },
    #[error("process {pid}: {what}: {reason}")]
    Malformed {
        pid: u32,
        what: String,
        reason: String,
    },
    #[error(
        "process {pid} ({exe}) is not a Go program: {} resident and {} swapped can only be split into \
         file-backed memory ({} resident) and anonymous memory ({} resident, {} swapped); \
         Go heap arenas and GC metadata exist only in Go programs",
        fmt_bytes(.summary.resident), fmt_bytes(.summary.swapped),
        fmt_bytes(.summary.file_resident), fmt_bytes(.summary.anon_resident),
        fmt_bytes(.summary.anon_swapped)
    )]
    NotGo {
        pid: u32,
        exe: String,
        summary: PlainSummary,
    },
    #[error("{source}")]
    Binary { pid: u32, source: BinaryError },
    #[error("reading {what}: {source}")]
    Host {
        what: String,
        source: std::io::Error,
    },
}

impl MemoryError {
    /// The error for a failed read of `what` of process `pid`: gone,
    /// not allowed, or the failure itself.
    pub(crate) fn from_io(pid: u32, what: &str, e: io::Error) -> MemoryError {
        let gone = e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH);
        if gone {
            if std::path::Path::new(&format!("/proc/{pid}")).exists() {
                return MemoryError::Read {
                    pid,
                    what: what.to_owned(),
                    source: e,
                };
            }
            return MemoryError::Gone { pid };
        }
        if e.kind() == io::ErrorKind::PermissionDenied {
            return MemoryError::Permission {
                pid,
                what: what.to_owned(),
            };
        }
        MemoryError::Read {
            pid,
            what: what.to_owned(),
            source: e,
        }
    }

    /// Why a process has no memory to read: gone, a zombie (exited, not yet
    /// reaped) or a kernel thread (never had any).
    pub(crate) fn no_memory(pid: u32) -> MemoryError {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return MemoryError::NoProcess { pid };
        }
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"));
        match exe {
            Err(e) if e.kind() == io::ErrorKind::NotFound && !is_zombie(pid) => {
                MemoryError::Malformed {
                    pid,
                    what: "its memory".into(),
                    reason: "a kernel thread has no user memory".into(),
                }
            }
            _ => MemoryError::Gone { pid },
        }
    }
}

/// Whether `pid` has exited and waits to be reaped.
fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// What smaps alone says of a process that is not Go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlainSummary {
    pub resident: u64,
    pub swapped: u64,
    pub file_resident: u64,
    pub anon_resident: u64,
    pub anon_swapped: u64,
}

/// Where the heap arenas are and how they were found.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ArenaSummary {
    pub source: Source,
    /// 64 MiB arenas.
    pub count: u64,
    /// Address ranges (hex), contiguous arenas merged.
    pub ranges: Vec<String>,
}

/// How much of the next GC's metadata reads would fault. The GC reads its
/// metadata every cycle (span structures when sweeping and marking, the
/// arena index and arena metadata when preparing mark roots, mark bits),
/// so each swapped-out page of the GC metadata class is a major fault when
/// the GC next touches it: at most one fault per page, and at least one per
/// swap readahead window (`1 << vm.page-cluster` pages) if readahead brings
/// in every neighbour. Pages of the class the GC does not read (unused page
/// summaries, profiling buckets) make it an upper bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MetadataReads {
    pub swapped_bytes: u64,
    pub swapped_pages: u64,
    pub faults_at_most: u64,
    pub faults_at_least: u64,
    pub readahead_pages: u64,
    /// Heap arena bytes in swap: the mark phase reads every live object,
    /// faulting those pages too (outside pauses, but it lengthens the cycle).
    pub heap_swapped_bytes: u64,
}

impl MetadataReads {
    /// The estimate for `swapped_bytes` of metadata in swap.
    pub fn estimate(
        swapped_bytes: u64,
        heap_swapped_bytes: u64,
        page_size: u64,
        page_cluster: Option<u64>,
    ) -> MetadataReads {
        let pages = swapped_bytes.div_ceil(page_size);
        // The kernel's default page-cluster is 3 (8 pages).
        let readahead_pages = 1u64 << page_cluster.unwrap_or(3).min(10);
        MetadataReads {
            swapped_bytes,
            swapped_pages: pages,
            faults_at_most: pages,
            faults_at_least: pages.div_ceil(readahead_pages),
            readahead_pages,
            heap_swapped_bytes,
        }
    }
}

/// The host's memory settings that matter for swap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HostMemory {
    pub swap_total_bytes: u64,
    pub swap_free_bytes: u64,
    /// `vm.swappiness`.
    pub swappiness: Option<u64>,
    /// `vm.page-cluster`: swap readahead reads up to `1 << page_cluster` pages.
    pub page_cluster: Option<u64>,
}

/// A process's memory and swap exposure now.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Exposure {
    pub pid: u32,
    pub exe: String,
    pub go_version: String,
    /// Whether the binary has a symbol table and DWARF (the runtime's heap
    /// index can be read only with both).
    pub symbols: bool,
    pub dwarf: bool,
    /// A C runtime shares the address space (cgo).
    pub c_runtime: bool,
    pub page_size: u64,
    /// `CLOCK_MONOTONIC` when read, ns.
    pub at_ns: u64,
    pub total: Usage,
    /// Heap arenas, GC metadata, binary and files, other; always all four.
    pub classes: Vec<ClassUsage>,
    pub arenas: ArenaSummary,
    pub gc_metadata_reads: MetadataReads,
    pub cgroup: Option<CgroupMemory>,
    pub host: HostMemory,
    /// What could not be found, and how that limits the figures.
    pub notes: Vec<String>,
}

impl Exposure {
    /// Read the exposure of `pid` now, with everything gostw can use.
    pub fn read(pid: u32) -> Result<Exposure, MemoryError> {
        read::read(pid, &Executable::of_process(pid)?, &ReadOptions::default())
    }

    /// Read it for a process of `exe` (analysed once per executable), with
    /// `options` (e.g. the mapping layout alone).
    pub fn read_with(
        pid: u32,
        exe: &Executable,
        options: &ReadOptions,
    ) -> Result<Exposure, MemoryError> {
        read::read(pid, exe, options)
    }

    /// The figures of one class.
    pub fn class(&self, class: MemoryClass) -> &ClassUsage {
        self.classes
            .iter()
            .find(|c| c.class == class)
            .expect("every class is present")
    }
}

/// What `gostw memory --json` prints: the exposure, the host's swap
/// traffic over the command's interval, and the advice.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MemoryReport {
    pub schema_version: u32,
    pub exposure: Exposure,
    pub host_swap: Option<HostSwapDelta>,
    pub advice: Vec<Advice>,
}

/// The current JSON schema of `MemoryReport`.
pub const SCHEMA_VERSION: u32 = 1;

impl MemoryReport {
    /// The report of `exposure`, with the host's swap traffic over the
    /// interval as the advice's only evidence.
    pub fn new(exposure: Exposure, host_swap: Option<HostSwapDelta>) -> MemoryReport {
        let evidence = Evidence {
            host_swap,
            ..Evidence::default()
        };
        MemoryReport {
            schema_version: SCHEMA_VERSION,
            advice: advice(&exposure, &evidence),
            exposure,
            host_swap,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_read_estimate_bounds() {
        let r = MetadataReads::estimate(100 * 4096 + 1, 0, 4096, Some(3));
        assert_eq!(r.swapped_pages, 101);
        assert_eq!(r.faults_at_most, 101);
        assert_eq!(r.faults_at_least, 13);
        assert_eq!(r.readahead_pages, 8);
        let r = MetadataReads::estimate(4096 * 5, 0, 4096, Some(0));
        assert_eq!((r.faults_at_most, r.faults_at_least), (5, 5));
        assert_eq!(MetadataReads::estimate(0, 0, 4096, None).faults_at_least, 0);
    }
}
