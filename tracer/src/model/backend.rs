//! Which fault backend a trace uses and why (`kernel::capabilities` decides;
//! reports, metrics and `check` show it).

/// The fault backend gostw would use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultBackend {
    Kprobe,
    Tracepoint,
    /// Neither can attach here.
    None,
}

impl FaultBackend {
    /// How people call it.
    pub fn describe(self) -> &'static str {
        match self {
            FaultBackend::Kprobe => "kprobes",
            FaultBackend::Tracepoint => "tracepoints + perf events",
            FaultBackend::None => "none",
        }
    }

    /// The name in reports and metrics.
    pub fn name(self) -> &'static str {
        match self {
            FaultBackend::Kprobe => "kprobe",
            FaultBackend::Tracepoint => "tracepoint",
            FaultBackend::None => "none",
        }
    }
}

/// The decision and what it rests on.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BackendChoice {
    pub backend: FaultBackend,
    pub reason: String,
    pub kprobes: Support,
    pub tracepoints: Support,
    /// Every file-backed fault is marked, so unmarked ones are swap-ins.
    pub file_faults_seen: bool,
}

/// Whether one mechanism works, with the evidence.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Support {
    pub available: bool,
    pub detail: String,
}

/// A feature that runs here but loses something: said once when tracing
/// begins (stderr, the agent's log), kept in the summary's `health` and the
/// agent's `gostw_agent_degraded_feature`, and `gostw check`'s `degraded`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Degraded {
    /// `gostw check`'s name of the feature.
    pub feature: &'static str,
    /// What is lost, and why.
    pub why: String,
}

/// `gostw check`'s names of the features that can lose something here.
pub const KERNEL_WAITS: &str = "kernel waits";
pub const STACK_GROWTH_SAMPLED: &str = "stack growth (sampled)";
pub const FAULTS: &str = "faults";

/// What this host takes from the features in use: the inputs.
pub struct HostLimits<'a> {
    /// The fault backend in use (None: faults are not traced).
    pub backend: Option<&'a BackendChoice>,
    /// Why user registers cannot be found (an older kernel without
    /// `bpf_task_pt_regs` whose task layout is unknown).
    pub layout_error: Option<&'a str>,
    /// `/proc/kallsyms` shows no addresses.
    pub symbols_hidden: bool,
    /// Pauses are explained (the kernel waits run).
    pub explain: bool,
    /// Stack growth is traced (the stack sampler may run).
    pub stacks: bool,
}

impl HostLimits<'_> {
    /// The degraded features, in `gostw check`'s order.
    pub fn degraded(&self) -> Vec<Degraded> {
        let mut out = Vec::new();
        if self.explain
            && let Some(why) = self.kernel_waits()
        {
            out.push(Degraded {
                feature: KERNEL_WAITS,
                why,
            });
        }
        if self.stacks
            && let Some(why) = self.layout_error
        {
            out.push(Degraded {
                feature: STACK_GROWTH_SAMPLED,
                why: format!(
                    "user registers cannot be found ({why}): samples in kernel mode are not counted"
                ),
            });
        }
        if let Some(why) = self.faults() {
            out.push(Degraded {
                feature: FAULTS,
                why,
            });
        }
        out
    }

    /// Kernel frames unnamed where the host hides addresses; page-fault
    /// counts and sleeps in faults where the backend does not see them.
    fn kernel_waits(&self) -> Option<String> {
        if self.symbols_hidden {
            return Some(crate::procfs::kallsyms::HIDDEN.into());
        }
        let b = self.backend?;
        const LOST: &str = "page faults are not counted (laggards' page_faults, \
             stopper_page_faults stay 0), and a laggard's sleep in a fault that began before \
             the stop is of kind unknown";
        match b.backend {
            FaultBackend::Tracepoint => None,
            FaultBackend::Kprobe => {
                let instead = if b.tracepoints.available {
                    "; `--fault-source tracepoint` sees both"
                } else {
                    ""
                };
                Some(format!(
                    "{LOST}: the kprobe fault backend sees major faults only, and no sleep in \
                     them{instead}"
                ))
            }
            FaultBackend::None => Some(format!("{LOST}: no fault backend runs here")),
        }
    }

    /// What the tracepoint backend loses without its optional parts.
    fn faults(&self) -> Option<String> {
        let b = self.backend?;
        if b.backend != FaultBackend::Tracepoint {
            return None;
        }
        if !b.file_faults_seen {
            return Some(
                "no filemap:mm_filemap_fault: file-backed faults and swap-ins are not told apart"
                    .into(),
            );
        }
        self.layout_error.map(|_| {
            "user registers cannot be found: every sleep of a thread in a fault counts as inside it"
                .into()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(backend: FaultBackend) -> BackendChoice {
        let s = Support {
            available: true,
            detail: String::new(),
        };
        BackendChoice {
            backend,
            reason: String::new(),
            kprobes: s.clone(),
            tracepoints: s,
            file_faults_seen: true,
        }
    }

    fn losses(b: &BackendChoice) -> HostLimits<'_> {
        HostLimits {
            backend: Some(b),
            layout_error: None,
            symbols_hidden: false,
            explain: true,
            stacks: true,
        }
    }

    fn names(d: &[Degraded]) -> Vec<&str> {
        d.iter().map(|d| d.feature).collect()
    }

    #[test]
    fn kernel_waits_say_what_they_lose() {
        let tracepoint = choice(FaultBackend::Tracepoint);
        assert!(losses(&tracepoint).degraded().is_empty());
        let kprobe = choice(FaultBackend::Kprobe);
        let d = losses(&kprobe).degraded();
        assert_eq!(names(&d), ["kernel waits"]);
        assert!(d[0].why.contains("kprobe fault backend"), "{d:?}");
        assert!(
            d[0].why.ends_with("`--fault-source tracepoint` sees both"),
            "{d:?}"
        );
        // Only where the tracepoint backend could run is it offered.
        let mut kprobe_only = choice(FaultBackend::Kprobe);
        kprobe_only.tracepoints.available = false;
        let d = losses(&kprobe_only).degraded();
        assert!(!d[0].why.contains("--fault-source"), "{d:?}");
        // Without explanation the kernel waits do not run: nothing to lose.
        let off = HostLimits {
            explain: false,
            ..losses(&kprobe)
        };
        assert!(off.degraded().is_empty());
        let hidden = HostLimits {
            symbols_hidden: true,
            ..losses(&tracepoint)
        };
        let d = hidden.degraded();
        assert!(d[0].why.contains("/proc/kallsyms"), "{d:?}");
    }

    #[test]
    fn the_tracepoint_backend_says_what_its_missing_parts_cost() {
        let mut no_filemap = choice(FaultBackend::Tracepoint);
        no_filemap.file_faults_seen = false;
        let d = losses(&no_filemap).degraded();
        assert_eq!(names(&d), ["faults"]);
        assert!(d[0].why.contains("filemap:mm_filemap_fault"), "{d:?}");
        let tracepoint = choice(FaultBackend::Tracepoint);
        let no_layout = HostLimits {
            layout_error: Some("no task_struct in BTF"),
            ..losses(&tracepoint)
        };
        let d = no_layout.degraded();
        assert_eq!(names(&d), ["stack growth (sampled)", "faults"]);
        assert!(d[0].why.contains("no task_struct in BTF"), "{d:?}");
        // The kprobe backend reads no registers: its faults lose nothing.
        let kprobe = choice(FaultBackend::Kprobe);
        let d = HostLimits {
            layout_error: Some("x"),
            ..losses(&kprobe)
        }
        .degraded();
        assert_eq!(names(&d), ["kernel waits", "stack growth (sampled)"]);
    }
}
