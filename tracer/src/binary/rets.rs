//! RET instructions of a function, found by decoding instructions from its
//! entry (amd64) or by scanning aligned words (arm64). A byte scan for 0xC3
//! would also match bytes inside other instructions.

use iced_x86::{Decoder, DecoderOptions, Mnemonic};

use super::{Arch, arm64};

/// Offsets, relative to the function start, of each return instruction.
pub fn ret_offsets(arch: Arch, address: u64, code: &[u8]) -> Vec<u64> {
    match arch {
        Arch::Amd64 => {
            let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
            let mut rets = Vec::new();
            for insn in &mut decoder {
                if insn.is_invalid() {
                    // Past the last real instruction Go pads with INT3; an
                    // invalid byte means we left the code: stop rather than guess.
                    break;
                }
                if matches!(insn.mnemonic(), Mnemonic::Ret | Mnemonic::Retf) {
                    rets.push(insn.ip() - address);
                }
            }
            rets
        }
        Arch::Arm64 => arm64::words(address, code)
            .filter(|&(_, w)| w == arm64::RET)
            .map(|(pc, _)| pc - address)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_ret_but_not_c3_inside_an_immediate() {
        // mov eax, 0xc3c3c3c3 ; ret ; int3
        let code = [0xb8, 0xc3, 0xc3, 0xc3, 0xc3, 0xc3, 0xcc];
        assert_eq!(ret_offsets(Arch::Amd64, 0x1000, &code), vec![5]);
    }

    #[test]
    fn arm64_scans_aligned_words_only() {
        let mut code = vec![0u8; 2];
        code.extend_from_slice(&0xd65f03c0u32.to_le_bytes()); // misaligned: ignored
        code.extend_from_slice(&[0, 0]);
        code.extend_from_slice(&0xd65f03c0u32.to_le_bytes());
        assert_eq!(ret_offsets(Arch::Arm64, 0, &code), vec![8]);
    }
}
