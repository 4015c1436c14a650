//! The data a function's code refers to, decoded from its instructions:
//! RIP-relative operands on amd64 (iced-x86), `ADRP` plus a load, store or
//! add on arm64. A stripped binary names no variable, but the runtime's own
//! code still reaches its variables by address, and pclntab says where that
//! code is.

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};

use super::Arch;

/// How an instruction uses a data address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Read into a register (`MOV reg, [addr]`, `LDR`).
    Load,
    /// Written from a register or an immediate (`MOV [addr], x`, `STR`).
    Store,
    /// The address itself taken (`LEA`, `ADRP`+`ADD`).
    Address,
    /// Anything else (`CMP`, `XCHG`, ...).
    Other,
}

/// One reference from code to a data address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DataRef {
    /// Address of the instruction.
    pub at: u64,
    /// The link-time address it refers to.
    pub target: u64,
    pub access: Access,
}

/// Every data reference of the code `code` that starts at `address`.
pub(crate) fn data_refs(arch: Arch, address: u64, code: &[u8]) -> Vec<DataRef> {
    match arch {
        Arch::Amd64 => amd64_instructions(address, code)
            .filter(Instruction::is_ip_rel_memory_operand)
            .map(|insn| DataRef {
                at: insn.ip(),
                target: insn.ip_rel_memory_address(),
                access: amd64_access(&insn),
            })
            .collect(),
        Arch::Arm64 => arm64_refs(address, code),
    }
}

/// The instructions of amd64 code, up to the first undecodable byte (past
/// the end of a function Go pads with INT3).
pub(crate) fn amd64_instructions(address: u64, code: &[u8]) -> impl Iterator<Item = Instruction> {
    Decoder::with_ip(64, code, address, DecoderOptions::NONE)
        .into_iter()
        .take_while(|insn| !insn.is_invalid())
}

fn amd64_access(insn: &Instruction) -> Access {
    match insn.mnemonic() {
        Mnemonic::Lea => Access::Address,
        Mnemonic::Mov if insn.op0_kind() == OpKind::Memory => Access::Store,
        Mnemonic::Mov if insn.op1_kind() == OpKind::Memory => Access::Load,
        _ => Access::Other,
    }
}

/// The register an amd64 memory operand is based on, if it is a plain
/// `[reg + disp]` (no index).
pub(crate) fn amd64_base(insn: &Instruction) -> Option<(Register, u64)> {
    let base = insn.memory_base();
    (base != Register::None && base != Register::RIP && insn.memory_index() == Register::None)
        .then(|| (base.full_register(), insn.memory_displacement64()))
}

/// arm64: `ADRP Xd, page` followed (within a few instructions) by
/// `LDR`/`STR Xt, [Xd, #imm]` or `ADD Xd', Xd, #imm`, which is how Go
/// reaches a global (`MOVD runtime.x(SB), R1`).
fn arm64_refs(address: u64, code: &[u8]) -> Vec<DataRef> {
    /// Instructions after which an `ADRP` result is no longer trusted.
    const REACH: usize = 4;
    let mut pages: [Option<(u64, usize)>; 32] = [None; 32];
    let mut out = Vec::new();
    for (i, (pc, insn)) in super::arm64::words(address, code).enumerate() {
        let rd = (insn & 31) as usize;
        let rn = ((insn >> 5) & 31) as usize;
        let base = pages[rn]
            .filter(|&(_, set)| i - set <= REACH)
            .map(|(p, _)| p);
        if insn & 0x9f00_0000 == 0x9000_0000 {
            // ADRP: a 21-bit signed page count (immhi:immlo) from this page.
            let imm = (((insn >> 5) & 0x7ffff) << 2 | (insn >> 29) & 3) as i64;
            let pages_off = (imm << 43) >> 43;
            let target = (pc & !0xfff).wrapping_add_signed(pages_off << 12);
            pages[rd] = Some((target, i));
            continue;
        }
        if insn & 0x3b00_0000 == 0x3900_0000 {
            // LDR/STR (unsigned immediate, general register): scaled imm12.
            let size = insn >> 30;
            let offset = u64::from((insn >> 10) & 0xfff) << size;
            if let Some(page) = base {
                let access = if (insn >> 22) & 3 == 0 {
                    Access::Store
                } else {
                    Access::Load
                };
                out.push(DataRef {
                    at: pc,
                    target: page + offset,
                    access,
                });
            }
        } else if insn & 0xff80_0000 == 0x9100_0000 {
            // ADD Xd, Xn, #imm{, LSL #12}.
            let mut imm = u64::from((insn >> 10) & 0xfff);
            if (insn >> 22) & 1 == 1 {
                imm <<= 12;
            }
            if let Some(page) = base {
                out.push(DataRef {
                    at: pc,
                    target: page + imm,
                    access: Access::Address,
                });
                pages[rd] = Some((page + imm, i));
                continue;
            }
        }
        // Whatever else this instruction does, its destination is no page.
        pages[rd] = None;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amd64_rip_relative_operands_are_found() {
        // cmp qword [rip+0x10], 0 ; mov rax, [rip+0x20] ; lea rcx, [rip-8] ;
        // mov [rip+4], rax ; ret
        let code = [
            0x48, 0x83, 0x3d, 0x10, 0, 0, 0, 0x00, // 8 bytes
            0x48, 0x8b, 0x05, 0x20, 0, 0, 0, // 7
            0x48, 0x8d, 0x0d, 0xf8, 0xff, 0xff, 0xff, // 7
            0x48, 0x89, 0x05, 0x04, 0, 0, 0, // 7
            0xc3,
        ];
        let refs = data_refs(Arch::Amd64, 0x1000, &code);
        let got: Vec<(u64, Access)> = refs.iter().map(|r| (r.target, r.access)).collect();
        assert_eq!(
            got,
            [
                (0x1008 + 0x10, Access::Other),
                (0x100f + 0x20, Access::Load),
                (0x1016 - 8, Access::Address),
                (0x101d + 4, Access::Store),
            ]
        );
    }

    #[test]
    fn arm64_adrp_pairs_are_found() {
        // Go 1.27's schedinit: adrp x27, #+0x212000 ; ldr x1, [x27, #2408] ;
        // then an adrp/add pair, and an ldr through a stale base (ignored).
        let words: [u32; 7] = [
            0xd000_109b, // ADRP 2170880(PC), R27
            0xf944_b761, // MOVD 2408(R27), R1
            0x9000_0640, // ADRP 819200(PC), R0
            0x9115_9800, // ADD $1382, R0, R0
            0xf944_b761, // MOVD 2408(R27), R1: R27 still holds the page
            0xd503_201f, // NOP
            0xf944_b761, // MOVD 2408(R27), R1: too far from its ADRP, ignored
        ];
        let code: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let pc = 0x58450u64;
        let refs = data_refs(Arch::Arm64, pc, &code);
        let page = (pc & !0xfff) + 2170880;
        assert_eq!(refs[0].target, page + 2408);
        assert_eq!(refs[0].access, Access::Load);
        assert_eq!(refs[1].target, ((pc + 8) & !0xfff) + 819200 + 1382);
        assert_eq!(refs[1].access, Access::Address);
        assert_eq!(refs[2].target, page + 2408);
        assert_eq!(refs.len(), 3, "{refs:x?}");
    }
}
