//! A tracing session: the loaded programs, the binaries they are attached to,
//! and the processes being traced.

use std::{collections::HashSet, os::unix::fs::MetadataExt as _};

use anyhow::Context as _;
use tracer_common::{
    counters::Counter,
    process::{Probe, TracedProcess},
};

use crate::{
    binary::{GoBinary, START_THE_WORLD, STOP_THE_WORLD},
    ebpf::Programs,
    events::EventReader,
};

/// Loaded programs plus what they are attached to.
pub struct Session {
    programs: Programs,
    /// Executables probed, by (device, inode): uprobes live on the inode, so
    /// `/proc/A/exe`, `/proc/B/exe` and the real path of one binary must be
    /// probed once, or every pause would be seen twice.
    attached: HashSet<(u64, u64)>,
}

impl Session {
    /// Load the kernel programs.
    pub fn new() -> anyhow::Result<Self> {
        Ok(Session {
            programs: Programs::load()?,
            attached: HashSet::new(),
        })
    }

    /// Attach the pause probes to `binary` (once per executable; every
    /// process running it is then filtered by the traced set).
    pub fn attach_binary(&mut self, binary: &GoBinary) -> anyhow::Result<()> {
        let meta = std::fs::metadata(&binary.path)
            .with_context(|| format!("reading {}", binary.path.display()))?;
        if self.attached.contains(&(meta.dev(), meta.ino())) {
            return Ok(());
        }
        let stop = binary.function(STOP_THE_WORLD)?;
        self.programs
            .attach_uprobe("stw_stop", &binary.path, stop.file_offset)?;
        let start = binary.function(START_THE_WORLD)?;
        for ret in start.ret_file_offsets {
            self.programs
                .attach_uprobe("stw_start_ret", &binary.path, ret)?;
        }
        self.attached.insert((meta.dev(), meta.ino()));
        Ok(())
    }

    /// Start tracing process `pid`, which runs `binary`.
    pub fn trace_process(&mut self, pid: u32, binary: &GoBinary) -> anyhow::Result<()> {
        self.programs.trace(
            pid,
            TracedProcess {
                go_version: binary.version.code(),
                flags: if binary.version.code() < 121 {
                    TracedProcess::FLAG_REASON_FROM_PREEMPTOFF
                } else {
                    0
                },
                offsets: binary.struct_offsets()?.to_kernel(),
            },
        )
    }

    /// Stop tracing `pid` (it exited, or tracing ends) and drop its kernel
    /// state. Its probe-hit counts stay readable.
    pub fn forget_process(&mut self, pid: u32) -> anyhow::Result<()> {
        self.programs.untrace(pid)?;
        self.programs.forget_pause_window(pid)
    }

    /// The reader of the events ring buffer (once per session).
    pub fn event_reader(&mut self) -> anyhow::Result<EventReader> {
        EventReader::new(self.programs.take_events()?).context("watching the events ring buffer")
    }

    /// The kernel-side health counters, summed over CPUs.
    pub fn counters(&self) -> anyhow::Result<Vec<(Counter, u64)>> {
        self.programs.counters()
    }

    /// Stop-the-world entries seen for `pid` so far.
    pub fn stop_the_world_count(&self, pid: u32) -> anyhow::Result<u64> {
        self.programs.probe_hits(pid, Probe::StopTheWorld)
    }

    /// The loaded programs, for callers that need the maps directly.
    pub fn programs(&mut self) -> &mut Programs {
        &mut self.programs
    }
}
