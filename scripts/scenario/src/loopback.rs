//! HTTP over loopback, as the tests and benches talk to `gostw agent`: a
//! free port, one GET, and the samples of a Prometheus text exposition.

use std::{
    io::{self, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    time::Duration,
};

/// A free loopback port (bound, then released for the server to take).
pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// GET `path` from 127.0.0.1:`port`; (status, body). None when nothing
/// listens yet or the answer is not HTTP.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let (status, body) = http_get_bytes(port, path, Duration::from_secs(10)).ok()?;
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

/// GET `path` from 127.0.0.1:`port`, waiting up to `timeout` for the
/// answer; (status, body as bytes).
pub fn http_get_bytes(port: u16, path: &str, timeout: Duration) -> io::Result<(u16, Vec<u8>)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(timeout))?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let not_http = || io::Error::new(io::ErrorKind::InvalidData, "not an HTTP response");
    let at = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(not_http)?;
    let status = String::from_utf8_lossy(&raw[..at])
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(not_http)?;
    Ok((status, raw[at + 4..].to_vec()))
}

/// The samples of metric `name` in Prometheus text exposition `text`:
/// (labels as written between the braces, value).
pub fn samples<'a>(text: &'a str, name: &str) -> Vec<(&'a str, f64)> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(r) => r.split_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            let value = value.split_whitespace().next()?.parse().ok()?;
            Some((labels, value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_prometheus_samples() {
        let t = "# HELP x\ngo_gc_duration_seconds_sum 1.5\ngo_gc_duration_seconds_count 7\n\
                 g_total{a=\"1\",reason=\"gc_x\"} 3 1700000000\ng_total_other 9\n";
        assert_eq!(samples(t, "go_gc_duration_seconds_count"), [("", 7.0)]);
        assert_eq!(samples(t, "g_total"), [("a=\"1\",reason=\"gc_x\"", 3.0)]);
    }

    #[test]
    fn nothing_listening_is_none() {
        let port = free_port().unwrap();
        assert_eq!(http_get(port, "/"), None);
    }
}
