//! `--pprof FILE` and `--timeline FILE`: the files a front end writes
//! beside its report, as sinks of the same stream.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use tracer::{
    engine::observed::Observed,
    formats::profiles::ProfileKind,
    kernel::CoreOptions,
    sink::{Sink, profile::ProfileFiles, timeline::TimelineSink},
    stackgrowth::Mode,
};

/// `--pprof` and `--timeline`.
#[derive(clap::Args, Debug, Default)]
pub struct FileOptions {
    /// Write a pprof profile (gzipped profile.proto, for `go tool pprof`)
    /// here when tracing ends; `attach` and `run` write both profiles, the
    /// kind before the extension (out.pb.gz: out.faults.pb.gz,
    /// out.stackgrowth.pb.gz).
    #[arg(long, value_name = "FILE")]
    pub pprof: Option<PathBuf>,
    /// Write pauses, major faults and stack growths as a trace-event
    /// timeline (JSON for Perfetto UI, chrome://tracing) as they happen.
    #[arg(long, value_name = "FILE")]
    pub timeline: Option<PathBuf>,
}

/// Which profiles `--pprof` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profiles {
    /// `attach`, `run`: every kind traced, each in its own file.
    Traced,
    /// `faults`: the fault profile in FILE.
    Faults,
    /// `stacks`: the stack-growth profile in FILE.
    StackGrowth,
}

/// The file sinks of one trace.
#[derive(Default)]
pub struct Outputs {
    profiles: Option<ProfileFiles>,
    timeline: Option<(TimelineSink, PathBuf)>,
}

impl Outputs {
    /// The outputs `opts` ask for, of what `core` traces; every file is
    /// created now, so a bad path fails before tracing starts.
    pub fn new(opts: &FileOptions, which: Profiles, core: &CoreOptions) -> anyhow::Result<Outputs> {
        let mut out = Outputs::default();
        if let Some(path) = &opts.pprof {
            let files = match which {
                Profiles::Faults => vec![(ProfileKind::Faults, path.clone())],
                Profiles::StackGrowth => vec![(ProfileKind::StackGrowth, path.clone())],
                Profiles::Traced => [
                    (ProfileKind::Faults, core.faults.is_some()),
                    (ProfileKind::StackGrowth, core.stacks.is_some()),
                ]
                .into_iter()
                .filter(|(_, traced)| *traced)
                .map(|(kind, _)| (kind, kind.path_for(path)))
                .collect(),
            };
            if files.is_empty() {
                bail!(
                    "--pprof: neither faults nor stack growth are traced (--no-faults, --stacks off)"
                );
            }
            let (mode, hz) = core
                .stacks
                .map_or((Mode::Sampled, 99), |s| (s.mode, s.sample_hz));
            let comment: Vec<String> = std::env::args().collect();
            let files = ProfileFiles::create(files, mode, hz, comment.join(" "))
                .with_context(|| format!("creating the --pprof file(s) of {}", path.display()))?;
            out.profiles = Some(files);
        }
        if let Some(path) = &opts.timeline {
            let file = std::fs::File::create(path)
                .with_context(|| format!("creating {}", path.display()))?;
            let sink = TimelineSink::new(Box::new(std::io::BufWriter::new(file)))
                .with_context(|| format!("writing {}", path.display()))?;
            out.timeline = Some((sink, path.clone()));
        }
        Ok(out)
    }

    /// Write what is written at the end (after the engine's `finish`).
    pub fn finish(self) -> anyhow::Result<()> {
        if let Some(p) = &self.profiles {
            for (path, total) in p.finish().context("writing the --pprof profiles")? {
                eprintln!("gostw: wrote {} ({total} in all)", path.display());
            }
        }
        if let Some((t, path)) = self.timeline {
            let pauses = t.pauses();
            t.finish()
                .with_context(|| format!("writing {}", path.display()))?;
            eprintln!("gostw: wrote {} ({pauses} pauses)", path.display());
        }
        Ok(())
    }
}

impl Sink for Outputs {
    fn observe(&mut self, o: &Observed) {
        self.profiles.observe(o);
        if let Some((t, _)) = &mut self.timeline {
            t.observe(o);
        }
    }
}
