//! `cargo xtask bench compat`: what the older-kernel program variants cost
//! beside the programs they replace, on this kernel's CPU rather than under
//! QEMU. `GOSTW_COMPAT=force` makes gostw load every variant
//! (`tracer_common::compat`: `fault_tp_switch_compat` and
//! `explain_switch_compat` where 5.10 cannot run `switch_both`,
//! `stack_sample_compat` for `stack_sample`), so both paths run the same
//! workload on the same kernel: the kernel-waits bench's spinner (the world
//! stopping a third of the time, so the scheduler programs work inside
//! pauses most) with the tracepoint fault backend and sampled stack growth.
//! Rounds alternate the two; figures are the kernel's BPF statistics.

use anyhow::bail;

use super::{
    Options, bpf,
    kernel_waits::{Gostw, Run, report, spinner},
};
use crate::{cmd::step, demo, go, setup};

/// The two ways gostw loads its programs: on a kernel with every helper, and
/// as it does on 5.10.
const WAYS: [(&str, &[(&str, &str)]); 2] = [
    ("preferred", &[]),
    ("variants", &[("GOSTW_COMPAT", "force")]),
];

pub fn run(opts: &Options) -> anyhow::Result<()> {
    let Some(toolchain) = go::toolchain(&opts.go) else {
        bail!("Go {} is not in the matrix", opts.go);
    };
    if !setup::is_root() {
        bail!("gostw loads eBPF programs and needs root: run `sudo -E cargo xtask bench compat`");
    }
    let gostw = crate::build::gostw(crate::arch::Arch::Amd64)?;
    let workload = demo::build_stw_workload(toolchain, &opts.go)?;
    let _stats = bpf::Stats::enable()?;
    step(&format!(
        "{} rounds of {} s of `gostw attach` on the spinner, preferred programs and older-kernel variants in turn (Go {})",
        opts.rounds(),
        opts.seconds,
        opts.go
    ));
    let args = ["--fault-source", "tracepoint", "--stacks", "sampled"];
    let mut runs: [Vec<Run>; 2] = Default::default();
    for round in 1..=opts.rounds() {
        for (i, (way, env)) in WAYS.iter().enumerate() {
            let r = spinner(&gostw, &workload, opts.seconds, &Gostw { args: &args, env })?;
            eprintln!(
                "round {round} {way}: {} pauses, programs: {}",
                r.pauses,
                r.programs.keys().cloned().collect::<Vec<_>>().join(" ")
            );
            runs[i].push(r);
        }
    }
    for ((way, _), runs) in WAYS.iter().zip(&runs) {
        report("compat", way, runs);
    }
    Ok(())
}
