//! gostw's kernel programs. One module per probe family; all of them share
//! the maps in `maps` and check the traced-process map before doing anything,
//! so processes that are not traced pay only that lookup.
#![no_std]
#![no_main]
// The BPF target has atomic add but no compare-and-swap, so core's atomic
// types offer no fetch_add; the intrinsic compiles to BPF's atomic add.
#![feature(core_intrinsics)]
#![expect(internal_features, reason = "atomic_xadd, see above")]

mod compat;
mod explain;
mod explain_sample;
mod explain_sched;
mod fault;
mod fault_kprobe;
mod fault_tracepoint;
mod maps;
mod pause;
mod regs;
mod stack;
mod stopping;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any program that could reach this; it only has to
    // exist for the compiler.
    loop {}
}

/// GPL-compatible so the programs may call `bpf_probe_read_user` and friends.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
