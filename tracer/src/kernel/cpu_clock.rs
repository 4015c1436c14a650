//! A perf_event program on a CPU-clock event of every online CPU (the
//! stack-growth sampler and the laggard sampler).

use anyhow::Context as _;
use aya::programs::{
    PerfEvent,
    perf_event::{PerfEventConfig, PerfEventLinkId, PerfEventScope, SamplePolicy, SoftwareEvent},
};

/// Attach `prog` (named `name`, for errors) to a CPU-clock event sampled by
/// `policy` on every online CPU, its links added to `links` (on an error,
/// those made so far are there for the caller to detach).
pub fn attach_every_cpu(
    prog: &mut PerfEvent,
    name: &str,
    policy: &SamplePolicy,
    links: &mut Vec<PerfEventLinkId>,
) -> anyhow::Result<()> {
    let cpus =
        aya::util::online_cpus().map_err(|(what, e)| anyhow::anyhow!("reading {what}: {e}"))?;
    for cpu in cpus {
        let policy = match policy {
            SamplePolicy::Period(p) => SamplePolicy::Period(*p),
            SamplePolicy::Frequency(f) => SamplePolicy::Frequency(*f),
        };
        let link = prog
            .attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                policy,
                false,
            )
            .with_context(|| format!("opening {name} on CPU {cpu}"))?;
        links.push(link);
    }
    Ok(())
}
