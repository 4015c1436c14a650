//! `gostw agent`'s command line: its options, checked and made into the
//! agent's `Options`.

use std::{net::SocketAddr, time::Duration};

use regex::Regex;
use tracer::{
    agent::{Options, PauseLogTo},
    model::pause::SlowThreshold,
    sink::{
        otlp::{OtlpOptions, Protocol},
        slow_pauses::StoreLimits,
    },
    targets::discovery::Filter,
};

/// `gostw agent` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to serve /metrics, /healthz and /readyz on.
    #[arg(long, default_value = "127.0.0.1:9477")]
    pub listen: SocketAddr,
    /// Serve /debug/pprof/* and /debug/pauses to peers other than loopback
    /// ones (profiles and records name code, files and containers; by
    /// default only 127.0.0.0/8 and ::1 get them).
    #[arg(long)]
    pub pprof_allow_remote: bool,
    /// Record every pause at least this long, with its explanation, for
    /// /debug/pauses, `gostw pauses`, the pause log, the exemplars and OTLP
    /// (0: every pause).
    #[arg(long, value_name = "DURATION", default_value = "1ms", value_parser = tracer::units::parse_duration)]
    pub slow_pause: Duration,
    /// Slow-pause records kept in memory in all; the oldest go first
    /// (counted in gostw_agent_slow_pauses_evicted_total).
    #[arg(long, value_name = "N", default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub slow_pauses_kept: u32,
    /// Slow-pause records kept in memory per label set (executable,
    /// container), so that one noisy program cannot push out the others'.
    #[arg(long, value_name = "N", default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub slow_pauses_per_set: u32,
    /// Where each slow-pause record is written as a JSON line: stdout, off,
    /// or a file (rotated to PATH.1 at --pause-log-max-mib).
    #[arg(long, value_name = "stdout|off|PATH", default_value = "stdout")]
    pub pause_log: String,
    /// A pause log file is rotated (to PATH.1, one old file kept) when it
    /// would grow past this many MiB.
    #[arg(long, value_name = "MIB", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub pause_log_max_mib: u64,
    /// Pause log lines written per second at most; the rest are counted
    /// (gostw_agent_slow_pauses_unlogged_total) and stay in /debug/pauses.
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub pause_log_rate: u32,
    /// Only trace processes whose executable path or command name matches.
    #[arg(long = "match", value_name = "REGEX", value_parser = parse_regex)]
    pub name: Option<Regex>,
    /// Only trace processes in this cgroup or below (e.g. /kubepods.slice).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<String>,
    /// How often /proc is compared with the previous poll (new processes are
    /// traced at most this long after they start). E.g. 500ms, 1s, 2m.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = tracer::units::parse_period)]
    pub poll_interval: Duration,
    /// containerd's socket, asked for the Kubernetes names (namespace, pod,
    /// container) of the containers traced processes run in; "off": label
    /// containers by id only. A process in a container waits up to 1s for
    /// its names before it is traced.
    #[arg(long, value_name = "PATH|off", default_value = tracer::targets::containerd::DEFAULT_SOCKET)]
    pub containerd_socket: String,
    /// Podman's storage root, read for the names of Podman's containers
    /// (the `container` label); "off": not read.
    #[arg(long, value_name = "PATH|off", default_value = tracer::targets::podman::DEFAULT_ROOT)]
    pub podman_root: String,
    /// Docker's socket, asked for the names of Docker's containers (the
    /// Kubernetes labels under cri-dockerd, else the container's name);
    /// "off": not asked.
    #[arg(long, value_name = "PATH|off", default_value = tracer::targets::docker::DEFAULT_SOCKET)]
    pub docker_socket: String,
    /// Also send the metrics and slow-pause records (as log records) to this
    /// OTLP receiver, e.g. http://127.0.0.1:4317 (grpc) or
    /// http://127.0.0.1:4318 (http/protobuf: /v1/metrics and /v1/logs are
    /// added). Without it, OTLP is on when OTEL_EXPORTER_OTLP_ENDPOINT (or
    /// a signal's own variable) is set; the other OTEL_EXPORTER_OTLP_*
    /// variables (headers, timeout, compression) are honoured.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// grpc or http/protobuf (default: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc).
    #[arg(long, value_name = "PROTOCOL")]
    pub otlp_protocol: Option<Protocol>,
    /// How often metrics are sent over OTLP (slow-pause records go within a
    /// second).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = tracer::units::parse_period)]
    pub otlp_interval: Duration,
    /// Executables traced at once; more are counted as attach failures.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_executables: u32,
    /// Distinct (executable, container) label sets at once; more share the
    /// container label "_overflow".
    #[arg(long, value_name = "N", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_label_sets: u32,
    /// Do not explain pauses: no stopping phase (Go 1.22+), laggards,
    /// callers or breakdown, and no scheduler programs. The explanation is
    /// on by default: the stopping probe lengthens every pause by about
    /// 0.8 us (docs/guide/attach-and-run.md, "Stopping phase"), and what
    /// makes a slow pause slow is known only if it was gathered then.
    #[arg(long)]
    pub no_explain: bool,
    /// The default since the explanation is on by default; kept so that
    /// existing command lines still parse.
    #[arg(long, hide = true, conflicts_with = "no_explain")]
    pub stopping: bool,
    /// How often each traced process's memory exposure is read for
    /// gostw_process_memory_bytes (first at once; 0: never; else at least
    /// 100ms). E.g. 60s, 5m.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = tracer::units::parse_interval)]
    pub exposure_every: Duration,
}

fn parse_regex(s: &str) -> Result<Regex, String> {
    Regex::new(s).map_err(|e| format!("not a valid regular expression: {e}"))
}

impl Args {
    fn options(self) -> Options {
        let slow = SlowThreshold::at_least(self.slow_pause);
        let otlp = self.otlp(slow);
        Options {
            listen: self.listen,
            debug_allow_remote: self.pprof_allow_remote,
            filter: Filter {
                name: self.name,
                cgroup: self.cgroup,
            },
            poll_interval: self.poll_interval,
            containerd_socket: (self.containerd_socket != "off")
                .then(|| self.containerd_socket.into()),
            podman_root: (self.podman_root != "off").then(|| self.podman_root.into()),
            docker_socket: (self.docker_socket != "off").then(|| self.docker_socket.into()),
            max_executables: self.max_executables,
            max_label_sets: self.max_label_sets,
            explain: !self.no_explain,
            exposure_every: self.exposure_every,
            slow,
            store: StoreLimits {
                total: self.slow_pauses_kept as usize,
                per_label_set: self.slow_pauses_per_set as usize,
            },
            pause_log: match self.pause_log.as_str() {
                "off" => PauseLogTo::Off,
                "stdout" | "-" => PauseLogTo::Stdout,
                path => PauseLogTo::File(path.into()),
            },
            pause_log_max_bytes: self.pause_log_max_mib << 20,
            pause_log_rate: self.pause_log_rate,
            otlp,
        }
    }

    /// OTLP if an endpoint is given here or in the environment.
    fn otlp(&self, slow: SlowThreshold) -> Option<OtlpOptions> {
        let from_env = [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        ]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()));
        if self.otlp_endpoint.is_none() && !from_env {
            return None;
        }
        let protocol = self.otlp_protocol.unwrap_or_else(|| {
            std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL")
                .ok()
                .and_then(|p| p.parse().ok())
                .unwrap_or(Protocol::Grpc)
        });
        Some(OtlpOptions {
            endpoint: self.otlp_endpoint.clone(),
            protocol,
            interval: self.otlp_interval,
            slow,
            host_name: tracer::procfs::host_name(),
        })
    }
}

/// Run the agent until SIGINT or SIGTERM.
pub async fn run(args: Args) -> anyhow::Result<()> {
    tracer::agent::run(args.options()).await
}
