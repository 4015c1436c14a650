//! gostw's library: Go binary analysis, loading and attaching the kernel
//! programs, and the pieces the `gostw` binary is made of.

pub mod agent;
pub mod binary;
pub mod bpf_stats;
pub mod ebpf;
pub mod events;
pub mod faults;
pub mod inspect;
pub mod kernel_support;
pub mod pauses;
pub mod pipeline;
pub mod process;
pub mod report;
pub mod session;
pub mod stackgrowth;
pub mod symbolize;
pub mod target;
pub mod units;
