//! CFS throttling of a traced process's CPU cgroup while it was traced
//! (`targets::cpu_throttle` reads it).

use serde::Serialize;

/// Throttling counters of one CPU cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ThrottleCounts {
    /// Periods in which the group ran out of quota.
    pub nr_throttled: u64,
    /// Time its tasks were held off the CPU for that.
    pub throttled_ns: u64,
}

/// A process's CPU cgroup and what it was throttled while traced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CpuThrottling {
    /// The cgroup's path inside its hierarchy.
    pub cgroup: String,
    #[serde(flatten)]
    pub while_traced: ThrottleCounts,
}
