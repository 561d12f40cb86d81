//! Failures talking to an engine: their kind, the phase they happened in, and the one log
//! line and count each gets.
//!
//! Engines close kept-alive connections that sit idle (llama.cpp's server after 5 s, as
//! do vLLM's and SGLang's uvicorn). A request the router writes on such a connection just
//! as the engine closes it fails before any byte of an answer came back: the engine never
//! served it. `frontend.pool_idle_timeout_ms` keeps the router's idle connections below
//! what engines keep, and a request that still meets a closed connection is sent again on
//! a connection of its own (`closed`), never answered 502 for it.

use switchyard_fleet::metrics::UpstreamFailure;
use switchyard_fleet::router::Router;
use switchyard_plugin_sdk::WorkerId;

/// Where in the exchange with the engine a failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Connecting, writing the request, or waiting for the answer's head.
    Send,
    /// Reading the answer's body, after its head.
    Answer,
}

impl Phase {
    fn as_str(self) -> &'static str {
        match self {
            Phase::Send => "send",
            Phase::Answer => "answer",
        }
    }
}

/// The worker a request was sent to, and its engine's URL.
pub struct Engine {
    pub worker: WorkerId,
    pub url: String,
}

/// One failure: with which engine, in which phase.
pub struct Failure<'a> {
    pub engine: &'a Engine,
    pub phase: Phase,
    pub error: &'a reqwest::Error,
}

impl Failure<'_> {
    /// What kind of failure it is (the `kind` label of `switchyard_upstream_failures_total`).
    pub fn kind(&self) -> UpstreamFailure {
        let error = self.error;
        if error.is_connect() {
            if error.is_timeout() {
                UpstreamFailure::ConnectTimeout
            } else {
                UpstreamFailure::Refused
            }
        } else if error.is_timeout() {
            UpstreamFailure::Timeout
        } else if self.phase == Phase::Answer {
            UpstreamFailure::MidAnswer
        } else if closed_before_answer(error) {
            UpstreamFailure::Closed
        } else {
            UpstreamFailure::Other
        }
    }

    /// Logs the failure (worker, phase, kind, cause, and `then`: what the router does
    /// about it) and counts it by kind. Called once per failure.
    pub fn record(&self, router: &Router, request: &str, then: &str) -> UpstreamFailure {
        let kind = self.kind();
        router.metrics.record_upstream_failure(kind);
        tracing::warn!(
            request,
            worker = self.engine.worker.worker_id,
            dp_rank = self.engine.worker.dp_rank,
            url = self.engine.url,
            phase = self.phase.as_str(),
            kind = kind.as_str(),
            error = describe(self.error),
            "upstream failure; {then}"
        );
        kind
    }
}

/// Whether the connection closed (or was reset) before any byte of the answer: hyper's
/// "connection closed before message completed", or a reset or broken pipe while the
/// request was written (not a refused connection, nor a timeout).
pub fn closed_before_answer(error: &reqwest::Error) -> bool {
    if error.is_connect() || error.is_timeout() {
        return false;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(cause) = source {
        if let Some(hyper) = cause.downcast_ref::<hyper::Error>() {
            if hyper.is_incomplete_message() || hyper.is_canceled() {
                return true;
            }
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::{
                BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof,
            };
            if matches!(
                io.kind(),
                BrokenPipe | ConnectionAborted | ConnectionReset | UnexpectedEof
            ) {
                return true;
            }
        }
        source = cause.source();
    }
    false
}

/// An upstream error with its causes (reqwest's own message names only the URL), and
/// what to do about an engine certificate the router does not trust.
pub fn describe(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    if text.contains("invalid peer certificate") {
        text.push_str(" (the engine's certificate is not trusted: set frontend.engine_ca to the CA that signed it)");
    }
    text
}
