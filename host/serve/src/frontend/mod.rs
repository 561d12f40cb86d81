//! The OpenAI-compatible frontend: `POST /v1/chat/completions`, `POST /v1/completions`
//! and `GET /v1/models` on `switchyard serve`. For each request it derives the prompt's
//! blocks, selects and reserves a worker through the configured instance (off the async
//! executor), forwards the body unchanged to the worker's engine, and streams the answer
//! back as it arrives, owning the booking's lifecycle (docs/frontend.md):
//!
//! - prefill complete at the first streamed byte (or at the response head when the
//!   request does not stream);
//! - free at the end of the answer, on an upstream error or timeout, and when the client
//!   goes away (dropping the body stream drops the upstream request too);
//! - a connection refused before anything was sent marks the worker unhealthy for a
//!   cool-down and selects again without it, a bounded number of times.

mod disaggregation;
pub mod gguf;
mod gguf_tokenizer;
pub mod prompt;
mod relay;
pub mod tokenizer;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router as HttpRouter};
use futures_util::StreamExt;
use serde_json::json;
use switchyard_plugin_sdk::WorkerId;

use crate::caller::Caller;
use crate::request_attributes::{self, Described};
use prompt::{Endpoint, Prompt};
pub use relay::Lease;
use relay::{relay, upstream_failure};
use switchyard_config::{Disaggregation, FrontendSettings};
pub use switchyard_engines::describe;
use switchyard_engines::upstream::{Engine, Failure, Phase};
use switchyard_engines::EngineClients;
use switchyard_fleet::metrics::UpstreamFailure;
use switchyard_fleet::router::{Refused, RouteDecision, RouteError, RouteRequest, Router};
use tokenizer::ModelTokenizer;

/// A selection and the booking it holds until the answer ends.
type Selected = (RouteDecision, Lease);
/// A parsed request and, unless its model is disaggregated, its first selection.
type Prepared = (
    Arc<Prompt>,
    Arc<Described>,
    Arc<RouteRequest>,
    Option<Result<Selected, RouteError>>,
);

/// What the request sends upstream, once a worker is selected.
pub(crate) struct Upstream {
    pub endpoint: Endpoint,
    pub prompt: Arc<Prompt>,
    pub described: Arc<Described>,
    /// What the router is asked: built once, shared by admission, every selection and
    /// retry (each books under a fresh id).
    pub route: Arc<RouteRequest>,
    pub body: Bytes,
    pub arrived: std::time::Instant,
}

/// The request header that names the instance to route with.
pub const INSTANCE_HEADER: &str = "x-switchyard-instance";

mod openai_error;
pub use openai_error::{forbidden, no_endpoint, refusal_error, refusal_response, OpenAiError};

/// Loads the tokenizer of every model that names one; each error names the config file
/// and line, then the tokenizer file and what is wrong.
pub fn load_tokenizers(
    source: &switchyard_config::ConfigSource,
) -> Result<HashMap<String, ModelTokenizer>, Vec<switchyard_config::ConfigError>> {
    let mut tokenizers = HashMap::new();
    let mut errors = Vec::new();
    for (model, settings) in &source.config.models {
        let Some(path) = &settings.tokenizer else {
            continue;
        };
        match ModelTokenizer::load(&source.resolve(path)) {
            Ok(tokenizer) => {
                tokenizers.insert(model.clone(), tokenizer);
            }
            Err(e) => {
                let value = path.to_string_lossy();
                let message = format!("model `{model}`: {e}");
                errors.push(source.error_at("tokenizer", &value, 0, message));
            }
        }
    }
    if errors.is_empty() {
        Ok(tokenizers)
    } else {
        Err(errors)
    }
}

/// The frontend's shared state.
pub struct Frontend {
    router: Arc<Router>,
    /// The pooled client, and the fresh one a request whose kept-alive connection
    /// closed before the answer is sent again with.
    clients: EngineClients,
    settings: FrontendSettings,
    /// Per model with a `tokenizer:`.
    tokenizers: HashMap<String, ModelTokenizer>,
    next_request: AtomicU64,
    /// Distinguishes this process's request ids from another router's.
    id_prefix: String,
    /// One permit per request being proxied (`frontend.max_in_flight`).
    in_flight: Arc<tokio::sync::Semaphore>,
}

/// Why the frontend (or its engine client) cannot start.
#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    #[error(transparent)]
    Client(#[from] switchyard_engines::ClientError),
    /// Every tokenizer of `models:` that does not load, one line each.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Tokenizers(Vec<switchyard_config::ConfigError>),
}

impl Frontend {
    /// The frontend over `router`; fails naming every tokenizer that does not load.
    pub fn new(router: Arc<Router>) -> Result<Arc<Self>, FrontendError> {
        let generation = router.generation();
        let source = &generation.startup.source;
        let settings = source.config.frontend.clone();
        let tokenizers = load_tokenizers(source).map_err(FrontendError::Tokenizers)?;
        let in_flight = usize::try_from(settings.max_in_flight)
            .unwrap_or(usize::MAX)
            .min(tokio::sync::Semaphore::MAX_PERMITS);
        let clients = EngineClients::new(source)?;
        Ok(Arc::new(Frontend {
            router,
            clients,
            settings,
            tokenizers,
            next_request: AtomicU64::new(0),
            id_prefix: format!("sy-{:08x}", rand::random::<u32>()),
            in_flight: Arc::new(tokio::sync::Semaphore::new(in_flight)),
        }))
    }

    pub fn router(&self) -> &Arc<Router> {
        &self.router
    }

    pub fn client(&self) -> &reqwest::Client {
        &self.clients.pooled
    }

    /// Both engine clients (the health prober uses them too).
    pub fn clients(&self) -> &EngineClients {
        &self.clients
    }

    /// The tokenizer of `model`, if its config names one.
    pub fn tokenizer(&self, model: &str) -> Option<&ModelTokenizer> {
        self.tokenizers.get(model)
    }

    pub fn settings(&self) -> &FrontendSettings {
        &self.settings
    }

    /// How `model` (a partition's) is served: by one worker, or by a prefill and a decode
    /// worker in vLLM's or SGLang's flow.
    pub fn disaggregation(&self, model: &str) -> Disaggregation {
        let generation = self.router.generation();
        let models = &generation.config().models;
        models
            .get(model)
            .map_or(Disaggregation::Off, |m| m.disaggregation)
    }

    /// Routes one request: select and reserve, forward, stream back.
    async fn proxy(
        self: Arc<Self>,
        endpoint: Endpoint,
        caller: Option<Caller>,
        headers: HeaderMap,
        body: Bytes,
    ) -> Response {
        let arrived = std::time::Instant::now();
        let Ok(slot) = self.in_flight.clone().try_acquire_owned() else {
            self.router.metrics.record_shed();
            let mut error = OpenAiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_exceeded",
                format!(
                    "the router is proxying {} requests already (frontend.max_in_flight); retry later",
                    self.settings.max_in_flight
                ),
            );
            error.code = Some("rate_limit_exceeded");
            return error.into_response();
        };
        let instance = match headers.get(INSTANCE_HEADER).map(HeaderValue::to_str) {
            None => None,
            Some(Ok(name)) => Some(name.to_owned()),
            Some(Err(_)) => {
                return OpenAiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    format!("the `{INSTANCE_HEADER}` header must be ASCII text"),
                )
                .into_response()
            }
        };
        let prepared = self
            .prepare(endpoint, caller, &headers, body.clone(), instance)
            .await;
        let (prompt, described, route, first) = match prepared {
            Ok(prepared) => prepared,
            Err(error) => return error.into_response(),
        };
        let request = Upstream {
            endpoint,
            prompt,
            described,
            route,
            body,
            arrived,
        };
        let Some(first) = first else {
            // A disaggregated model's pair is selected on its own path.
            let mode = self.disaggregation(&request.described.partition_model);
            let engine_request_id = self.next_request_id();
            let pair = disaggregation::Pair {
                request,
                engine_request_id,
            };
            return self.serve_pair(mode, pair, slot).await;
        };
        let selected = match self
            .wait_turn(
                &request.route,
                &request.described,
                request.body.len(),
                first,
            )
            .await
        {
            Ok(selected) => selected,
            Err(response) => return response,
        };
        self.forward(request, selected, slot).await
    }

    /// Parses the request and runs its first selection (unless its model is
    /// disaggregated), in one trip to the blocking pool.
    async fn prepare(
        self: &Arc<Self>,
        endpoint: Endpoint,
        caller: Option<Caller>,
        headers: &HeaderMap,
        parsing: Bytes,
        first: Option<String>,
    ) -> Result<Prepared, OpenAiError> {
        // Parsing (tokenizing a long prompt is CPU work) and the first selection (plugin
        // code) run in one trip to the blocking pool, or inline (`off_executor`).
        let frontend = self.clone();
        let generation = self.router.generation();
        let settings = &generation.config().request_attributes;
        let kept = match request_attributes::kept_headers(settings, |name| {
            headers.get(name).map(HeaderValue::as_bytes)
        }) {
            Ok(kept) => kept,
            Err(error) => return Err(OpenAiError::from(error)),
        };
        drop(generation);
        let inline = self.inline_ok(parsing.len(), first.as_deref());
        self.off_executor(inline, move || {
            let prompt = prompt::parse(endpoint, &parsing, frontend.router.block_size(), |model| {
                frontend.tokenizers.get(model)
            })
            .map_err(OpenAiError::from)?;
            if let Some(caller) = &caller {
                caller
                    .check_route(&prompt.model, first.as_deref())
                    .map_err(forbidden)?;
            }
            let request_id = frontend.next_request_id();
            let described = request_attributes::describe(
                &frontend.router.generation().config().request_attributes,
                kept,
                caller.as_ref(),
                &prompt.model,
                prompt.user.as_deref(),
                &request_id,
            )?;
            // From here on the prompt's model is the partition's (an adapter's base).
            let mut prompt = prompt;
            prompt.model.clone_from(&described.partition_model);
            let mut described = described;
            let mut route = frontend.route_request(&prompt, &described, first);
            let placement = frontend.router.admit(
                &route,
                prompt.block_hashes.len() as u64,
                prompt.tokens.len() as u64,
            )?;
            described.admitted(placement);
            route.strict_priority = described.priority;
            let (prompt, described, route) =
                (Arc::new(prompt), Arc::new(described), Arc::new(route));
            // A disaggregated model's pair is selected on its own path.
            let mode = frontend.disaggregation(&described.partition_model);
            let selected =
                (mode == Disaggregation::Off).then(|| frontend.select_now(&route, request_id));
            Ok((prompt, described, route, selected))
        })
        .await
    }

    /// Waits in the admission queue while every worker is busy (`admission:`); each retry
    /// selects where `off_executor` says for the request's `input_bytes`.
    async fn wait_turn(
        self: &Arc<Self>,
        route: &Arc<RouteRequest>,
        described: &Described,
        input_bytes: usize,
        first: Result<Selected, RouteError>,
    ) -> Result<Selected, Response> {
        let place = described.place(switchyard_plugin_host::plugin::PartitionKey::new(
            route.model.clone(),
            switchyard_plugin_sdk::WorkerType::Select,
        ));
        let retry = || {
            let (frontend, route) = (self.clone(), route.clone());
            async move {
                let inline = frontend.inline_ok(input_bytes, route.instance.as_deref());
                let selected = crate::off_executor::run(inline, move || {
                    let request_id = frontend.next_request_id();
                    frontend.select_now(&route, request_id)
                })
                .await;
                selected.unwrap_or_else(|e| {
                    Err(RouteError::Unfinished {
                        what: "request's selection",
                        why: e.to_string(),
                    })
                })
            }
        };
        let waited = self
            .router
            .queued(place, first, switchyard_fleet::router::is_saturated, retry)
            .await;
        match waited {
            Ok(selected) => Ok(selected),
            Err(switchyard_fleet::router::Waited::Refused(refusal)) => {
                self.router.metrics.record_shed();
                Err(refusal_response(&refusal))
            }
            Err(switchyard_fleet::router::Waited::Failed(error)) => {
                Err(OpenAiError::from(error).into_response())
            }
        }
    }

    /// Sends the request to the selected worker. A connection that closed before the
    /// answer's head (a kept-alive one the engine closed as idle) sends it again on a
    /// fresh connection; an engine that refuses the connection, or closes a fresh one, is
    /// marked unhealthy and another is selected (`connect_retries`). Each failure is
    /// logged once and counted by kind.
    async fn forward(
        self: &Arc<Self>,
        request: Upstream,
        mut selected: Selected,
        slot: tokio::sync::OwnedSemaphorePermit,
    ) -> Response {
        let Upstream {
            endpoint,
            prompt,
            described: _,
            route,
            body,
            arrived,
        } = request;
        let mut excluded_attempts = 0;
        let mut fresh = false;
        loop {
            let (decision, mut lease) = selected;
            let worker = WorkerId {
                worker_id: decision.worker_id,
                dp_rank: decision.dp_rank,
            };
            let Some(url) = self.router.worker_url(worker) else {
                let removed = self.router.worker_spec(worker).is_none();
                if !removed || excluded_attempts >= self.settings.connect_retries.max(1) {
                    return no_url(worker, &prompt.model);
                }
                // Removed since it was selected (`DELETE /v1/workers`, a pod that left):
                // the request never reached it, so another is selected.
                drop(lease);
                excluded_attempts += 1;
                selected = match self.select_again(&route, body.len()).await {
                    Ok(selected) => selected,
                    Err(error) => return error.into_response(),
                };
                continue;
            };
            let target = format!("{}{}", url.trim_end_matches('/'), endpoint.path());
            let upstream = self.send(fresh, target, body.clone()).await;
            let engine = Engine { worker, url };
            let error = match upstream {
                Ok(response) => {
                    lease.hold(slot);
                    return self
                        .respond(&prompt, decision, lease, response, (arrived, engine))
                        .await;
                }
                Err(error) => error,
            };
            let failure = Failure {
                engine: &engine,
                phase: Phase::Send,
                error: &error,
            };
            if !fresh && failure.kind() == UpstreamFailure::Closed {
                failure.record(
                    &self.router,
                    lease.request_id(),
                    "the engine never answered: sending the request again on a fresh connection",
                );
                self.router.metrics.record_upstream_retry();
                fresh = true;
                selected = (decision, lease);
                continue;
            }
            let request_id = lease.request_id().to_owned();
            drop(lease);
            if let Some(answer) = self.exclude(&failure, &request_id, excluded_attempts) {
                return answer;
            }
            excluded_attempts += 1;
            fresh = false;
            selected = match self.select_again(&route, body.len()).await {
                Ok(selected) => selected,
                Err(error) => return error.into_response(),
            };
        }
    }

    /// Sends `body` to `target` on a pooled connection, or on one of its own (`fresh`).
    async fn send(
        &self,
        fresh: bool,
        target: String,
        body: Bytes,
    ) -> reqwest::Result<reqwest::Response> {
        let client = if fresh {
            &self.clients.fresh
        } else {
            &self.clients.pooled
        };
        client
            .post(target)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .timeout(Duration::from_secs(self.settings.request_timeout_secs))
            .body(body)
            .send()
            .await
    }

    /// After a failure before the answer's head: the worker is marked unhealthy and
    /// `None` (select again) when the engine never got the request (refused, or a fresh
    /// connection closed) and `connect_retries` allows another; else the error answer.
    fn exclude(&self, failure: &Failure<'_>, request_id: &str, attempts: u32) -> Option<Response> {
        let unreachable = matches!(
            failure.kind(),
            UpstreamFailure::Refused | UpstreamFailure::ConnectTimeout | UpstreamFailure::Closed
        );
        if !unreachable || attempts >= self.settings.connect_retries {
            return Some(self.upstream_failed(failure, request_id));
        }
        failure.record(
            &self.router,
            request_id,
            "marked unhealthy, selecting again",
        );
        self.router.mark_unhealthy(
            failure.engine.worker,
            Duration::from_millis(self.settings.unhealthy_cooldown_ms),
        );
        self.router.metrics.record_upstream_retry();
        None
    }

    /// A new selection for a request whose worker failed (it is out of the candidates
    /// now, marked unhealthy).
    async fn select_again(
        self: &Arc<Self>,
        route: &Arc<RouteRequest>,
        input_bytes: usize,
    ) -> Result<Selected, OpenAiError> {
        let (frontend, route) = (self.clone(), route.clone());
        self.off_executor(
            self.inline_ok(input_bytes, route.instance.as_deref()),
            move || {
                let request_id = frontend.next_request_id();
                frontend
                    .select_now(&route, request_id)
                    .map_err(OpenAiError::from)
            },
        )
        .await
    }

    /// The answer when the engine could not be reached or failed before its answer's
    /// head, retries spent (logged and counted here).
    fn upstream_failed(&self, failure: &Failure<'_>, request_id: &str) -> Response {
        let (status, what) = match failure.kind() {
            UpstreamFailure::Refused | UpstreamFailure::ConnectTimeout => {
                self.router.mark_unhealthy(
                    failure.engine.worker,
                    Duration::from_millis(self.settings.unhealthy_cooldown_ms),
                );
                (StatusCode::BAD_GATEWAY, "could not connect to")
            }
            UpstreamFailure::Timeout => (StatusCode::GATEWAY_TIMEOUT, "timed out waiting for"),
            _ => (StatusCode::BAD_GATEWAY, "failed talking to"),
        };
        failure.record(
            &self.router,
            request_id,
            &format!("answered {}", status.as_u16()),
        );
        self.router.metrics.record_upstream_error();
        OpenAiError::new(
            status,
            "server_error",
            format!(
                "switchyard {what} worker {} ({}): {}",
                failure.engine.worker.worker_id,
                failure.engine.url,
                describe(failure.error)
            ),
        )
        .into_response()
    }

    /// Whether work over `input_bytes` of a request for policy `instance` may run on the
    /// executor's thread (`off_executor::run`): only the router's own code, no
    /// tokenizer, a small input.
    pub fn inline_ok(&self, input_bytes: usize, instance: Option<&str>) -> bool {
        self.tokenizers.is_empty()
            && crate::off_executor::inline_ok(&self.router, input_bytes, instance)
    }

    /// Runs `work` inline when `inline` (`inline_ok`: only the router's own code over a
    /// small input), else on the blocking pool (plugin code never runs on the async
    /// executor's threads). If the client goes away while it runs on the pool, what
    /// `work` returns is dropped when it finishes, so a lease it made frees its booking.
    async fn off_executor<T: Send + 'static>(
        &self,
        inline: bool,
        work: impl FnOnce() -> Result<T, OpenAiError> + Send + 'static,
    ) -> Result<T, OpenAiError> {
        crate::off_executor::run(inline, work)
            .await
            .unwrap_or_else(|e| {
                Err(OpenAiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    format!("the request's preparation did not finish: {e}"),
                ))
            })
    }

    /// Selects and reserves a worker for `route`, booked as `request_id` (blocking:
    /// plugin code runs here). The lease is made here too, so the booking is never
    /// without an owner.
    pub fn select_now(
        &self,
        route: &RouteRequest,
        request_id: String,
    ) -> Result<(RouteDecision, Lease), RouteError> {
        let decision = self.router.reserve_as(route, &request_id)?;
        Ok((decision, Lease::new(self.router.clone(), request_id)))
    }

    /// What the router is asked for this request: made once per request and shared by
    /// its admission and every selection (each books under its own id).
    pub fn route_request(
        &self,
        prompt: &Prompt,
        described: &Described,
        instance: Option<String>,
    ) -> RouteRequest {
        let session = described.session.clone().map(|session_id| {
            switchyard_plugin_host::plugin::SessionInfo {
                session_id,
                ..Default::default()
            }
        });
        RouteRequest {
            model: described.partition_model.clone(),
            strict_priority: described.priority,
            session,
            attributes: Some(described.attributes.clone()),
            instance,
            block_hashes: Some(prompt.block_hashes.clone()),
            expected_output_tokens: prompt.expected_output_tokens,
            // (`Default` leaves it off; serde's default, and engines, have it on.)
            tracks_prefill_tokens: true,
            ..Default::default()
        }
    }

    /// A fresh booking id: unique in this router's run (the prefix is per run).
    fn next_request_id(&self) -> String {
        format!(
            "{}-{}",
            self.id_prefix,
            self.next_request.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// The client's response: the engine's status, body and content type, the decision in
    /// `x-switchyard-*` headers, and the lease riding along the body stream.
    /// The engine's answer, relayed. Its first body chunk is awaited before any byte goes
    /// to the client: an engine that fails before it (closes after its headers, times
    /// out) gets a JSON error with 502 or 504, not a broken or mixed body. After it, an
    /// error ends a `text/event-stream` with an SSE error event, and any other body by
    /// cutting the connection (nothing can be appended honestly to half a JSON answer).
    async fn respond(
        &self,
        prompt: &Prompt,
        decision: RouteDecision,
        mut lease: Lease,
        upstream: reqwest::Response,
        (arrived, engine): (std::time::Instant, Engine),
    ) -> Response {
        let status = upstream.status();
        let worker = engine.worker;
        if status.is_success() {
            self.router
                .predict_cached(&prompt.model, worker, &prompt.block_hashes);
            if !prompt.stream {
                lease.prefill_complete();
            }
        }
        let mut headers = HeaderMap::new();
        if let Some(content_type) = upstream.headers().get(reqwest::header::CONTENT_TYPE) {
            if let Ok(value) = HeaderValue::from_bytes(content_type.as_bytes()) {
                headers.insert(axum::http::header::CONTENT_TYPE, value);
            }
        }
        let decision_headers = [
            ("x-switchyard-worker", decision.worker_id.to_string()),
            ("x-switchyard-dp-rank", decision.dp_rank.to_string()),
            ("x-switchyard-instance", decision.instance.clone()),
            (
                "x-switchyard-overlap-blocks",
                decision.device_overlap_blocks.to_string(),
            ),
            ("x-switchyard-fallback", decision.fallback.to_string()),
        ];
        for (name, value) in decision_headers {
            if let Ok(value) = HeaderValue::from_str(&value) {
                headers.insert(HeaderName::from_static(name), value);
            }
        }
        let sse = status.is_success()
            && headers
                .get(axum::http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
        let mut chunks = Box::pin(upstream.bytes_stream());
        let first = match chunks.next().await {
            Some(Err(error)) => {
                lease.free();
                self.router.metrics.record_upstream_error();
                let (status, message) =
                    upstream_failure(&error, self.settings.request_timeout_secs);
                let failure = Failure {
                    engine: &engine,
                    phase: Phase::Answer,
                    error: &error,
                };
                failure.record(
                    &self.router,
                    lease.request_id(),
                    &format!(
                        "failed before the answer's first byte; answered {}",
                        status.as_u16()
                    ),
                );
                return OpenAiError::new(
                    status,
                    "server_error",
                    format!("worker {}: {message}", worker.worker_id),
                )
                .into_response();
            }
            first => first,
        };
        let body = Body::from_stream(relay(
            futures_util::stream::iter(first).chain(chunks),
            lease,
            sse,
            &self.router,
            (arrived, engine),
            self.settings.request_timeout_secs,
        ));
        let status = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
        (status, headers, body).into_response()
    }
}

async fn chat_completions(
    State(frontend): State<Arc<Frontend>>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let caller = caller.map(|c| c.0);
    frontend
        .proxy(Endpoint::ChatCompletions, caller, headers, body)
        .await
}

async fn completions(
    State(frontend): State<Arc<Frontend>>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let caller = caller.map(|c| c.0);
    frontend
        .proxy(Endpoint::Completions, caller, headers, body)
        .await
}

/// The models workers serve, in OpenAI's list shape.
async fn models(State(frontend): State<Arc<Frontend>>) -> Json<serde_json::Value> {
    let data: Vec<_> = frontend
        .router
        .models()
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "switchyard"}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// The answer for a worker without an engine address (configured without `url`).
fn no_url(worker: WorkerId, model: &str) -> Response {
    let message = format!("worker {} (dp_rank {}) has no `url`: give every worker of model `{model}` the address of its engine", worker.worker_id, worker.dp_rank);
    OpenAiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message).into_response()
}

/// The paths of the OpenAI routes (their errors take OpenAI's shape).
pub const OPENAI_PATHS: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/v1/models"];

pub fn is_openai_path(path: &str) -> bool {
    OPENAI_PATHS.contains(&path)
}

/// The frontend's routes, to merge into the HTTP service.
pub fn routes(frontend: Arc<Frontend>) -> HttpRouter {
    HttpRouter::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .with_state(frontend)
}
