//! Stack growth named once: before any sink sees them, the engine fills in
//! the code of each stack-growth observation (an event's return addresses,
//! a process's site rows) from the process's image, with the load bias the
//! engine resolved. Sinks only look names up (`model::code`).

use std::{collections::HashMap, sync::Arc};

use crate::{
    image::ProcessImage,
    model::{
        code::{Code, ReturnCode, growth_pcs, site_pcs},
        observed::Observed,
    },
};

/// Return addresses kept symbolized per process; past it that process's
/// cache starts over (they are many only in a long trace of varied code,
/// and cheap to read again).
const CACHE_MAX: usize = 65_536;

/// The images of the traced processes and what was read from them.
#[derive(Default)]
pub struct GrowthCode {
    images: HashMap<u32, Arc<ProcessImage>>,
    /// Per process, per return address; only what was read with the load
    /// bias known (an address read before is read again).
    cache: HashMap<u32, HashMap<u64, ReturnCode>>,
}

impl GrowthCode {
    /// Fill in the code of the stack-growth observations of `out`, in
    /// order: a process is known from its `Started` to its `Exited`.
    pub fn annotate(&mut self, out: &mut [Observed]) {
        for o in out.iter_mut() {
            match o {
                Observed::Started(info) => {
                    if let Some(image) = &info.image {
                        self.images.insert(info.pid, image.clone());
                    }
                }
                Observed::StackGrowth { event, code } => {
                    let pcs = growth_pcs(event).iter().copied();
                    *code = Arc::new(self.code(event.header.tgid, pcs));
                }
                Observed::StackSites {
                    pid, rows, code, ..
                } => {
                    *code = Arc::new(self.code(*pid, site_pcs(rows)));
                }
                Observed::Exited { pid, .. } => {
                    self.images.remove(pid);
                    self.cache.remove(pid);
                }
                _ => {}
            }
        }
    }

    fn code(&mut self, pid: u32, pcs: impl Iterator<Item = u64>) -> Code {
        let mut code = Code::default();
        for pc in pcs {
            if !code.contains(pc) {
                code.insert(pc, self.return_code(pid, pc));
            }
        }
        code
    }

    fn return_code(&mut self, pid: u32, pc: u64) -> ReturnCode {
        if let Some(c) = self.cache.get(&pid).and_then(|m| m.get(&pc)) {
            return c.clone();
        }
        let Some(image) = self.images.get(&pid) else {
            return ReturnCode::default();
        };
        if image.resolve().is_none() {
            return ReturnCode::default();
        }
        let c = ReturnCode {
            frames: image.frames_of_return(pc).into(),
            max_frame: image.max_frame_of_return(pc),
        };
        let cache = self.cache.entry(pid).or_default();
        if cache.len() >= CACHE_MAX {
            cache.clear();
        }
        cache.insert(pc, c.clone());
        c
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::stack::{StackGrowthEvent, StackSiteCounts, StackSiteKey};

    use super::*;
    use crate::{
        model::observed::tests_support::api_process,
        stackgrowth::{Symbolizer as _, tests_support::exact_row},
    };

    fn event(pid: u32, pcs: &[u64]) -> Observed {
        // SAFETY: a plain-old-data event; all zeroes is a valid one.
        let mut event: StackGrowthEvent = unsafe { std::mem::zeroed() };
        event.header.tgid = pid;
        event.nframes = pcs.len() as u32;
        event.frames[..pcs.len()].copy_from_slice(pcs);
        Observed::StackGrowth {
            event,
            code: Arc::default(),
        }
    }

    fn row(pid: u32, site_pc: u64, caller_pc: u64) -> (StackSiteKey, StackSiteCounts) {
        exact_row(pid, (site_pc, caller_pc), (8192, 16384), 1, 0)
    }

    fn code_of(o: &Observed) -> &Code {
        match o {
            Observed::StackGrowth { code, .. } | Observed::StackSites { code, .. } => code,
            _ => unreachable!(),
        }
    }

    /// Every address an observation carries gets its code (unknown here:
    /// the test process has no image), none that it does not.
    #[test]
    fn every_growth_address_is_looked_up_once() {
        let mut out = vec![
            Observed::Started(api_process(7, "b1")),
            // The walk ends at the first zero.
            event(7, &[0x10, 0x20, 0, 0x40]),
            Observed::StackSites {
                pid: 7,
                rows: vec![row(7, 0x10, 0x30), row(7, 0, 0)],
                observed: Default::default(),
                code: Arc::default(),
            },
        ];
        let mut g = GrowthCode::default();
        g.annotate(&mut out);
        let growth = code_of(&out[1]);
        assert_eq!(growth.len(), 2);
        assert!(growth.contains(0x10) && growth.contains(0x20) && !growth.contains(0x40));
        let sites = code_of(&out[2]);
        assert_eq!(sites.len(), 2);
        assert!(sites.contains(0x10) && sites.contains(0x30) && !sites.contains(0));
        assert_eq!(sites.symbolize_return_address(0x30).function, "0x30");
    }
}
