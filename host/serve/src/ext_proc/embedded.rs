//! The picker's decisions for a host that runs the router inside a proxy's own process
//! (the Envoy dynamic module, `host/envoy-module`): the same parsing, admission,
//! selection, booking and fallbacks a gRPC stream gets, without the stream. The host
//! reads the request from the proxy and applies the answer; everything decided here is
//! the picker's own code, so both ways of embedding switchyard in Envoy decide alike.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use switchyard_policy::histogram::Stopwatch;

use switchyard_fleet::router::Router;
use switchyard_plugin_sdk::WorkerId;

use super::decide::{decide, eligible, Wanted};
use super::{Booked, EndpointPicker};
use crate::caller::Caller;
use crate::frontend::prompt::Endpoint;
use crate::frontend::OpenAiError;

impl EndpointPicker {
    pub fn router(&self) -> &Arc<Router> {
        self.frontend.router()
    }

    /// `ext_proc.max_body_bytes`: a larger request body is refused (413).
    pub fn max_body_bytes(&self) -> usize {
        self.max_body_bytes
    }

    /// Who sends the requests of a proxy the router runs inside: the proxy's clients,
    /// whom the proxy authenticates (its own filters); never loopback.
    pub fn proxy_caller(&self) -> Caller {
        let choice = self.router().generation().startup.keyring.choose_instance;
        Caller::behind_gateway(None, choice)
    }
}

/// What a request's headers ask for, before its body is read.
#[derive(Clone)]
pub struct Asked(Wanted);

impl Asked {
    /// `instance`: the `x-switchyard-instance` header; `subset`: the gateway's subset
    /// hint (`ip:port` each); `kept`: the headers `request_attributes:` keeps.
    pub fn new(
        endpoint: Endpoint,
        instance: Option<String>,
        subset: Option<Vec<String>>,
        kept: Vec<(String, String)>,
    ) -> Self {
        Asked(Wanted {
            endpoint,
            instance,
            subset,
            selection: None,
            kept,
            admitted: Arc::default(),
        })
    }
}

/// What a request decided at its headers (the Envoy module's `headers_only`) is decided
/// on: a completion of `model` with no prompt, so the policy sees no prefix, as the body
/// is neither read nor waited for.
pub fn headers_only_body(model: &str) -> Vec<u8> {
    serde_json::json!({"model": model, "prompt": ""})
        .to_string()
        .into_bytes()
}

/// A request's booking and where it goes; the booking is freed when this is dropped.
pub struct Pick(Booked, Duration);

impl Pick {
    /// How long the decision took: what `switchyard_ext_proc_decision_seconds` recorded.
    pub fn decided_in(&self) -> Duration {
        self.1
    }

    /// The chosen worker's endpoint.
    pub fn endpoint(&self) -> SocketAddr {
        self.0.endpoint
    }

    pub fn worker(&self) -> WorkerId {
        self.0.worker
    }

    /// The destination header's value: the endpoint, then the fallbacks, comma-joined.
    pub fn destination(&self) -> String {
        self.0.destination()
    }

    /// A disaggregated model's prefill worker (`x-prefiller-host-port`).
    pub fn prefiller(&self) -> Option<SocketAddr> {
        self.0.prefill.as_ref().map(|(_, at)| *at)
    }

    /// The engine answers: prefill is complete.
    pub fn answering(&mut self) {
        self.0.answering();
    }

    /// The proxy could not reach the engine: it leaves the candidates for
    /// `frontend.unhealthy_cooldown_ms`, as the picker does at Envoy's own 503.
    pub fn engine_failed(&self, picker: &EndpointPicker) {
        self.0.engine_failed(&picker.frontend);
    }

    /// The proxy served the request at `served` (`ip:port`): the booking follows.
    pub fn served_by(&mut self, router: &Router, served: &str) {
        self.0.served_by(router, served);
    }
}

/// A decision made on the calling thread, or the need for `pick`.
// Made and matched once per request, on the stack: boxing the pick would cost an
// allocation for nothing.
#[allow(clippy::large_enum_variant)]
pub enum Now {
    Decided(Result<Pick, OpenAiError>),
    /// Plugin code or a tokenizer would run, or every worker is busy: `pick` decides
    /// (off the executor; a busy request waits in the admission queue).
    Later,
}

/// Decides on the calling thread when only the router's own code runs over a small input
/// (`Frontend::inline_ok`, as the picker decides inline) and a worker is free.
pub fn decide_now(picker: &EndpointPicker, caller: &Caller, asked: &Asked, body: &[u8]) -> Now {
    if !picker
        .frontend
        .inline_ok(body.len(), asked.0.instance.as_deref())
    {
        return Now::Later;
    }
    let started = Stopwatch::start();
    let mut busy = None;
    match decide(picker, caller, asked.0.clone(), body, &mut busy) {
        Err(_) if busy.is_some() => Now::Later,
        decided => Now::Decided(recorded(picker, started, decided)),
    }
}

/// Decides off the executor (plugin code and tokenizers run on its blocking pool), a busy
/// request waiting its turn (`admission:`), as the picker's streams do.
pub async fn pick(
    picker: Arc<EndpointPicker>,
    caller: Caller,
    asked: Asked,
    body: Arc<Vec<u8>>,
) -> Result<Pick, OpenAiError> {
    let started = Stopwatch::start();
    let decided = super::pick(picker.clone(), caller, asked.0, body).await;
    recorded(&picker, started, decided)
}

/// The picker's metrics for a decision (`switchyard_ext_proc_picks_total`,
/// `..._refusals_total`, `..._decision_seconds`).
fn recorded(
    picker: &EndpointPicker,
    started: Stopwatch,
    decided: Result<Booked, OpenAiError>,
) -> Result<Pick, OpenAiError> {
    let metrics = &picker.router().metrics;
    match decided {
        Ok(booked) => {
            let took = started.elapsed();
            metrics.record_ext_proc_pick(took);
            Ok(Pick(booked, took))
        }
        Err(error) => {
            metrics.record_ext_proc_refusal();
            Err(error)
        }
    }
}

/// Any eligible endpoint, for a request without a body (`GET /v1/models`): nothing is
/// booked.
pub fn any_endpoint(picker: &EndpointPicker, subset: Option<&[String]>) -> Option<SocketAddr> {
    let eligible = eligible(picker.router(), subset);
    if eligible.is_empty() {
        return None;
    }
    Some(eligible[rand::random::<u32>() as usize % eligible.len()].1)
}
