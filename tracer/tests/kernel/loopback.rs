//! HTTP over loopback for the tests of real services: free ports, one GET,
//! Prometheus text exposition, and bounded keep-alive load.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    time::{Duration, Instant},
};

/// A free loopback port (bound, then released for the server to take).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET over loopback; (status, body). None when nothing listens yet.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// Call `f` every 100 ms until it returns something; panic after `timeout`.
pub fn wait_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
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

/// `requests` GETs of `path` on `port` from `threads` threads at once, one
/// connection each (loopback); stops early at `limit`. Returns the requests
/// answered 200.
pub fn load(port: u16, path: &str, requests: usize, threads: usize, limit: Duration) -> usize {
    let deadline = Instant::now() + limit;
    let per = requests.div_ceil(threads);
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let path = path.to_owned();
            std::thread::spawn(move || {
                (0..per)
                    .take_while(|_| Instant::now() < deadline)
                    .filter(|_| matches!(http_get(port, &path), Some((200, _))))
                    .count()
            })
        })
        .collect();
    workers.into_iter().map(|w| w.join().unwrap()).sum()
}

#[test]
fn reads_prometheus_samples() {
    let t = "# HELP x\ngo_gc_duration_seconds_sum 1.5\ngo_gc_duration_seconds_count 7\n\
             g_total{a=\"1\",reason=\"gc_x\"} 3 1700000000\ng_total_other 9\n";
    assert_eq!(samples(t, "go_gc_duration_seconds_count"), [("", 7.0)]);
    assert_eq!(samples(t, "g_total"), [("a=\"1\",reason=\"gc_x\"", 3.0)]);
}
