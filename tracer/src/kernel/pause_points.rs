//! Where the pause probes go in one executable. Each sits where the kernel
//! emulates the probed instruction when the code allows it (one trap, 0.8 us
//! here; a single-stepped instruction costs a second trap, 10 us in all:
//! docs/cost-and-accuracy/cost.md):
//! - the entry: the prologue's stack-check branch (`GoFunction::entry_probe_offset`);
//! - the stopping phase (Go 1.22+, when asked for): `stopTheWorldWithSema`'s
//!   two calls of `timeHistogram.record` (GC and other pauses), RBX = Go's
//!   stopping time;
//! - the end: `startTheWorldWithSema`'s two calls of `timeHistogram.record`
//!   (Go 1.22+), RBX = Go's pause (`now - w.startedStopping`), with
//!   `startedStopping` in the function's frame; else its RETs (RAX = Go's
//!   `now`).

use crate::binary::{
    BinaryError, GoBinary, START_THE_WORLD, STOP_THE_WORLD, TIME_HISTOGRAM_RECORD,
};
use tracer_common::process::GoOffsets;

use super::STOPPING_SINCE;

/// File offsets of the pause probes of one executable.
pub struct PausePoints {
    pub stop: u64,
    /// Empty: the stopping phase is not read.
    pub stopping: Vec<u64>,
    pub end: Vec<u64>,
    /// `GoOffsets::start_call_rsp_started_stopping` for the end probes
    /// (UNKNOWN: they sit on the RETs).
    pub end_at_call: u16,
}

/// Choose the probe points of `binary`; `stopping`: the stopping phase is
/// asked for; `offsets`: its kernel offsets (the RET's stack slot).
pub fn choose(
    binary: &GoBinary,
    stopping: bool,
    offsets: &GoOffsets,
) -> Result<PausePoints, BinaryError> {
    let stop = binary.function(STOP_THE_WORLD)?;
    let start = binary.function(START_THE_WORLD)?;
    let mut points = PausePoints {
        stop: stop.entry_probe_offset,
        stopping: Vec::new(),
        end: start.ret_file_offsets.clone(),
        end_at_call: GoOffsets::UNKNOWN,
    };
    if binary.version.code() < STOPPING_SINCE {
        return Ok(points);
    }
    if stopping {
        points.stopping = record_calls(binary, STOP_THE_WORLD, "stopping times are not read");
    }
    let calls = record_calls(binary, START_THE_WORLD, "pauses end at the RETs");
    if let Some(at_call) = end_slot(binary, offsets.start_rsp_started_stopping)
        && !calls.is_empty()
    {
        points.end = calls;
        points.end_at_call = at_call;
    }
    Ok(points)
}

/// The two calls of `timeHistogram.record` in `function` (logged, with
/// `otherwise`, where they are not found).
fn record_calls(binary: &GoBinary, function: &str, otherwise: &str) -> Vec<u64> {
    match binary.calls(function, TIME_HISTOGRAM_RECORD) {
        Ok(calls) if calls.len() == 2 => calls,
        Ok(calls) => {
            log::warn!(
                "{}: {} calls of {TIME_HISTOGRAM_RECORD} in {function} (2 expected): {otherwise}",
                binary.path.display(),
                calls.len()
            );
            Vec::new()
        }
        Err(e) => {
            log::warn!("{otherwise}: {e}");
            Vec::new()
        }
    }
}

/// The distance above RSP, inside `startTheWorldWithSema`'s body, of the
/// slot that is `ret_minus` below RSP at its RET (RSP at the RET is the
/// entry's; the body's is that minus the prologue's drop).
fn end_slot(binary: &GoBinary, ret_minus: u16) -> Option<u16> {
    if ret_minus == GoOffsets::UNKNOWN {
        return None;
    }
    let drop = binary.frame_drop(START_THE_WORLD).ok().flatten()?;
    let at = drop.checked_sub(u64::from(ret_minus))?;
    u16::try_from(at).ok().filter(|&a| a != GoOffsets::UNKNOWN)
}
