//! The Kubernetes names (namespace, pod, container) of the containers the
//! agent's processes run in, asked of the container runtime by a thread of
//! their own so that the engine's loop never waits for it.
//!
//! A process whose container the runtime has not been asked about yet is
//! held back (up to `MAX_WAIT`) until the answer comes, so that its series
//! are created once, with their names: labels are fixed for a process's
//! life. An answer is kept for `FRESH_FOR`; a process of the same container
//! started later asks again (a restarted container may have been relabelled).
//! A runtime that cannot be reached costs processes their names (said once
//! in the log), never their tracing: unknown names stay empty.

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::mpsc::{Receiver, Sender, channel},
    time::{Duration, Instant},
};

use super::discovery::NewProcess;
use crate::model::labels::{ContainerNames, container_id};

/// A container runtime that names containers by id.
pub trait Runtime: Send + 'static {
    /// The names of container `id`; None when the runtime does not know it
    /// or it carries no Kubernetes labels.
    fn names(&mut self, id: &str) -> anyhow::Result<Option<ContainerNames>>;
    /// What it is, for the log ("containerd at /run/...").
    fn describe(&self) -> String;
}

/// Several runtimes asked in turn (containerd, Docker, Podman's storage):
/// the first that knows the container names it. An error only when every
/// runtime failed, so a host without containerd but with Podman says
/// nothing.
pub struct Runtimes(pub Vec<Box<dyn Runtime>>);

impl Runtime for Runtimes {
    fn names(&mut self, id: &str) -> anyhow::Result<Option<ContainerNames>> {
        let mut first_error = None;
        let mut answered = false;
        for r in &mut self.0 {
            match r.names(id) {
                Ok(Some(n)) => return Ok(Some(n)),
                Ok(None) => answered = true,
                Err(e) => {
                    first_error.get_or_insert(e.context(r.describe()));
                }
            }
        }
        match first_error {
            Some(e) if !answered => Err(e),
            _ => Ok(None),
        }
    }

    fn describe(&self) -> String {
        self.0
            .iter()
            .map(|r| r.describe())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Longest a new process waits for its container's names.
pub const MAX_WAIT: Duration = Duration::from_secs(1);

/// How long an answer names new processes of the same container.
pub const FRESH_FOR: Duration = Duration::from_secs(30);

/// Containers remembered at once (forgotten in bulk past it).
const MAX_KNOWN: usize = 4096;

/// A process and the path its executable is reached by, as the tracker
/// takes them.
pub type Started = (NewProcess, PathBuf);

struct Held {
    started: Started,
    id: String,
    until: Instant,
}

/// The names known so far, the processes waiting for theirs, and the
/// channels to the thread that asks the runtime.
pub struct Resolver {
    ask: Sender<String>,
    answers: Receiver<(String, Option<ContainerNames>)>,
    known: HashMap<String, (Option<ContainerNames>, Instant)>,
    /// Containers asked about and not yet answered.
    asked: HashSet<String>,
    held: Vec<Held>,
}

impl Resolver {
    /// Start the thread that asks `runtime`.
    pub fn start(mut runtime: impl Runtime) -> std::io::Result<Resolver> {
        let (ask, questions) = channel::<String>();
        let (reply, answers) = channel();
        std::thread::Builder::new()
            .name("gostw-containers".into())
            .spawn(move || {
                let mut failing = false;
                for id in questions {
                    let names = match runtime.names(&id) {
                        Ok(n) => {
                            if failing {
                                log::info!("{} answers again", runtime.describe());
                            }
                            failing = false;
                            n
                        }
                        Err(e) => {
                            if !failing {
                                log::warn!(
                                    "container names unavailable from {}: {e:#}; processes in containers are labelled by container id",
                                    runtime.describe()
                                );
                            }
                            failing = true;
                            None
                        }
                    };
                    if reply.send((id, names)).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Resolver {
            ask,
            answers,
            known: HashMap::new(),
            asked: HashSet::new(),
            held: Vec::new(),
        })
    }

    /// The processes that may be traced now: of `started`, those in no
    /// container or in one whose names are fresh (named), and of those held
    /// before, the ones whose answer came or whose wait ran out. Processes
    /// in `exited` are no longer held.
    pub fn pass(&mut self, started: Vec<Started>, exited: &[u32], now: Instant) -> Vec<Started> {
        for (id, names) in self.answers.try_iter() {
            self.asked.remove(&id);
            if self.known.len() >= MAX_KNOWN {
                self.known.clear();
            }
            self.known.insert(id, (names, now));
        }
        self.held.retain(|h| !exited.contains(&h.started.0.pid));
        let mut out = Vec::new();
        for s in started {
            // Outside containers: nothing to ask, nothing to wait for.
            let Some(id) = container_id(&s.0.cgroup).map(str::to_owned) else {
                out.push(s);
                continue;
            };
            let fresh = self
                .known
                .get(&id)
                .is_some_and(|(_, at)| now.duration_since(*at) < FRESH_FOR);
            if !fresh && !self.asked.contains(&id) && self.ask.send(id.clone()).is_ok() {
                self.known.remove(&id);
                self.asked.insert(id.clone());
            }
            self.held.push(Held {
                started: s,
                id,
                until: now + MAX_WAIT,
            });
        }
        let mut kept = Vec::new();
        for mut h in std::mem::take(&mut self.held) {
            let answer = self.known.get(&h.id);
            if answer.is_some() || now >= h.until {
                h.started.0.names = answer.and_then(|(n, _)| n.clone());
                out.push(h.started);
            } else {
                kept.push(h);
            }
        }
        self.held = kept;
        out
    }

    /// Whether processes wait for names (the target is asked again soon).
    pub fn holding(&self) -> bool {
        !self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::image::ExeId;

    const ID: &str = "03d7c5c0f739774d72331d9b042afbcbd2df8aa6427acdfdb31f82219a732300";

    /// Answers from a table; counts the questions.
    struct Table {
        names: Arc<Mutex<HashMap<String, ContainerNames>>>,
        asked: Arc<Mutex<u32>>,
        fail: bool,
    }

    impl Runtime for Table {
        fn names(&mut self, id: &str) -> anyhow::Result<Option<ContainerNames>> {
            *self.asked.lock().unwrap() += 1;
            if self.fail {
                anyhow::bail!("no socket");
            }
            Ok(self.names.lock().unwrap().get(id).cloned())
        }
        fn describe(&self) -> String {
            "a table".into()
        }
    }

    fn process(pid: u32, cgroup: &str) -> Started {
        let p = NewProcess {
            pid,
            exe: ExeId { dev: 1, ino: 1 },
            exe_path: "/app".into(),
            comm: "app".into(),
            cgroup: cgroup.into(),
            names: None,
        };
        (p, "/app".into())
    }

    fn names(pod: &str) -> ContainerNames {
        ContainerNames {
            namespace: "shop".into(),
            pod: pod.into(),
            container: "app".into(),
        }
    }

    type Shared = Arc<Mutex<HashMap<String, ContainerNames>>>;

    fn resolver(fail: bool) -> (Resolver, Shared, Arc<Mutex<u32>>) {
        let table = Arc::new(Mutex::new(HashMap::from([(ID.to_owned(), names("web-0"))])));
        let asked = Arc::new(Mutex::new(0));
        let r = Resolver::start(Table {
            names: table.clone(),
            asked: asked.clone(),
            fail,
        })
        .unwrap();
        (r, table, asked)
    }

    /// Pass until something comes out (the thread answers within ms).
    fn pass_until_out(r: &mut Resolver, mut started: Vec<Started>, now: Instant) -> Vec<Started> {
        for _ in 0..200 {
            let out = r.pass(std::mem::take(&mut started), &[], now);
            if !out.is_empty() {
                return out;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("nothing passed");
    }

    #[test]
    fn a_process_waits_for_its_names_and_one_outside_containers_does_not() {
        let (mut r, _, asked) = resolver(false);
        let now = Instant::now();
        let host = r.pass(vec![process(1, "0::/system.slice/x.service\n")], &[], now);
        assert_eq!(host.len(), 1);
        assert_eq!(host[0].0.names, None);
        let out = pass_until_out(&mut r, vec![process(2, &format!("0::/k8s.io/{ID}\n"))], now);
        assert_eq!(out[0].0.names, Some(names("web-0")));
        assert!(!r.holding());
        // A second process of the container is named from what is known.
        let again = r.pass(vec![process(3, &format!("0::/k8s.io/{ID}\n"))], &[], now);
        assert_eq!(again[0].0.names, Some(names("web-0")));
        assert_eq!(*asked.lock().unwrap(), 1);
    }

    #[test]
    fn a_container_started_after_the_answer_went_stale_is_asked_again() {
        let (mut r, table, asked) = resolver(false);
        let now = Instant::now();
        pass_until_out(&mut r, vec![process(2, &format!("0::/k8s.io/{ID}\n"))], now);
        table.lock().unwrap().insert(ID.to_owned(), names("web-1"));
        let later = now + FRESH_FOR;
        let out = pass_until_out(
            &mut r,
            vec![process(4, &format!("0::/k8s.io/{ID}\n"))],
            later,
        );
        assert_eq!(out[0].0.names, Some(names("web-1")));
        assert_eq!(*asked.lock().unwrap(), 2);
    }

    #[test]
    fn an_unknown_container_or_a_failing_runtime_leaves_names_empty() {
        let (mut r, _, _) = resolver(false);
        let other = ID.replace('0', "f");
        let out = pass_until_out(
            &mut r,
            vec![process(5, &format!("0::/k8s.io/{other}\n"))],
            Instant::now(),
        );
        assert_eq!(out[0].0.names, None);
        let (mut r, _, asked) = resolver(true);
        let out = pass_until_out(
            &mut r,
            vec![process(6, &format!("0::/k8s.io/{ID}\n"))],
            Instant::now(),
        );
        assert_eq!(out[0].0.names, None);
        assert_eq!(*asked.lock().unwrap(), 1);
    }

    #[test]
    fn the_first_runtime_that_knows_a_container_names_it() {
        let table = |known: &[(&str, &str)], fail| Table {
            names: Arc::new(Mutex::new(
                known
                    .iter()
                    .map(|(id, pod)| (id.to_string(), names(pod)))
                    .collect(),
            )),
            asked: Arc::new(Mutex::new(0)),
            fail,
        };
        let mut chain = Runtimes(vec![
            Box::new(table(&[("a", "web-0")], true)),
            Box::new(table(&[("b", "web-1")], false)),
        ]);
        assert_eq!(chain.names("b").unwrap(), Some(names("web-1")));
        // One failed, one did not know it: unknown, not an error.
        assert_eq!(chain.names("c").unwrap(), None);
        let mut failing = Runtimes(vec![Box::new(table(&[], true))]);
        assert!(failing.names("a").is_err());
    }

    #[test]
    fn a_held_process_goes_on_unnamed_when_its_wait_runs_out_or_is_dropped_when_it_exits() {
        // A runtime that never answers: its thread is blocked.
        struct Stuck;
        impl Runtime for Stuck {
            fn names(&mut self, _: &str) -> anyhow::Result<Option<ContainerNames>> {
                std::thread::sleep(Duration::from_secs(3600));
                Ok(None)
            }
            fn describe(&self) -> String {
                "stuck".into()
            }
        }
        let mut r = Resolver::start(Stuck).unwrap();
        let now = Instant::now();
        let cg = format!("0::/k8s.io/{ID}\n");
        assert!(
            r.pass(vec![process(7, &cg), process(8, &cg)], &[], now)
                .is_empty()
        );
        assert!(r.holding());
        assert!(r.pass(Vec::new(), &[8], now + MAX_WAIT / 2).is_empty());
        let out = r.pass(Vec::new(), &[], now + MAX_WAIT);
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].0.pid, out[0].0.names.clone()), (7, None));
        assert!(!r.holding());
    }
}
