//! The serve layer's HTTP API as a library, through its public API: the app a host
//! serves (`http_service::app`) over a router started from a config, driven request by
//! request in process (no listener, no binary): a selection, a reservation seen in the
//! workers' load and freed, and a malformed body answered as JSON.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use switchyard_config::ConfigSource;
use switchyard_fleet::router::Router;
use switchyard_policy::startup::start;
use switchyard_serve::frontend::Frontend;
use switchyard_serve::guards::BodyLimits;
use switchyard_serve::http_service::app;
use tower::ServiceExt;

const CONFIG: &str = "workers:\n  - {model: demo, worker_id: 1}\n  - {model: demo, worker_id: 2}\n";

/// The app over a router of `CONFIG`.
fn http_app() -> axum::Router {
    switchyard_engines::tls::install_default_provider();
    let source = ConfigSource::parse(CONFIG.to_owned(), "config.yaml".to_owned(), PathBuf::new())
        .unwrap_or_else(|e| panic!("{e}"));
    let startup = start(source).unwrap_or_else(|e| panic!("{e:?}"));
    let router = Arc::new(Router::new(startup).unwrap_or_else(|e| panic!("{e}")));
    let frontend = Frontend::new(router.clone()).unwrap_or_else(|e| panic!("{e}"));
    let limits = BodyLimits {
        max_bytes: 1 << 20,
        read_timeout: Duration::from_secs(10),
    };
    app(router, frontend, limits)
}

/// `method path` with `body` (raw); the status and the JSON answer.
async fn call(app: &axum::Router, method: &str, path: &str, body: &str) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes);
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|_| json!(text)),
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Active requests per worker, in id order.
async fn active(app: &axum::Router) -> Vec<u64> {
    let (status, workers) = call(app, "GET", "/v1/workers", "").await;
    assert_eq!(status, StatusCode::OK, "{workers}");
    let workers = workers.as_array().unwrap().iter();
    workers
        .map(|w| w["load"]["active_requests"].as_u64().unwrap())
        .collect()
}

#[test]
fn a_reservation_is_booked_seen_in_the_load_and_freed() {
    let app = http_app();
    runtime().block_on(async {
        let select = json!({"model": "demo", "block_hashes": [1, 2]}).to_string();
        let (status, picked) = call(&app, "POST", "/v1/select", &select).await;
        assert_eq!(status, StatusCode::OK, "{picked}");
        assert!(picked["worker_id"].is_u64(), "{picked}");
        assert_eq!(active(&app).await, [0, 0], "a selection books nothing");

        let reserve = json!({"model": "demo", "block_hashes": [1, 2], "request_id": "r1"});
        let (status, booked) = call(&app, "POST", "/v1/reserve", &reserve.to_string()).await;
        assert_eq!(status, StatusCode::OK, "{booked}");
        let worker = booked["worker_id"].as_u64().unwrap();
        let mut expected = vec![0, 0];
        expected[usize::try_from(worker - 1).unwrap()] = 1;
        assert_eq!(active(&app).await, expected, "{booked}");

        let (status, freed) = call(&app, "DELETE", "/v1/requests/r1", "").await;
        assert_eq!(status, StatusCode::OK, "{freed}");
        assert_eq!(active(&app).await, [0, 0]);
    });
}

#[test]
fn a_malformed_body_is_answered_as_json_naming_the_problem() {
    let app = http_app();
    runtime().block_on(async {
        let (status, answer) = call(&app, "POST", "/v1/select", "{\"model\": ").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(
            error.starts_with("invalid JSON body: EOF while parsing"),
            "a JSON error naming the problem: {answer}"
        );
    });
}
