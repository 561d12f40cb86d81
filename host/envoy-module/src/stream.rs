//! One HTTP stream through the filter: the request's headers say what it asks for, its
//! body (buffered by Envoy, up to `ext_proc.max_body_bytes`) is parsed and decided as the
//! endpoint picker decides, and the pick becomes Envoy's upstream override host (and the
//! picker's destination header). Prefill completes at the response headers; the booking
//! is freed when the stream completes, is reset, or the client hangs up (Envoy ends the
//! stream either way, and dropping the pick frees it).

use std::borrow::Cow;
use std::sync::Arc;

use parking_lot::Mutex;
use switchyard_serve::caller::Caller;
use switchyard_serve::ext_proc::embedded::{self, Asked, Now, Pick};
use switchyard_serve::frontend::prompt::Endpoint;
use switchyard_serve::frontend::{OpenAiError, INSTANCE_HEADER};
use switchyard_serve::request_attributes;

use crate::abi;
use crate::envoy::{Scheduler, Stream};
use crate::filter_config::FilterConfig;

/// The picker's destination header (docs/envoy.md): for configs whose cluster routes by
/// it (`ORIGINAL_DST` with `use_http_header`, or the override-host load balancer).
const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
/// llm-d's decode sidecar reads the prefill worker of a disaggregated pair here.
const PREFILLER_HEADER: &str = "x-prefiller-host-port";
/// A route may add it to the response to say which endpoint served (Envoy's retries).
const SERVED_HEADER: &str = "x-gateway-destination-endpoint-served";
/// The Inference Extension's subset hint: the endpoints a pick must stay within, in the
/// stream's dynamic metadata (a gateway's filter ahead of this one writes it).
const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";

/// A decision made on the module's runtime, waiting for the stream's worker thread.
type Pending = Arc<Mutex<Option<Result<Pick, OpenAiError>>>>;

/// The filter config a stream's filter was made under, borrowed without a count of its
/// own: Envoy holds its config in every filter of it (a shared pointer) and calls
/// `on_http_filter_config_destroy` only after the last one is gone. A count per stream
/// would be two atomic writes per request to a line all of Envoy's workers write. A copy
/// is as good as the filter's own: it lives within the filter's hooks.
#[derive(Clone, Copy)]
pub struct ConfigRef(std::ptr::NonNull<FilterConfig>);

impl ConfigRef {
    /// # Safety
    /// `config` is the pointer `on_http_filter_config_new` returned, and the filter that
    /// holds this is one of the config's (Envoy destroys the config after it).
    pub unsafe fn new(config: std::ptr::NonNull<FilterConfig>) -> ConfigRef {
        ConfigRef(config)
    }
}

impl std::ops::Deref for ConfigRef {
    type Target = FilterConfig;

    fn deref(&self) -> &FilterConfig {
        // SAFETY: `new`'s promise: the config outlives every filter of it.
        unsafe { self.0.as_ref() }
    }
}

/// The module's filter of one stream.
pub struct Filter {
    config: ConfigRef,
    asked: Option<Asked>,
    pick: Option<Pick>,
    pending: Option<(Pending, Arc<Scheduler>)>,
}

impl Filter {
    pub fn new(config: ConfigRef) -> Filter {
        Filter {
            config,
            asked: None,
            pick: None,
            pending: None,
        }
    }

    pub fn request_headers(&mut self, stream: Stream, end_of_stream: bool) -> u32 {
        let endpoint = match stream.header(abi::REQUEST_HEADER, ":path") {
            Some(path)
                if path.split(|&b| b == b'?').next()
                    == Some(Endpoint::Completions.path().as_bytes()) =>
            {
                Endpoint::Completions
            }
            _ => Endpoint::ChatCompletions,
        };
        let instance = stream
            .header(abi::REQUEST_HEADER, INSTANCE_HEADER)
            .map(|v| String::from_utf8_lossy(v).into_owned());
        let generation = self.config.router().generation();
        let kept =
            request_attributes::kept_headers(&generation.config().request_attributes, |name| {
                stream.header(abi::REQUEST_HEADER, name)
            });
        drop(generation);
        let kept = match kept {
            Ok(kept) => kept,
            Err(error) => return self.refuse(stream, error.into(), abi::HEADERS_STOP_ITERATION),
        };
        let subset = stream.metadata_strings(SUBSET_NAMESPACE, SUBSET_KEY);
        // Borrowed apart from `self`, which deciding changes.
        let config = self.config;
        if let (false, Some(header)) = (end_of_stream, config.model_header.as_deref()) {
            let asked = Asked::new(Endpoint::Completions, instance, subset, kept);
            return self.decide_at_headers(stream, header, asked);
        }
        if !end_of_stream {
            self.asked = Some(Asked::new(endpoint, instance, subset, kept));
            stream.buffer_at_least(self.config.picker.max_body_bytes());
            return abi::HEADERS_STOP_ITERATION; // the pick waits for the body
        }
        // No body (GET /v1/models and the like): any eligible endpoint, nothing booked.
        match embedded::any_endpoint(&self.config.picker, subset.as_deref()) {
            Some(endpoint) => {
                let endpoint = endpoint.to_string();
                stream.override_host(&endpoint);
                stream.set_request_header(DESTINATION_HEADER, &endpoint);
                abi::HEADERS_CONTINUE
            }
            None => self.refuse(
                stream,
                OpenAiError::new(
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    "switchyard knows no endpoint to send the request to",
                ),
                abi::HEADERS_STOP_ITERATION,
            ),
        }
    }

    /// `headers_only`: decided now, on the model its header names; the body is neither
    /// read nor waited for (unless plugin code decides, when it waits for that).
    fn decide_at_headers(&mut self, stream: Stream, header: &str, asked: Asked) -> u32 {
        let Some(model) = stream.header(abi::REQUEST_HEADER, header) else {
            let error = OpenAiError::new(
                axum::http::StatusCode::BAD_REQUEST,
                "invalid_request_error",
                format!("the switchyard filter decides at the request headers (`headers_only`), and this request has no `{header}` header naming its model: send one (a gateway's body-based routing sets it), or drop `headers_only` from the filter config"),
            );
            return self.refuse(stream, error, abi::HEADERS_STOP_ITERATION);
        };
        let body = embedded::headers_only_body(&String::from_utf8_lossy(model));
        match self.decide(stream, asked, body.into()) {
            abi::BODY_CONTINUE => abi::HEADERS_CONTINUE,
            _ => abi::HEADERS_STOP_ITERATION,
        }
    }

    pub fn request_body(&mut self, stream: Stream, end_of_stream: bool) -> u32 {
        let Some(asked) = self.asked.take() else {
            if self.pending.is_some() {
                // Decided at the headers, on the module's runtime, not yet back: the body
                // waits under Envoy's flow control.
                return abi::BODY_STOP_AND_WATERMARK;
            }
            return abi::BODY_CONTINUE; // decided (or refused) already
        };
        let limit = self.config.picker.max_body_bytes();
        let too_large = || {
            let error = OpenAiError::new(
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!("the request body is over the switchyard module's limit of {limit} bytes (ext_proc.max_body_bytes)"),
            );
            (error, abi::BODY_STOP_NO_BUFFER)
        };
        if !end_of_stream {
            if stream.request_body_size() > limit {
                let (error, status) = too_large();
                return self.refuse(stream, error, status);
            }
            self.asked = Some(asked);
            return abi::BODY_STOP_AND_BUFFER;
        }
        // The whole body is here (one chunk, usually): its length is what is read.
        let body = stream.request_body();
        if body.len() > limit {
            let (error, status) = too_large();
            return self.refuse(stream, error, status);
        }
        self.decide(stream, asked, body)
    }

    /// A request with trailers: its body ended before them, and the pick is made now.
    pub fn request_trailers(&mut self, stream: Stream) -> u32 {
        let Some(asked) = self.asked.take() else {
            if self.pending.is_some() {
                return abi::TRAILERS_STOP_ITERATION;
            }
            return abi::TRAILERS_CONTINUE;
        };
        match self.decide(stream, asked, stream.buffered_request_body()) {
            abi::BODY_CONTINUE => abi::TRAILERS_CONTINUE,
            _ => abi::TRAILERS_STOP_ITERATION,
        }
    }

    /// Decides on the whole `body`: here when only the router's own code runs, else on
    /// the module's runtime. A body hook's status. Who may choose an instance is the
    /// serving generation's (`auth.choose_instance`, which a reload changes).
    fn decide(&mut self, stream: Stream, asked: Asked, body: Cow<'_, [u8]>) -> u32 {
        let picker = &self.config.picker;
        let caller = picker.proxy_caller();
        match embedded::decide_now(picker, &caller, &asked, &body) {
            Now::Decided(Ok(pick)) => {
                self.route(stream, pick);
                abi::BODY_CONTINUE
            }
            Now::Decided(Err(error)) => self.refuse(stream, error, abi::BODY_STOP_NO_BUFFER),
            Now::Later => self.decide_later(stream, caller, asked, body.into_owned()),
        }
    }

    /// Plugin code, a tokenizer or the admission queue: decided on the module's runtime
    /// (never on Envoy's worker thread, never on the executor's threads), and the stream
    /// resumes on its worker thread (`scheduled`).
    fn decide_later(&mut self, stream: Stream, caller: Caller, asked: Asked, body: Vec<u8>) -> u32 {
        let (Some(runtime), Some(scheduler)) =
            (self.config.runtime.as_ref(), Scheduler::new(stream))
        else {
            let error = OpenAiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "the switchyard module is stopping",
            );
            return self.refuse(stream, error, abi::BODY_STOP_NO_BUFFER);
        };
        let pending: Pending = Arc::default();
        let scheduler = Arc::new(scheduler);
        self.pending = Some((pending.clone(), scheduler.clone()));
        let picker = self.config.picker.clone();
        runtime.spawn(async move {
            let decided = embedded::pick(picker, caller, asked, Arc::new(body)).await;
            *pending.lock() = Some(decided);
            scheduler.commit(0);
        });
        abi::BODY_STOP_AND_BUFFER
    }

    /// The decision made on the module's runtime arrived on the worker thread.
    pub fn scheduled(&mut self, stream: Stream) {
        let Some((pending, _scheduler)) = self.pending.take() else {
            return;
        };
        let decided = pending.lock().take();
        match decided {
            Some(Ok(pick)) => {
                self.route(stream, pick);
                stream.continue_decoding();
            }
            Some(Err(error)) => {
                self.refuse(stream, error, abi::BODY_STOP_NO_BUFFER);
            }
            None => {}
        }
    }

    /// Sends the request where the pick says, and keeps the booking with the stream. The
    /// override host binds the first attempt: a route's retries go where Envoy's load
    /// balancer sends them (with the fallbacks in the destination header and the
    /// override-host load balancer, down the policy's list), and `response_headers`
    /// moves the booking there.
    fn route(&mut self, stream: Stream, pick: Pick) {
        // The destination starts with the endpoint: one string for both.
        let destination = pick.destination();
        let endpoint = destination.split(',').next().unwrap_or(&destination);
        if !stream.override_host(endpoint) {
            tracing::warn!(
                endpoint,
                "switchyard (Envoy module): Envoy refused the override host"
            );
        }
        stream.set_request_header(DESTINATION_HEADER, &destination);
        if let Some(prefiller) = pick.prefiller() {
            stream.set_request_header(PREFILLER_HEADER, &prefiller.to_string());
        }
        if let Some(stats) = &self.config.stats {
            stats.picked(stream, pick.decided_in());
        }
        self.pick = Some(pick);
    }

    /// Answers the request itself (an OpenAI-style JSON error); `status` is the hook's.
    fn refuse(&mut self, stream: Stream, error: OpenAiError, status: u32) -> u32 {
        self.asked = None;
        if let Some(stats) = &self.config.stats {
            stats.refused(stream);
        }
        let body = error.body().to_string();
        stream.reply(
            error.status().as_u16(),
            body.as_bytes(),
            error.retry_after(),
        );
        status
    }

    /// The engine answers: prefill is complete; a served endpoint other than the pick
    /// (after the route's retries: the last host Envoy's router tried, or else
    /// `x-gateway-destination-endpoint-served` when the route adds it) takes the booking.
    pub fn response_headers(&mut self, stream: Stream) -> u32 {
        if let Some(pick) = self.pick.as_mut() {
            let served = stream.last_upstream_host_attempted().or_else(|| {
                let named = stream.header(abi::RESPONSE_HEADER, SERVED_HEADER)?;
                std::str::from_utf8(named).ok()?.trim().parse().ok()
            });
            if let Some(served) = served.filter(|s| *s != pick.endpoint()) {
                pick.served_by(self.config.router(), &served.to_string());
                if let Some(stats) = &self.config.stats {
                    stats.rebooked(stream);
                }
            }
            pick.answering();
        }
        abi::HEADERS_CONTINUE
    }

    /// Envoy answers the request itself: when its router could not reach the picked
    /// engine (`upstream_reset_before_response_started`, `UF`/`UR` in its access log), the
    /// worker leaves the candidates for a cool-down, before any health probe notices.
    pub fn local_reply(&mut self, stream: Stream, details: &[u8]) {
        const UPSTREAM_FAILURE: &[u8] = b"upstream_reset_before_response_started";
        if let (Some(pick), true) = (self.pick.as_ref(), details.starts_with(UPSTREAM_FAILURE)) {
            pick.engine_failed(&self.config.picker);
            if let Some(stats) = &self.config.stats {
                stats.engine_failed(stream);
            }
        }
    }

    /// The stream is over (completed, reset, or the client hung up): the booking is freed.
    pub fn complete(&mut self) {
        self.pick = None;
        self.pending = None;
    }
}
