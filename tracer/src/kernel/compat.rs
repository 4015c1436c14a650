//! Which program variants this kernel needs (`tracer_common::compat`):
//! the helpers the preferred programs call are probed once, at load, and
//! each program whose helper is missing is loaded as its variant instead.

use aya::{
    maps::Array,
    programs::ProgramType,
    sys::{BpfHelper, is_helper_supported},
};
use tracer_common::compat::{COMPAT_MAX_MS, FALLBACKS, Fallback, Helper, TASK_LAYOUT, TaskLayout};

use super::btf::Btf;

/// x86-64's kernel stack (`THREAD_SIZE`, 16 KiB without KASAN); the saved
/// user registers are the last `struct pt_regs` in it.
const THREAD_SIZE: u32 = 16 * 1024;

/// The helpers this kernel lacks, and where the variants find registers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Compat {
    pub missing: Vec<Helper>,
    /// For the variants without `bpf_task_pt_regs`; `Err`: why it is unknown.
    pub layout: Option<Result<TaskLayout, String>>,
}

impl Compat {
    /// Probe the running kernel. `GOSTW_COMPAT=force` loads every variant
    /// even where the helpers exist (to compare both on one kernel).
    pub fn detect() -> Compat {
        let force = std::env::var_os("GOSTW_COMPAT").is_some_and(|v| v == "force");
        let missing: Vec<Helper> = Helper::ALL
            .into_iter()
            .filter(|&h| force || !supported(h))
            .collect();
        // Read on every kernel: the explanation's scheduler programs check
        // a preempted laggard's registers through it too.
        let layout = Some(task_layout().map_err(|e| format!("{e:#}")));
        Compat { missing, layout }
    }

    /// The program to load for `name` on this kernel.
    pub fn program(&self, name: &'static str) -> &'static str {
        self.fallback(name).map_or(name, |f| f.fallback)
    }

    /// The variant used in place of `name`, if any.
    pub fn fallback(&self, name: &str) -> Option<&'static Fallback> {
        FALLBACKS
            .iter()
            .find(|f| f.preferred == name && self.missing.contains(&f.helper))
    }

    /// The variants in use, in words (one line each).
    pub fn describe(&self) -> Vec<String> {
        FALLBACKS
            .iter()
            .filter(|f| self.missing.contains(&f.helper))
            .map(|f| {
                format!(
                    "{} -> {}: no {} (Linux {}); the variant {}",
                    f.preferred,
                    f.fallback,
                    f.helper.name(),
                    f.helper.since(),
                    f.how.replace("COMPAT_MAX_MS", &COMPAT_MAX_MS.to_string())
                )
            })
            .collect()
    }

    /// Why the register-reading variants cannot find user registers here
    /// (they then lose what needs them), if so.
    pub fn layout_error(&self) -> Option<&str> {
        match &self.layout {
            Some(Err(e)) if self.missing.contains(&Helper::TaskPtRegs) => Some(e),
            _ => None,
        }
    }

    /// Write the task layout into the object's map.
    pub fn write_layout(&self, ebpf: &mut aya::Ebpf) -> anyhow::Result<()> {
        let Some(Ok(layout)) = &self.layout else {
            return Ok(());
        };
        let map = ebpf
            .map_mut(TASK_LAYOUT)
            .ok_or_else(|| anyhow::anyhow!("map {TASK_LAYOUT} missing from the eBPF object"))?;
        let mut array: Array<_, TaskLayout> = Array::try_from(map)?;
        array.set(0, layout, 0)?;
        Ok(())
    }
}

fn supported(helper: Helper) -> bool {
    let id = match helper {
        Helper::TaskPtRegs => BpfHelper::BPF_FUNC_task_pt_regs,
        Helper::Loop => BpfHelper::BPF_FUNC_loop,
    };
    // A probe that cannot tell (no privilege) keeps the preferred program:
    // its own load then fails with the real reason.
    is_helper_supported(ProgramType::TracePoint, id).unwrap_or(true)
}

/// `task_struct.stack` and `sizeof(struct pt_regs)` from the kernel's BTF.
fn task_layout() -> anyhow::Result<TaskLayout> {
    let btf = Btf::vmlinux()?;
    let stack_offset = btf.offset("task_struct", &["stack"])?;
    let regs = btf.size("pt_regs")?;
    Ok(TaskLayout {
        stack_offset,
        regs_offset: THREAD_SIZE - regs,
    })
}

/// `BPF_F_NO_PREALLOC`.
const NO_PREALLOC: u32 = 1;

/// Before 6.1 (its BPF memory allocator) the verifier refuses perf_event
/// programs (the fault end, the stack sampler) that use a hash map which is
/// not preallocated. There, `object` is copied with every map's
/// `BPF_F_NO_PREALLOC` cleared (legacy `maps` section: `bpf_map_def`,
/// `map_flags` at byte 16); `None` where the kernel needs no change.
pub fn preallocated_maps(object: &[u8]) -> anyhow::Result<Option<Vec<u64>>> {
    use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
    let old = aya::util::KernelVersion::current()
        .is_ok_and(|v| v < aya::util::KernelVersion::new(6, 1, 0));
    if !old {
        return Ok(None);
    }
    // u64 words keep the copy aligned for the ELF parser.
    let mut words = vec![0u64; object.len().div_ceil(8)];
    let bytes: &mut [u8] = bytemuck_bytes(&mut words);
    bytes[..object.len()].copy_from_slice(object);
    let elf = object::File::parse(object)?;
    let Some(maps) = elf.section_by_name("maps") else {
        return Ok(None);
    };
    let (start, _) = maps
        .file_range()
        .ok_or_else(|| anyhow::anyhow!("the maps section has no file data"))?;
    let mut changed = Vec::new();
    for sym in elf.symbols() {
        if sym.section_index() != Some(maps.index()) {
            continue;
        }
        let at = (start + sym.address()) as usize + 16;
        let Some(field) = bytes.get_mut(at..at + 4) else {
            continue;
        };
        let flags = u32::from_le_bytes(field.try_into()?);
        if flags & NO_PREALLOC != 0 {
            field.copy_from_slice(&(flags & !NO_PREALLOC).to_le_bytes());
            changed.push(sym.name().unwrap_or("?").to_owned());
        }
    }
    log::info!(
        "Linux before 6.1: perf_event programs need preallocated hash maps; preallocating {}",
        changed.join(", ")
    );
    Ok(Some(words))
}

fn bytemuck_bytes(words: &mut [u64]) -> &mut [u8] {
    // SAFETY: any u64 slice is a valid byte slice of 8 times its length.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), words.len() * 8) }
}
