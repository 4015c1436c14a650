//! The HTTP side: `/metrics`, `/healthz` and `/readyz` (see `health`), the profiles
//! (`/debug/pprof/faults`, `/debug/pprof/stackgrowth`, see `pprof`) and the
//! slow-pause records (`/debug/pauses`, see `pauses`), served
//! by axum on a tokio runtime of its own thread, so a slow `/proc` poll or
//! binary analysis never delays a scrape.

pub mod pauses;
pub mod pprof;

use std::{
    net::{SocketAddr, TcpListener},
    sync::Arc,
    time::Instant,
};

pub use self::{pauses::Pauses, pprof::Profiles};

use anyhow::Context as _;
use axum::{
    Router,
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use prometheus_client::encoding::text::encode;

use super::health::Health;
use crate::sink::metrics::Metrics;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Bind the listening socket now, so a port in use fails before anything is
/// loaded into the kernel, with a message that says what to do.
pub fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    let listener = TcpListener::bind(addr).map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => {
                "; another process listens there: stop it or pick another address with --listen"
            }
            std::io::ErrorKind::AddrNotAvailable => {
                "; that address is not on this host: use one of its addresses or 0.0.0.0"
            }
            std::io::ErrorKind::PermissionDenied => {
                "; ports below 1024 need root or CAP_NET_BIND_SERVICE"
            }
            _ => "",
        };
        anyhow::anyhow!("cannot listen on {addr}: {e}{hint}")
    })?;
    listener
        .set_nonblocking(true)
        .context("setting the listener non-blocking")?;
    Ok(listener)
}

/// Serve until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    profiles: Profiles,
    pauses: Pauses,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let app = router(metrics, health, profiles, pauses);
    // The peer's address decides who gets profiles.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
    .context("serving HTTP")
}

/// Every route of the agent.
pub fn router(
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    profiles: Profiles,
    pauses: Pauses,
) -> Router {
    let live = health.clone();
    let ready = health.clone();
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(move || async move { verdict(live.live()) }))
        .route("/readyz", get(move || async move { verdict(ready.ready()) }))
        .route(
            "/",
            get(|| async {
                "gostw agent: /metrics (Prometheus), /healthz, /readyz, /debug/pauses, /debug/pprof/pauses, /debug/pprof/faults, /debug/pprof/stackgrowth?seconds=N\n"
            }),
        )
        .with_state((metrics, health))
        .merge(pprof::routes(profiles))
        .merge(pauses::routes(pauses))
}

/// A health check's answer: 200 and its body, or 503 and why.
fn verdict(v: Result<String, String>) -> (StatusCode, String) {
    match v {
        Ok(body) => (StatusCode::OK, body),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

async fn metrics_handler(
    State((metrics, health)): State<(Arc<Metrics>, Arc<Health>)>,
    headers: HeaderMap,
) -> impl IntoResponse {
    let started = Instant::now();
    health.refresh(&metrics);
    let openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    let mut body = String::with_capacity(64 * 1024);
    if let Err(e) = encode(&mut body, metrics.registry()) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, TEXT)],
            format!("encoding metrics: {e}\n"),
        );
    }
    let (body, content_type) = if openmetrics {
        (body, OPENMETRICS)
    } else {
        (openmetrics_to_text(&body), TEXT)
    };
    metrics
        .scrape_duration
        .observe(started.elapsed().as_secs_f64());
    (StatusCode::OK, [(header::CONTENT_TYPE, content_type)], body)
}

/// The Prometheus text format (0.0.4) of an OpenMetrics exposition, for
/// clients that do not ask for OpenMetrics (promtool, curl, older scrapers).
/// The formats differ where prometheus-client's output uses them: counter
/// families are named with their `_total` suffix in 0.0.4, and `# UNIT` and
/// `# EOF` do not exist there.
pub fn openmetrics_to_text(om: &str) -> String {
    let counters: std::collections::HashSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        // Exemplars (` # {labels} value`) exist in OpenMetrics only.
        let line = match line.find(" # {") {
            Some(at) if !line.starts_with('#') => &line[..at],
            _ => line,
        };
        let rewritten = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        out.push_str(rewritten.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_get_total_names_and_openmetrics_lines_go() {
        let om = "# HELP gostw_x Things.\n# TYPE gostw_x counter\n# UNIT gostw_x bytes\ngostw_x_total{a=\"b\"} 1\n# HELP gostw_h H.\n# TYPE gostw_h histogram\ngostw_h_sum 0.0\ngostw_h_bucket{le=\"1.0\"} 1 # {pause_id=\"7-12\"} 0.5\n# EOF\n";
        assert_eq!(
            openmetrics_to_text(om),
            "# HELP gostw_x_total Things.\n# TYPE gostw_x_total counter\ngostw_x_total{a=\"b\"} 1\n# HELP gostw_h H.\n# TYPE gostw_h histogram\ngostw_h_sum 0.0\ngostw_h_bucket{le=\"1.0\"} 1\n"
        );
    }

    /// /healthz and /readyz through the router: what the agent's health
    /// says, as status and body.
    #[tokio::test]
    async fn the_health_routes_answer_what_the_loop_and_outputs_say() {
        use tower::ServiceExt as _;

        use crate::sink::{
            profile::store::Store,
            slow_pauses::{SlowPauseStore, StoreLimits},
        };

        let health = Arc::new(Health::new(Vec::new()));
        let app = router(
            Arc::new(Metrics::new()),
            health.clone(),
            Profiles {
                store: Arc::new(std::sync::Mutex::new(Store::new())),
                sample_hz: 99,
                allow_remote: false,
                windows: Default::default(),
            },
            Pauses {
                store: Arc::new(std::sync::Mutex::new(SlowPauseStore::new(StoreLimits {
                    total: 1,
                    per_label_set: 1,
                }))),
                allow_remote: false,
            },
        );
        let get = |path: &'static str| {
            let app = app.clone();
            async move {
                let r = app
                    .oneshot(
                        axum::http::Request::get(path)
                            .body(axum::body::Body::empty())
                            .unwrap(),
                    )
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                let body = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
                (status, String::from_utf8_lossy(&body).into_owned())
            }
        };
        assert_eq!(get("/healthz").await, (200, "ok\n".into()));
        let (status, body) = get("/readyz").await;
        assert_eq!(status, 503, "{body}");
        health.beat();
        assert_eq!(get("/readyz").await, (200, "ready\n".into()));
    }

    #[test]
    fn a_port_in_use_says_what_to_do() {
        let first = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = first.local_addr().unwrap();
        let err = bind(addr).unwrap_err().to_string();
        assert!(err.contains("--listen"), "{err}");
    }
}
