//! `gostw pauses`: the agent's slow-pause records, read from its
//! `/debug/pauses` and printed the way `attach` prints its live lines (or as
//! the JSON lines the endpoint serves), newest first.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    time::Duration,
};

use anyhow::{Context as _, bail};
use tracer::units::parse_duration;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The agent's address (its --listen).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:9477")]
    pub agent: String,
    /// Only pauses that began this long ago or later (e.g. 10m, 2h).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub since: Option<Duration>,
    /// Only pauses at least this long (e.g. 5ms; the endpoint's `min`).
    /// (Formerly --min.)
    #[arg(long, value_name = "DURATION", alias = "min", value_parser = parse_duration)]
    pub slow_pause: Option<Duration>,
    /// Only this executable's pauses (its file name, the series' label).
    #[arg(long, value_name = "NAME")]
    pub executable: Option<String>,
    /// Only this container's pauses (the series' label: its name where the
    /// container runtime names it, else its id).
    #[arg(long, value_name = "NAME")]
    pub container: Option<String>,
    /// Only pauses of pods in this Kubernetes namespace.
    #[arg(long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// Only this Kubernetes pod's pauses.
    #[arg(long, value_name = "POD")]
    pub pod: Option<String>,
    /// Only this process's pauses.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// At most this many records, the newest.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub limit: usize,
    /// The records as JSON lines (each one the pause log's line for it).
    #[arg(long)]
    pub json: bool,
}

impl Args {
    /// The request's path and query.
    fn path(&self) -> String {
        let ns = |d: Duration| format!("{}ns", d.as_nanos());
        let mut q = vec![
            format!("limit={}", self.limit),
            format!("format={}", if self.json { "json" } else { "text" }),
        ];
        if let Some(d) = self.since {
            q.push(format!("since={}", ns(d)));
        }
        if let Some(d) = self.slow_pause {
            q.push(format!("min={}", ns(d)));
        }
        if let Some(p) = self.pid {
            q.push(format!("pid={p}"));
        }
        for (k, v) in [
            ("executable", &self.executable),
            ("container", &self.container),
            ("namespace", &self.namespace),
            ("pod", &self.pod),
        ] {
            if let Some(v) = v {
                q.push(format!("{k}={}", percent_encode(v)));
            }
        }
        format!("/debug/pauses?{}", q.join("&"))
    }
}

/// `s` as a URL query value (RFC 3986 unreserved characters kept).
pub fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One GET of `path` from `agent`: the status and the body.
fn get(agent: &str, path: &str) -> anyhow::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(agent).with_context(|| {
        format!("cannot reach the agent at {agent} (is `gostw agent` running? --agent HOST:PORT)")
    })?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    // HTTP/1.0: the agent answers with the whole body and closes.
    write!(s, "GET {path} HTTP/1.0\r\nHost: {agent}\r\n\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .with_context(|| format!("reading the answer of {agent}"))?;
    let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        bail!("{agent} did not answer in HTTP");
    };
    let head = String::from_utf8_lossy(&raw[..split]);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("{agent} did not answer in HTTP"))?;
    Ok((status, raw[split + 4..].to_vec()))
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let (status, body) = get(&args.agent, &args.path())?;
    if status != 200 {
        bail!(
            "the agent at {} answered {status}: {}",
            args.agent,
            String::from_utf8_lossy(&body).trim()
        );
    }
    if body.is_empty() && !args.json {
        eprintln!("gostw: no slow-pause records match");
        return Ok(0);
    }
    let mut out = std::io::stdout().lock();
    // A reader that went away (`| head`) ends the listing, not in an error.
    match out.write_all(&body).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
        r => r.map(|()| 0).context("writing the records"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_carries_every_filter() {
        let a = Args {
            agent: "127.0.0.1:9477".into(),
            since: Some(Duration::from_secs(600)),
            slow_pause: Some(Duration::from_millis(5)),
            executable: Some("my api".into()),
            container: None,
            namespace: None,
            pod: None,
            pid: Some(42),
            limit: 10,
            json: false,
        };
        assert_eq!(
            a.path(),
            "/debug/pauses?limit=10&format=text&since=600000000000ns&min=5000000ns&pid=42&executable=my%20api"
        );
    }
}
