//! What stack-growth aggregation needs to know about code: the frame of an
//! address and the frame size of its function. A `ProcessImage` (the one
//! symbolizer) provides it; tests provide fakes.

use crate::image::{Frame, ProcessImage};

/// Maps a runtime PC of the traced process to a code location.
pub trait Symbolizer {
    /// The innermost frame (inlined calls included) of instruction address `pc`.
    fn symbolize(&self, pc: u64) -> Option<Frame>;

    /// The frame of a return address (the call instruction is just before it).
    fn symbolize_return_address(&self, pc: u64) -> Frame {
        self.symbolize(pc.saturating_sub(1))
            .unwrap_or_else(|| Frame::unknown(pc))
    }

    /// The most stack the function holding return address `pc` takes for its
    /// own frame (Go's `funcMaxSPDelta`), if known.
    fn max_frame(&self, _pc: u64) -> Option<u64> {
        None
    }
}

/// A symbolizer that knows nothing (addresses are printed as hex).
pub struct NoSymbols;

impl Symbolizer for NoSymbols {
    fn symbolize(&self, _pc: u64) -> Option<Frame> {
        None
    }
}

impl Symbolizer for ProcessImage {
    fn symbolize(&self, pc: u64) -> Option<Frame> {
        self.frames(pc).into_iter().next()
    }

    fn max_frame(&self, pc: u64) -> Option<u64> {
        self.max_frame_of_return(pc)
    }
}
