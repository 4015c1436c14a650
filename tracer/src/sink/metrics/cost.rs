//! What the agent itself costs, as series: run time and run count of each of
//! its BPF programs (the kernel's statistics, on while the agent runs), and
//! its own CPU time and resident memory.
//!
//! The process series carry the standard names of Prometheus client
//! libraries (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! unprefixed): existing dashboards and alerts on a job's own CPU and memory
//! work for the agent unchanged, and the agent serves no other process's
//! figures under these names.

use std::{collections::HashMap, sync::Mutex};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::{Registry, Unit},
};

use crate::bpf_stats::CostReading;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProgramLabel {
    program: String,
}

/// Cumulative figures of the last reading, to turn the next one into
/// counter increments.
#[derive(Default)]
struct Last {
    programs: HashMap<String, (u64, u64)>,
    cpu_seconds: f64,
}

/// The cost series.
pub struct CostMetrics {
    run_seconds: Family<ProgramLabel, Counter<f64, std::sync::atomic::AtomicU64>>,
    runs: Family<ProgramLabel, Counter>,
    cpu_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    resident_bytes: Gauge,
    last: Mutex<Last>,
}

impl Default for CostMetrics {
    fn default() -> Self {
        CostMetrics {
            run_seconds: Family::default(),
            runs: Family::default(),
            cpu_seconds: Counter::default(),
            resident_bytes: Gauge::default(),
            last: Mutex::new(Last::default()),
        }
    }
}

impl CostMetrics {
    /// Register the program series in `gostw` (the `gostw_`-prefixed
    /// registry).
    pub fn register_programs(&self, gostw: &mut Registry) {
        gostw.register_with_unit(
            "bpf_program_run",
            "Time the agent's BPF programs ran in the kernel, by program (kernel BPF statistics, enabled while the agent runs)",
            Unit::Seconds,
            self.run_seconds.clone(),
        );
        gostw.register(
            "bpf_program_runs",
            "Runs of the agent's BPF programs, by program (kernel BPF statistics, enabled while the agent runs)",
            self.runs.clone(),
        );
    }

    /// Register the process series in `root` (no prefix).
    pub fn register_process(&self, root: &mut Registry) {
        root.register_with_unit(
            "process_cpu",
            "User and system CPU time of the agent's process",
            Unit::Seconds,
            self.cpu_seconds.clone(),
        );
        root.register_with_unit(
            "process_resident_memory",
            "Resident memory of the agent's process",
            Unit::Bytes,
            self.resident_bytes.clone(),
        );
    }

    /// Bring the series to `reading` (cumulative figures).
    pub fn observe(&self, reading: &CostReading) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        for p in &reading.programs {
            let label = ProgramLabel {
                program: p.name.clone(),
            };
            let (runs, ns) = last.programs.entry(p.name.clone()).or_default();
            self.runs
                .get_or_create(&label)
                .inc_by(p.runs.saturating_sub(*runs));
            self.run_seconds
                .get_or_create(&label)
                .inc_by(p.run_ns.saturating_sub(*ns) as f64 / 1e9);
            (*runs, *ns) = (p.runs.max(*runs), p.run_ns.max(*ns));
        }
        if let Some(u) = reading.usage {
            if u.cpu_seconds > last.cpu_seconds {
                self.cpu_seconds.inc_by(u.cpu_seconds - last.cpu_seconds);
                last.cpu_seconds = u.cpu_seconds;
            }
            self.resident_bytes
                .set(i64::try_from(u.rss_bytes).unwrap_or(i64::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf_stats::{ProgramCost, SelfUsage};

    fn reading(runs: u64, run_ns: u64, cpu_seconds: f64) -> CostReading {
        CostReading {
            stats_enabled: true,
            programs: vec![ProgramCost {
                name: "stw_stop".into(),
                runs,
                run_ns,
            }],
            usage: Some(SelfUsage {
                cpu_seconds,
                rss_bytes: 30 << 20,
                peak_rss_bytes: 31 << 20,
            }),
        }
    }

    #[test]
    fn cumulative_readings_become_counters_with_their_standard_names() {
        let cost = CostMetrics::default();
        let (mut gostw, mut root) = (Registry::with_prefix("gostw"), Registry::default());
        cost.register_programs(&mut gostw);
        cost.register_process(&mut root);
        cost.observe(&reading(10, 5_000, 0.25));
        cost.observe(&reading(30, 2_000_000_000, 1.5));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &gostw).unwrap();
        prometheus_client::encoding::text::encode(&mut text, &root).unwrap();
        assert!(
            text.contains("gostw_bpf_program_runs_total{program=\"stw_stop\"} 30\n"),
            "{text}"
        );
        assert!(
            text.contains("gostw_bpf_program_run_seconds_total{program=\"stw_stop\"} 2.0\n"),
            "{text}"
        );
        assert!(text.contains("process_cpu_seconds_total 1.5\n"), "{text}");
        assert!(
            text.contains(&format!("process_resident_memory_bytes {}\n", 30 << 20)),
            "{text}"
        );
    }
}
