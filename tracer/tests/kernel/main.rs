//! Kernel tests: real eBPF programs loaded into the running kernel, tracing
//! real Go binaries of every Go version of the matrix. Run serially (they
//! share kernel state) through `cargo xtask test`.

mod loopback;
mod scenario;
mod support;

mod agent;
mod agent_cost;
mod agent_outputs;
mod agent_pauses;
mod backend_agreement;
mod binary_analysis;
mod bpf_stats;
mod callers;
mod check;
mod compat;
mod containers;
mod faults;
mod formats;
mod goroutine_residency;
mod kernel_waits;
mod laggards;
mod live_lines;
mod memory;
mod memory_trace;
mod otlp;
mod outputs;
mod pageout_breakdown;
mod pauses;
mod real_services;
mod stack_growth;
mod stopping;
mod storm;
mod stw_probe;
mod vm_env;
