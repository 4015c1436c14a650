//! The front ends' ends of the one stream: every output gostw makes is a
//! `Sink` of `engine::observed::Observed`.
//!
//! - `report`: live lines and the summary, as text or JSON (attach, run,
//!   faults, stacks).
//! - `metrics`: the agent's Prometheus metrics.

pub mod metrics;
pub mod report;

use crate::engine::observed::Observed;

/// Something that consumes the observed stream.
pub trait Sink {
    fn observe(&mut self, o: &Observed);

    /// Every observation of `all`, in order.
    fn observe_all(&mut self, all: &[Observed]) {
        for o in all {
            self.observe(o);
        }
    }
}

/// Two sinks fed the same stream.
impl<A: Sink, B: Sink> Sink for (A, B) {
    fn observe(&mut self, o: &Observed) {
        self.0.observe(o);
        self.1.observe(o);
    }
}
