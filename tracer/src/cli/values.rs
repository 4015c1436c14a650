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

    /// A value's name on the command line is its name in the JSON records
    /// (`"mode": "sampled"`), so `--mode X` and the output agree.
    fn names_match_json<T: ValueEnum + serde::Serialize>() {
        for v in T::value_variants() {
            let name = v.to_possible_value().unwrap();
            assert_eq!(serde_json::to_value(v).unwrap(), name.get_name());
        }
    }

    #[test]
    fn command_line_names_are_the_json_names() {
        names_match_json::<Mode>();
        names_match_json::<FaultSource>();
    }
}
