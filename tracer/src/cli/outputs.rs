//! `--pprof FILE` and `--timeline FILE`: the files a front end writes
//! beside its report, as sinks of the same stream.

use std::{collections::HashMap, path::PathBuf};

use anyhow::{Context as _, bail};
use tracer::{
    formats::{
        pause_profile::{PauseProfile, ProfiledPause},
        profiles::{ProfileKind, path_for},
    },
    kernel::CoreOptions,
    model::{labels::ProcessLabels, observed::Observed},
    sink::{
        Sink,
        file::{SharedFile, WholeFile, check_output_path, check_profile_path},
        profile::ProfileFiles,
        timeline::TimelineSink,
    },
    stackgrowth::Mode,
};

/// `--pprof` and `--timeline`.
#[derive(clap::Args, Debug, Default)]
pub struct FileOptions {
    /// Write a pprof profile (gzipped profile.proto, for `go tool pprof`)
    /// here when tracing ends; `attach` and `run` write every profile, the
    /// kind before the extension (out.pb.gz: out.faults.pb.gz,
    /// out.stackgrowth.pb.gz, and out.pauses.pb.gz: pause time by the
    /// laggards' and the callers' code). Not a directory or a device. Files
    /// appear when complete.
    #[arg(long, value_name = "FILE", value_parser = profile_path)]
    pub pprof: Option<PathBuf>,
    /// Write pauses, major faults and stack growths as a trace-event
    /// timeline (JSON for Perfetto UI, chrome://tracing); the file appears
    /// when tracing ends, complete.
    #[arg(long, value_name = "FILE", value_parser = output_path)]
    pub timeline: Option<PathBuf>,
}

/// `--output`, `--timeline`: a file name, not a directory.
pub fn output_path(s: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(s);
    check_output_path(&p)?;
    Ok(p)
}

/// `--pprof`: a file name, not a directory or a device.
fn profile_path(s: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(s);
    check_profile_path(&p)?;
    Ok(p)
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

/// `--pprof`'s pause-time profile (attach and run, with the explanation):
/// built as pauses come, written whole at the end.
struct PauseFile {
    profile: PauseProfile,
    file: WholeFile,
    path: PathBuf,
    /// Executable and container of each traced process.
    labels: HashMap<u32, ProcessLabels>,
}

/// The file sinks of one trace.
#[derive(Default)]
pub struct Outputs {
    profiles: Option<ProfileFiles>,
    pauses: Option<PauseFile>,
    timeline: Option<(TimelineSink, SharedFile, PathBuf)>,
    /// `--output FILE`, completed after the report's last line.
    pub output: Option<SharedFile>,
}

impl Outputs {
    /// The outputs `opts` ask for, of what `core` traces; every file is
    /// tried now, so a bad path fails before tracing starts; each appears,
    /// complete, at `finish`.
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
                .map_or((Mode::Sampled, tracer::kernel::stacks::SAMPLE_HZ), |s| {
                    (s.mode, s.sample_hz)
                });
            let comment: Vec<String> = std::env::args().collect();
            if which == Profiles::Traced && core.explain {
                let pauses = path_for(path, "pauses");
                out.pauses = Some(PauseFile {
                    profile: PauseProfile::new(&comment.join(" ")),
                    file: WholeFile::create(&pauses)
                        .with_context(|| format!("creating {}", pauses.display()))?,
                    path: pauses,
                    labels: HashMap::new(),
                });
            }
            let files = ProfileFiles::create(files, mode, hz, comment.join(" "))
                .with_context(|| format!("creating the --pprof file(s) of {}", path.display()))?;
            out.profiles = Some(files);
        }
        if let Some(path) = &opts.timeline {
            let file = SharedFile::new(
                WholeFile::create(path).with_context(|| format!("creating {}", path.display()))?,
            );
            let sink = TimelineSink::new(Box::new(file.clone()))
                .with_context(|| format!("writing {}", path.display()))?;
            out.timeline = Some((sink, file, path.clone()));
        }
        Ok(out)
    }

    /// Write what is written at the end (after the engine's `finish` and
    /// the report's last line), each file whole.
    pub fn finish(self) -> anyhow::Result<()> {
        if let Some(o) = &self.output {
            o.commit().context("writing the --output file")?;
        }
        if let Some(p) = &self.profiles {
            for (path, total) in p.finish().context("writing the --pprof profiles")? {
                tracer::say!("gostw: wrote {} ({total} in all)", path.display());
            }
        }
        if let Some(PauseFile {
            profile,
            mut file,
            path,
            ..
        }) = self.pauses
        {
            std::io::Write::write_all(&mut file, &profile.encode())
                .and_then(|()| file.commit())
                .with_context(|| format!("writing {}", path.display()))?;
            tracer::say!(
                "gostw: wrote {} ({} pauses with a laggard or a caller)",
                path.display(),
                profile.pauses()
            );
        }
        if let Some((t, file, path)) = self.timeline {
            let pauses = t.pauses();
            t.finish()
                .and_then(|()| file.commit())
                .with_context(|| format!("writing {}", path.display()))?;
            tracer::say!("gostw: wrote {} ({pauses} pauses)", path.display());
        }
        Ok(())
    }
}

impl Sink for Outputs {
    fn observe(&mut self, o: &Observed) {
        self.profiles.observe(o);
        if let Some(p) = &mut self.pauses {
            match o {
                Observed::Started(info) => {
                    p.labels.insert(info.pid, info.labels.clone());
                }
                Observed::Pause(pause) => {
                    let unknown = ProcessLabels::default();
                    p.profile.add(&ProfiledPause {
                        record: &pause.record,
                        labels: p.labels.get(&pause.record.pid).unwrap_or(&unknown),
                    });
                }
                _ => {}
            }
        }
        if let Some((t, ..)) = &mut self.timeline {
            t.observe(o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::file::tests::{dir, names};

    /// The files of a trace appear only when it ends and are complete then;
    /// a trace that ends without `finish` (it failed) leaves none, whole or
    /// cut off.
    #[test]
    fn files_appear_complete_or_not_at_all() {
        let d = dir("outputs");
        let opts = FileOptions {
            pprof: Some(d.join("p.pb.gz")),
            timeline: Some(d.join("t.json")),
        };
        let core = CoreOptions {
            faults: Some(Default::default()),
            ..CoreOptions::default()
        };
        // While tracing only hidden temporary files exist.
        let visible = |d: &std::path::Path| -> Vec<String> {
            names(d)
                .into_iter()
                .filter(|n| !n.starts_with('.'))
                .collect()
        };
        let failed = Outputs::new(&opts, Profiles::Traced, &core).unwrap();
        assert_eq!(visible(&d), Vec::<String>::new());
        drop(failed);
        assert_eq!(names(&d), Vec::<String>::new());

        let done = Outputs::new(&opts, Profiles::Traced, &core).unwrap();
        assert_eq!(visible(&d), Vec::<String>::new());
        done.finish().unwrap();
        assert_eq!(names(&d), ["p.faults.pb.gz", "t.json"]);
        let timeline: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.join("t.json")).unwrap()).unwrap();
        assert!(timeline["traceEvents"].is_array(), "{timeline}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
