//! Docker's container names, from the Engine API on its socket
//! (`GET /containers/{id}/json`). Under Kubernetes (cri-dockerd) a container
//! carries the same `io.kubernetes.*` labels as under containerd; otherwise
//! its Docker name becomes the `container` label.
//!
//! One HTTP/1.0 request per lookup on a fresh connection: the answer ends
//! where the daemon closes it, so no chunked body and no connection state.
//! Lookups are rare (once per new container) and run on the resolver's
//! thread, so blocking I/O with a timeout is all that is needed.

use std::{
    io::{Read as _, Write as _},
    os::unix::net::UnixStream,
    path::PathBuf,
    time::Duration,
};

use anyhow::{Context as _, bail};
use serde::Deserialize;

use super::container_names::Runtime;
use crate::model::labels::{ContainerNames, truncate};

/// Docker's socket on a node.
pub const DEFAULT_SOCKET: &str = "/var/run/docker.sock";

/// How long one lookup may take before the daemon counts as unreachable.
const TIMEOUT: Duration = Duration::from_secs(2);

/// The daemon whose socket is `socket`.
pub struct Docker {
    socket: PathBuf,
}

impl Docker {
    pub fn new(socket: PathBuf) -> Docker {
        Docker { socket }
    }

    /// Status and body of `GET path`.
    fn get(&self, path: &str) -> anyhow::Result<(u16, Vec<u8>)> {
        let mut s = UnixStream::connect(&self.socket)
            .with_context(|| format!("connecting to {}", self.socket.display()))?;
        s.set_read_timeout(Some(TIMEOUT))?;
        s.set_write_timeout(Some(TIMEOUT))?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n")?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer)
            .with_context(|| format!("reading the answer to GET {path}"))?;
        parse_response(&answer)
    }
}

/// The status and body of an HTTP/1.x response read to its end.
fn parse_response(answer: &[u8]) -> anyhow::Result<(u16, Vec<u8>)> {
    let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        bail!("no HTTP header in {} bytes", answer.len());
    };
    let head = String::from_utf8_lossy(&answer[..end]);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status in {:?}", head.lines().next()))?;
    Ok((status, answer[end + 4..].to_vec()))
}

#[derive(Deserialize)]
struct Inspect {
    #[serde(rename = "Name", default)]
    name: String,
    #[serde(rename = "Config", default)]
    config: Option<Config>,
}

#[derive(Deserialize)]
struct Config {
    #[serde(rename = "Labels", default)]
    labels: Option<std::collections::HashMap<String, String>>,
}

/// The names in an inspect answer: Kubernetes' labels where present, else
/// the container's name (Docker writes it with a leading '/').
fn names_of(body: &[u8]) -> anyhow::Result<ContainerNames> {
    let c: Inspect = serde_json::from_slice(body).context("parsing the container's JSON")?;
    let labels = c.config.and_then(|c| c.labels).unwrap_or_default();
    Ok(
        ContainerNames::from_labels(labels.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .unwrap_or_else(|| ContainerNames {
                container: truncate(c.name.trim_start_matches('/')),
                ..Default::default()
            }),
    )
}

impl Runtime for Docker {
    fn names(&mut self, id: &str) -> anyhow::Result<Option<ContainerNames>> {
        // The id comes from a cgroup path: 64 hex digits, nothing to escape.
        if !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(None);
        }
        match self.get(&format!("/containers/{id}/json"))? {
            (200, body) => names_of(&body).map(Some),
            (404, _) => Ok(None),
            (status, body) => bail!(
                "GET /containers/{id}/json: status {status}: {}",
                String::from_utf8_lossy(&body).trim()
            ),
        }
    }

    fn describe(&self) -> String {
        format!("Docker at {}", self.socket.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_container_is_named_by_its_docker_name() {
        let n = names_of(br#"{"Id":"ab","Name":"/web","Config":{"Labels":{"a":"b"}}}"#).unwrap();
        assert_eq!(n.container, "web");
        assert_eq!((n.namespace.as_str(), n.pod.as_str()), ("", ""));
        let n = names_of(br#"{"Name":"/web","Config":{"Labels":null}}"#).unwrap();
        assert_eq!(n.container, "web");
    }

    #[test]
    fn kubernetes_labels_win_over_the_docker_name() {
        let n = names_of(
            br#"{"Name":"/k8s_app_web-0_shop_uid_0","Config":{"Labels":{
                "io.kubernetes.pod.name":"web-0","io.kubernetes.pod.namespace":"shop",
                "io.kubernetes.container.name":"app"}}}"#,
        )
        .unwrap();
        assert_eq!(
            (n.namespace.as_str(), n.pod.as_str(), n.container.as_str()),
            ("shop", "web-0", "app")
        );
    }

    #[test]
    fn responses_are_split_and_bad_ones_refused() {
        let (status, body) =
            parse_response(b"HTTP/1.0 404 Not Found\r\nContent-Type: x\r\n\r\n{\"message\":1}")
                .unwrap();
        assert_eq!((status, body.as_slice()), (404, &b"{\"message\":1}"[..]));
        assert!(parse_response(b"HTTP/1.0 200 OK\r\n").is_err());
        assert!(parse_response(b"garbage\r\n\r\n").is_err());
        assert!(names_of(b"<html>").is_err());
    }

    #[test]
    fn an_id_that_is_not_hex_is_not_asked_and_a_missing_socket_is_an_error() {
        let mut d = Docker::new("/nonexistent/docker.sock".into());
        assert_eq!(d.names("../../info").unwrap(), None);
        assert!(d.names(&"a".repeat(64)).is_err());
    }
}
