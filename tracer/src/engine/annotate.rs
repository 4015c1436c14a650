//! Watches that read `/proc` and cgroup files beside the kernel's events
//! (CPU throttling, memory exposure) and put what they read into the
//! stream, around the processes' `Started` and `Exited`.

use std::sync::Arc;

use crate::model::observed::Observed;
use crate::{memory::watch::ExposureWatch, targets::cpu_throttle::ThrottleWatch};

/// Follow the processes `out` starts, and add what their cgroup was
/// throttled just before the `Exited` of those it ends.
pub fn throttling(w: &mut ThrottleWatch, out: &mut Vec<Observed>) {
    let mut i = 0;
    while i < out.len() {
        match &out[i] {
            Observed::Started(info) => w.started(info.pid),
            &Observed::Exited { pid, .. } => {
                if let Some(throttling) = w.ended(pid) {
                    out.insert(i, Observed::CpuThrottling { pid, throttling });
                    i += 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
}

/// Follow the processes `out` starts, add the readings that came in and
/// each ended process's last reading just before its `Exited`, and start
/// the reads that are due.
pub fn exposure(w: &mut ExposureWatch, out: &mut Vec<Observed>) {
    let mut i = 0;
    while i < out.len() {
        match &out[i] {
            Observed::Started(info) => {
                w.started(info.pid, info.image.as_ref().map(|i| i.exe.clone()));
            }
            &Observed::Exited { pid, .. } => {
                if let Some(r) = w.ended(pid) {
                    out.insert(i, Observed::Exposure(Arc::new(r)));
                    i += 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out.extend(
        w.collect()
            .into_iter()
            .map(|r| Observed::Exposure(Arc::new(r))),
    );
    w.refresh();
}
