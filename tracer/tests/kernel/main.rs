//! Kernel tests (see support.rs).
