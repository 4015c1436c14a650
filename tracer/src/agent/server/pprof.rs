//! `GET /debug/pprof/faults` and `GET /debug/pprof/stackgrowth`: the
//! profile store's samples as pprof profiles, for the label sets a request
//! selects (`formats::debug_pprof` has the rules: parameters, defaults,
//! who may ask).
//!
//! - No `seconds`: everything so far (faults only; a label set's samples
//!   are summed from when the agent first traced it, as Go's heap profile
//!   is cumulative).
//! - `seconds=N` (stackgrowth: 30 by default): the next N seconds, as
//!   net/http/pprof's CPU profile and delta profiles do: the answer is the
//!   difference of the store's snapshots at the request and N seconds later,
//!   so a window costs no memory in the sink and holds one snapshot while it
//!   waits. At most `MAX_WINDOWS` windows wait at once.
//!
//! Every sample is labelled with its `executable` (and `container` when
//! there is one), so `-tagfocus` tells apart the label sets of one answer.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use axum::{
    Router,
    extract::{ConnectInfo, Query, State},
    http::{StatusCode, header},
    response::{IntoResponse as _, Response},
    routing::get,
};

use crate::{
    formats::{
        debug_pprof::{CONTENT_TYPE, ProfileKind, ProfileRequest, peer_allowed},
        profiles::StackGrowthMode,
    },
    model::labels::ProcessLabels,
    sink::profile::{
        lock,
        store::{Encoding, Store},
    },
};

/// Windowed requests that may wait at once (each holds a snapshot).
pub const MAX_WINDOWS: usize = 4;

/// What the profile endpoints serve from.
#[derive(Clone)]
pub struct Profiles {
    /// The store the agent's profile sink fills.
    pub store: Arc<Mutex<Store>>,
    /// The stack-growth sampler's rate (samples per second per CPU).
    pub sample_hz: u64,
    /// Serve peers that are not loopback addresses.
    pub allow_remote: bool,
    /// Windowed requests waiting now.
    pub windows: Arc<AtomicUsize>,
}

/// The profile routes.
pub fn routes(profiles: Profiles) -> Router {
    Router::new()
        .route(
            ProfileKind::Faults.path(),
            get(
                |State(p): State<Profiles>,
                 ConnectInfo(peer): ConnectInfo<SocketAddr>,
                 Query(q): Query<HashMap<String, String>>| async move {
                    answer(&p, ProfileKind::Faults, peer.ip(), &q).await
                },
            ),
        )
        .route(
            ProfileKind::StackGrowth.path(),
            get(
                |State(p): State<Profiles>,
                 ConnectInfo(peer): ConnectInfo<SocketAddr>,
                 Query(q): Query<HashMap<String, String>>| async move {
                    answer(&p, ProfileKind::StackGrowth, peer.ip(), &q).await
                },
            ),
        )
        .with_state(profiles)
}

/// Counts a waiting window for as long as it lives (a client that goes
/// away drops it too).
struct Window(Arc<AtomicUsize>);

impl Window {
    fn take(count: &Arc<AtomicUsize>) -> Option<Window> {
        count
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < MAX_WINDOWS).then_some(n + 1)
            })
            .ok()
            .map(|_| Window(count.clone()))
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn text(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body + "\n",
    )
        .into_response()
}

/// The answer to a request for `kind` from `peer` with query `params`.
pub async fn answer(
    p: &Profiles,
    kind: ProfileKind,
    peer: IpAddr,
    params: &HashMap<String, String>,
) -> Response {
    if !peer_allowed(peer, p.allow_remote) {
        return text(
            StatusCode::FORBIDDEN,
            format!(
                "profiles are served to loopback peers only, not {peer}; start the agent with --pprof-allow-remote to serve others"
            ),
        );
    }
    let req = match ProfileRequest::from_params(kind, params) {
        Ok(r) => r,
        Err(e) => return text(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let select = |l: &ProcessLabels| {
        req.selects(&[
            ("executable", &l.executable),
            ("go_version", &l.go_version),
            ("build_id", &l.build_id),
            ("container", &l.container),
            ("namespace", &l.namespace),
            ("pod", &l.pod),
        ])
    };
    let mut query: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
    query.sort();
    let mut how = Encoding {
        growth_mode: StackGrowthMode::Sampled {
            sample_hz: u32::try_from(p.sample_hz).unwrap_or(u32::MAX),
        },
        set_labels: true,
        comment: Some(format!("gostw agent {}?{}", kind.path(), query.join("&"))),
        span: None,
    };
    let snapshot = match req.window {
        None => lock(&p.store).snapshot(kind, select),
        Some(window) => {
            let Some(_waiting) = Window::take(&p.windows) else {
                return text(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "{MAX_WINDOWS} profile windows are being collected already; try again later"
                    ),
                );
            };
            let start = lock(&p.store).snapshot(kind, select);
            tokio::time::sleep(window).await;
            let end = lock(&p.store).snapshot(kind, select);
            how.span = Some((start.at_unix_ns, end.at_unix_ns - start.at_unix_ns));
            end.since(&start)
        }
    };
    let body = snapshot.encode(&how);
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, CONTENT_TYPE),
            (header::CONTENT_DISPOSITION, kind.content_disposition()),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        formats::pprof::{Location, decode},
        image::Frame,
        model::fault::FaultKind,
        sink::profile::store::{PauseTag, Tags},
    };

    fn profiles(allow_remote: bool) -> Profiles {
        Profiles {
            store: Arc::new(Mutex::new(Store::new())),
            sample_hz: 99,
            allow_remote,
            windows: Default::default(),
        }
    }

    fn labels(exe: &str) -> ProcessLabels {
        ProcessLabels {
            executable: exe.into(),
            go_version: "go1.26.6".into(),
            build_id: "b1".into(),
            container: String::new(),
            namespace: String::new(),
            pod: String::new(),
        }
    }

    fn stack(name: &str) -> Vec<Location> {
        vec![Location {
            address: 0,
            frames: vec![Frame {
                function: name.into(),
                file: String::new(),
                line: 0,
                inlined: false,
                start_line: 0,
            }],
        }]
    }

    const GC: Tags = Tags::Fault {
        kind: FaultKind::SwapIn,
        pause: Some(PauseTag {
            reason: "gc_sweep_termination",
            by_stopper: true,
        }),
    };

    fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    async fn body(r: Response) -> (StatusCode, Vec<u8>) {
        let status = r.status();
        let bytes = axum::body::to_bytes(r.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, bytes.to_vec())
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    #[test]
    fn a_non_loopback_peer_is_refused_unless_allowed() {
        let rt = rt();
        let p = profiles(false);
        let remote: IpAddr = "192.0.2.7".parse().unwrap();
        let (status, b) = rt.block_on(async {
            body(answer(&p, ProfileKind::Faults, remote, &params(&[])).await).await
        });
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(String::from_utf8_lossy(&b).contains("--pprof-allow-remote"));
        let (status, _) = rt.block_on(async {
            body(
                answer(
                    &p,
                    ProfileKind::Faults,
                    "::1".parse().unwrap(),
                    &params(&[]),
                )
                .await,
            )
            .await
        });
        assert_eq!(status, StatusCode::OK);
        let open = profiles(true);
        let (status, _) = rt.block_on(async {
            body(answer(&open, ProfileKind::Faults, remote, &params(&[])).await).await
        });
        assert_eq!(status, StatusCode::OK);
    }

    #[test]
    fn labels_select_and_bad_parameters_are_refused() {
        let rt = rt();
        let p = profiles(false);
        {
            let mut st = lock(&p.store);
            st.started(&labels("api"), None);
            st.started(&labels("web"), None);
            st.add(&labels("api"), stack("a"), GC, [3, 30]);
            st.add(&labels("web"), stack("w"), GC, [5, 50]);
        }
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        let get = |q: &[(&str, &str)]| {
            rt.block_on(async {
                body(answer(&p, ProfileKind::Faults, local, &params(q)).await).await
            })
        };
        let (status, b) = get(&[("executable", "web")]);
        assert_eq!(status, StatusCode::OK);
        let prof = decode(&b).unwrap();
        let values: Vec<i64> = prof.sample.iter().map(|s| s.value[0]).collect();
        assert_eq!(values, [5]);
        let (_, b) = get(&[]);
        assert_eq!(decode(&b).unwrap().sample.len(), 2);
        let (status, b) = get(&[("exectuable", "web")]);
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(String::from_utf8_lossy(&b).contains("executable"));
        let (status, _) = get(&[("seconds", "0")]);
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }

    /// `seconds=N` answers with what the next N seconds added. Real time
    /// (no paused clock: tokio's `test-util` in the tests would change
    /// tokio's features and so rebuild every crate above it, see the VM
    /// page's "Build once"): the adds come 50 ms into a 2 s window, so only
    /// a stall of nearly 2 s could move them out of it.
    #[test]
    fn a_window_holds_what_happened_in_it() {
        let rt = rt();
        let p = profiles(false);
        let api = labels("api");
        {
            let mut st = lock(&p.store);
            st.started(&api, None);
            st.add(&api, stack("before"), GC, [7, 70]);
        }
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        let (status, b) = rt.block_on(async {
            let q = params(&[("seconds", "2")]);
            let request = answer(&p, ProfileKind::Faults, local, &q);
            let during = async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                lock(&p.store).add(&api, stack("during"), GC, [2, 20]);
                lock(&p.store).add(&api, stack("before"), GC, [1, 10]);
            };
            let (r, ()) = tokio::join!(request, during);
            body(r).await
        });
        assert_eq!(status, StatusCode::OK);
        let prof = decode(&b).unwrap();
        let mut values: Vec<i64> = prof.sample.iter().map(|s| s.value[0]).collect();
        values.sort();
        assert_eq!(values, [1, 2]);
        assert_eq!(p.windows.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn windows_are_bounded() {
        let count = Arc::new(AtomicUsize::new(0));
        let held: Vec<Window> = (0..MAX_WINDOWS)
            .map(|_| Window::take(&count).unwrap())
            .collect();
        assert!(Window::take(&count).is_none());
        drop(held);
        assert_eq!(count.load(Ordering::SeqCst), 0);
        assert!(Window::take(&count).is_some());
    }
}
