//! The real `Kernel`: Go binary analysis and the eBPF programs.

use std::{io, path::Path};

use tracer_common::process::{Probe, TracedProcess};

use super::{
    labels,
    metrics::FailureReason,
    tracker::{AttachError, Attached, Kernel},
};
use crate::{
    binary::{BinaryError, GoBinary, START_THE_WORLD, STOP_THE_WORLD},
    ebpf::{Programs, UprobeLink},
};

/// The loaded programs, attached per executable.
pub struct EbpfKernel {
    programs: Programs,
}

impl EbpfKernel {
    pub fn new(programs: Programs) -> EbpfKernel {
        EbpfKernel { programs }
    }

    pub fn programs(&mut self) -> &mut Programs {
        &mut self.programs
    }

    fn attach_probes(&mut self, binary: &GoBinary) -> anyhow::Result<Vec<UprobeLink>> {
        let mut links = Vec::new();
        let result = (|| {
            let stop = binary.function(STOP_THE_WORLD)?;
            links.push(self.programs.attach_uprobe_detachable(
                "stw_stop",
                &binary.path,
                stop.file_offset,
            )?);
            let start = binary.function(START_THE_WORLD)?;
            for ret in start.ret_file_offsets {
                links.push(self.programs.attach_uprobe_detachable(
                    "stw_start_ret",
                    &binary.path,
                    ret,
                )?);
            }
            Ok(())
        })();
        match result {
            Ok(()) => Ok(links),
            Err(e) => {
                self.detach(links);
                Err(e)
            }
        }
    }
}

fn gone(pid: u32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

fn failed(reason: FailureReason, message: impl ToString) -> AttachError {
    AttachError::Failed {
        reason,
        message: message.to_string(),
    }
}

impl Kernel for EbpfKernel {
    type Probes = Vec<UprobeLink>;

    fn attach(&mut self, pid: u32, path: &Path) -> Result<Attached<Self::Probes>, AttachError> {
        let binary = match GoBinary::open(path) {
            Ok(b) => b,
            Err(BinaryError::NotGo { .. } | BinaryError::NotElf { .. }) => {
                return Err(AttachError::NotGo);
            }
            Err(BinaryError::Read { source, .. })
                if source.kind() == io::ErrorKind::NotFound
                    || source.raw_os_error() == Some(libc::ESRCH)
                    || gone(pid) =>
            {
                return Err(failed(FailureReason::ProcessGone, source));
            }
            Err(e @ BinaryError::Read { .. }) => return Err(failed(FailureReason::Analysis, e)),
            Err(e) => return Err(failed(FailureReason::Analysis, e)),
        };
        let offsets = binary
            .struct_offsets()
            .map_err(|e| failed(FailureReason::UnsupportedGo, e))?;
        // Both probes must exist before anything is attached.
        for f in [STOP_THE_WORLD, START_THE_WORLD] {
            binary
                .function(f)
                .map_err(|e| failed(FailureReason::Analysis, e))?;
        }
        let probes = self.attach_probes(&binary).map_err(|e| {
            if gone(pid) {
                failed(FailureReason::ProcessGone, format!("{e:#}"))
            } else {
                failed(FailureReason::Attach, format!("{e:#}"))
            }
        })?;
        let build_id = binary
            .build_id()
            .map(labels::short_build_id)
            .unwrap_or_default();
        let code = binary.version.code();
        Ok(Attached {
            probes,
            traced: TracedProcess {
                go_version: code,
                flags: if code < 121 {
                    TracedProcess::FLAG_REASON_FROM_PREEMPTOFF
                } else {
                    0
                },
                offsets: offsets.to_kernel(),
            },
            go_version: binary.version.to_string(),
            build_id,
        })
    }

    fn detach(&mut self, probes: Self::Probes) {
        for link in probes {
            if let Err(e) = self.programs.detach_uprobe(link) {
                log::warn!("{e:#}");
            }
        }
    }

    fn trace(&mut self, pid: u32, traced: &TracedProcess) -> anyhow::Result<()> {
        self.programs.trace(pid, *traced)
    }

    fn untrace(&mut self, pid: u32) {
        if let Err(e) = self
            .programs
            .untrace(pid)
            .and_then(|()| self.programs.forget_probe_hits(pid))
            .and_then(|()| self.programs.forget_pause_window(pid))
        {
            log::warn!("forgetting pid {pid}: {e:#}");
        }
    }

    fn stop_the_world_entries(&mut self, pid: u32) -> u64 {
        self.programs
            .probe_hits(pid, Probe::StopTheWorld)
            .unwrap_or(0)
    }
}
