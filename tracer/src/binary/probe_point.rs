//! Where an entry uprobe costs least. The kernel runs the instruction under
//! a uprobe either by emulating it (relative jumps and calls, conditional
//! jumps, NOPs, PUSH: one trap) or by single-stepping a copy of it (a second
//! trap). Single-stepping costs about 9 us more per hit on these VMs (docs/cost-and-accuracy/cost.md).
//! A Go function's prologue checks the stack bound and branches to
//! `morestack`:
//!
//! ```text
//! [lea r12, [rsp - frame]]   (frames larger than the guard's slack)
//! cmp  rsp|r12, [r14 + stackguard]
//! jbe  morestack
//! ```
//!
//! The branch sees every register as the entry did, apart from R12 (a
//! scratch register: no argument lives in it) and the flags, so a probe on
//! it reads the same arguments (AX...), g (R14), SP and BP as one on the
//! first byte, with one trap instead of two.
//!
//! A direct CALL is emulated too, and sees the callee's arguments in their
//! registers: `call_offsets` finds the calls of one function in another.
//!
//! arm64 is the same in its own words (`arm64`): the prologue's `B.LS` and
//! a `BL` are simulated by the kernel, and see the entry's registers.

use iced_x86::{Code, Decoder, DecoderOptions, Instruction, Register};

use super::{Arch, arm64};

/// Offset from the function's start of the instruction an entry probe goes
/// on: its prologue's stack-bound branch when the prologue is the one above,
/// else 0 (the entry itself).
pub fn entry_probe_offset(arch: Arch, address: u64, code: &[u8]) -> u64 {
    if arch == Arch::Arm64 {
        return arm64_entry_probe_offset(address, code);
    }
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut insn = Instruction::default();
    let mut next = || {
        decoder.can_decode().then(|| {
            decoder.decode_out(&mut insn);
            insn
        })
    };
    let Some(mut first) = next() else { return 0 };
    let mut bound = Register::RSP;
    if first.code() == Code::Lea_r64_m
        && first.op0_register() == Register::R12
        && first.memory_base() == Register::RSP
        && first.memory_index() == Register::None
    {
        bound = Register::R12;
        let Some(i) = next() else { return 0 };
        first = i;
    }
    let is_guard_check = first.code() == Code::Cmp_r64_rm64
        && first.op0_register() == bound
        && first.memory_base() == Register::R14
        && first.memory_index() == Register::None;
    if !is_guard_check {
        return 0;
    }
    match next() {
        Some(branch) if matches!(branch.code(), Code::Jbe_rel8_64 | Code::Jbe_rel32_64) => {
            branch.ip() - address
        }
        _ => 0,
    }
}

/// `entry_probe_offset` on arm64: `ldr x16, [g, #guard]`, an optional
/// `sub x17, sp, #frame`, `cmp sp|x17, x16`, then `b.ls`.
fn arm64_entry_probe_offset(address: u64, code: &[u8]) -> u64 {
    let mut words = arm64::words(address, code).take(4);
    let Some(guard) = words.next().and_then(|(_, w)| arm64::load_from_g(w)) else {
        return 0;
    };
    let Some((_, mut w)) = words.next() else {
        return 0;
    };
    let mut bound = arm64::SP;
    if let Some((rd, _)) = arm64::sub_from_sp(w) {
        bound = rd;
        let Some((_, next)) = words.next() else {
            return 0;
        };
        w = next;
    }
    if arm64::compare(w) != Some((bound, guard)) {
        return 0;
    }
    match words.next() {
        Some((pc, w)) if arm64::is_branch_if_lower_or_same(w) => pc - address,
        _ => 0,
    }
}

/// How far a Go prologue moves RSP down (`push rbp` and `sub rsp, N`, or
/// `sub rsp, N` alone before Go 1.21; on arm64 `MOVD.W R30, -N(RSP)`, or
/// for large frames `SUB $N, RSP, R20; STP (R29, R30), -8(R20); MOVD R20,
/// RSP`), read from its first instructions: SP inside the body is the
/// entry's minus this (`None` for another prologue).
pub fn frame_drop(arch: Arch, address: u64, code: &[u8]) -> Option<u64> {
    if arch == Arch::Arm64 {
        return arm64_frame_drop(address, code);
    }
    let mut drop = 0;
    for insn in Decoder::with_ip(64, code, address, DecoderOptions::NONE)
        .into_iter()
        .take(8)
    {
        match insn.code() {
            Code::Push_r64 if insn.op0_register() == Register::RBP => drop += 8,
            Code::Sub_rm64_imm8 | Code::Sub_rm64_imm32 if insn.op0_register() == Register::RSP => {
                return Some(drop + insn.immediate(1));
            }
            // The stack check and the frame pointer set-up before it.
            Code::Lea_r64_m | Code::Cmp_r64_rm64 | Code::Jbe_rel8_64 | Code::Jbe_rel32_64 => {}
            Code::Mov_r64_rm64 | Code::Mov_rm64_r64 => {}
            _ => return None,
        }
    }
    None
}

fn arm64_frame_drop(address: u64, code: &[u8]) -> Option<u64> {
    // (register, amount) of a `sub Xd, sp, ...` that becomes SP.
    let mut pending: Option<(u32, u64)> = None;
    // The constant last moved into a register (frames over 4 KiB: R27).
    let mut constant: Option<(u32, u64)> = None;
    for (_, w) in arm64::words(address, code).take(14) {
        if let Some(n) = arm64::push_link_register(w) {
            return Some(n);
        }
        if let (Some((reg, n)), Some(from)) = (pending, arm64::move_to_sp(w)) {
            return (from == reg).then_some(n);
        }
        if let Some((reg, shift, imm, keep)) = arm64::move_wide(w) {
            let before = match constant {
                Some((r, v)) if keep && r == reg => v & !(0xffff << shift),
                _ if keep => return None,
                _ => 0,
            };
            constant = Some((reg, before | imm << shift));
            continue;
        }
        let sub = arm64::sub_from_sp(w).or_else(|| {
            let (reg, from) = arm64::sub_register_from_sp(w)?;
            constant.filter(|&(r, _)| r == from).map(|(_, n)| (reg, n))
        });
        match sub {
            // The stack check's bound (R17), not the frame.
            Some((17, _)) => continue,
            Some((reg, n)) => {
                pending = Some((reg, n));
                continue;
            }
            None => {}
        }
        let prologue = arm64::load_from_g(w).is_some()
            || arm64::compare(w).is_some()
            || arm64::is_branch_if_lower_or_same(w)
            || arm64::is_branch_if_lower(w)
            || (pending.is_some() && arm64::is_store_pair(w));
        if !prologue {
            return None;
        }
    }
    None
}

/// Offsets from the function's start of its direct calls (`call rel32`,
/// arm64's `bl`) to `target`.
pub fn call_offsets(arch: Arch, address: u64, code: &[u8], target: u64) -> Vec<u64> {
    if arch == Arch::Arm64 {
        return arm64::words(address, code)
            .filter(|&(pc, w)| arm64::call_target(pc, w) == Some(target))
            .map(|(pc, _)| pc - address)
            .collect();
    }
    let mut calls = Vec::new();
    for insn in Decoder::with_ip(64, code, address, DecoderOptions::NONE) {
        if insn.is_invalid() {
            // Past the last instruction (Go pads with INT3, which decodes).
            break;
        }
        if insn.code() == Code::Call_rel32_64 && insn.near_branch64() == target {
            calls.push(insn.ip() - address);
        }
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_frame_prologue_probes_the_branch() {
        // cmp rsp, [r14+0x10]; jbe +0x266; sub rsp, 0x60 (Go 1.19)
        let code = [
            0x49, 0x3b, 0x66, 0x10, 0x0f, 0x86, 0x60, 0x02, 0x00, 0x00, 0x48, 0x83, 0xec, 0x60,
        ];
        assert_eq!(entry_probe_offset(Arch::Amd64, 0x43aa00, &code), 4);
    }

    #[test]
    fn large_frame_prologue_probes_the_branch() {
        // lea r12, [rsp-0x18]; cmp r12, [r14+0x18]; jbe ...; push rbp (Go 1.26)
        let code = [
            0x4c, 0x8d, 0x64, 0x24, 0xe8, 0x4d, 0x3b, 0x66, 0x18, 0x0f, 0x86, 0x1e, 0x04, 0x00,
            0x00, 0x55,
        ];
        assert_eq!(entry_probe_offset(Arch::Amd64, 0x44fa00, &code), 9);
    }

    #[test]
    fn frame_drop_counts_the_push_and_the_sub() {
        // lea r12,[rsp-0x18]; cmp r12,[r14+0x18]; jbe; push rbp; mov rbp,rsp; sub rsp,0x90
        let code = [
            0x4c, 0x8d, 0x64, 0x24, 0xe8, 0x4d, 0x3b, 0x66, 0x18, 0x0f, 0x86, 0x1e, 0x04, 0x00,
            0x00, 0x55, 0x48, 0x89, 0xe5, 0x48, 0x81, 0xec, 0x90, 0x00, 0x00, 0x00,
        ];
        assert_eq!(frame_drop(Arch::Amd64, 0x1000, &code), Some(0x98));
        // cmp rsp,[r14+0x10]; jbe; sub rsp,0x60; mov [rsp+0x58],rbp (Go 1.19)
        let code = [
            0x49, 0x3b, 0x66, 0x10, 0x0f, 0x86, 0x60, 0x02, 0x00, 0x00, 0x48, 0x83, 0xec, 0x60,
            0x48, 0x89, 0x6c, 0x24, 0x58,
        ];
        assert_eq!(frame_drop(Arch::Amd64, 0x1000, &code), Some(0x60));
        // xor eax, eax; ret: not a prologue
        assert_eq!(frame_drop(Arch::Amd64, 0x1000, &[0x31, 0xc0, 0xc3]), None);
        assert_eq!(frame_drop(Arch::Arm64, 0x1000, &code), None);
    }

    #[test]
    fn arm64_frame_drop_reads_both_prologues() {
        // Go 1.19 startTheWorldWithSema: ...; BLS; MOVD.W R30, -96(RSP)
        let small = arm64_code(&[0xf940_0b90, 0xeb30_63ff, 0x5400_0e49, 0xf81a_0ffe]);
        assert_eq!(frame_drop(Arch::Arm64, 0x46f40, &small), Some(96));
        // Go 1.27 copystack: MOVD 16(R28), R16; SUB $128, RSP, R17; CMP;
        // BLS; SUB $256, RSP, R20; STP (R29, R30), -8(R20); MOVD R20, RSP
        let large = arm64_code(&[
            0xf940_0b90,
            0xd102_03f1,
            0xeb10_023f,
            0x5400_1c89,
            0xd104_03f4,
            0xa93f_fa9d,
            0x9100_029f,
        ]);
        assert_eq!(frame_drop(Arch::Arm64, 0x6dea0, &large), Some(256));
        // Go 1.27 main.deep19k (a 19 KB frame): the sizes come from R27.
        let huge = arm64_code(&[
            0xf940_0b90, // MOVD 16(R28), R16
            0xd289_721b, // MOVD $19344, R27
            0xeb3b_63f1, // SUBS R27, RSP, R17
            0x5400_0503, // BCC
            0xeb10_023f, // CMP R16, R17
            0x5400_04c9, // BLS
            0xd289_821b, // MOVD $19472, R27
            0xcb3b_63f4, // SUB R27, RSP, R20
            0xa93f_fa9d, // STP (R29, R30), -8(R20)
            0x9100_029f, // MOVD R20, RSP
        ]);
        assert_eq!(frame_drop(Arch::Arm64, 0x27c930, &huge), Some(19472));
        // A register whose constant is unknown gives no size.
        let mut unknown = huge.clone();
        unknown[24..28].copy_from_slice(&0xaa1f_03fbu32.to_le_bytes()); // MOV XZR, R27
        assert_eq!(frame_drop(Arch::Arm64, 0x27c930, &unknown), None);
        // No prologue: MOVD 112(R0), R2 first.
        assert_eq!(
            frame_drop(Arch::Arm64, 0, &arm64_code(&[0xf940_3802])),
            None
        );
    }

    #[test]
    fn calls_to_one_target_are_found() {
        // 0x1000: call 0x2000; 0x1005: call 0x3000; 0x100a: call 0x2000; int3
        let rel = |from: u64, to: u64| ((to as i64 - (from as i64 + 5)) as i32).to_le_bytes();
        let mut code = vec![0xe8];
        code.extend(rel(0x1000, 0x2000));
        code.push(0xe8);
        code.extend(rel(0x1005, 0x3000));
        code.push(0xe8);
        code.extend(rel(0x100a, 0x2000));
        code.push(0xcc);
        assert_eq!(
            call_offsets(Arch::Amd64, 0x1000, &code, 0x2000),
            vec![0, 10]
        );
        assert_eq!(call_offsets(Arch::Amd64, 0x1000, &code, 0x3000), vec![5]);
        // The same bytes read as arm64 words hold no BL.
        assert!(call_offsets(Arch::Arm64, 0x1000, &code, 0x2000).is_empty());
    }

    #[test]
    fn anything_else_probes_the_entry() {
        // sub rsp, 0x48; mov [rsp+0x20], rdi (no stack check: nosplit, or not Go)
        let code = [0x48, 0x83, 0xec, 0x48, 0x48, 0x89, 0x7c, 0x24, 0x20];
        assert_eq!(entry_probe_offset(Arch::Amd64, 0x1000, &code), 0);
        // cmp rsp, [r14+0x10] followed by something other than jbe
        let code = [0x49, 0x3b, 0x66, 0x10, 0x90];
        assert_eq!(entry_probe_offset(Arch::Amd64, 0x1000, &code), 0);
        // a guard check against another base register
        let code = [0x48, 0x3b, 0x66, 0x10, 0x76, 0x10];
        assert_eq!(entry_probe_offset(Arch::Amd64, 0x1000, &code), 0);
        assert_eq!(entry_probe_offset(Arch::Arm64, 0x1000, &code), 0);
        assert_eq!(entry_probe_offset(Arch::Amd64, 0x1000, &[]), 0);
        assert_eq!(entry_probe_offset(Arch::Arm64, 0x1000, &[]), 0);
    }

    fn arm64_code(words: &[u32]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn arm64_prologues_probe_the_branch() {
        // Go 1.19 stopTheWorldWithSema: MOVD 16(R28), R16; CMP R16, RSP;
        // BLS; MOVD.W R30, -112(RSP)
        let small = arm64_code(&[0xf940_0b90, 0xeb30_63ff, 0x5400_19c9, 0xf819_0ffe]);
        assert_eq!(entry_probe_offset(Arch::Arm64, 0x46bf0, &small), 8);
        // Go 1.27 stopTheWorldWithSema: MOVD 24(R28), R16; SUB $32, RSP, R17;
        // CMP R16, R17; BLS
        let large = arm64_code(&[0xf940_0f90, 0xd100_83f1, 0xeb10_023f, 0x5400_1f69]);
        assert_eq!(entry_probe_offset(Arch::Arm64, 0x59bd0, &large), 12);
        // The SUB's register compared against SP instead: not the prologue.
        let wrong = arm64_code(&[0xf940_0f90, 0xd100_83f1, 0xeb30_63ff, 0x5400_1f69]);
        assert_eq!(entry_probe_offset(Arch::Arm64, 0, &wrong), 0);
        // BCS in the branch's place.
        let bcs = arm64_code(&[0xf940_0b90, 0xeb30_63ff, 0x5400_0202]);
        assert_eq!(entry_probe_offset(Arch::Arm64, 0, &bcs), 0);
    }

    #[test]
    fn arm64_calls_to_one_target_are_found() {
        // 0x1000: bl 0x1040; 0x1004: nop; 0x1008: bl 0x1040; 0x100c: b 0x104c
        let code = arm64_code(&[0x9400_0010, 0xd503_201f, 0x9400_000e, 0x1400_0010]);
        assert_eq!(call_offsets(Arch::Arm64, 0x1000, &code, 0x1040), vec![0, 8]);
        assert!(call_offsets(Arch::Arm64, 0x1000, &code, 0x104c).is_empty());
    }
}
