//! `bpf_stats`: with statistics enabled, the kernel's run count and run
//! time of a real attached program rise as it runs.

use aya::programs::TracePoint;
use tracer::{
    bpf_stats,
    kernel::{faults::ensure_tracefs, object::Object},
};

use crate::support::require_root;

/// Touch `pages` fresh anonymous pages: one page fault each.
fn fault_pages(pages: usize) {
    let len = pages * 4096;
    // SAFETY: a private anonymous mapping, written inside its bounds, then
    // unmapped.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(
            p,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        for i in 0..pages {
            p.cast::<u8>().add(i * 4096).write_volatile(1);
        }
        libc::munmap(p, len);
    }
}

fn cost_of(programs: &Object, name: &str) -> bpf_stats::ProgramCost {
    bpf_stats::program_costs(programs.ebpf())
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("{name} is loaded but has no cost entry"))
}

#[test]
fn run_counts_and_time_rise_for_an_attached_program() {
    require_root();
    // The sysctl shows only its own setting, not fds like the guard's: when
    // it is off, the run time counted below is the guard's doing.
    let sysctl = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").unwrap();
    let guard = bpf_stats::enable().expect("enabling BPF statistics");

    let mut programs = Object::load().expect("loading the programs");
    ensure_tracefs().expect("tracefs");
    let never_loaded = bpf_stats::program_costs(programs.ebpf());
    assert!(
        never_loaded.is_empty(),
        "nothing loaded yet, so no costs: {never_loaded:?}"
    );
    let tp = programs
        .program::<TracePoint>("fault_tp_user")
        .expect("loading fault_tp_user");
    tp.attach("exceptions", "page_fault_user")
        .expect("attaching fault_tp_user");

    let before = cost_of(&programs, "fault_tp_user");
    // It runs on every user page fault on the machine (and returns at once
    // for this untraced process).
    let pages = 4096;
    fault_pages(pages);
    let ran = cost_of(&programs, "fault_tp_user").since(&before);
    assert!(
        ran.runs >= pages as u64,
        "{pages} page faults, {} runs counted",
        ran.runs
    );
    assert!(ran.run_ns > 0, "no run time counted: {ran:?}");
    let ns = ran.ns_per_run().unwrap();
    assert!(ns < 10_000.0, "{ns:.0} ns per run for a lookup that misses");
    eprintln!(
        "fault_tp_user: {} runs, {ns:.0} ns per run (kernel.bpf_stats_enabled {})",
        ran.runs,
        sysctl.trim()
    );
    drop(guard);
}
