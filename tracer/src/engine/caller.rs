//! The code that asked for a stop-the-world: the stopping goroutine's stack
//! (`PauseDetail::caller`, symbolized), and the one frame that names it in a
//! summary, the first outside the runtime (`main.readStats` for a pause of
//! `runtime.ReadMemStats` it called), with the runtime entry point it went
//! through.

use serde::Serialize;

use crate::image::Frame;

/// Frames kept of a caller stack.
pub const MAX_FRAMES: usize = 24;

/// Packages whose frames are the runtime's plumbing, not the caller.
const RUNTIME_PREFIXES: &[&str] = &["runtime.", "internal/runtime/"];

fn is_runtime(function: &str) -> bool {
    RUNTIME_PREFIXES.iter().any(|p| function.starts_with(p))
}

/// The caller of a pause, as a summary counts it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct CallerSite {
    /// The first function outside the runtime (e.g. `main.readStats`), or
    /// the outermost frame when the whole stack is the runtime's (a GC
    /// worker's mark termination: `runtime.gcBgMarkWorker`).
    pub function: String,
    /// The runtime function it called on the way (`runtime.ReadMemStats`,
    /// `runtime.GC`, `runtime.mallocgc`, ...); empty when there is none.
    pub via: String,
}

impl CallerSite {
    /// The site of a symbolized caller stack (innermost first), if any frame.
    pub fn of(frames: &[Frame]) -> Option<CallerSite> {
        let outside = frames.iter().position(|f| !is_runtime(&f.function));
        let (at, via) = match outside {
            Some(i) => (i, i.checked_sub(1).map(|v| &frames[v])),
            None => {
                let last = frames.len().checked_sub(1)?;
                // runtime.goexit and the compiler's `go f()` wrappers
                // (`*.gowrapN`) frame goroutines: the one inside names it.
                let at = frames
                    .iter()
                    .rposition(|f| {
                        f.function != "runtime.goexit" && !f.function.contains(".gowrap")
                    })
                    .unwrap_or(last);
                (at, None)
            }
        };
        Some(CallerSite {
            function: frames[at].function.clone(),
            via: via.map(|f| f.function.clone()).unwrap_or_default(),
        })
    }
}

/// The goroutine's part of a stopping thread's stack (innermost first):
/// the frames after the first `runtime.systemstack`, where the thread left
/// the goroutine's stack for g0's; all of them when there is none (before
/// Go 1.21 `systemstack` has no frame of its own, and a stop run as the
/// function it calls leaves no g0 frame on the chain).
pub fn goroutine_part(mut frames: Vec<Frame>) -> Vec<Frame> {
    if let Some(i) = frames
        .iter()
        .position(|f| f.function == "runtime.systemstack")
    {
        frames.drain(..=i);
    }
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(names: &[&str]) -> Vec<Frame> {
        names
            .iter()
            .map(|n| Frame {
                function: (*n).to_owned(),
                file: String::new(),
                line: 0,
                inlined: false,
                start_line: 0,
            })
            .collect()
    }

    #[test]
    fn the_first_frame_outside_the_runtime_is_the_caller() {
        let s = CallerSite::of(&frames(&[
            "runtime.stopTheWorld",
            "runtime.ReadMemStats",
            "main.readStats",
            "main.main",
            "runtime.main",
            "runtime.goexit",
        ]))
        .unwrap();
        assert_eq!(
            (s.function.as_str(), s.via.as_str()),
            ("main.readStats", "runtime.ReadMemStats")
        );
        let gc = CallerSite::of(&frames(&[
            "runtime.gcMarkDone",
            "runtime.gcBgMarkWorker",
            "runtime.gcBgMarkStartWorkers.gowrap1",
            "runtime.goexit",
        ]))
        .unwrap();
        assert_eq!(
            (gc.function.as_str(), gc.via.as_str()),
            ("runtime.gcBgMarkWorker", "")
        );
        let pprof = CallerSite::of(&frames(&[
            "runtime.goroutineProfileWithLabels",
            "runtime/pprof.writeGoroutine",
        ]))
        .unwrap();
        assert_eq!(pprof.function, "runtime/pprof.writeGoroutine");
        assert_eq!(CallerSite::of(&[]), None);
    }

    #[test]
    fn the_g0_frames_are_dropped() {
        let f = frames(&[
            "runtime.systemstack",
            "runtime.stopTheWorld",
            "runtime.ReadMemStats",
            "main.readStats",
        ]);
        let names: Vec<String> = goroutine_part(f).into_iter().map(|f| f.function).collect();
        assert_eq!(
            names,
            [
                "runtime.stopTheWorld",
                "runtime.ReadMemStats",
                "main.readStats"
            ]
        );
        let f = frames(&["runtime.GC", "main.main"]);
        assert_eq!(goroutine_part(f.clone()), f);
    }
}
