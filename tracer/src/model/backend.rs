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
