//! The few arm64 instructions the probe-point finders read, decoded from
//! their fixed 32-bit words (Arm ARM, A64 encodings). Go's arm64 prologue:
//!
//! ```text
//! MOVD  16(R28), R16          ldr  x16, [x28, #16]     g.stackguard0
//! [SUB  $frame, RSP, R17]     sub  x17, sp, #frame     (larger frames)
//! CMP   R16, RSP|R17          cmp  sp|x17, x16
//! BLS   morestack             b.ls ...
//! MOVD.W R30, -N(RSP)         str  x30, [sp, #-N]!     (or SUB/STP/MOVD
//!                                                      for large frames)
//! ```
//!
//! Frames over 4 KiB guard against SP - frame wrapping and take their
//! sizes from R27 (`MOVD $n, R27; SUBS R27, RSP, R17; BCC morestack; CMP
//! R16, R17; BLS morestack; MOVD $frame, R27; SUB R27, RSP, R20; STP ...;
//! MOVD R20, RSP`).
//!
//! The kernel simulates a conditional branch under a uprobe (one trap, no
//! single-step), and at the `B.LS` every argument register (R0-R15), g
//! (R28), SP, the frame pointer (R29) and the link register (R30, the
//! caller's return address) still hold what they held at the entry; only
//! R16/R17 (scratch, never arguments) and the flags differ.

/// The instruction words of `code` with their addresses.
pub fn words(address: u64, code: &[u8]) -> impl Iterator<Item = (u64, u32)> + '_ {
    code.chunks_exact(4).enumerate().map(move |(i, w)| {
        (
            address + 4 * i as u64,
            u32::from_le_bytes([w[0], w[1], w[2], w[3]]),
        )
    })
}

/// Go's g register.
const G: u32 = 28;
/// The stack pointer, where an instruction's register field means SP.
pub const SP: u32 = 31;
/// `ret` (to x30).
pub const RET: u32 = 0xd65f_03c0;

fn rd(w: u32) -> u32 {
    w & 31
}

fn rn(w: u32) -> u32 {
    (w >> 5) & 31
}

fn rm(w: u32) -> u32 {
    (w >> 16) & 31
}

/// `ldr Xt, [x28, #imm]`: a load from g (the stack guard); its Xt.
pub fn load_from_g(w: u32) -> Option<u32> {
    (w & 0xffc0_0000 == 0xf940_0000 && rn(w) == G).then_some(rd(w))
}

/// `sub Xd, sp, #imm{, lsl #12}`: its Xd and the amount.
pub fn sub_from_sp(w: u32) -> Option<(u32, u64)> {
    if w & 0xff80_0000 != 0xd100_0000 || rn(w) != SP {
        return None;
    }
    let imm = u64::from((w >> 10) & 0xfff);
    Some((rd(w), if (w >> 22) & 1 == 1 { imm << 12 } else { imm }))
}

/// `movz Xd, #imm16, lsl #s` or `movk ...` (Go's `MOVD $n, Rd` of a
/// constant): (d, s, imm16, keeps the other bits).
pub fn move_wide(w: u32) -> Option<(u32, u32, u64, bool)> {
    let keep = match w & 0xff80_0000 {
        0xd280_0000 => false,
        0xf280_0000 => true,
        _ => return None,
    };
    let shift = ((w >> 21) & 3) * 16;
    Some((rd(w), shift, u64::from((w >> 5) & 0xffff), keep))
}

/// `sub Xd, sp, Xm` or `subs` (extended register, UXTX, no shift): (d, m);
/// `subs` to XZR is a compare, not this.
pub fn sub_register_from_sp(w: u32) -> Option<(u32, u32)> {
    let sub = w & 0xffe0_fc00 == 0xcb20_6000;
    let subs = w & 0xffe0_fc00 == 0xeb20_6000 && rd(w) != 31;
    ((sub || subs) && rn(w) == SP).then_some((rd(w), rm(w)))
}

/// `b.lo` (`BCC`): unsigned lower.
pub fn is_branch_if_lower(w: u32) -> bool {
    w & 0xff00_0010 == 0x5400_0000 && w & 0xf == 0x3
}

/// `cmp Xn|sp, Xm` (SUBS to XZR, shifted or extended register): (n, m).
pub fn compare(w: u32) -> Option<(u32, u32)> {
    let shifted = w & 0xff20_0000 == 0xeb00_0000;
    let extended = w & 0xffe0_0000 == 0xeb20_0000;
    ((shifted || extended) && rd(w) == 31).then_some((rn(w), rm(w)))
}

/// `b.ls`: unsigned lower or same.
pub fn is_branch_if_lower_or_same(w: u32) -> bool {
    w & 0xff00_0010 == 0x5400_0000 && w & 0xf == 0x9
}

/// `bl label`: the call's target.
pub fn call_target(pc: u64, w: u32) -> Option<u64> {
    (w & 0xfc00_0000 == 0x9400_0000).then(|| {
        let imm26 = i64::from(((w & 0x03ff_ffff) << 6) as i32 >> 6);
        pc.wrapping_add_signed(imm26 * 4)
    })
}

/// `str x30, [sp, #-n]!` (Go's `MOVD.W R30, -n(RSP)`): n.
pub fn push_link_register(w: u32) -> Option<u64> {
    if w & 0xffe0_0c00 != 0xf800_0c00 || rn(w) != SP || rd(w) != 30 {
        return None;
    }
    let imm9 = ((((w >> 12) & 0x1ff) << 23) as i32) >> 23;
    (imm9 < 0).then(|| u64::from(imm9.unsigned_abs()))
}

/// `mov sp, Xn` (`add sp, Xn, #0`): n.
pub fn move_to_sp(w: u32) -> Option<u32> {
    (w & 0xffff_fc00 == 0x9100_0000 && rd(w) == SP).then_some(rn(w))
}

/// `stp Xt1, Xt2, [Xn, #imm]` (64-bit, signed offset).
pub fn is_store_pair(w: u32) -> bool {
    w & 0xffc0_0000 == 0xa900_0000
}

/// `stlr Xt, [Xn]` (a 64-bit atomic store): (t, n).
pub fn store_release(w: u32) -> Option<(u32, u32)> {
    (w & 0xffff_fc00 == 0xc89f_fc00).then_some((rd(w), rn(w)))
}

/// The register an instruction writes, read from bits 0-4 (true of the
/// loads, moves and arithmetic Go emits; for a store those bits name the
/// source, so a reader treating them as written only forgets a value).
pub fn destination(w: u32) -> u32 {
    rd(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Words from `go tool objdump` of Go 1.19 and 1.27 arm64 builds.
    #[test]
    fn prologue_words_decode() {
        assert_eq!(load_from_g(0xf940_0b90), Some(16)); // MOVD 16(R28), R16
        assert_eq!(load_from_g(0xf940_0f90), Some(16)); // MOVD 24(R28), R16
        assert_eq!(load_from_g(0xf940_3802), None); // MOVD 112(R0), R2
        assert_eq!(sub_from_sp(0xd100_83f1), Some((17, 32))); // SUB $32, RSP, R17
        assert_eq!(sub_from_sp(0xd105_03f1), Some((17, 320))); // SUB $320, RSP, R17
        assert_eq!(sub_from_sp(0xd100_23fd), Some((29, 8))); // SUB $8, RSP, R29
        assert_eq!(sub_from_sp(0xd100_0421), None); // SUB $1, R1, R1
        assert_eq!(compare(0xeb30_63ff), Some((31, 16))); // CMP R16, RSP
        assert_eq!(compare(0xeb10_023f), Some((17, 16))); // CMP R16, R17
        assert_eq!(compare(0xeb01_005f), Some((2, 1))); // CMP R1, R2
        assert!(is_branch_if_lower_or_same(0x5400_19c9)); // BLS 206(PC)
        assert!(!is_branch_if_lower_or_same(0x5400_0202)); // BCS 16(PC)
        assert_eq!(store_release(0xc89f_fc41), Some((1, 2))); // STLR R1, (R2)
        assert_eq!(push_link_register(0xf819_0ffe), Some(112)); // MOVD.W R30, -112(RSP)
        assert_eq!(push_link_register(0xf816_0ffe), Some(160)); // MOVD.W R30, -160(RSP)
        assert_eq!(push_link_register(0xf81f_83fd), None); // MOVD R29, -8(RSP)
        assert_eq!(move_to_sp(0x9100_029f), Some(20)); // MOVD R20, RSP
        assert!(is_store_pair(0xa93f_fa9d)); // STP (R29, R30), -8(R20)
        // A 19 KB frame (Go 1.27 main.deep19k).
        assert_eq!(move_wide(0xd289_721b), Some((27, 0, 19344, false))); // MOVD $19344, R27
        assert_eq!(move_wide(0xf2a0_003b), Some((27, 16, 1, true))); // MOVK $(1<<16), R27
        assert_eq!(sub_register_from_sp(0xeb3b_63f1), Some((17, 27))); // SUBS R27, RSP, R17
        assert_eq!(sub_register_from_sp(0xcb3b_63f4), Some((20, 27))); // SUB R27, RSP, R20
        assert_eq!(sub_register_from_sp(0xeb30_63ff), None); // CMP R16, RSP
        assert!(is_branch_if_lower(0x5400_0503)); // BCC 40(PC)
        assert!(!is_branch_if_lower(0x5400_04c9)); // BLS 38(PC)
    }

    #[test]
    fn calls_reach_backwards_and_forwards() {
        // 0x59e3c: CALL runtime.(*timeHistogram).record (0x97ff35f9).
        assert_eq!(
            call_target(0x59e3c, 0x97ff_35f9),
            Some(0x59e3c - 4 * 0xca07)
        );
        assert_eq!(call_target(0x1000, 0x9400_0010), Some(0x1040));
        assert_eq!(call_target(0x1000, 0x1400_0010), None); // B, not BL
    }
}
