//! Output formats other tools read: pprof profiles (`go tool pprof`,
//! Pyroscope, Parca) and a pause timeline in Chrome's trace-event JSON
//! (Perfetto UI, chrome://tracing, Chromium's DevTools). Pure encoders: the
//! engine's sinks feed them symbolized stacks and pause records.
//!
//! - `pprof`: the profile.proto builder (any sample types).
//! - `profiles`: gostw's fault and stack-growth profiles from plain records.
//! - `debug_pprof`: the agent endpoints' request rules (who, what, headers).
//! - `pause_profile`: pause time by laggard and caller code, from
//!   slow-pause records.
//! - `timeline`: the streaming trace-event writer.

pub mod debug_pprof;
pub mod pause_profile;
pub mod pprof;
pub mod profile_proto;
pub mod profiles;
pub mod timeline;
