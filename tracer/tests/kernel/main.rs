//! Kernel tests: real eBPF programs loaded into the running kernel, tracing
//! real Go binaries of every Go version of the matrix. Run serially (they
//! share kernel state) through `cargo xtask test`.

mod scenario;
mod support;

mod agent;
mod backend_agreement;
mod binary_analysis;
mod faults;
mod formats;
mod memory;
mod pauses;
mod stack_growth;
mod stw_probe;
mod vm_env;
