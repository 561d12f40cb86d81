//! The endpoint picker for Envoy gateways: `envoy.service.ext_proc.v3.ExternalProcessor`
//! as the Gateway API Inference Extension's endpoint-picker protocol uses it, so that an
//! Envoy (or a Kubernetes Gateway with an InferencePool) proxies and switchyard decides.
//!
//! One gRPC stream per HTTP request, in Envoy's `FULL_DUPLEX_STREAMED` body mode:
//!
//! 1. request headers: remembered (path, `x-switchyard-instance`); the answer is held,
//!    because Envoy picks the upstream host when that answer arrives and the pick needs the
//!    body. A request without a body gets any eligible endpoint at once.
//! 2. request body chunks: gathered; at `end_of_stream` the OpenAI body is parsed exactly as
//!    the frontend parses it (same tokenizers, same block hashes), the instance selects and
//!    books a worker off the executor, and the held headers answer goes out with the pick
//!    (header and `envoy.lb` metadata), then the body unchanged.
//! 3. response headers: if the gateway says another endpoint served (its retries), the
//!    booking moves there.
//! 4. response body chunks: passed back as they come; the first completes prefill, the
//!    last frees. A stream that ends or is reset early frees too (the booking's lease is
//!    dropped with the stream).
//!
//! Candidates are the request model's workers that have an endpoint (`address`, or a
//! `url` with an IP host), narrowed to the gateway's subset hint when it sends one.
//! Errors are immediate responses with an OpenAI-style JSON body: 400 for a body that is
//! not a request, 404 for an unknown model, 413 for a body over `max_body_bytes`, 503
//! when no endpoint is eligible, 429 when every eligible worker is at
//! `max_requests_per_worker` (load shedding), 500 when the policy failed and `on_error`
//! says so.

mod booked;
mod decide;
pub mod embedded;
pub mod messages;
mod selection;

use crate::frontend::no_endpoint;
use booked::Booked;
use decide::{eligible, selected, Attempt, BusyPlace, Wanted};
use selection::TestSelection;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request::Request, HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use futures_util::Stream;
use switchyard_plugin_sdk::WorkerId;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Status, Streaming};

use super::frontend::prompt::Endpoint;
use super::frontend::{Frontend, OpenAiError, INSTANCE_HEADER};
use crate::caller::Caller;
use crate::guards;
use crate::listener::Listener;
use crate::request_attributes;
use switchyard_config::auth::Audience;
use switchyard_config::ExtProcSettings;

/// The gRPC service name Envoy calls (and the health service reports).
pub const SERVICE_NAME: &str = "envoy.service.ext_proc.v3.ExternalProcessor";

/// The services gRPC health answers for: the endpoint-picker protocol's three, GIE's
/// conformance pickers' `inference-extension` (its manifests' probes ask for it), and
/// the server as a whole.
const HEALTH_SERVICES: [&str; 5] = [
    "liveness",
    "readiness",
    SERVICE_NAME,
    "inference-extension",
    "",
];

/// The endpoint picker over the frontend's router and tokenizers.
pub struct EndpointPicker {
    frontend: Arc<Frontend>,
    max_body_bytes: usize,
    max_requests_per_worker: Option<u64>,
    fallback_endpoints: u8,
    next_request: AtomicU64,
    id_prefix: String,
    limits: StreamLimits,
    /// Request body bytes every stream holds together, at most `max_buffered_bytes`.
    buffered: std::sync::atomic::AtomicUsize,
    max_buffered_bytes: usize,
    /// `ext_proc.test_endpoint_selection`: GIE's conformance header is read.
    test_endpoint_selection: bool,
}

impl EndpointPicker {
    /// Takes `n` bytes of the body budget; false (nothing taken) if they would pass it.
    fn take_buffer(&self, n: usize) -> bool {
        use std::sync::atomic::Ordering;
        self.buffered
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n)
                    .filter(|&total| total <= self.max_buffered_bytes)
            })
            .is_ok()
    }

    fn give_buffer(&self, n: usize) {
        self.buffered
            .fetch_sub(n, std::sync::atomic::Ordering::AcqRel);
    }
}

/// What one connection and one stream may hold (`ext_proc:` settings).
#[derive(Clone, Copy)]
struct StreamLimits {
    streams_per_connection: u32,
    request_headers_timeout: Duration,
    max_message_bytes: usize,
    max_header_bytes: usize,
}

impl EndpointPicker {
    pub fn new(frontend: Arc<Frontend>, settings: &ExtProcSettings) -> Self {
        EndpointPicker {
            frontend,
            max_body_bytes: settings.max_body_bytes,
            max_requests_per_worker: settings.max_requests_per_worker,
            fallback_endpoints: settings.fallback_endpoints,
            next_request: AtomicU64::new(0),
            id_prefix: format!("epp-{:08x}", rand::random::<u32>()),
            limits: StreamLimits {
                streams_per_connection: settings.max_streams_per_connection,
                request_headers_timeout: Duration::from_millis(settings.request_headers_timeout_ms),
                max_message_bytes: settings.max_message_bytes,
                max_header_bytes: settings.max_header_bytes,
            },
            buffered: std::sync::atomic::AtomicUsize::new(0),
            max_buffered_bytes: settings.max_buffered_bytes,
            test_endpoint_selection: settings.test_endpoint_selection,
        }
    }
}

/// Serves the endpoint picker and gRPC health (`liveness`, `readiness` and the picker's
/// own service name) on `listener` until the process ends.
///
/// When `drain` completes, health turns `NOT_SERVING` (so the gateway sends new streams
/// elsewhere), the listener stops accepting, and the streams in flight finish.
pub async fn serve(
    picker: EndpointPicker,
    listener: Listener,
    drain: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    let address = listener.local_addr()?;
    let (health, health_service) = tonic_health::server::health_reporter();
    for service in HEALTH_SERVICES {
        health
            .set_service_status(service, tonic_health::ServingStatus::Serving)
            .await;
    }
    let scheme = if listener.has_tls() { "grpcs" } else { "grpc" };
    println!("switchyard ext_proc (Envoy endpoint picker) listening on {scheme}://{address}");
    let mut stop = drain.clone();
    let draining = async move {
        let _ = stop.wait_for(|d| *d).await;
        for service in HEALTH_SERVICES {
            health
                .set_service_status(service, tonic_health::ServingStatus::NotServing)
                .await;
        }
        tracing::info!("ext_proc: draining; health is NOT_SERVING, streams in flight finish");
    };
    // Connections come admitted (limits) and shaken hands with (TLS) by the listener.
    let (connections, incoming) = mpsc::unbounded_channel();
    tokio::spawn(listener.run(drain, move |connection| {
        let _ = connections.send(Ok::<_, std::io::Error>(connection));
    }));
    let limits = picker.limits;
    // A message's length prefix is checked against the limit before its bytes are read.
    let service = ExternalProcessorServer::new(Service(Arc::new(picker)))
        .max_decoding_message_size(limits.max_message_bytes);
    tonic::transport::Server::builder()
        .max_concurrent_streams(limits.streams_per_connection)
        // A connection silent this long is pinged and closed if the ping is not answered
        // as long again: a client stopped inside a header block cannot answer (nothing
        // but its CONTINUATION may come next), nor can a peer that is gone.
        .http2_keepalive_interval(Some(limits.request_headers_timeout))
        .http2_keepalive_timeout(Some(limits.request_headers_timeout))
        .add_service(health_service)
        .add_service(service)
        .serve_with_incoming_shutdown(UnboundedReceiverStream::new(incoming), draining)
        .await
        .map_err(std::io::Error::other)
}

/// The gRPC service: one `Exchange` task per stream.
struct Service(Arc<EndpointPicker>);

#[tonic::async_trait]
impl ExternalProcessor for Service {
    type ProcessStream = Responses;

    async fn process(
        &self,
        request: tonic::Request<Streaming<ProcessingRequest>>,
    ) -> Result<tonic::Response<Self::ProcessStream>, Status> {
        // Envoy sends a client key as `authorization: Bearer KEY` metadata
        // (`grpc_service.initial_metadata`), when client keys are configured.
        let keyring = self
            .0
            .frontend
            .router()
            .generation()
            .startup
            .keyring
            .clone();
        let token = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        let grant = guards::check(&keyring, Audience::Client, token).map_err(|denied| {
            let message = format!("{denied}; Envoy sends it with grpc_service.initial_metadata");
            match denied.status() {
                axum::http::StatusCode::FORBIDDEN => Status::permission_denied(message),
                _ => Status::unauthenticated(message),
            }
        })?;
        let exchange = Exchange {
            headers_due: Some(Instant::now() + self.0.limits.request_headers_timeout),
            caller: Caller::behind_gateway(grant, keyring.choose_instance),
            picker: self.0.clone(),
            outbox: VecDeque::new(),
            endpoint: Endpoint::ChatCompletions,
            instance: None,
            kept_headers: Vec::new(),
            subset: None,
            selection: None,
            body: Vec::new(),
            body_held: 0,
            booked: None,
            response_status: None,
            response_body: true,
        };
        Ok(tonic::Response::new(
            exchange.responses(request.into_inner()),
        ))
    }
}

/// One HTTP request's stream.
struct Exchange {
    /// Until the request headers arrive: when the stream is given up on without them.
    headers_due: Option<Instant>,
    /// Who the gateway's key says sent the stream (its clients are never loopback).
    caller: Caller,
    picker: Arc<EndpointPicker>,
    /// Answers not yet handed to the gateway, in order.
    outbox: VecDeque<Result<ProcessingResponse, Status>>,
    endpoint: Endpoint,
    instance: Option<String>,
    /// The request headers routing keeps (`request_attributes`), read with the headers.
    kept_headers: Vec<(String, String)>,
    /// The gateway's subset hint, once a message carried it.
    subset: Option<Vec<String>>,
    /// The request's `test-epp-endpoint-selection`, when the picker takes it.
    selection: Option<TestSelection>,
    body: Vec<u8>,
    /// What `body` holds of the picker's body budget, given back when it is let go.
    body_held: usize,
    booked: Option<Booked>,
    /// The response's `:status`, once its headers passed.
    response_status: Option<u16>,
    /// Whether Envoy sends the response body (`response_body_mode` is not `NONE`, the
    /// lean response path of docs/envoy.md): if not, the response headers are all the
    /// picker sees of the answer.
    response_body: bool,
}

/// The start of the body of the 503 Envoy's router answers itself when the upstream
/// connection fails or is reset before response headers (`UF`, `UR` in its access log).
const ENVOY_UPSTREAM_FAILURE: &[u8] = b"upstream connect error or disconnect/reset before headers";

/// How a message was handled: go on, or the stream is over for the picker.
enum Next {
    Continue,
    Done,
}

/// The answers of one stream, as the gateway reads them.
type Responses = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

impl Exchange {
    /// The answers to `inbound`, worked out as the gRPC stream polls for them: no task
    /// and no channel between the stream and the exchange, so a message costs no extra
    /// hand-off between threads. Whatever was booked is freed when the stream ends or
    /// Envoy resets it (dropping the exchange drops its lease).
    fn responses(self, inbound: Streaming<ProcessingRequest>) -> Responses {
        let state = (self, inbound, false);
        Box::pin(futures_util::stream::unfold(
            state,
            |(mut exchange, mut inbound, mut over)| async move {
                loop {
                    if let Some(response) = exchange.outbox.pop_front() {
                        return Some((response, (exchange, inbound, over)));
                    }
                    if over {
                        return None;
                    }
                    over = matches!(exchange.next_message(&mut inbound).await, Next::Done);
                }
            },
        ))
    }

    /// Reads and handles the stream's next message; `Done` when the stream is over.
    async fn next_message(&mut self, inbound: &mut Streaming<ProcessingRequest>) -> Next {
        let received = match self.headers_due {
            Some(due) => tokio::time::timeout_at(due.into(), inbound.message()).await,
            None => Ok(inbound.message().await),
        };
        let message = match received {
            Ok(Ok(Some(message))) => message,
            // Envoy half-closed, or reset the stream: whatever was booked is freed
            // when the exchange drops.
            Ok(Ok(None)) => return Next::Done,
            Ok(Err(status)) => return self.unreadable(status),
            Err(_) => {
                self.outbox.push_back(Err(Status::deadline_exceeded(format!(
                    "no request headers within {} ms of the stream's start (ext_proc.request_headers_timeout_ms)",
                    self.picker.limits.request_headers_timeout.as_millis()
                ))));
                return Next::Done;
            }
        };
        if let Some(config) = &message.protocol_config {
            if config.request_body_mode != BodySendMode::FullDuplexStreamed as i32 {
                self.outbox.push_back(Err(Status::failed_precondition(format!(
                    "switchyard's endpoint picker needs the request body before it answers the request headers: set the ext_proc filter's processing_mode.request_body_mode to FULL_DUPLEX_STREAMED (got {})",
                    BodySendMode::try_from(config.request_body_mode).map_or("an unknown mode".to_owned(), |m| m.as_str_name().to_owned())
                ))));
                return Next::Done;
            }
            self.response_body = config.response_body_mode != BodySendMode::None as i32;
        }
        if let Some(subset) = messages::subset(message.metadata_context.as_ref()) {
            self.subset = Some(subset);
        }
        match message.request {
            Some(Request::RequestHeaders(headers)) => {
                self.headers_due = None;
                self.request_headers(&headers).await
            }
            Some(Request::RequestBody(body)) => self.request_body(body).await,
            Some(Request::RequestTrailers(_)) => self.send(vec![messages::trailers(true)]),
            Some(Request::ResponseHeaders(headers)) => {
                self.response_status = messages::header(&headers, ":status")
                    .and_then(|s| std::str::from_utf8(s).ok()?.parse().ok());
                let served = messages::served(message.metadata_context.as_ref()).or_else(|| {
                    let header = messages::header(&headers, messages::SERVED_KEY)?;
                    Some(String::from_utf8_lossy(header).into_owned())
                });
                self.rebook_if_served_elsewhere(served);
                if !self.response_body {
                    self.answering();
                }
                // GIE's conformance suite reads who served from the response.
                let report = self
                    .picker
                    .test_endpoint_selection
                    .then(|| selection::served_report(message.metadata_context.as_ref()));
                self.send(vec![messages::response_headers_with(
                    report.as_deref().map(|r| (selection::SERVED_REPORT, r)),
                )])
            }
            Some(Request::ResponseBody(body)) => self.response_body(body).await,
            Some(Request::ResponseTrailers(_)) => {
                self.booked = None;
                self.send(vec![messages::trailers(false)])
            }
            None => Next::Continue,
        }
    }

    /// A message that could not be read ends the stream with a status saying why (never
    /// `OK`): too large, or not a `ProcessingRequest`. A stream the gateway reset or
    /// cancelled just ends.
    fn unreadable(&mut self, status: Status) -> Next {
        use tonic::Code;
        tracing::debug!(%status, "ext_proc: a message could not be read; the stream ends");
        let answer = match status.code() {
            Code::Cancelled => return Next::Done,
            Code::OutOfRange | Code::ResourceExhausted => Status::resource_exhausted(format!(
                "{}; the endpoint picker takes messages of at most {} bytes (ext_proc.max_message_bytes)",
                status.message(),
                self.picker.limits.max_message_bytes
            )),
            _ => Status::invalid_argument(format!(
                "not a ProcessingRequest stream: {}",
                status.message()
            )),
        };
        self.outbox.push_back(Err(answer));
        Next::Done
    }

    /// Queues `responses` for the gateway.
    fn send(&mut self, responses: Vec<ProcessingResponse>) -> Next {
        self.outbox.extend(responses.into_iter().map(Ok));
        Next::Continue
    }

    /// Answers the request itself (Envoy sends it to the client); the stream is over.
    fn refuse(&mut self, error: OpenAiError) -> Next {
        self.picker
            .frontend
            .router()
            .metrics
            .record_ext_proc_refusal();
        self.outbox.push_back(Ok(messages::immediate(
            error.status().as_u16(),
            &error.body(),
            error.retry_after(),
        )));
        Next::Done
    }

    async fn request_headers(&mut self, headers: &HttpHeaders) -> Next {
        let size = messages::headers_size(headers);
        if size > self.picker.limits.max_header_bytes {
            return self.refuse(OpenAiError::new(
                axum::http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "invalid_request_error",
                format!(
                    "the request headers have {size} bytes, over the endpoint picker's limit of {} (ext_proc.max_header_bytes)",
                    self.picker.limits.max_header_bytes
                ),
            ));
        }
        if let Some(path) = messages::header(headers, ":path") {
            let path = String::from_utf8_lossy(path);
            if path.split('?').next() == Some(Endpoint::Completions.path()) {
                self.endpoint = Endpoint::Completions;
            }
        }
        self.instance = messages::header(headers, INSTANCE_HEADER)
            .map(|v| String::from_utf8_lossy(v).into_owned());
        if self.picker.test_endpoint_selection {
            self.selection = messages::header(headers, selection::HEADER)
                .and_then(|v| TestSelection::parse(&String::from_utf8_lossy(v)));
        }
        let generation = self.picker.frontend.router().generation();
        let kept =
            request_attributes::kept_headers(&generation.config().request_attributes, |name| {
                messages::header(headers, name)
            });
        drop(generation);
        self.kept_headers = match kept {
            Ok(kept) => kept,
            Err(error) => return self.refuse(error.into()),
        };
        if !headers.end_of_stream {
            return Next::Continue; // the answer waits for the body
        }
        // No body (GET /v1/models and the like): any eligible endpoint, nothing booked.
        let eligible = match selected(self.eligible(), self.selection.as_ref()) {
            Ok(eligible) if !eligible.is_empty() => eligible,
            Ok(_) => {
                return self.refuse(no_endpoint(
                    "the gateway's subset names no endpoint switchyard knows",
                ))
            }
            Err(error) => return self.refuse(error),
        };
        let endpoint = eligible[rand::random::<u32>() as usize % eligible.len()].1;
        self.send(vec![messages::pick(&endpoint.to_string(), None)])
    }

    /// Endpoints that may take a request: every worker's, within the subset hint when
    /// there is one.
    fn eligible(&self) -> Vec<(WorkerId, SocketAddr)> {
        eligible(self.picker.frontend.router(), self.subset.as_deref())
    }

    async fn request_body(&mut self, body: HttpBody) -> Next {
        if self.body.len() + body.body.len() > self.picker.max_body_bytes {
            return self
                .refuse(OpenAiError::new(
                    axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                    "invalid_request_error",
                    format!(
                        "the request body is over the endpoint picker's limit of {} bytes (ext_proc.max_body_bytes)",
                        self.picker.max_body_bytes
                    ),
                ));
        }
        if !self.picker.take_buffer(body.body.len()) {
            return self.refuse(
                OpenAiError::new(
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    format!(
                        "the endpoint picker holds {} bytes of request bodies, its limit (ext_proc.max_buffered_bytes); try again",
                        self.picker.max_buffered_bytes
                    ),
                )
                .with_code("overloaded")
                .with_retry_after(1),
            );
        }
        self.body_held += body.body.len();
        self.body.extend_from_slice(&body.body);
        if !body.end_of_stream {
            return Next::Continue;
        }
        let started = Instant::now();
        let picker = self.picker.clone();
        let (endpoint, instance, subset, selection) = (
            self.endpoint,
            self.instance.clone(),
            self.subset.clone(),
            self.selection.clone(),
        );
        let kept = std::mem::take(&mut self.kept_headers);
        let caller = self.caller.clone();
        let request_body = Arc::new(std::mem::take(&mut self.body));
        let wanted = Wanted {
            endpoint,
            instance,
            subset,
            selection,
            kept,
            admitted: Arc::default(),
        };
        let booked = pick(picker, caller, wanted, request_body.clone()).await;
        // Picked or refused, the body is no longer gathered: its budget goes back.
        self.picker.give_buffer(std::mem::take(&mut self.body_held));
        match booked {
            Ok(booked) => {
                let prefiller = booked.prefill.as_ref().map(|(_, at)| at.to_string());
                let destination = booked.destination();
                let mut responses = vec![messages::pick(&destination, prefiller.as_deref())];
                responses.extend(messages::body(&request_body, true, true));
                self.booked = Some(booked);
                self.picker
                    .frontend
                    .router()
                    .metrics
                    .record_ext_proc_pick(started.elapsed());
                self.send(responses)
            }
            Err(error) => self.refuse(error),
        }
    }

    /// Envoy retried elsewhere: the booking follows (`Booked::served_by`).
    fn rebook_if_served_elsewhere(&mut self, served: Option<String>) {
        if let (Some(booked), Some(served)) = (self.booked.as_mut(), served) {
            booked.served_by(self.picker.frontend.router(), &served);
        }
    }

    async fn response_body(&mut self, body: HttpBody) -> Next {
        if self.response_status == Some(503) && body.body.starts_with(ENVOY_UPSTREAM_FAILURE) {
            self.engine_failed();
        }
        self.answering();
        if body.end_of_stream {
            if let Some(mut booked) = self.booked.take() {
                booked.lease.free();
            }
        }
        self.send(messages::body(&body.body, body.end_of_stream, false))
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        self.picker.give_buffer(self.body_held);
    }
}

impl Exchange {
    /// The engine answers (`Booked::answering`).
    fn answering(&mut self) {
        if let Some(booked) = self.booked.as_mut() {
            booked.answering();
        }
    }

    /// Envoy could not reach the picked engine: out of the candidates for a cool-down,
    /// as the frontend does on a refused connection (health probes bring it back).
    fn engine_failed(&mut self) {
        if let Some(booked) = self.booked.as_ref() {
            booked.engine_failed(&self.picker.frontend);
        }
    }
}

/// Parsing (tokenizing) and selecting (plugin code) run off the executor
/// (`off_executor`); a request that finds every worker busy waits its turn
/// (`admission:`) while Envoy holds the stream open. It is parsed, described and
/// admitted once, at its first try; each later try selects again.
async fn pick(
    picker: Arc<EndpointPicker>,
    caller: Caller,
    wanted: Wanted,
    request_body: Arc<Vec<u8>>,
) -> Result<Booked, OpenAiError> {
    let inline = picker
        .frontend
        .inline_ok(request_body.len(), wanted.instance.as_deref());
    let first = off_executor(inline, {
        let picker = picker.clone();
        move || {
            let prepared = decide::prepare(&picker, &caller, wanted, &request_body);
            let prepared = Arc::new(prepared.map_err(Attempt::Failed)?);
            let mut busy = None;
            let booked = decide::book(&picker, &prepared, &mut busy);
            Ok((prepared, attempted(booked, busy)))
        }
    })
    .await;
    let (prepared, first) = match first {
        Ok((prepared, first)) => (prepared, first),
        Err(attempt) => return Err(failed(attempt)),
    };
    let attempt = || {
        let (picker, prepared) = (picker.clone(), prepared.clone());
        off_executor(inline, move || {
            let mut busy = None;
            let booked = decide::book(&picker, &prepared, &mut busy);
            attempted(booked, busy)
        })
    };
    let place = match &first {
        Err(Attempt::Busy(place)) => Some(place.clone()),
        _ => None,
    };
    let router = picker.frontend.router().clone();
    let waited = match place {
        // Not busy: the first try's answer is the answer.
        None => first.map_err(switchyard_fleet::router::Waited::Failed),
        Some(place) => {
            router
                .queued(
                    switchyard_fleet::router::Place {
                        partition: place.partition,
                        priority: place.priority,
                        tenant: place.tenant.as_deref(),
                        max_wait: place.max_wait,
                    },
                    first,
                    |e| matches!(e, Attempt::Busy(_)),
                    attempt,
                )
                .await
        }
    };
    match waited {
        Ok(booked) => Ok(booked),
        Err(switchyard_fleet::router::Waited::Failed(attempt)) => Err(failed(attempt)),
        Err(switchyard_fleet::router::Waited::Refused(refusal)) => {
            Err(crate::frontend::refusal_error(&refusal))
        }
    }
}

/// What the client of a request whose try failed is told.
fn failed(attempt: Attempt) -> OpenAiError {
    match attempt {
        Attempt::Failed(error) => error,
        Attempt::Busy(_) => OpenAiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "every worker is busy (admission.busy)",
        )
        .with_code("overloaded"),
    }
}

/// A try's answer as the queue reads it: busy (it waits its turn) or failed.
fn attempted(
    booked: Result<Booked, OpenAiError>,
    busy: Option<BusyPlace>,
) -> Result<Booked, Attempt> {
    booked.map_err(|error| match busy {
        Some(place) => Attempt::Busy(place),
        None => Attempt::Failed(error),
    })
}

/// `work` off the executor (`off_executor`), or inline when it runs no plugin code; work
/// that did not finish is a failed try.
async fn off_executor<T: Send + 'static>(
    inline: bool,
    work: impl FnOnce() -> Result<T, Attempt> + Send + 'static,
) -> Result<T, Attempt> {
    crate::off_executor::run(inline, work)
        .await
        .unwrap_or_else(|e| {
            Err(Attempt::Failed(OpenAiError::new(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                format!("the pick did not finish: {e}"),
            )))
        })
}
