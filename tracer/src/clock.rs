//! The two clocks: kernel timestamps are CLOCK_MONOTONIC; people read
//! wall-clock time. One offset, taken once, turns the first into the second.

/// CLOCK_MONOTONIC in ns, the clock of kernel timestamps.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Difference between CLOCK_REALTIME and CLOCK_MONOTONIC, taken once, to
/// print kernel timestamps as wall-clock time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WallClock {
    pub realtime_minus_monotonic_ns: i128,
}

impl WallClock {
    /// Measure the offset now.
    pub fn now() -> WallClock {
        let read = |clock| {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: valid clock id and pointer.
            unsafe { libc::clock_gettime(clock, &mut ts) };
            i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
        };
        let mono = read(libc::CLOCK_MONOTONIC);
        let real = read(libc::CLOCK_REALTIME);
        WallClock {
            realtime_minus_monotonic_ns: real - mono,
        }
    }

    /// A monotonic timestamp as Unix nanoseconds.
    pub fn unix_ns(self, mono_ns: u64) -> u64 {
        u64::try_from(i128::from(mono_ns) + self.realtime_minus_monotonic_ns).unwrap_or(0)
    }
}
