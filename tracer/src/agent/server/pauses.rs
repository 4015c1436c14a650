//! `GET /debug/pauses`: the slow-pause records, newest first, as JSON lines
//! (each one the line the pause log has for it) or as text (`format=text`,
//! the lines `gostw attach` prints, for `gostw pauses`). Loopback peers
//! only unless the agent allows others, like the profiles: records name
//! code, files and containers.
//!
//! Parameters, all optional: `executable`, `container`, `pid`, `since` (a
//! duration back from now, e.g. `10m`, or a Unix time in seconds), `min`
//! (a duration, e.g. `5ms`), `limit` (default 100).
//!
//! `GET /debug/pprof/pauses` (same filters, every record by default): the
//! records' pause time as a pprof profile (`formats::pause_profile`).

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
};

use axum::{
    Router,
    extract::{ConnectInfo, Query as Params, State},
    http::{StatusCode, header},
    response::{IntoResponse as _, Response},
    routing::get,
};

use crate::{
    formats::{
        debug_pprof::{CONTENT_TYPE, peer_allowed},
        pause_profile::{self, ProfiledPause},
    },
    sink::{
        report::text::pause_line,
        slow_pauses::{Query, SharedStore},
    },
};

pub const PATH: &str = "/debug/pauses";
pub const PROFILE_PATH: &str = "/debug/pprof/pauses";

/// Records a request gets when it does not say.
pub const DEFAULT_LIMIT: usize = 100;

/// What the route serves from.
#[derive(Clone)]
pub struct Pauses {
    pub store: SharedStore,
    pub allow_remote: bool,
}

/// An answer to a request's parameters from a peer at a time.
type Answer = fn(&Pauses, IpAddr, &HashMap<String, String>, u64) -> Response;

pub fn routes(pauses: Pauses) -> Router {
    let route = |answer: Answer| {
        get(
            move |State(p): State<Pauses>,
                  ConnectInfo(peer): ConnectInfo<SocketAddr>,
                  Params(q): Params<HashMap<String, String>>| async move {
                answer(&p, peer.ip(), &q, now_unix_ns())
            },
        )
    };
    Router::new()
        .route(PATH, route(answer))
        .route(PROFILE_PATH, route(profile))
        .with_state(pauses)
}

fn now_unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn text(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body + "\n",
    )
        .into_response()
}

/// Whether the answer is text rather than JSON lines.
fn parse(params: &HashMap<String, String>, now_unix_ns: u64) -> Result<(Query, bool), String> {
    let mut q = Query {
        limit: Some(DEFAULT_LIMIT),
        ..Query::default()
    };
    let mut as_text = false;
    for (k, v) in params {
        let duration = || {
            crate::units::parse_duration(v)
                .map(|d| d.as_nanos() as u64)
                .map_err(|e| format!("{k}={v}: {e}"))
        };
        match k.as_str() {
            "executable" => q.executable = Some(v.clone()),
            "container" => q.container = Some(v.clone()),
            "namespace" => q.namespace = Some(v.clone()),
            "pod" => q.pod = Some(v.clone()),
            "pid" => q.pid = Some(v.parse().map_err(|_| format!("pid={v}: not a pid"))?),
            "min" => q.min_ns = Some(duration()?),
            "since" => {
                q.since_unix_ns = Some(match v.parse::<f64>() {
                    Ok(secs) if secs >= 0.0 => (secs * 1e9) as u64,
                    _ => now_unix_ns.saturating_sub(duration()?),
                })
            }
            "limit" => {
                q.limit = Some(
                    v.parse()
                        .map_err(|_| format!("limit={v}: not a count of records"))?,
                )
            }
            "format" => {
                as_text = match v.as_str() {
                    "text" => true,
                    "json" => false,
                    _ => return Err(format!("format={v}: json or text")),
                }
            }
            _ => {
                return Err(format!(
                    "unknown parameter {k}: executable, container, namespace, pod, pid, since, min, limit, format"
                ));
            }
        }
    }
    Ok((q, as_text))
}

fn refused(peer: IpAddr) -> Response {
    text(
        StatusCode::FORBIDDEN,
        format!(
            "pause records are served to loopback peers only, not {peer}; start the agent with --pprof-allow-remote to serve others"
        ),
    )
}

/// The query `params` make, if `peer` may ask and they are valid; else the
/// answer that refuses it.
fn request(
    p: &Pauses,
    peer: IpAddr,
    params: &HashMap<String, String>,
    now_unix_ns: u64,
) -> Result<(Query, bool), Box<Response>> {
    if !peer_allowed(peer, p.allow_remote) {
        return Err(Box::new(refused(peer)));
    }
    parse(params, now_unix_ns).map_err(|e| Box::new(text(StatusCode::BAD_REQUEST, e)))
}

/// The profile of the records `params` select, for `peer`.
pub fn profile(
    p: &Pauses,
    peer: IpAddr,
    params: &HashMap<String, String>,
    now_unix_ns: u64,
) -> Response {
    let (mut q, _) = match request(p, peer, params, now_unix_ns) {
        Ok(q) => q,
        Err(refusal) => return *refusal,
    };
    if !params.contains_key("limit") {
        q.limit = None;
    }
    let records = p.store.lock().unwrap_or_else(|e| e.into_inner()).query(&q);
    let pauses: Vec<ProfiledPause> = records
        .iter()
        .map(|r| ProfiledPause {
            record: &r.record,
            labels: &r.labels,
        })
        .collect();
    let mut query: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
    query.sort();
    let body = pause_profile::encode(
        &pauses,
        &format!("gostw agent {PROFILE_PATH}?{}", query.join("&")),
    );
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, CONTENT_TYPE),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"pauses.pb.gz\"",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

/// The answer to `params` from `peer`.
pub fn answer(
    p: &Pauses,
    peer: IpAddr,
    params: &HashMap<String, String>,
    now_unix_ns: u64,
) -> Response {
    let (q, as_text) = match request(p, peer, params, now_unix_ns) {
        Ok(q) => q,
        Err(refusal) => return *refusal,
    };
    let records = p.store.lock().unwrap_or_else(|e| e.into_inner()).query(&q);
    let mut body = Vec::with_capacity(records.len() * 2048);
    for r in &records {
        if as_text {
            body.extend_from_slice(
                format!(
                    "{}  {}  {}\n",
                    r.id,
                    r.labels.executable,
                    pause_line(&r.record)
                )
                .as_bytes(),
            );
        } else if serde_json::to_writer(&mut body, &**r).is_ok() {
            body.push(b'\n');
        }
    }
    let content_type = if as_text {
        "text/plain; charset=utf-8"
    } else {
        "application/x-ndjson"
    };
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::{
        model::labels::ProcessLabels,
        model::pause::tests_support::record,
        sink::slow_pauses::{SlowPause, SlowPauseStore, StoreLimits},
    };

    const S: u64 = 1_000_000_000;

    fn pauses(allow_remote: bool) -> Pauses {
        let mut store = SlowPauseStore::new(StoreLimits {
            total: 10,
            per_label_set: 10,
        });
        for (i, dur) in [(1u64, 2_000_000u64), (2, 9_000_000)] {
            let labels = ProcessLabels {
                executable: "api".into(),
                go_version: "go1.27.3".into(),
                build_id: String::new(),
                container: String::new(),
                namespace: String::new(),
                pod: String::new(),
            };
            store.insert(Arc::new(SlowPause::new(
                &labels,
                record(7, i * 100 * S, dur),
            )));
        }
        Pauses {
            store: Arc::new(Mutex::new(store)),
            allow_remote,
        }
    }

    fn get(p: &Pauses, peer: &str, q: &[(&str, &str)]) -> (StatusCode, String) {
        let params = q
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let r = answer(p, peer.parse().unwrap(), &params, 300 * S);
        let status = r.status();
        let body = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(axum::body::to_bytes(r.into_body(), usize::MAX))
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[test]
    fn records_come_newest_first_filtered_as_json_lines_or_text() {
        let p = pauses(false);
        let (status, body) = get(&p, "127.0.0.1", &[]);
        assert_eq!(status, StatusCode::OK);
        let ids: Vec<String> = body
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].to_string())
            .collect();
        assert_eq!(ids, ["\"7-200000000000\"", "\"7-100000000000\""]);
        let (_, body) = get(&p, "::1", &[("min", "5ms")]);
        assert_eq!(body.lines().count(), 1);
        // 150 s back from 300 s: only the one at 200 s.
        let (_, body) = get(&p, "127.0.0.1", &[("since", "150s"), ("format", "text")]);
        assert!(body.starts_with("7-200000000000  api  "), "{body}");
        assert_eq!(body.lines().count(), 1);
        let (_, body) = get(&p, "127.0.0.1", &[("since", "150")]);
        assert_eq!(body.lines().count(), 1);
    }

    #[test]
    fn remote_peers_and_bad_parameters_are_refused() {
        let (status, body) = get(&pauses(false), "10.0.0.2", &[]);
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(body.contains("--pprof-allow-remote"), "{body}");
        assert_eq!(get(&pauses(true), "10.0.0.2", &[]).0, StatusCode::OK);
        for bad in [
            ("min", "fast"),
            ("pid", "x"),
            ("limit", "-1"),
            ("color", "red"),
        ] {
            let (status, body) = get(&pauses(false), "127.0.0.1", &[bad]);
            assert_eq!(status, StatusCode::BAD_REQUEST, "{bad:?}: {body}");
        }
    }
}
