//! The request side of the agent's `/debug/pprof/faults` and
//! `/debug/pprof/stackgrowth`, as Go's own net/http/pprof behaves: who may
//! ask, what a query selects, and the response headers. The body is
//! `profiles::faults_profile` / `profiles::stack_growth_profile` of the
//! processes the request selects.
//!
//! - `seconds=N`: collect for N seconds and answer with what happened in
//!   them (stackgrowth: default 30, as Go's `/debug/pprof/profile`;
//!   faults: default none, meaning everything since the process was
//!   attached, as Go's heap profile is cumulative).
//! - Any of the agent's label names (`executable`, `go_version`,
//!   `build_id`, `container`) selects the processes whose label has that
//!   value; several are ANDed. Another parameter is an error, so a typo
//!   never silently selects every process.

use std::{collections::HashMap, net::IpAddr, time::Duration};

pub use super::profiles::ProfileKind;

/// Response `Content-Type`, as net/http/pprof sends profiles.
pub const CONTENT_TYPE: &str = "application/octet-stream";

/// The label names a request may select on (the agent's per-process labels).
pub const LABEL_NAMES: &[&str] = &["executable", "go_version", "build_id", "container"];

/// Longest collection a request may ask for.
pub const MAX_SECONDS: u64 = 300;

/// Default `seconds` of the stack-growth endpoint.
pub const STACK_GROWTH_DEFAULT_SECONDS: u64 = 30;

/// Why a request is refused (answer 400 with the message).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("seconds={0:?} is not a whole number of seconds from 1 to {MAX_SECONDS}")]
    Seconds(String),
    #[error("unknown parameter {0:?}: use seconds or a label ({labels})", labels = LABEL_NAMES.join(", "))]
    Unknown(String),
}

/// A parsed request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileRequest {
    /// Collect for this long; `None`: everything so far (faults only).
    pub window: Option<Duration>,
    /// (label name, value) pairs a process must all have, sorted.
    pub labels: Vec<(String, String)>,
}

impl ProfileRequest {
    /// Parses the decoded query parameters of a request for `kind`.
    pub fn from_params(
        kind: ProfileKind,
        params: &HashMap<String, String>,
    ) -> Result<ProfileRequest, RequestError> {
        let mut labels = Vec::new();
        let mut window = match kind {
            ProfileKind::Faults => None,
            ProfileKind::StackGrowth => Some(Duration::from_secs(STACK_GROWTH_DEFAULT_SECONDS)),
        };
        for (key, value) in params {
            if key == "seconds" {
                let secs = value
                    .parse::<u64>()
                    .ok()
                    .filter(|s| (1..=MAX_SECONDS).contains(s))
                    .ok_or_else(|| RequestError::Seconds(value.clone()))?;
                window = Some(Duration::from_secs(secs));
            } else if LABEL_NAMES.contains(&key.as_str()) {
                labels.push((key.clone(), value.clone()));
            } else {
                return Err(RequestError::Unknown(key.clone()));
            }
        }
        labels.sort();
        Ok(ProfileRequest { window, labels })
    }

    /// Does a process with these (label name, value) pairs belong?
    pub fn selects(&self, process_labels: &[(&str, &str)]) -> bool {
        self.labels
            .iter()
            .all(|(k, v)| process_labels.iter().any(|(pk, pv)| pk == k && pv == v))
    }
}

/// May `peer` fetch profiles? Loopback only unless the agent was told to
/// serve them further (`allow_remote`): profiles name code and files.
pub fn peer_allowed(peer: IpAddr, allow_remote: bool) -> bool {
    if allow_remote {
        return true;
    }
    match peer {
        IpAddr::V4(a) => a.is_loopback(),
        // ::1, or 127.x.y.z as an IPv4-mapped address on a dual-stack socket.
        IpAddr::V6(a) => a.is_loopback() || a.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn defaults_follow_net_http_pprof() {
        let none = params(&[]);
        let faults = ProfileRequest::from_params(ProfileKind::Faults, &none).unwrap();
        assert_eq!(faults.window, None, "cumulative, like the heap profile");
        let growth = ProfileRequest::from_params(ProfileKind::StackGrowth, &none).unwrap();
        assert_eq!(growth.window, Some(Duration::from_secs(30)));
        assert!(growth.labels.is_empty());
        assert!(growth.selects(&[("executable", "server")]));
    }

    #[test]
    fn seconds_and_labels_select() {
        let p = params(&[
            ("seconds", "10"),
            ("executable", "server"),
            ("container", "abc123"),
        ]);
        let r = ProfileRequest::from_params(ProfileKind::Faults, &p).unwrap();
        assert_eq!(r.window, Some(Duration::from_secs(10)));
        assert_eq!(
            r.labels,
            [
                ("container".to_owned(), "abc123".to_owned()),
                ("executable".to_owned(), "server".to_owned())
            ]
        );
        assert!(r.selects(&[
            ("executable", "server"),
            ("go_version", "go1.26.6"),
            ("container", "abc123")
        ]));
        assert!(!r.selects(&[("executable", "server"), ("container", "other")]));
        assert!(!r.selects(&[("executable", "server")]));
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        for bad in ["0", "-1", "301", "1.5", "ten", ""] {
            let r =
                ProfileRequest::from_params(ProfileKind::StackGrowth, &params(&[("seconds", bad)]));
            assert_eq!(r, Err(RequestError::Seconds(bad.to_owned())), "{bad:?}");
        }
        let r = ProfileRequest::from_params(ProfileKind::Faults, &params(&[("exectuable", "x")]));
        let err = r.unwrap_err();
        assert_eq!(err, RequestError::Unknown("exectuable".to_owned()));
        assert!(err.to_string().contains("executable"), "{err}");
    }

    #[test]
    fn only_loopback_peers_unless_allowed() {
        let ok = ["127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"];
        let refused = [
            "10.0.0.5",
            "192.168.1.1",
            "::ffff:10.0.0.5",
            "fe80::1",
            "2001:db8::1",
        ];
        for a in ok {
            assert!(peer_allowed(a.parse().unwrap(), false), "{a}");
        }
        for a in refused {
            assert!(!peer_allowed(a.parse().unwrap(), false), "{a}");
            assert!(peer_allowed(a.parse().unwrap(), true), "{a}");
        }
    }

    #[test]
    fn endpoints_are_named_like_go_profiles() {
        assert_eq!(ProfileKind::Faults.path(), "/debug/pprof/faults");
        assert_eq!(ProfileKind::StackGrowth.path(), "/debug/pprof/stackgrowth");
        assert!(
            ProfileKind::StackGrowth
                .content_disposition()
                .contains("filename=\"stackgrowth\"")
        );
    }
}
