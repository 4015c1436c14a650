//! The embedded kernel object: loading it, typed handles to its programs
//! (each loaded once, on first use) and its maps. Program and map names come
//! from `tracer_common`, next to the kernel side that defines them.

use super::compat::Compat;
use anyhow::{Context as _, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray, PerCpuHashMap, PerCpuValues, RingBuf, StackTraceMap},
    programs::{KProbe, PerfEvent, Program, TracePoint, UProbe},
};
use tracer_common::{
    counters::Counter,
    fault::FaultCounts,
    map_names,
    pause::PauseWindow,
    process::{MAX_TRACED, Probe, ProbeHitKey, TracedProcess},
};

/// The object built from `tracer-ebpf` by build.rs.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gostw-ebpf"));

/// A program type whose `load()` takes no arguments.
pub trait Loadable {
    fn load_once(&mut self) -> Result<(), aya::programs::ProgramError>;
}

macro_rules! loadable {
    ($($t:ty),*) => {$(
        impl Loadable for $t {
            fn load_once(&mut self) -> Result<(), aya::programs::ProgramError> {
                if self.fd().is_err() {
                    self.load()?;
                }
                Ok(())
            }
        }
    )*};
}
loadable!(UProbe, TracePoint, KProbe, PerfEvent);

/// The loaded object: programs (not attached here) and maps.
pub struct Object {
    ebpf: Ebpf,
    /// The program variants this kernel needs.
    compat: Compat,
}

impl Object {
    /// Load every map into the kernel; programs load when first used.
    pub fn load() -> anyhow::Result<Object> {
        if EBPF_OBJECT.is_empty() {
            bail!(
                "this gostw was built with AYA_BUILD_SKIP=1 and carries no eBPF programs; \
                 rebuild it without that variable (cargo xtask setup installs what the build needs)"
            );
        }
        raise_memlock_limit();
        // The programs read raw offsets (tracepoint formats, Go's structs
        // from binary analysis) and need no CO-RE relocation, so the kernel's
        // BTF (megabytes, about half a second to parse here) is not loaded.
        let patched = super::compat::preallocated_maps(EBPF_OBJECT)?;
        let bytes: &[u8] = match &patched {
            // SAFETY: the words hold the copied object; the tail past its
            // length is cut off.
            Some(words) => unsafe {
                &std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), words.len() * 8)
                    [..EBPF_OBJECT.len()]
            },
            None => EBPF_OBJECT,
        };
        let ebpf = EbpfLoader::new().btf(None).load(bytes).map_err(|e| {
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
        let compat = Compat::detect();
        for line in compat.describe() {
            log::info!("older kernel: {line}");
        }
        if let Some(why) = compat.layout_error() {
            log::warn!(
                "this kernel has no bpf_task_pt_regs and its task layout is unknown ({why}): \
                 sampled stack growth only counts samples taken in user mode, and the \
                 tracepoint fault backend counts every sleep of a thread that was in a fault \
                 as inside it"
            );
        }
        let mut object = Object { ebpf, compat };
        object.compat.write_layout(&mut object.ebpf)?;
        Ok(object)
    }

    /// The program variants this kernel needs.
    pub fn compat(&self) -> &Compat {
        &self.compat
    }

    /// Program `name`, as type `T`, loaded into the kernel: its variant
    /// where this kernel lacks a helper it calls (`Compat`).
    pub fn program<T>(&mut self, name: &str) -> anyhow::Result<&mut T>
    where
        T: Loadable,
        for<'a> &'a mut T: TryFrom<&'a mut Program, Error = aya::programs::ProgramError>,
    {
        let name = self.compat.fallback(name).map_or(name, |f| f.fallback);
        let prog: &mut T = self
            .ebpf
            .program_mut(name)
            .with_context(|| format!("program {name} missing from the eBPF object"))?
            .try_into()?;
        prog.load_once()
            .with_context(|| format!("the kernel rejected program {name}"))?;
        Ok(prog)
    }

    /// Every program of the object by name (for cost statistics).
    pub fn programs(&self) -> impl Iterator<Item = (&str, &Program)> {
        self.ebpf.programs()
    }

    /// The whole object, for code that reads program information.
    pub fn ebpf(&self) -> &Ebpf {
        &self.ebpf
    }

    /// Add process `tgid` to the traced set, with its closed pause window
    /// (`explained`: its pauses are explained too).
    pub fn trace(
        &mut self,
        tgid: u32,
        process: TracedProcess,
        explained: bool,
    ) -> anyhow::Result<()> {
        let mut windows: HashMap<_, u32, PauseWindow> =
            HashMap::try_from(self.map_mut(map_names::PAUSE_WINDOWS)?)?;
        windows
            .insert(tgid, PauseWindow::closed(&process, explained), 0)
            .with_context(|| {
                format!(
                    "adding the pause window of pid {tgid} (at most {MAX_TRACED} processes are \
                     traced at once)"
                )
            })?;
        let mut counts: PerCpuHashMap<_, u32, FaultCounts> =
            PerCpuHashMap::try_from(self.map_mut(map_names::FAULT_COUNTS)?)?;
        let zeros = PerCpuValues::try_from(vec![FaultCounts::default(); nr_cpus()?])?;
        counts
            .insert(tgid, zeros, 0)
            .with_context(|| format!("adding the fault counts of pid {tgid}"))?;
        let mut traced: HashMap<_, u32, TracedProcess> =
            HashMap::try_from(self.map_mut(map_names::TRACED)?)?;
        traced.insert(tgid, process, 0).with_context(|| {
            format!(
                "adding pid {tgid} to the traced set (at most {MAX_TRACED} processes are \
                     traced at once)"
            )
        })
    }

    /// Remove process `tgid` and its entries in the maps every probe family
    /// shares (the stack-growth family's own map: `stacks::forget_process`).
    pub fn forget(&mut self, tgid: u32) -> anyhow::Result<()> {
        // Absent entries are fine: a probe that never fired left none.
        let mut traced: HashMap<_, u32, TracedProcess> =
            HashMap::try_from(self.map_mut(map_names::TRACED)?)?;
        let _ = traced.remove(&tgid);
        let mut windows: HashMap<_, u32, PauseWindow> =
            HashMap::try_from(self.map_mut(map_names::PAUSE_WINDOWS)?)?;
        let _ = windows.remove(&tgid);
        let mut counts: PerCpuHashMap<_, u32, FaultCounts> =
            PerCpuHashMap::try_from(self.map_mut(map_names::FAULT_COUNTS)?)?;
        let _ = counts.remove(&tgid);
        let mut hits: PerCpuHashMap<_, ProbeHitKey, u64> =
            PerCpuHashMap::try_from(self.map_mut(map_names::PROBE_HITS)?)?;
        for probe in Probe::ALL {
            let _ = hits.remove(&ProbeHitKey {
                tgid,
                probe: probe as u32,
            });
        }
        Ok(())
    }

    /// How many times `probe` fired in process `tgid`. The two probes that
    /// fire most in a traced process count in the entry they read anyway:
    /// stop entries in the pause window, CPU samples in the traced entry.
    pub fn probe_hits(&self, tgid: u32, probe: Probe) -> anyhow::Result<u64> {
        let absent = |r: Result<u64, aya::maps::MapError>| match r {
            Err(aya::maps::MapError::KeyNotFound) => Ok(0),
            r => r.map_err(anyhow::Error::from),
        };
        match probe {
            Probe::StopTheWorld => {
                let windows: HashMap<_, u32, PauseWindow> =
                    HashMap::try_from(self.map(map_names::PAUSE_WINDOWS)?)?;
                return absent(windows.get(&tgid, 0).map(|w| w.entries));
            }
            Probe::CpuSample => {
                let traced: HashMap<_, u32, TracedProcess> =
                    HashMap::try_from(self.map(map_names::TRACED)?)?;
                return absent(traced.get(&tgid, 0).map(|p| p.cpu_samples));
            }
            _ => {}
        }
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

    /// The major faults of process `tgid` counted in the kernel so far,
    /// summed over CPUs (None when it is not traced).
    pub fn fault_counts(&self, tgid: u32) -> anyhow::Result<Option<FaultCounts>> {
        let counts: PerCpuHashMap<_, u32, FaultCounts> =
            PerCpuHashMap::try_from(self.map(map_names::FAULT_COUNTS)?)?;
        match counts.get(&tgid, 0) {
            Ok(per_cpu) => Ok(Some(per_cpu.iter().fold(
                FaultCounts::default(),
                |mut sum, c| {
                    sum.merge(c);
                    sum
                },
            ))),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The kernel-side health counters, summed over CPUs.
    pub fn counters(&self) -> anyhow::Result<Vec<(Counter, u64)>> {
        let array: PerCpuArray<_, u64> = PerCpuArray::try_from(self.map(map_names::COUNTERS)?)?;
        Counter::ALL
            .iter()
            .map(|&c| {
                let per_cpu = array.get(&(c as u32), 0)?;
                Ok((c, per_cpu.iter().fold(0u64, |a, &n| a.wrapping_add(n))))
            })
            .collect()
    }

    /// Take the `EVENTS` ring buffer (once) for the engine's reader.
    pub fn take_events(&mut self) -> anyhow::Result<RingBuf<MapData>> {
        let map = self
            .ebpf
            .take_map(map_names::EVENTS)
            .context("the EVENTS ring buffer was already taken")?;
        Ok(RingBuf::try_from(map)?)
    }

    /// Take the `PAUSE_EVENTS` ring buffer (once) for the engine's reader.
    pub fn take_pause_events(&mut self) -> anyhow::Result<RingBuf<MapData>> {
        let map = self
            .ebpf
            .take_map(map_names::PAUSE_EVENTS)
            .context("the PAUSE_EVENTS ring buffer was already taken")?;
        Ok(RingBuf::try_from(map)?)
    }

    /// Take the laggards' user-stack map (once) for the engine's decoder.
    pub fn take_pause_stacks(&mut self) -> anyhow::Result<StackTraceMap<MapData>> {
        let map = self
            .ebpf
            .take_map(map_names::PAUSE_STACKS)
            .context("the PAUSE_STACKS map was already taken")?;
        Ok(StackTraceMap::try_from(map)?)
    }

    pub(super) fn map(&self, name: &str) -> anyhow::Result<&aya::maps::Map> {
        self.ebpf
            .map(name)
            .with_context(|| format!("map {name} missing from the eBPF object"))
    }

    pub(super) fn map_mut(&mut self, name: &str) -> anyhow::Result<&mut aya::maps::Map> {
        self.ebpf
            .map_mut(name)
            .with_context(|| format!("map {name} missing from the eBPF object"))
    }
}

/// Possible CPUs: the length of a per-CPU map's values.
fn nr_cpus() -> anyhow::Result<usize> {
    aya::util::nr_cpus().map_err(|(_, e)| anyhow::anyhow!("reading the possible CPUs: {e}"))
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
