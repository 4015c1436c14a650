//! A tracing session: the loaded programs, the binaries they are attached to,
//! and the processes being traced.

use std::{collections::HashSet, path::PathBuf};

use tracer_common::process::{Probe, TracedProcess};

use crate::{
    binary::{GoBinary, START_THE_WORLD, STOP_THE_WORLD},
    ebpf::Programs,
};

/// Loaded programs plus what they are attached to.
pub struct Session {
    programs: Programs,
    attached: HashSet<PathBuf>,
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
        if !self.attached.insert(binary.path.clone()) {
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

    /// Stop-the-world entries seen for `pid` so far.
    pub fn stop_the_world_count(&self, pid: u32) -> anyhow::Result<u64> {
        self.programs.probe_hits(pid, Probe::StopTheWorld)
    }

    /// The loaded programs, for callers that need the maps directly.
    pub fn programs(&mut self) -> &mut Programs {
        &mut self.programs
    }
}
