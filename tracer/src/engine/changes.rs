//! Applying what a target says changed: exit statuses, exited processes
//! (their pauses and faults released first, then untraced), new processes
//! traced.

use crate::{
    model::observed::Observed,
    targets::{
        Changes,
        tracker::{Kernel, NotTraced, Tracker},
    },
};

use super::stream::Stream;

/// Apply `changes` of a target: exit statuses, exited processes (their
/// pauses and faults released first, then untraced), new processes traced.
/// With `single` (a one-process target), why its process is not traced.
pub fn apply<K: Kernel>(
    tracker: &mut Tracker<K>,
    stream: &mut Stream,
    changes: Changes,
    single: bool,
    out: &mut Vec<Observed>,
) -> Option<anyhow::Error> {
    for (pid, code) in changes.statuses {
        out.push(Observed::ExitStatus { pid, code });
    }
    for pid in changes.exited {
        stream.exited(pid, out);
        tracker.exited(pid, out);
    }
    let mut failure = None;
    for (p, path) in &changes.started {
        let before = out.len();
        let traced = tracker.started(p, path, out);
        for o in &out[before..] {
            if let Observed::Started(info) = o {
                stream.started(info);
            }
        }
        match traced {
            Ok(()) => {}
            Err(NotTraced::NotGo) if single => {
                failure = Some(anyhow::anyhow!(
                    "pid {} ({}) is not a Go program: gostw traces Go programs (Go 1.19 or later)",
                    p.pid,
                    p.exe_path.display()
                ));
            }
            Err(why) if single => {
                failure = Some(anyhow::anyhow!("cannot trace pid {}: {why}", p.pid));
            }
            Err(_) => {}
        }
    }
    failure
}
