//! Where `runtime.allglen` is: the length of `allgs`, which holds one `g`
//! per goroutine that ever existed at the same time (Go never frees a `g`),
//! so its value is the process's peak goroutine count.
//!
//! With a symbol table it is found by name. Without one, from the code that
//! writes it: `runtime.allgadd` ends with
//! `atomic.Storeuintptr(&allglen, uintptr(len(allgs)))` on every Go version
//! with `allglen` (1.16-1.27), which on amd64 is
//!
//! ```text
//! MOVQ  runtime.allgs+8(SB), CX   // len(allgs), which append just stored
//! LEAQ  runtime.allglen(SB), DX
//! XCHGQ CX, 0(DX)                 // the atomic store
//! ```
//!
//! so allglen is the target of the XCHG whose value was loaded from a word
//! the function also stores to (append's new length) and whose word before
//! it (the slice's pointer) the function also addresses. The other atomic
//! store there (`allgptr`) stores the slice's pointer, which fails the test.
//! `len(allgs)` comes out with it: a reader checks that both read the same,
//! as they do outside allgadd, so a wrong address cannot pass as a count.
//!
//! On arm64 the same store is
//!
//! ```text
//! ADRP  allgs+8, R27; MOVD (allgs+8 - page)(R27), R1   // len(allgs)
//! ADRP  allglen, R2; ADD $off, R2, R2                  // &allglen
//! STLR  R1, (R2)                                       // the atomic store
//! ```
//!
//! and the same test picks it.

use std::collections::{HashMap, HashSet};

use iced_x86::{Mnemonic, OpKind, Register};

use super::{
    Arch, Pclntab, arm64,
    coderefs::{Access, amd64_base, amd64_instructions, data_refs},
    image::Image,
};

/// How `runtime.allglen` was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AllglenSource {
    /// The symbol table names it.
    Symtab,
    /// Decoded from `runtime.allgadd`'s store to it.
    AllgaddCode,
}

/// The runtime's goroutine-count variables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Allglen {
    /// Link-time address of `runtime.allglen`.
    pub address: u64,
    /// Link-time address of `len(runtime.allgs)`, equal to allglen outside
    /// `allgadd` (for checking a read).
    pub allgs_len: Option<u64>,
    pub source: AllglenSource,
}

const ALLGADD: &str = "runtime.allgadd";

/// Find `runtime.allglen` in `image`.
pub(crate) fn find(image: &Image, pclntab: Option<&Pclntab>) -> Option<Allglen> {
    if let Some((address, _)) = image.symbol("runtime.allglen") {
        return Some(Allglen {
            address,
            allgs_len: image.symbol("runtime.allgs").map(|(a, _)| a + 8),
            source: AllglenSource::Symtab,
        });
    }
    let (entry, end) = pclntab?
        .lookup(ALLGADD)
        .into_iter()
        .max_by_key(|&(e, end)| end.saturating_sub(e))?;
    let code = image.bytes_at(entry, usize::try_from(end.checked_sub(entry)?).ok()?)?;
    let (address, allgs_len) = match image.arch {
        Arch::Amd64 => from_allgadd(entry, code)?,
        Arch::Arm64 => from_allgadd_arm64(entry, code)?,
    };
    Some(Allglen {
        address,
        allgs_len: Some(allgs_len),
        source: AllglenSource::AllgaddCode,
    })
}

/// What a register is known to hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Holds {
    /// The address `a` (`LEA reg, [rip+a]`).
    Address(u64),
    /// The word loaded from `a` (`MOV reg, [rip+a]`).
    LoadedFrom(u64),
}

/// (allglen, len(allgs)) from the amd64 code of `runtime.allgadd`.
fn from_allgadd(entry: u64, code: &[u8]) -> Option<(u64, u64)> {
    let mut regs: HashMap<Register, Holds> = HashMap::new();
    let mut referenced = HashSet::new();
    let mut stored = HashSet::new();
    // (XCHG target, the address its value was loaded from)
    let mut atomic_stores = Vec::new();
    for insn in amd64_instructions(entry, code) {
        let rip_target = insn
            .is_ip_rel_memory_operand()
            .then(|| insn.ip_rel_memory_address());
        if let Some(t) = rip_target {
            referenced.insert(t);
            if insn.mnemonic() == Mnemonic::Mov && insn.op0_kind() == OpKind::Memory {
                stored.insert(t);
            }
        }
        let op0_reg = (insn.op_count() > 0 && insn.op0_kind() == OpKind::Register)
            .then(|| insn.op0_register().full_register());
        match insn.mnemonic() {
            Mnemonic::Lea if rip_target.is_some() => {
                if let (Some(r), Some(t)) = (op0_reg, rip_target) {
                    regs.insert(r, Holds::Address(t));
                }
            }
            Mnemonic::Mov if rip_target.is_some() && op0_reg.is_some() => {
                if let (Some(r), Some(t)) = (op0_reg, rip_target) {
                    regs.insert(r, Holds::LoadedFrom(t));
                }
            }
            Mnemonic::Xchg => {
                let value = if insn.op0_kind() == OpKind::Memory {
                    insn.op1_register()
                } else {
                    insn.op0_register()
                }
                .full_register();
                let target = rip_target.or_else(|| {
                    let (base, disp) = amd64_base(&insn)?;
                    match regs.get(&base)? {
                        Holds::Address(a) => Some(a.wrapping_add(disp)),
                        Holds::LoadedFrom(_) => None,
                    }
                });
                if let (Some(t), Some(Holds::LoadedFrom(from))) = (target, regs.get(&value)) {
                    atomic_stores.push((t, *from));
                }
                // XCHG leaves the old memory value in the register.
                regs.remove(&value);
            }
            // A call may change every register.
            Mnemonic::Call => regs.clear(),
            _ => {
                if let Some(r) = op0_reg {
                    regs.remove(&r);
                }
            }
        }
    }
    allglen_store(atomic_stores, &stored, &referenced)
}

/// Of the atomic stores (target, where the stored value was loaded from),
/// the last whose value is a slice's length that the function also stores
/// (append's), with the slice's pointer before it also used.
fn allglen_store(
    atomic_stores: Vec<(u64, u64)>,
    stored: &HashSet<u64>,
    referenced: &HashSet<u64>,
) -> Option<(u64, u64)> {
    atomic_stores.into_iter().rev().find(|&(target, len)| {
        target != len
            && stored.contains(&len)
            && len
                .checked_sub(8)
                .is_some_and(|ptr| referenced.contains(&ptr))
    })
}

/// (allglen, len(allgs)) from the arm64 code of `runtime.allgadd`.
fn from_allgadd_arm64(entry: u64, code: &[u8]) -> Option<(u64, u64)> {
    let refs: HashMap<u64, (u64, Access)> = data_refs(Arch::Arm64, entry, code)
        .into_iter()
        .map(|r| (r.at, (r.target, r.access)))
        .collect();
    let referenced: HashSet<u64> = refs.values().map(|&(t, _)| t).collect();
    let stored: HashSet<u64> = refs
        .values()
        .filter(|(_, a)| *a == Access::Store)
        .map(|&(t, _)| t)
        .collect();
    let mut regs: [Option<Holds>; 32] = [None; 32];
    let mut atomic_stores = Vec::new();
    for (pc, w) in arm64::words(entry, code) {
        if let Some((value, base)) = arm64::store_release(w) {
            if let (Some(Holds::Address(t)), Some(Holds::LoadedFrom(from))) =
                (regs[base as usize], regs[value as usize])
            {
                atomic_stores.push((t, from));
            }
            continue;
        }
        if arm64::call_target(pc, w).is_some() {
            // A call may change every register.
            regs = [None; 32];
            continue;
        }
        regs[arm64::destination(w) as usize] = match refs.get(&pc) {
            Some(&(t, Access::Load)) => Some(Holds::LoadedFrom(t)),
            Some(&(t, Access::Address)) => Some(Holds::Address(t)),
            _ => None,
        };
    }
    allglen_store(atomic_stores, &stored, &referenced)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Go 1.27.3's allgadd tail, re-based: allgs at 0x2000, allgptr at
    /// 0x3000, allglen at 0x4000 (RIP-relative displacements computed
    /// below).
    fn allgadd_tail() -> (u64, Vec<u8>) {
        let entry = 0x1000u64;
        let mut code = Vec::new();
        // An instruction `prefix disp32` whose operand is [rip + target].
        let rip = |code: &mut Vec<u8>, prefix: &[u8], target: u64| {
            let end = entry + (code.len() + prefix.len() + 4) as u64;
            code.extend_from_slice(prefix);
            code.extend_from_slice(&((target as i64 - end as i64) as i32).to_le_bytes());
        };
        rip(&mut code, &[0x48, 0x89, 0x1d], 0x2008); // MOVQ BX, allgs+8 (append's len)
        rip(&mut code, &[0x48, 0x8b, 0x1d], 0x2000); // MOVQ allgs, BX
        rip(&mut code, &[0x48, 0x8d, 0x0d], 0x3000); // LEAQ allgptr, CX
        code.extend_from_slice(&[0x48, 0x87, 0x19]); // XCHGQ BX, 0(CX)
        rip(&mut code, &[0x48, 0x8b, 0x0d], 0x2008); // MOVQ allgs+8, CX
        rip(&mut code, &[0x48, 0x8d, 0x15], 0x4000); // LEAQ allglen, DX
        code.extend_from_slice(&[0x48, 0x87, 0x0a]); // XCHGQ CX, 0(DX)
        code.push(0xc3);
        (entry, code)
    }

    #[test]
    fn the_store_of_len_allgs_is_allglen() {
        let (entry, code) = allgadd_tail();
        assert_eq!(from_allgadd(entry, &code), Some((0x4000, 0x2008)));
    }

    #[test]
    fn no_store_of_a_slice_length_finds_nothing() {
        let (entry, mut code) = allgadd_tail();
        // Without append's store to allgs+8 the pattern is not allgadd's.
        code.drain(..7);
        assert_eq!(from_allgadd(entry + 7, &code), None);
        // A call between the load and the store forgets what CX held.
        let (entry, code) = allgadd_tail();
        let split = code.len() - 1 - 3 - 7;
        let mut with_call = code[..split].to_vec();
        with_call.extend_from_slice(&[0xe8, 0, 0, 0, 0]); // CALL next
        with_call.extend_from_slice(&code[split..]);
        assert_eq!(from_allgadd(entry, &with_call), None);
    }

    /// Go 1.27.3's arm64 allgadd: its stores to allgs and allgs+8 (append),
    /// then the tail storing len(allgs) to allglen, moved together (all on
    /// the page 0x57000, so each ADRP reaches what it did).
    fn arm64_allgadd() -> Vec<u32> {
        vec![
            0xb000_10db, // ADRP 2199552(PC), R27
            0xf907_6b60, // MOVD R0, 3792(R27): allgs
            0xb000_10db, // ADRP 2199552(PC), R27
            0xf907_6f61, // MOVD R1, 3800(R27): allgs+8
            0xb000_10db, // ADRP 2199552(PC), R27
            0xf947_6f61, // MOVD 3800(R27), R1
            0x9000_1202, // ADRP 2359296(PC), R2
            0x9128_e042, // ADD $2616, R2, R2
            0xc89f_fc41, // STLR R1, (R2)
        ]
    }

    fn code(words: &[u32]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn arm64_the_store_of_len_allgs_is_allglen() {
        // go tool nm: runtime.allglen 0x297a38, runtime.allgs 0x270ed0.
        let words = arm64_allgadd();
        assert_eq!(
            from_allgadd_arm64(0x57d64, &code(&words)),
            Some((0x297a38, 0x270ed8))
        );
    }

    #[test]
    fn arm64_no_append_or_a_call_between_finds_nothing() {
        let mut words = arm64_allgadd();
        words[3] = 0xd503_201f; // NOP for append's store to allgs+8
        assert_eq!(from_allgadd_arm64(0x57d64, &code(&words)), None);
        let mut words = arm64_allgadd();
        words.insert(6, 0x9400_0010); // BL between the load and the store
        assert_eq!(from_allgadd_arm64(0x57d64, &code(&words)), None);
    }
}
