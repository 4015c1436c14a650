//! The stream's stacks as pprof locations: one location per address, its
//! frames innermost first (inlined calls, then the function holding them),
//! at the executable's own (link-time) addresses, so every process of one
//! executable shares locations whatever its load bias.

use std::sync::Arc;

use crate::{
    formats::pprof::{Location, MappingInfo},
    image::Frame,
    model::{code::Code, fault::Fault, observed::ProcessInfo},
};

/// ELF `PF_X`: the executable segment.
const PF_X: u32 = 1;

/// The mapping of a traced executable's code, at link-time addresses, named
/// by the path the process runs it from, with its build id.
pub fn main_mapping(info: &ProcessInfo) -> Option<MappingInfo> {
    let binary = &info.image.as_ref()?.exe.binary;
    let text = binary
        .load_segments()
        .iter()
        .find(|s| s.flags & PF_X != 0)?;
    Some(MappingInfo {
        start: text.vaddr,
        limit: text.vaddr + text.memsz,
        offset: text.offset,
        file: info.exe.display().to_string(),
        build_id: binary.build_id().unwrap_or_default().to_owned(),
    })
}

/// A runtime address as a link-time one (0, no mapping, when the load bias
/// is not known).
fn link_address(pc: u64, bias: Option<u64>) -> u64 {
    bias.map_or(0, |b| pc.wrapping_sub(b))
}

/// A fault's stack as locations: each run of inlined frames closed by a
/// non-inlined one is one location, at the matching address of `f.pcs`.
pub fn fault_locations(f: &Fault, bias: Option<u64>) -> Vec<Location> {
    let mut out = Vec::new();
    let mut frames = Vec::new();
    let close = |frames: &mut Vec<Frame>, out: &mut Vec<Location>| {
        let address = f.pcs.get(out.len()).map_or(0, |&pc| link_address(pc, bias));
        out.push(Location {
            address,
            frames: std::mem::take(frames),
        });
    };
    for frame in f.stack.iter() {
        frames.push(frame.clone());
        if !frame.inlined {
            close(&mut frames, &mut out);
        }
    }
    if !frames.is_empty() {
        close(&mut frames, &mut out);
    }
    out
}

/// Return addresses of a goroutine stack as locations, named from the
/// engine's `code` (an address it does not know is one frame named by the
/// address), at link-time addresses given the load `bias`.
pub fn return_locations(code: &Code, bias: Option<u64>, pcs: &[u64]) -> Vec<Location> {
    pcs.iter()
        .map(|&pc| {
            let frames = code.return_frames(pc).to_vec();
            Location {
                address: link_address(pc, bias),
                frames: if frames.is_empty() {
                    vec![Frame::unknown(pc)]
                } else {
                    frames
                },
            }
        })
        .collect()
}

/// An interned stack: shared by every sample (of every label set) with the
/// same locations.
pub type Stack = Arc<[Location]>;

/// Bytes a stack holds, roughly (its strings and structs): what the
/// profile store's memory bound counts.
pub fn stack_bytes(stack: &[Location]) -> usize {
    stack
        .iter()
        .map(|l| {
            size_of::<Location>()
                + l.frames
                    .iter()
                    .map(|f| size_of::<Frame>() + f.function.len() + f.file.len())
                    .sum::<usize>()
        })
        .sum::<usize>()
        + 16
}

#[cfg(test)]
mod tests {
    use tracer_common::{fault::FaultEvent, stack::StackGrowthEvent};

    use super::*;
    use crate::model::code::{ReturnCode, growth_pcs};

    fn frame(name: &str, inlined: bool) -> Frame {
        Frame {
            function: name.into(),
            file: "x.go".into(),
            line: 1,
            inlined,
            start_line: 0,
        }
    }

    #[test]
    fn inlined_frames_share_their_caller_s_location_and_address() {
        let ev: FaultEvent = unsafe { std::mem::zeroed() };
        let mut f = Fault::from_event(&ev, Arc::from(Vec::new()), true);
        f.stack = vec![
            frame("internal/runtime/atomic.(*Uint32).Load", true),
            frame("runtime.(*spanSet).reset", false),
            frame("runtime.finishsweep_m", false),
            frame("runtime.gcStart", false),
        ]
        .into();
        f.pcs = vec![0x10_1000, 0x10_2000].into();
        let l = fault_locations(&f, Some(0x10_0000));
        assert_eq!(l.len(), 3);
        assert_eq!(l[0].frames.len(), 2);
        assert_eq!(l[0].frames[1].function, "runtime.(*spanSet).reset");
        assert_eq!((l[0].address, l[1].address), (0x1000, 0x2000));
        // More locations than addresses (a cut stack): no address.
        assert_eq!(l[2].address, 0);
        // Unknown bias: no address either.
        assert!(fault_locations(&f, None).iter().all(|l| l.address == 0));
    }

    #[test]
    fn growth_stacks_end_at_the_walk_s_end() {
        let mut ev: StackGrowthEvent = unsafe { std::mem::zeroed() };
        ev.nframes = 4;
        ev.frames[..4].copy_from_slice(&[1, 2, 0, 4]);
        assert_eq!(growth_pcs(&ev), [1, 2]);
        let l = return_locations(&Code::default(), None, growth_pcs(&ev));
        assert_eq!(l[0].frames[0].function, "0x1");
        assert_eq!(l[0].address, 0);
    }

    #[test]
    fn growth_locations_take_the_engine_s_frames() {
        let mut code = Code::default();
        code.insert(
            0x10_1005,
            ReturnCode {
                frames: vec![frame("main.leaf", true), frame("main.work", false)].into(),
                max_frame: None,
            },
        );
        let l = return_locations(&code, Some(0x10_0000), &[0x10_1005, 0x10_2005]);
        let names: Vec<&str> = l[0].frames.iter().map(|f| &f.function[..]).collect();
        assert_eq!(names, ["main.leaf", "main.work"]);
        assert_eq!(l[0].address, 0x1005);
        // An address the engine did not name: one frame named by it.
        assert_eq!(l[1].frames[0].function, "0x102005");
    }
}
