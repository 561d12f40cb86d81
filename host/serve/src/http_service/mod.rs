//! The HTTP service: routing, reservations, workers, KV events, policies, metrics and
//! health, as JSON over HTTP. Every error is a JSON `{"error": ...}` with a status that
//! says whose fault it is; nothing a client sends can panic the router.

mod select_body;
mod token_ids;
pub use select_body::{route_request, SelectBody};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Extension, Path, Query, State};
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router as HttpRouter};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::json;
use switchyard_plugin_sdk::{Placement, WorkerId};

use crate::caller::Caller;
use crate::errors::refusal;
use crate::ext_proc::{self, EndpointPicker};
use crate::frontend::{self, Frontend};
use crate::guards::BodyLimits;
use crate::listener::{ConnectionTable, Limits, Listener};
use crate::off_executor;
use crate::request_attributes;
use switchyard_config::ExtProcSettings;
use switchyard_engines::tls::ListenerTls;
use switchyard_engines::tls::ServerTls;
use switchyard_fleet::generation::Generation;
use switchyard_fleet::kv_index::KvEvent;
use switchyard_fleet::load_accounting::AccountingError;
use switchyard_fleet::router::{Refused, RouteDecision, RouteError, RouteRequest, Router};
use switchyard_fleet::workers::{WorkerError, WorkerSpec};
use switchyard_plugin_host::plugin::PartitionKey;

type Shared = State<Arc<Router>>;

mod server;
pub use server::{bind, expire_forever, serve, shutdown_signal, start_replicas, ServeOptions};

/// An error response: status and a JSON body naming what is wrong.
pub struct ApiError {
    status: StatusCode,
    body: serde_json::Value,
}

impl ApiError {
    fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            body: json!({ "error": message.into() }),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

impl From<RouteError> for ApiError {
    fn from(error: RouteError) -> Self {
        let status = match &error {
            RouteError::BadRequest(_)
            | RouteError::Partition(_)
            | RouteError::Worker(WorkerError::Invalid(_) | WorkerError::Destination { .. }) => {
                StatusCode::BAD_REQUEST
            }
            RouteError::UnknownModel(_)
            | RouteError::UnknownInstance { .. }
            | RouteError::Worker(WorkerError::Unknown(_))
            | RouteError::Accounting(
                AccountingError::UnknownRequest(_) | AccountingError::WorkerLeft(_),
            ) => StatusCode::NOT_FOUND,
            RouteError::Worker(WorkerError::AlreadyRegistered(..))
            | RouteError::Accounting(AccountingError::AlreadyReserved(_)) => StatusCode::CONFLICT,
            RouteError::NoWorker(_) | RouteError::Saturated(_) => StatusCode::SERVICE_UNAVAILABLE,
            RouteError::PolicyFailed { .. } | RouteError::Unfinished { .. } => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        let mut body = json!({ "error": error.to_string() });
        if let RouteError::PolicyFailed { instance, error } = &error {
            body["instance"] = json!(instance);
            if let Some(component) = error.component() {
                body["component"] = json!(component);
            }
        }
        ApiError { status, body }
    }
}

/// Parses a JSON body; a 400 says which field is wrong, where.
fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request(
            "the request body is empty; send a JSON object",
        ));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

/// The size of what a selection hashes: the request's token ids or block hashes.
fn input_bytes(request: &RouteRequest) -> usize {
    request.token_ids.as_ref().map_or(0, |t| t.len() * 4)
        + request.block_hashes.as_ref().map_or(0, |b| b.len() * 8)
}

/// Runs a selection on the blocking pool: plugin code never runs on the async
/// executor's threads, so a slow component cannot delay other endpoints.
async fn off_executor<T: Send + 'static>(
    router: Arc<Router>,
    select: impl FnOnce(&Router) -> Result<T, RouteError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(move || select(&router))
        .await
        .map_err(|e| ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            body: json!({ "error": format!("the selection did not finish: {e}") }),
        })?
        .map_err(ApiError::from)
}

async fn select(
    State(router): Shared,
    caller: Option<Extension<Caller>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let mut request: RouteRequest = parse::<SelectBody>(&body)?.into();
    if let Some(Extension(caller)) = &caller {
        caller
            .check_route(&request.model, request.instance.as_deref())
            .map_err(|e| ApiError {
                status: StatusCode::FORBIDDEN,
                body: json!({ "error": e.to_string(), "code": "permission_denied" }),
            })?;
    }
    let generation = router.generation();
    let settings = &generation.config().request_attributes;
    request_attributes::complete(settings, caller.as_ref().map(|c| &c.0), &mut request);
    let wait = request.wait.unwrap_or(false);
    // A dry run: no admission (no tenant's rate is charged, no admitter asked).
    decide_waiting(router, request, Placement::default(), wait, |r, q| {
        r.select(q)
    })
    .await
}

/// Selects (and, for `/v1/reserve`, books) off the executor; with `wait`, a request that
/// finds every worker busy waits its turn in the admission queue.
async fn decide_waiting(
    router: Arc<Router>,
    request: RouteRequest,
    placement: Placement,
    wait: bool,
    decide: fn(&Router, &RouteRequest) -> Result<RouteDecision, RouteError>,
) -> Result<Response, ApiError> {
    let request = Arc::new(request);
    let attempt = || {
        let (router, request) = (router.clone(), request.clone());
        async move {
            let inline = off_executor::inline_ok(
                &router,
                input_bytes(&request),
                request.instance.as_deref(),
            );
            off_executor::run(inline, move || decide(&router, &request))
                .await
                .unwrap_or_else(|e| {
                    Err(RouteError::Unfinished {
                        what: "selection",
                        why: e.to_string(),
                    })
                })
        }
    };
    let first = attempt().await;
    if !wait {
        return Ok(Json(first?).into_response());
    }
    let place = switchyard_fleet::router::Place {
        partition: PartitionKey::new(request.model.clone(), request.worker_type),
        priority: request.strict_priority,
        tenant: placement.tenant.as_deref().or(request
            .attributes
            .as_ref()
            .and_then(|a| a.tenant.as_deref())),
        max_wait: placement.max_wait_ms.map(std::time::Duration::from_millis),
    };
    match router
        .queued(
            place,
            first,
            switchyard_fleet::router::is_saturated,
            attempt,
        )
        .await
    {
        Ok(decision) => Ok(Json(decision).into_response()),
        Err(switchyard_fleet::router::Waited::Failed(error)) => Err(error.into()),
        Err(switchyard_fleet::router::Waited::Refused(refusal)) => {
            let status = match refusal {
                switchyard_fleet::admission::QueueRefusal::Full { .. }
                | switchyard_fleet::admission::QueueRefusal::Evicted => {
                    StatusCode::TOO_MANY_REQUESTS
                }
                switchyard_fleet::admission::QueueRefusal::TimedOut { .. } => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
            };
            let mut response =
                (status, Json(json!({ "error": refusal.to_string() }))).into_response();
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
            Ok(response)
        }
    }
}

async fn reserve(
    State(router): Shared,
    caller: Option<Extension<Caller>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let mut request: RouteRequest = parse::<SelectBody>(&body)?.into();
    let generation = router.generation();
    let settings = &generation.config().request_attributes;
    request_attributes::complete(settings, caller.as_ref().map(|c| &c.0), &mut request);
    let tokens = match (&request.token_ids, &request.block_hashes) {
        (Some(tokens), _) => tokens.len() as u64,
        (None, Some(blocks)) => blocks.len() as u64 * u64::from(router.block_size()),
        (None, None) => 0,
    };
    let blocks = match (&request.token_ids, &request.block_hashes) {
        (Some(tokens), _) => (tokens.len() as u64).div_ceil(u64::from(router.block_size())),
        (None, Some(blocks)) => blocks.len() as u64,
        (None, None) => 0,
    };
    // Admitters may be plugin code: off the executor.
    let inline =
        off_executor::inline_ok(&router, input_bytes(&request), request.instance.as_deref());
    let (admitting, request) = (router.clone(), Arc::new(request));
    let asked = request.clone();
    let admitted = off_executor::run(inline, move || admitting.admit(&asked, blocks, tokens)).await;
    let placement = match admitted {
        Ok(Ok(placement)) => placement,
        Ok(Err(refused)) => return Ok(refused_response(refused)),
        Err(e) => {
            return Err(RouteError::Unfinished {
                what: "admission",
                why: e.to_string(),
            }
            .into())
        }
    };
    let mut request = Arc::unwrap_or_clone(request);
    if let Some(priority) = placement.priority {
        request.strict_priority = priority;
    }
    let wait = request.wait.unwrap_or(true);
    decide_waiting(router, request, placement, wait, |r, q| {
        r.select_and_reserve(q)
    })
    .await
}

/// A request admission refused: its status, `Retry-After`, and `{"error", "code"}`.
fn refused_response(refused: Refused) -> Response {
    let (status, code, message, retry_after) = match refused {
        Refused::OverRate(over) => (
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_exceeded",
            over.to_string(),
            over.retry_after.as_secs_f64().ceil().max(1.0) as u64,
        ),
        Refused::Rejected(rejection) => (
            StatusCode::from_u16(rejection.status).unwrap_or(StatusCode::TOO_MANY_REQUESTS),
            "admission_rejected",
            rejection.message,
            u64::from(rejection.retry_after_seconds),
        ),
    };
    let mut response = (status, Json(json!({ "error": message, "code": code }))).into_response();
    if retry_after > 0 {
        response.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from(retry_after),
        );
    }
    response
}

async fn prefill_complete(
    State(router): Shared,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    router.prefill_complete(&id)?;
    Ok(Json(json!({ "request_id": id, "phase": "decode" })).into_response())
}

async fn free(State(router): Shared, Path(id): Path<String>) -> Result<Response, ApiError> {
    router.free(&id)?;
    Ok(Json(json!({ "request_id": id, "freed": true })).into_response())
}

async fn add_worker(State(router): Shared, body: Bytes) -> Result<Response, ApiError> {
    let spec: WorkerSpec = parse(&body)?;
    // A new partition builds every instance for it: plugin code, off the executor.
    let added = spec.clone();
    off_executor(router.clone(), move |r| r.add_worker(added)).await?;
    router
        .subscribe_kv_events(std::slice::from_ref(&spec))
        .map_err(|e| ApiError::bad_request(format!("kv_events: {e}")))?;
    Ok((StatusCode::CREATED, Json(spec)).into_response())
}

/// Every worker with its booked load.
async fn list_workers(State(router): Shared) -> Json<Vec<serde_json::Value>> {
    let loads: std::collections::HashMap<_, _> = router.loads().into_iter().collect();
    let mut workers = router.workers();
    workers.sort_by_key(|w| (w.worker_id, w.dp_rank));
    Json(
        workers
            .into_iter()
            .map(|w| {
                let load = loads.get(&w.id()).copied().unwrap_or_default();
                let mut value = json!(w);
                value["healthy"] = json!(router.is_healthy(w.id()));
                if let Some(reason) = router.health_error(w.id()) {
                    value["health_error"] = json!(reason);
                }
                value["load"] = json!({
                    "active_requests": load.active_requests,
                    "active_prefill_tokens": load.active_prefill_tokens,
                    "active_decode_blocks": load.active_decode_blocks,
                });
                let report = router.engine_report(w.id());
                if let Some(reading) = report.read() {
                    let s = &reading.sample;
                    value["engine"] = json!({
                        "state": if reading.fresh { "fresh" } else { "stale" },
                        "sample_age_ms": reading.age.as_millis() as u64,
                        "running_requests": s.running_requests,
                        "waiting_requests": s.waiting_requests,
                        "kv_cache_usage": Some(s.kv_cache_usage).filter(|k| k.is_finite()),
                        "running_adapters": s.running_adapters.as_deref(),
                        "waiting_adapters": s.waiting_adapters.as_deref(),
                    });
                }
                if let Some(why) = report.failure() {
                    value["engine_error"] = json!(why);
                }
                if let Some(bound) = router.kv_bound(w.id()) {
                    value["kv_index"] = json!({
                        "held_blocks": router.kv_held(w.id()),
                        "bound": bound,
                    });
                }
                value
            })
            .collect(),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DpRank {
    #[serde(default)]
    dp_rank: u32,
}

fn worker_id(text: &str) -> Result<u64, ApiError> {
    text.parse().map_err(|_| {
        ApiError::bad_request(format!("worker id must be a whole number, got `{text}`"))
    })
}

async fn remove_worker(
    State(router): Shared,
    Path(id): Path<String>,
    rank: Result<Query<DpRank>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(rank) = rank.map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))?;
    let id = WorkerId {
        worker_id: worker_id(&id)?,
        dp_rank: rank.dp_rank,
    };
    // It may wait for a reload (the membership lock) and retire a partition's policies:
    // off the executor, as adding one is.
    let spec = off_executor(router, move |r| r.remove_worker(id)).await?;
    Ok(Json(spec).into_response())
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KvEventBatch {
    pub worker_id: u64,
    #[serde(default)]
    pub dp_rank: u32,
    pub events: Vec<KvEvent>,
    /// When the publisher sent the batch (Unix seconds); feeds the KV event lag metric.
    #[serde(default)]
    pub timestamp: Option<f64>,
}

async fn kv_events(State(router): Shared, body: Bytes) -> Result<Response, ApiError> {
    let batch: KvEventBatch = parse(&body)?;
    if let Some(sent) = batch.timestamp.filter(|t| t.is_finite()) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let lag = Duration::try_from_secs_f64((now - sent).max(0.0)).unwrap_or_default();
        router.metrics.record_kv_event_lag(lag);
    }
    router.kv_events(
        WorkerId {
            worker_id: batch.worker_id,
            dp_rank: batch.dp_rank,
        },
        &batch.events,
    )?;
    Ok(Json(json!({ "applied": batch.events.len() })).into_response())
}

async fn policies(State(router): Shared) -> Json<serde_json::Value> {
    let generation = router.generation();
    let startup = &generation.startup;
    let registry = &startup.registry;
    let components: Vec<_> = registry
        .components()
        .map(|c| json!({ "name": c.name, "kind": c.kind.as_str(), "inputs": c.inputs.names(), "origin": c.origin.to_string() }))
        .collect();
    let policies: Vec<_> = registry
        .policies()
        .map(|p| json!({ "name": p.name, "origin": p.origin.to_string() }))
        .collect();
    let instances: Vec<_> = startup
        .instances
        .iter()
        .map(|i| {
            json!({
                "name": i.name,
                "pipeline": i.describe(),
                "on_error": i.on_error.as_str(),
                "worker_types": i.serves.iter().map(|&r| switchyard_policy::instances::role_word(r)).collect::<Vec<_>>(),
                "call_budget_ms": i.budget.map(|b| b.limit.as_secs_f64() * 1e3),
                "tripped": router.metrics.is_tripped(&i.name),
            })
        })
        .collect();
    let plugins: Vec<_> = registry.plugins().iter().map(|p| json!(p)).collect();
    Json(json!({
        "generation": generation_json(&generation),
        "default": startup.default_instance(),
        "defaults": switchyard_plugin_sdk::WorkerType::ALL.iter().map(|&r| (switchyard_policy::instances::role_word(r).to_owned(), json!(startup.default_for(r)))).collect::<serde_json::Map<_, _>>(),
        "instances": instances,
        "policy_types": policies,
        "component_types": components,
        "plugins": plugins,
        // `admission:` as configured (null without it), and the requests waiting now.
        "admission": startup.config().admission.as_ref().map(|a| json!({
            "busy": a.busy,
            "queue": a.queue,
            "rate_limits": a.rate_limits,
            "admitters": startup.admitters.iter().map(|u| json!({
                "type": u.component.name,
                "origin": u.component.origin.to_string(),
                "parameters": serde_json::from_str::<serde_json::Value>(u.params.json()).unwrap_or_default(),
                "on_error": u.on_error.as_str(),
            })).collect::<Vec<_>>(),
            "rejected": router.admission.queue.counters().rejected.load(std::sync::atomic::Ordering::Relaxed),
            "waiting": router.admission.queue.len(),
        })),
    }))
}

/// Which generation serves: its number, when it was loaded, from which config.
fn generation_json(generation: &Generation) -> serde_json::Value {
    let loaded_at = generation
        .loaded_at
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    json!({
        "number": generation.number,
        "loaded_at_unix": loaded_at,
        "config": generation.startup.source.name,
    })
}

/// `POST /v1/admin/reload`: 200 with what changed, or 422 with every error (the serving
/// config stays). With operator keys configured, for their holders (the credentials
/// check ran before); without, for loopback clients only, unless `router.remote_admin`.
async fn reload(
    State(router): Shared,
    caller: Option<Extension<Caller>>,
    tls: Option<Extension<ListenerTls>>,
) -> Response {
    let generation = router.generation();
    let remote = caller.is_some_and(|c| !c.loopback);
    let operator_keys = generation
        .startup
        .keyring
        .has(switchyard_config::auth::Audience::Operator);
    if remote && !operator_keys && !generation.config().router.remote_admin {
        return (
            StatusCode::FORBIDDEN,
            Json(json!({"error": "reload is answered for loopback clients only; configure operator keys (auth.operators) or set router.remote_admin: true to allow others", "code": "loopback_only"})),
        )
            .into_response();
    }
    drop(generation);
    let tls = tls.map(|t| t.0).unwrap_or_default();
    match super::reload::reload(router.clone(), &tls).await {
        Ok(outcome) => Json(json!({
            "reloaded": true,
            "generation": generation_json(&router.generation()),
            "changes": outcome,
        }))
        .into_response(),
        Err(failure) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({
                "reloaded": false,
                "errors": failure.messages(),
                "generation": generation_json(&router.generation()),
            })),
        )
            .into_response(),
    }
}

async fn metrics(State(router): Shared) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            switchyard_fleet::metrics::CONTENT_TYPE,
        )],
        router.render_metrics(),
    )
        .into_response()
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(router): Shared) -> Response {
    if router.workers().is_empty() {
        (StatusCode::SERVICE_UNAVAILABLE, "no workers registered\n").into_response()
    } else {
        "ready\n".into_response()
    }
}

async fn not_found(uri: Uri) -> Response {
    refusal(
        uri.path(),
        StatusCode::NOT_FOUND,
        "not_found",
        "no such endpoint; see docs/http-api.md".into(),
    )
}

async fn method_not_allowed(uri: Uri) -> Response {
    refusal(
        uri.path(),
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "`{}` does not take this method; see docs/http-api.md",
            uri.path()
        ),
    )
}

/// The HTTP API and the OpenAI-compatible frontend's routes, behind the credentials
/// check and the body limits.
pub fn app(router: Arc<Router>, frontend: Arc<Frontend>, body: BodyLimits) -> HttpRouter {
    routes(router.clone(), frontend)
        .method_not_allowed_fallback(method_not_allowed)
        // axum's own rejections (text) answered again as JSON.
        .layer(axum::middleware::from_fn(crate::errors::json_error_bodies))
        .layer(axum::middleware::from_fn_with_state(
            body,
            crate::guards::buffered,
        ))
        // The credentials check runs first: no body of an unauthenticated client is read.
        .layer(axum::middleware::from_fn_with_state(
            router,
            crate::guards::authorize,
        ))
        // `buffered` enforces `http.max_body_bytes`; axum's own 2 MB default would cut it.
        .layer(DefaultBodyLimit::disable())
}

fn routes(router: Arc<Router>, frontend: Arc<Frontend>) -> HttpRouter {
    HttpRouter::new()
        .route("/v1/select", post(select))
        .route("/v1/reserve", post(reserve))
        .route("/v1/requests/{id}/prefill_complete", post(prefill_complete))
        .route("/v1/requests/{id}/free", post(free))
        .route("/v1/requests/{id}", delete(free))
        .route("/v1/workers", post(add_worker).get(list_workers))
        .route("/v1/workers/{id}", delete(remove_worker))
        .route("/v1/kv_events", post(kv_events))
        .route("/v1/policies", get(policies))
        .route("/v1/admin/reload", post(reload))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(router)
        .merge(frontend::routes(frontend))
}
