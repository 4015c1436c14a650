//! HTTP over loopback for the tests of real services: free ports, one GET
//! and the samples of /metrics (gostw_scenario's, shared with xtask), waiting
//! for an answer, and bounded load.

use std::time::{Duration, Instant};

pub use gostw_scenario::loopback::{http_get, samples};

/// A free loopback port (bound, then released for the server to take).
pub fn free_port() -> u16 {
    gostw_scenario::loopback::free_port().expect("binding a loopback port")
}

/// Call `f` every 100 ms until it returns something; panic after `timeout`.
pub fn wait_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    wait_showing(what, timeout, || f().ok_or_else(String::new))
}

/// As [`wait_until`], with what `f` last saw (its `Err`, when not empty)
/// in the panic.
pub fn wait_showing<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let seen = match f() {
            Ok(v) => return v,
            Err(seen) => seen,
        };
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}{}",
            if seen.is_empty() {
                String::new()
            } else {
                format!("; last seen:\n{seen}")
            }
        );
        std::thread::sleep(Duration::from_millis(100));
    }
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
