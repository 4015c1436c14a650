//! The command line's own behaviour: what it refuses, how it says things.

use std::{
    io::Write,
    sync::{Arc, Mutex},
};

use clap::Parser as _;
use log::Log as _;

use super::{Cli, logger, message};

/// Durations that mean nothing are refused when the arguments are parsed,
/// before anything is traced; sensible ones are accepted.
#[test]
fn nonsensical_durations_and_intervals_are_refused() {
    let refused: &[&[&str]] = &[
        &["attach", "--pid", "1", "--duration", "0"],
        &["attach", "--pid", "1", "--duration", "0s"],
        &["attach", "--pid", "1", "--exposure-every", "1ns"],
        &["run", "--duration", "0", "--", "prog"],
        &["faults", "--pid", "1", "--duration", "0"],
        &["stacks", "--pid", "1", "--duration", "0ms"],
        &["stacks", "--pid", "1", "--exact-on", "0"],
        &["stacks", "--pid", "1", "--exact-period", "0"],
        &["stacks", "--pid", "1", "--sample-hz", "0"],
        &["memory", "--pid", "1", "--interval", "1ns"],
        &["agent", "--exposure-every", "1ns"],
    ];
    for args in refused {
        let argv = std::iter::once("gostw").chain(args.iter().copied());
        assert!(Cli::try_parse_from(argv).is_err(), "{args:?} accepted");
    }
    let accepted: &[&[&str]] = &[
        &["attach", "--pid", "1", "--duration", "1s"],
        &["attach", "--pid", "1", "--exposure-every", "0"],
        &["attach", "--pid", "1", "--exposure-every", "100ms"],
        &["attach", "--pid", "1", "--slow-pause", "0"],
        &["memory", "--pid", "1", "--interval", "0"],
        &["agent", "--exposure-every", "0"],
    ];
    for args in accepted {
        let argv = std::iter::once("gostw").chain(args.iter().copied());
        if let Err(e) = Cli::try_parse_from(argv) {
            panic!("{args:?} refused: {e}");
        }
    }
}

/// "A pause at least this long" is `--slow-pause` in every command that
/// has it; the names it had before (attach and run's `--threshold`,
/// pauses' `--min`) still parse, to the same option, and are not shown.
#[test]
fn a_slow_pause_has_one_name_and_the_old_ones_still_work() {
    use clap::CommandFactory as _;
    let mut cmd = Cli::command();
    cmd.build();
    for sub in ["attach", "run", "agent", "pauses"] {
        let sub = cmd.find_subcommand(sub).unwrap();
        let arg = sub
            .get_arguments()
            .find(|a| a.get_long() == Some("slow-pause"))
            .unwrap_or_else(|| panic!("{} has no --slow-pause", sub.get_name()));
        assert!(!arg.is_hide_set());
        for old in ["threshold", "min"] {
            assert!(
                sub.get_arguments().all(|a| a.get_long() != Some(old)),
                "{} still has a flag --{old} of its own",
                sub.get_name()
            );
        }
        let shown: Vec<&str> = sub
            .get_arguments()
            .flat_map(|a| a.get_visible_aliases().unwrap_or_default())
            .collect();
        assert!(
            shown.is_empty(),
            "{}: visible aliases {shown:?}",
            sub.get_name()
        );
    }
    let same = |old: &[&str], new: &[&str]| {
        let parse = |a: &[&str]| {
            let m = Cli::command()
                .try_get_matches_from(std::iter::once("gostw").chain(a.iter().copied()))
                .unwrap_or_else(|e| panic!("{a:?}: {e}"));
            let (_, sub) = m.subcommand().unwrap();
            *sub.get_one::<std::time::Duration>("slow_pause").unwrap()
        };
        assert_eq!(parse(old), parse(new), "{old:?} against {new:?}");
    };
    same(
        &["attach", "--pid", "1", "--threshold", "5ms"],
        &["attach", "--pid", "1", "--slow-pause", "5ms"],
    );
    same(
        &["run", "--threshold", "200us", "--", "prog"],
        &["run", "--slow-pause", "200us", "--", "prog"],
    );
    same(
        &["pauses", "--min", "5ms"],
        &["pauses", "--slow-pause", "5ms"],
    );
}

/// An io error wrapped by an error whose message already ends with it is
/// said once, with every context around it.
#[test]
fn an_error_says_its_cause_once() {
    let io = std::io::Error::from_raw_os_error(libc::EISDIR);
    let e = anyhow::Error::new(tracer::binary::BinaryError::Read {
        path: "/tmp".into(),
        source: io,
    })
    .context("opening the program");
    assert_eq!(
        message(&e),
        "opening the program: cannot read /tmp: Is a directory (os error 21)"
    );
    // Causes that add something are all kept.
    let e = anyhow::Error::new(std::io::Error::from_raw_os_error(libc::ENOENT))
        .context("creating /x/t.json")
        .context("--timeline");
    assert_eq!(
        message(&e),
        "--timeline: creating /x/t.json: No such file or directory (os error 2)"
    );
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What the logger prints for a record of `level` from an internal module.
fn logged(rust_log: bool, level: log::Level) -> String {
    let out = Captured::default();
    let l = logger(rust_log)
        .target(env_logger::Target::Pipe(Box::new(out.clone())))
        .build();
    l.log(
        &log::Record::builder()
            .level(level)
            .target("tracer::targets::tracker")
            .args(format_args!("cannot trace pid 7"))
            .build(),
    );
    l.flush();
    String::from_utf8(out.0.lock().unwrap().clone()).unwrap()
}

/// Without RUST_LOG a warning reads as one of gostw's own messages, with no
/// log-line prefix or module path; informational logging stays quiet.
#[test]
fn default_logging_speaks_to_people() {
    assert_eq!(
        logged(false, log::Level::Warn),
        "gostw: warning: cannot trace pid 7\n"
    );
    assert_eq!(
        logged(false, log::Level::Error),
        "gostw: error: cannot trace pid 7\n"
    );
    assert_eq!(logged(false, log::Level::Info), "");
}

/// `--pprof` names files beside itself: a directory or a device there is
/// refused with what to give instead, before anything is traced; so is a
/// directory for any output file.
#[test]
fn output_files_must_be_file_names() {
    let dir = std::env::temp_dir();
    let dir = dir.to_str().unwrap();
    let slash = format!("{dir}/");
    for (flag, path) in [
        ("--pprof", dir),
        ("--pprof", slash.as_str()),
        ("--pprof", "/dev/full"),
        ("--timeline", dir),
        ("--output", dir),
    ] {
        let e = match Cli::try_parse_from(["gostw", "attach", "--pid", "1", flag, path]) {
            Ok(_) => panic!("{flag} {path} accepted"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("give a file name"), "{flag} {path}: {e}");
    }
    for cmd in ["faults", "stacks"] {
        let args = ["gostw", cmd, "--pid", "1", "--pprof", dir];
        assert!(Cli::try_parse_from(args).is_err(), "{cmd} --pprof {dir}");
    }
    let ok = ["gostw", "attach", "--pid", "1", "--pprof", "/tmp/p.pb.gz"];
    assert!(Cli::try_parse_from(ok).is_ok());
}
