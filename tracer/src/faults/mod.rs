//! Major page faults of traced processes, and how much of each pause they
//! explain: backends (attach), decoding, symbolization, correlation with
//! pause windows, and the report.
//!
//! Wiring into a session: `FaultTracer::attach(&mut programs, source)` after
//! loading the programs, `add_process(pid)` for each traced process, hand every
//! ring-buffer event to `handle_event` (non-fault kinds are ignored), feed
//! each pause record of the pipeline as `add_window(PauseWindow::from(&rec))`,
//! then `summary()` (Serialize) or `report::render_text`.

pub mod backend;
pub mod correlate;
pub mod decode;
pub mod report;
pub mod symbols;

use aya::maps::StackTraceMap;
use tracer_common::{event::EventKind, map_names};

use self::decode::FaultDecoder;
pub use self::{
    backend::{BackendChoice, FaultSource},
    correlate::{Fault, FaultCorrelator, FaultSummary, PauseFaultStats, PauseWindow},
};
use crate::{ebpf::Programs, events};

/// An attached fault backend with its decoder and correlator.
pub struct FaultTracer {
    pub choice: BackendChoice,
    decoder: FaultDecoder,
    correlator: FaultCorrelator,
    /// Events that could not be decoded.
    pub decode_errors: u64,
}

impl FaultTracer {
    /// Choose and attach a backend, and take the user-stack map.
    pub fn attach(programs: &mut Programs, source: FaultSource) -> anyhow::Result<Self> {
        let choice = backend::attach(programs, source)?;
        let stacks = StackTraceMap::try_from(programs.take_map(map_names::FAULT_STACKS)?)?;
        let name = match choice.backend {
            tracer_common::fault::Backend::Tracepoint => "tracepoint",
            tracer_common::fault::Backend::Kprobe => "kprobe",
        };
        let mut decoder = FaultDecoder::new(Some(stacks));
        decoder.file_faults_seen = choice.file_faults_seen;
        Ok(FaultTracer {
            choice,
            decoder,
            correlator: FaultCorrelator::new(name),
            decode_errors: 0,
        })
    }

    /// Remember `pid`'s executable for symbolization (call while it lives).
    pub fn add_process(&mut self, pid: u32) -> anyhow::Result<()> {
        self.decoder.symbolizer.add_process(pid)
    }

    /// Handle one raw ring-buffer event; returns the fault if it was one.
    pub fn handle_event(&mut self, bytes: &[u8]) -> Option<&Fault> {
        match events::header(bytes) {
            Ok((_, EventKind::Fault)) => {}
            Ok(_) => return None,
            Err(_) => {
                self.decode_errors += 1;
                return None;
            }
        }
        match self.decoder.decode(bytes) {
            Ok(f) => {
                self.correlator.add_fault(f);
                self.correlator.faults().last()
            }
            Err(e) => {
                log::warn!("undecodable fault event: {e}");
                self.decode_errors += 1;
                None
            }
        }
    }

    /// A pause window of a traced process.
    pub fn add_window(&mut self, window: PauseWindow) {
        self.correlator.add_window(window);
    }

    /// The faults already in that fall in `window` (call before
    /// `add_window(window)`).
    pub fn pause_faults(&self, window: &PauseWindow) -> PauseFaultStats {
        PauseFaultStats::from(&self.correlator.pause_faults(window))
    }

    /// Every fault so far.
    pub fn faults(&self) -> &[Fault] {
        self.correlator.faults()
    }

    /// Correlate faults with the pause windows given so far.
    pub fn summary(&self) -> FaultSummary {
        self.correlator.summary()
    }
}
