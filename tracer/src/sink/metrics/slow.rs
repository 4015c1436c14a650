//! The health of the slow-pause records: how many were made, evicted from
//! the store, and left out of the pause log.

use prometheus_client::{
    metrics::{counter::Counter, gauge::Gauge},
    registry::Registry,
};

#[derive(Default)]
pub struct SlowPauseMetrics {
    pub recorded: Counter,
    pub evicted: Counter,
    pub unlogged: Counter,
    pub kept: Gauge,
}

impl SlowPauseMetrics {
    /// Register under the agent's prefix.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "slow_pauses_recorded",
            "Pauses at or above --slow-pause recorded with their explanation",
            self.recorded.clone(),
        );
        r.register(
            "slow_pauses_evicted",
            "Slow-pause records evicted from the store, oldest first (--slow-pauses-kept, --slow-pauses-per-set)",
            self.evicted.clone(),
        );
        r.register(
            "slow_pauses_unlogged",
            "Slow-pause records not written to the pause log (its rate limit, or a write error)",
            self.unlogged.clone(),
        );
        r.register(
            "slow_pauses_kept",
            "Slow-pause records in the store now (/debug/pauses)",
            self.kept.clone(),
        );
    }
}
