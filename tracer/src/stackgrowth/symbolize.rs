//! What stack-growth aggregation needs to know about code: the frame of a
//! return address and the frame size of its function. The engine's
//! `model::code::Code` (what it symbolized, once) provides it; tests
//! provide fakes.

use crate::image::Frame;

/// Maps a return address of the traced process to a code location.
pub trait Symbolizer {
    /// The innermost frame (inlined calls included) of the call just before
    /// return address `pc`.
    fn return_frame(&self, pc: u64) -> Option<Frame>;

    /// That frame, or one named by the address.
    fn symbolize_return_address(&self, pc: u64) -> Frame {
        self.return_frame(pc).unwrap_or_else(|| Frame::unknown(pc))
    }

    /// The most stack the function holding return address `pc` takes for its
    /// own frame (Go's `funcMaxSPDelta`), if known.
    fn max_frame(&self, _pc: u64) -> Option<u64> {
        None
    }
}
