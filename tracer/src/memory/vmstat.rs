//! The host's swap traffic: `/proc/vmstat` counters (`pswpin`, `pswpout`,
//! `swap_ra`, `swap_ra_hit`, `pgmajfault`) and `/proc/meminfo` swap sizes,
//! as snapshots; two snapshots (e.g. at trace start and end) give rates and
//! the swap readahead hit ratio over the interval.

use super::MemoryError;
use crate::clock::monotonic_ns;

/// The host's swap counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HostSwap {
    /// `CLOCK_MONOTONIC` when read, ns.
    pub at_ns: u64,
    /// Pages read from swap since boot.
    pub pswpin: u64,
    /// Pages written to swap since boot.
    pub pswpout: u64,
    /// Zero-filled pages swapped in and out without I/O (Linux 6.12+ keeps
    /// them as a bitmap; `pswpin`/`pswpout` leave them out).
    pub swpin_zero: u64,
    pub swpout_zero: u64,
    /// Pages read ahead from swap (brought in around a faulting page).
    pub swap_ra: u64,
    /// Read-ahead pages that a later fault used.
    pub swap_ra_hit: u64,
    /// Major faults since boot (all processes).
    pub pgmajfault: u64,
    pub swap_total_bytes: u64,
    pub swap_free_bytes: u64,
}

/// Swap traffic between two snapshots.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct HostSwapDelta {
    pub interval_secs: f64,
    pub pswpin: u64,
    pub pswpout: u64,
    pub swpin_zero: u64,
    pub swpout_zero: u64,
    pub pswpin_per_sec: f64,
    pub pswpout_per_sec: f64,
    pub swap_ra: u64,
    pub swap_ra_hit: u64,
    /// `swap_ra_hit / swap_ra`; `None` when nothing was read ahead.
    pub readahead_hit_ratio: Option<f64>,
    pub pgmajfault_per_sec: f64,
    /// Swap in use at the second snapshot.
    pub swap_used_bytes: u64,
}

impl HostSwap {
    /// Read the counters now.
    pub fn snapshot() -> Result<HostSwap, MemoryError> {
        let read = |path: &str| {
            std::fs::read_to_string(path).map_err(|source| MemoryError::Host {
                what: path.to_owned(),
                source,
            })
        };
        let vmstat = read("/proc/vmstat")?;
        let meminfo = read("/proc/meminfo")?;
        Ok(HostSwap::parse(&vmstat, &meminfo, monotonic_ns()))
    }

    /// Build a snapshot from the two files' text (absent counters read 0:
    /// `swap_ra*` exist since Linux 4.16).
    pub fn parse(vmstat: &str, meminfo: &str, at_ns: u64) -> HostSwap {
        let mut s = HostSwap {
            at_ns,
            ..HostSwap::default()
        };
        for line in vmstat.lines() {
            let Some((k, v)) = line.split_once(' ') else {
                continue;
            };
            let Ok(v) = v.trim().parse() else { continue };
            match k {
                "pswpin" => s.pswpin = v,
                "pswpout" => s.pswpout = v,
                "swpin_zero" => s.swpin_zero = v,
                "swpout_zero" => s.swpout_zero = v,
                "swap_ra" => s.swap_ra = v,
                "swap_ra_hit" => s.swap_ra_hit = v,
                "pgmajfault" => s.pgmajfault = v,
                _ => {}
            }
        }
        for line in meminfo.lines() {
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            let kb = v
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok());
            match (k, kb) {
                ("SwapTotal", Some(kb)) => s.swap_total_bytes = kb * 1024,
                ("SwapFree", Some(kb)) => s.swap_free_bytes = kb * 1024,
                _ => {}
            }
        }
        s
    }

    /// Traffic from `a` to the later `b` (counters that went backwards read 0).
    pub fn delta(a: &HostSwap, b: &HostSwap) -> HostSwapDelta {
        let interval_secs = b.at_ns.saturating_sub(a.at_ns) as f64 / 1e9;
        let rate = |n: u64| {
            if interval_secs > 0.0 {
                n as f64 / interval_secs
            } else {
                0.0
            }
        };
        let pswpin = b.pswpin.saturating_sub(a.pswpin);
        let pswpout = b.pswpout.saturating_sub(a.pswpout);
        let swap_ra = b.swap_ra.saturating_sub(a.swap_ra);
        let swap_ra_hit = b.swap_ra_hit.saturating_sub(a.swap_ra_hit);
        HostSwapDelta {
            interval_secs,
            pswpin,
            pswpout,
            swpin_zero: b.swpin_zero.saturating_sub(a.swpin_zero),
            swpout_zero: b.swpout_zero.saturating_sub(a.swpout_zero),
            pswpin_per_sec: rate(pswpin),
            pswpout_per_sec: rate(pswpout),
            swap_ra,
            swap_ra_hit,
            readahead_hit_ratio: (swap_ra > 0).then(|| swap_ra_hit as f64 / swap_ra as f64),
            pgmajfault_per_sec: rate(b.pgmajfault.saturating_sub(a.pgmajfault)),
            swap_used_bytes: b.swap_total_bytes.saturating_sub(b.swap_free_bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parts of this machine's /proc/vmstat and /proc/meminfo.
    const VMSTAT_A: &str = "nr_free_pages 2819744\npgmajfault 2203\npswpin 100\npswpout 5000\nswap_ra 40\nswap_ra_hit 10\nswpin_zero 20140\nswpout_zero 21098\n";
    const VMSTAT_B: &str = "nr_free_pages 2819000\npgmajfault 4203\npswpin 2100\npswpout 5000\nswap_ra 240\nswap_ra_hit 60\nswpin_zero 20140\nswpout_zero 21117\n";
    const MEMINFO: &str =
        "MemTotal:       24683364 kB\nSwapTotal:       1048572 kB\nSwapFree:         524288 kB\n";

    #[test]
    fn rates_and_readahead_hit_ratio_over_an_interval() {
        let a = HostSwap::parse(VMSTAT_A, MEMINFO, 1_000_000_000);
        let b = HostSwap::parse(VMSTAT_B, MEMINFO, 3_000_000_000);
        assert_eq!(
            (a.pswpin, a.pswpout, a.swap_ra, a.swap_ra_hit),
            (100, 5000, 40, 10)
        );
        assert_eq!(a.swap_total_bytes, 1048572 * 1024);
        let d = HostSwap::delta(&a, &b);
        assert_eq!(d.interval_secs, 2.0);
        assert_eq!((d.pswpin, d.pswpout), (2000, 0));
        assert_eq!((d.swpin_zero, d.swpout_zero), (0, 19));
        assert_eq!(d.pswpin_per_sec, 1000.0);
        assert_eq!(d.readahead_hit_ratio, Some(0.25));
        assert_eq!(d.pgmajfault_per_sec, 1000.0);
        assert_eq!(d.swap_used_bytes, (1048572 - 524288) * 1024);
    }

    #[test]
    fn no_readahead_no_ratio_and_old_kernels_read_zero() {
        let a = HostSwap::parse("pswpin 1\n", "", 5);
        let d = HostSwap::delta(&a, &a);
        assert_eq!(d.readahead_hit_ratio, None);
        assert_eq!(d.pswpin_per_sec, 0.0);
        assert_eq!(a.swap_ra, 0);
    }

    #[test]
    fn snapshot_reads_this_host() {
        let s = HostSwap::snapshot().unwrap();
        assert!(s.at_ns > 0);
        assert!(s.swap_free_bytes <= s.swap_total_bytes);
    }
}
