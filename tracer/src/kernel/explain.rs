//! Explaining pauses (`tracer_common::explain`): the per-process detail the
//! pause probes fill, present only for the processes to explain.

use anyhow::Context as _;
use aya::maps::HashMap;
use tracer_common::{explain::PauseDetail, map_names};

use super::object::Object;

/// Explain the pauses of process `tgid` from now on.
pub fn watch(object: &mut Object, tgid: u32) -> anyhow::Result<()> {
    let mut details: HashMap<_, u32, PauseDetail> =
        HashMap::try_from(object.map_mut(map_names::PAUSE_DETAILS)?)?;
    details
        .insert(tgid, PauseDetail::ZERO, 0)
        .with_context(|| format!("adding pid {tgid} to the explained processes"))
}

/// Forget process `tgid` (absent is fine).
pub fn forget(object: &mut Object, tgid: u32) -> anyhow::Result<()> {
    let mut details: HashMap<_, u32, PauseDetail> =
        HashMap::try_from(object.map_mut(map_names::PAUSE_DETAILS)?)?;
    let _ = details.remove(&tgid);
    Ok(())
}
