//! The embedded kernel programs: loading them, attaching the Go probes to a
//! binary, and reading the shared maps.

use std::path::Path;

use anyhow::{Context as _, bail};
use aya::{
    Ebpf,
    maps::{HashMap, PerCpuArray, PerCpuHashMap},
    programs::{
        UProbe,
        uprobe::{UProbeLinkId, UProbeScope},
    },
};
use tracer_common::{
    counters::Counter,
    map_names,
    pause::PauseWindow,
    process::{Probe, ProbeHitKey, TracedProcess},
};

/// The object built from `tracer-ebpf` by build.rs.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gostw-ebpf"));

/// Loaded kernel programs and the maps user space talks to.
pub struct Programs {
    ebpf: Ebpf,
}

impl Programs {
    /// Load every program and map into the kernel (nothing is attached yet).
    pub fn load() -> anyhow::Result<Self> {
        if EBPF_OBJECT.is_empty() {
            bail!(
                "this gostw was built with AYA_BUILD_SKIP=1 and carries no eBPF programs; \
                 rebuild it without that variable (cargo xtask setup installs what the build needs)"
            );
        }
        raise_memlock_limit();
        let ebpf = Ebpf::load(EBPF_OBJECT).map_err(|e| {
            // SAFETY: no preconditions.
            let root = unsafe { libc::geteuid() } == 0;
            // The errno is in the source chain (a map or program creation error).
            let msg = format!("{e} {e:?}");
            let hint = if !root || msg.contains("EPERM") || msg.contains("ermission") {
                format!(" ({})", crate::privilege::bpf_denied())
            } else {
                String::new()
            };
            // The deepest cause (the errno), unless the message already says it.
            let mut deepest: Option<&dyn std::error::Error> = None;
            let mut next = std::error::Error::source(&e);
            while let Some(s) = next {
                deepest = Some(s);
                next = s.source();
            }
            let cause = deepest
                .map(|s| s.to_string())
                .filter(|s| !e.to_string().contains(s.as_str()))
                .map_or(String::new(), |s| format!(": {s}"));
            anyhow::anyhow!("loading the eBPF programs failed{hint}: {e}{cause}")
        })?;
        Ok(Programs { ebpf })
    }

    /// Load the named uprobe program if it is not loaded yet.
    fn uprobe(&mut self, name: &str) -> anyhow::Result<&mut UProbe> {
        let prog: &mut UProbe = self
            .ebpf
            .program_mut(name)
            .with_context(|| format!("program {name} missing from the eBPF object"))?
            .try_into()?;
        if prog.fd().is_err() {
            prog.load()
                .with_context(|| format!("the kernel rejected program {name}"))?;
        }
        Ok(prog)
    }

    /// Attach `program` at `file_offset` of the executable at `binary`, for
    /// every process that runs it (the traced-process map filters).
    pub fn attach_uprobe(
        &mut self,
        program: &str,
        binary: &Path,
        file_offset: u64,
    ) -> anyhow::Result<()> {
        self.uprobe(program)?
            .attach(file_offset, binary, UProbeScope::AllProcesses)
            .with_context(|| {
                format!(
                    "attaching {program} to {} at file offset {file_offset:#x}",
                    binary.display()
                )
            })?;
        Ok(())
    }

    /// Like `attach_uprobe`, but the attachment can be undone with
    /// `detach_uprobe` (a long-running agent detaches executables that no
    /// process runs any more).
    pub fn attach_uprobe_detachable(
        &mut self,
        program: &'static str,
        binary: &Path,
        file_offset: u64,
    ) -> anyhow::Result<UprobeLink> {
        let id = self
            .uprobe(program)?
            .attach(file_offset, binary, UProbeScope::AllProcesses)
            .with_context(|| {
                format!(
                    "attaching {program} to {} at file offset {file_offset:#x}",
                    binary.display()
                )
            })?;
        Ok(UprobeLink { program, id })
    }

    /// Remove a probe attached by `attach_uprobe_detachable`.
    pub fn detach_uprobe(&mut self, link: UprobeLink) -> anyhow::Result<()> {
        self.uprobe(link.program)?
            .detach(link.id)
            .with_context(|| format!("detaching {}", link.program))
    }

    /// Drop the probe-hit counts of `tgid` (it exited; the map is bounded).
    pub fn forget_probe_hits(&mut self, tgid: u32) -> anyhow::Result<()> {
        let mut hits: PerCpuHashMap<_, ProbeHitKey, u64> =
            PerCpuHashMap::try_from(self.map_mut(map_names::PROBE_HITS)?)?;
        for probe in [
            Probe::StopTheWorld,
            Probe::StartTheWorldRet,
            Probe::Newstack,
            Probe::Copystack,
            Probe::CpuSample,
            Probe::StackCopySample,
        ] {
            // Absent is fine: that probe never fired in this process.
            let _ = hits.remove(&ProbeHitKey {
                tgid,
                probe: probe as u32,
            });
        }
        Ok(())
    }

    /// Attach `program` at the entry of the ELF symbol `symbol` of `binary`.
    pub fn attach_uprobe_symbol(
        &mut self,
        program: &str,
        binary: &Path,
        symbol: &str,
    ) -> anyhow::Result<()> {
        self.uprobe(program)?
            .attach(symbol, binary, UProbeScope::AllProcesses)
            .with_context(|| format!("attaching {program} to {symbol} in {}", binary.display()))?;
        Ok(())
    }

    /// Start tracing process `tgid`.
    pub fn trace(&mut self, tgid: u32, process: TracedProcess) -> anyhow::Result<()> {
        let mut traced: HashMap<_, u32, TracedProcess> =
            HashMap::try_from(self.map_mut(map_names::TRACED)?)?;
        traced
            .insert(tgid, process, 0)
            .with_context(|| format!("adding pid {tgid} to the traced set"))?;
        Ok(())
    }

    /// Stop tracing process `tgid` and forget its per-process state.
    pub fn untrace(&mut self, tgid: u32) -> anyhow::Result<()> {
        let mut traced: HashMap<_, u32, TracedProcess> =
            HashMap::try_from(self.map_mut(map_names::TRACED)?)?;
        // Already gone is fine: the process may never have been added.
        let _ = traced.remove(&tgid);
        Ok(())
    }

    /// Drop the open pause window of `tgid`, if any (it exited mid-pause).
    pub fn forget_pause_window(&mut self, tgid: u32) -> anyhow::Result<()> {
        let mut windows: HashMap<_, u32, PauseWindow> =
            HashMap::try_from(self.map_mut(map_names::PAUSE_WINDOWS)?)?;
        let _ = windows.remove(&tgid);
        Ok(())
    }

    /// How many times `probe` fired in process `tgid`.
    pub fn probe_hits(&self, tgid: u32, probe: Probe) -> anyhow::Result<u64> {
        let hits: PerCpuHashMap<_, ProbeHitKey, u64> =
            PerCpuHashMap::try_from(self.map(map_names::PROBE_HITS)?)?;
        let key = ProbeHitKey {
            tgid,
            probe: probe as u32,
        };
        match hits.get(&key, 0) {
            Ok(per_cpu) => Ok(per_cpu.iter().sum()),
            Err(aya::maps::MapError::KeyNotFound) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// The kernel-side health counters, summed over CPUs.
    pub fn counters(&self) -> anyhow::Result<Vec<(Counter, u64)>> {
        let array: PerCpuArray<_, u64> = PerCpuArray::try_from(self.map(map_names::COUNTERS)?)?;
        Counter::ALL
            .iter()
            .map(|&c| Ok((c, array.get(&(c as u32), 0)?.iter().sum())))
            .collect()
    }

    /// Take the `EVENTS` ring buffer (once) for an `EventReader`.
    pub fn take_events(&mut self) -> anyhow::Result<aya::maps::RingBuf<aya::maps::MapData>> {
        let map = self
            .ebpf
            .take_map(map_names::EVENTS)
            .context("the EVENTS ring buffer was already taken")?;
        Ok(aya::maps::RingBuf::try_from(map)?)
    }

    /// The loaded object, for probe families that manage their own
    /// programs and maps (e.g. `stackgrowth`).
    pub fn ebpf(&self) -> &Ebpf {
        &self.ebpf
    }

    /// The loaded object, mutably.
    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    /// A program of the object by name, for attach code outside this module
    /// (fault backends attach tracepoints, perf events and kprobes).
    pub fn program_mut(&mut self, name: &str) -> anyhow::Result<&mut aya::programs::Program> {
        self.ebpf
            .program_mut(name)
            .with_context(|| format!("program {name} missing from the eBPF object"))
    }

    /// Take ownership of a map (once), e.g. `FAULT_STACKS` for a stack reader.
    pub fn take_map(&mut self, name: &str) -> anyhow::Result<aya::maps::Map> {
        self.ebpf
            .take_map(name)
            .with_context(|| format!("map {name} missing or already taken"))
    }

    fn map(&self, name: &str) -> anyhow::Result<&aya::maps::Map> {
        self.ebpf
            .map(name)
            .with_context(|| format!("map {name} missing from the eBPF object"))
    }

    fn map_mut(&mut self, name: &str) -> anyhow::Result<&mut aya::maps::Map> {
        self.ebpf
            .map_mut(name)
            .with_context(|| format!("map {name} missing from the eBPF object"))
    }
}

/// A uprobe attachment that `Programs::detach_uprobe` can undo.
#[derive(Debug)]
pub struct UprobeLink {
    program: &'static str,
    id: UProbeLinkId,
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; lift it so large
/// ring buffers load there too. Failure is harmless on newer kernels.
fn raise_memlock_limit() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall with a valid pointer.
    let ret = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) };
    if ret != 0 {
        log::debug!(
            "setrlimit(RLIMIT_MEMLOCK) failed: {}",
            std::io::Error::last_os_error()
        );
    }
}
