//! Empty on purpose: the kernel programs live in the `gostw-ebpf` binary
//! target. This library exists so `tracer` can name this crate as a
//! build-dependency and cargo rebuilds it when the programs change.
#![no_std]
