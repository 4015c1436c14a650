//! The real `Kernel`: Go binary analysis and the eBPF programs. Pauses are
//! probed per executable; stack growth by one CPU-clock sampler for the whole
//! agent (perf events are per CPU, and the traced-process map filters), started
//! with the first executable attached.

use std::{io, path::Path};

use tracer_common::process::{Probe, TracedProcess};

use super::{
    labels,
    metrics::FailureReason,
    observe::CpuSamples,
    tracker::{AttachError, Attached, Kernel},
};
use crate::{
    binary::{BinaryError, GoBinary, START_THE_WORLD, STOP_THE_WORLD},
    ebpf::{Programs, UprobeLink},
    stackgrowth::{self, StackGrowthProbes},
};

/// CPU samples per second per CPU of the stack growth sampler: the
/// affordable default of `gostw stacks` (measured at under 3% throughput on
/// a growth-heavy workload), and off the 100 Hz of timer ticks.
pub const SAMPLE_HZ: u64 = 99;

/// Whether the stack growth sampler runs.
enum Sampler {
    /// Not yet: no executable attached so far.
    NotStarted,
    /// The links live in `Programs` until it is dropped at shutdown; the
    /// handle is kept for what it knows (attach time, sample rate).
    Running { _probes: Box<StackGrowthProbes> },
    /// The kernel refused it (logged once): pauses are still traced.
    Failed,
}

/// The loaded programs, attached per executable.
pub struct EbpfKernel {
    programs: Programs,
    sampler: Sampler,
}

impl EbpfKernel {
    pub fn new(programs: Programs) -> EbpfKernel {
        EbpfKernel {
            programs,
            sampler: Sampler::NotStarted,
        }
    }

    /// Whether the stack growth sampler runs now.
    pub fn sampling(&self) -> bool {
        matches!(self.sampler, Sampler::Running { .. })
    }

    fn start_sampler(&mut self) {
        if !matches!(self.sampler, Sampler::NotStarted) {
            return;
        }
        self.sampler = match StackGrowthProbes::sampler(&mut self.programs, SAMPLE_HZ) {
            Ok(p) => Sampler::Running {
                _probes: Box::new(p),
            },
            Err(e) => {
                log::warn!(
                    "stack growth is not measured: {e:#} (the CPU-clock perf event needs CAP_PERFMON or root and perf_event_paranoid <= 2)"
                );
                Sampler::Failed
            }
        };
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
        self.start_sampler();
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
            .and_then(|()| stackgrowth::forget_process(&mut self.programs, pid))
        {
            log::warn!("forgetting pid {pid}: {e:#}");
        }
    }

    fn stop_the_world_entries(&mut self, pid: u32) -> u64 {
        self.programs
            .probe_hits(pid, Probe::StopTheWorld)
            .unwrap_or(0)
    }

    fn cpu_samples(&mut self, pid: u32) -> CpuSamples {
        let hits = |probe| self.programs.probe_hits(pid, probe).unwrap_or(0);
        CpuSamples {
            all: hits(Probe::CpuSample),
            stack_growth: hits(Probe::StackCopySample),
        }
    }

    fn sample_hz(&self) -> u64 {
        SAMPLE_HZ
    }
}
