//! How much stack a Go function's frame takes, read from its prologue: Go
//! amd64 functions start with the stack-bound check, then `PUSHQ BP; MOVQ
//! SP, BP; SUBQ $frame, SP`. The SP delta after that is what newstack makes
//! room for (its `funcMaxSPDelta`, which pclntab's SP-delta table also
//! gives), so a sample that only sees the old size can still tell the size
//! the stack grew to. arm64 functions save LR at the new SP in the same
//! instruction that drops it (`MOVD.W R30, -frame(RSP)`, or `SUB` into a
//! register then `MOVD` to RSP for large frames): the probe points' reader
//! of that prologue gives the delta there.

use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind, Register};

use crate::binary::{Arch, prologue_frame_drop};

/// Instructions looked at before giving up.
const PROLOGUE_INSTRUCTIONS: usize = 12;

/// The largest SP delta of the `arch` function whose code starts at `code`
/// (linked at `ip`), from its prologue; None if it sets up no frame.
pub fn max_sp_delta(arch: Arch, code: &[u8], ip: u64) -> Option<u64> {
    match arch {
        Arch::Amd64 => prologue_max_sp_delta(code, ip),
        Arch::Arm64 => prologue_frame_drop(arch, ip, code),
    }
}

/// amd64: the delta after the stack check, pushes and `SUB RSP, imm`; None
/// if there is no `SUB RSP, imm` in the prologue. Any instruction may come
/// between them (spills of register arguments do), unlike the probe
/// points' reader, which accepts only the prologue's own.
fn prologue_max_sp_delta(code: &[u8], ip: u64) -> Option<u64> {
    let mut decoder = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    let mut delta = 0u64;
    for insn in decoder.iter().take(PROLOGUE_INSTRUCTIONS) {
        match insn.mnemonic() {
            Mnemonic::Push => delta += 8,
            Mnemonic::Sub
                if insn.op0_register() == Register::RSP
                    && matches!(
                        insn.op1_kind(),
                        OpKind::Immediate8to64 | OpKind::Immediate32to64
                    ) =>
            {
                return Some(delta + insn.immediate(1));
            }
            Mnemonic::Ret | Mnemonic::Jmp | Mnemonic::Call => return None,
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_go_big_frame_prologue() {
        // lea r12,[rsp-0x4b88]; cmp r12,[r14+0x10]; jbe +0x..; push rbp;
        // mov rbp,rsp; sub rsp,0x4c08
        let code = [
            0x4c, 0x8d, 0xa4, 0x24, 0x78, 0xb4, 0xff, 0xff, // lea r12,[rsp-0x4b88]
            0x4d, 0x3b, 0x66, 0x10, // cmp r12,[r14+0x10]
            0x0f, 0x86, 0x00, 0x01, 0x00, 0x00, // jbe
            0x55, // push rbp
            0x48, 0x89, 0xe5, // mov rbp,rsp
            0x48, 0x81, 0xec, 0x08, 0x4c, 0x00, 0x00, // sub rsp,0x4c08
        ];
        assert_eq!(prologue_max_sp_delta(&code, 0x401000), Some(0x4c08 + 8));
    }

    #[test]
    fn small_frame_and_frameless() {
        // cmp rsp,[r14+0x10]; jbe; push rbp; mov rbp,rsp; sub rsp,0x18
        let code = [
            0x49, 0x3b, 0x66, 0x10, 0x76, 0x20, 0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x18,
        ];
        assert_eq!(prologue_max_sp_delta(&code, 0), Some(0x18 + 8));
        // mov eax,1; ret
        assert_eq!(prologue_max_sp_delta(&[0xb8, 1, 0, 0, 0, 0xc3], 0), None);
    }

    #[test]
    fn arm64_frames_come_from_the_lr_save() {
        let words = |ws: &[u32]| ws.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<_>>();
        // ldr x16,[x28,#16]; cmp sp,x16; b.ls; str x30,[sp,#-96]!
        let small = words(&[0xf9400b90, 0xeb3063ff, 0x54000469, 0xf81a0ffe]);
        assert_eq!(max_sp_delta(Arch::Arm64, &small, 0x1000), Some(96));
        // The same bytes read as amd64 are no frame at all.
        assert_eq!(max_sp_delta(Arch::Amd64, &small, 0x1000), None);
    }
}
