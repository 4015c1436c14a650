//! The command line's names and help texts for the library's enums, here
//! with every other clap definition (the library's types know nothing of
//! clap).

use clap::{ValueEnum, builder::PossibleValue};
use tracer::{kernel::capabilities::FaultSource, stackgrowth::Mode};

/// `--mode` of `gostw stacks`.
impl ValueEnum for Mode {
    fn value_variants<'a>() -> &'a [Self] {
        &[Mode::Sampled, Mode::Exact]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(match self {
            Mode::Sampled => PossibleValue::new("sampled").help(
                "CPU-clock samples that catch a thread copying a goroutine stack: near-zero \
                 cost, shares of CPU time rather than counts. The default",
            ),
            Mode::Exact => PossibleValue::new("exact").help(
                "A uprobe on every `runtime.copystack`: exact counts and sizes, but each hit \
                 costs microseconds, so it is attached only part of the time",
            ),
        })
    }
}

/// `--fault-source`.
impl ValueEnum for FaultSource {
    fn value_variants<'a>() -> &'a [Self] {
        &[
            FaultSource::Auto,
            FaultSource::Kprobe,
            FaultSource::Tracepoint,
        ]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(match self {
            FaultSource::Auto => PossibleValue::new("auto")
                .help("kprobes when the kernel has them and the functions exist, else tracepoints"),
            FaultSource::Kprobe => PossibleValue::new("kprobe"),
            FaultSource::Tracepoint => PossibleValue::new("tracepoint"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant has a name (a new one the list leaves out fails here
    /// only if added to the list: the match above fails to compile first).
    #[test]
    fn names_round_trip() {
        for m in Mode::value_variants() {
            let name = m.to_possible_value().unwrap();
            assert_eq!(Mode::from_str(name.get_name(), false), Ok(*m));
        }
        for s in FaultSource::value_variants() {
            let name = s.to_possible_value().unwrap();
            assert_eq!(FaultSource::from_str(name.get_name(), false), Ok(*s));
        }
    }
}
