//! The code at the return addresses of a traced process's goroutine stacks,
//! as the engine symbolized it once, with the load bias it resolved: every
//! sink names stack-growth sites from here, never from an executable or
//! `/proc`, so a recorded stream gives the same names later.

use std::{collections::HashMap, sync::Arc};

use tracer_common::stack::{StackGrowthEvent, StackSiteCounts, StackSiteKey};

use crate::{image::Frame, stackgrowth::Symbolizer};

/// What is at one return address.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReturnCode {
    /// Frames of the call just before it, innermost (inlined) first; empty
    /// when no table knows the address.
    pub frames: Arc<[Frame]>,
    /// The stack the function holding it takes for its own frame (Go's
    /// `funcMaxSPDelta`), if known.
    pub max_frame: Option<u64>,
}

/// Return addresses and their code.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Code(HashMap<u64, ReturnCode>);

impl Code {
    pub fn insert(&mut self, pc: u64, code: ReturnCode) {
        self.0.insert(pc, code);
    }

    pub fn contains(&self, pc: u64) -> bool {
        self.0.contains_key(&pc)
    }

    /// Frames of return address `pc`, innermost first (empty when unknown).
    pub fn return_frames(&self, pc: u64) -> &[Frame] {
        self.0.get(&pc).map_or(&[], |c| &c.frames[..])
    }

    /// Add what `other` knows: an address named there and not here (read
    /// before its process's load bias was known) takes the name.
    pub fn extend(&mut self, other: &Code) {
        for (pc, c) in &other.0 {
            match self.0.get(pc) {
                Some(known) if !known.frames.is_empty() || c.frames.is_empty() => {}
                _ => {
                    self.0.insert(*pc, c.clone());
                }
            }
        }
    }

    /// Addresses known.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Symbolizer for Code {
    fn return_frame(&self, pc: u64) -> Option<Frame> {
        self.return_frames(pc).first().cloned()
    }

    fn max_frame(&self, pc: u64) -> Option<u64> {
        self.0.get(&pc)?.max_frame
    }
}

/// The goroutine stack of a stack-growth event (return addresses: the site
/// that needed more stack, its caller, then a frame-pointer walk).
pub fn growth_pcs(ev: &StackGrowthEvent) -> &[u64] {
    let n = (ev.nframes as usize).min(ev.frames.len());
    let pcs = &ev.frames[..n];
    // The walk stops at the first zero.
    let end = pcs.iter().position(|&pc| pc == 0).unwrap_or(pcs.len());
    &pcs[..end]
}

/// The return addresses of stack-growth site rows: each site and its caller
/// (0 for shrinks: no address).
pub fn site_pcs(rows: &[(StackSiteKey, StackSiteCounts)]) -> impl Iterator<Item = u64> + '_ {
    rows.iter()
        .flat_map(|(k, _)| [k.site_pc, k.caller_pc])
        .filter(|&pc| pc != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(function: &str) -> ReturnCode {
        ReturnCode {
            frames: vec![Frame {
                function: function.into(),
                file: String::new(),
                line: 0,
                inlined: false,
                start_line: 0,
            }]
            .into(),
            max_frame: Some(64),
        }
    }

    #[test]
    fn a_name_replaces_an_unknown_address_but_not_a_name() {
        let mut known = Code::default();
        known.insert(0x10, ReturnCode::default());
        known.insert(0x20, named("main.a"));
        let mut later = Code::default();
        later.insert(0x10, named("main.b"));
        later.insert(0x20, ReturnCode::default());
        later.insert(0x30, named("main.c"));
        known.extend(&later);
        let names: Vec<String> = [0x10, 0x20, 0x30]
            .iter()
            .map(|&pc| known.symbolize_return_address(pc).function)
            .collect();
        assert_eq!(names, ["main.b", "main.a", "main.c"]);
        assert_eq!(known.max_frame(0x10), Some(64));
        assert_eq!(known.symbolize_return_address(0x40).function, "0x40");
    }
}
