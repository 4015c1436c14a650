//! Output formats other tools read: pprof profiles (`go tool pprof`,
//! Pyroscope, Parca) and a pause timeline in Chrome's trace-event JSON
//! (Perfetto UI, chrome://tracing). Pure encoders: the engine's sinks feed
//! them symbolized stacks and pause records.

pub mod pprof;
pub mod profile_proto;
pub mod timeline;
