//! The answer's way back: a request's booking [`Lease`] and the relay that streams the
//! engine's body to the client, completing prefill and freeing the booking as it goes.

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::StatusCode;
use futures_util::{Stream, StreamExt};
use serde_json::json;
use switchyard_fleet::load_accounting::AccountingError;
use switchyard_fleet::router::{RouteError, Router};

use switchyard_engines::upstream::{Engine, Failure, Phase};

/// One request's booking: prefill complete once, freed exactly once (at the end of the
/// answer, on error, or when dropped because the client went away).
pub struct Lease {
    router: Arc<Router>,
    request_id: String,
    prefilled: bool,
    freed: bool,
    /// The frontend's in-flight slot, given back with the lease.
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Lease {
    pub fn new(router: Arc<Router>, request_id: String) -> Self {
        Lease {
            router,
            request_id,
            prefilled: false,
            freed: false,
            slot: None,
        }
    }

    /// Keeps `slot` taken until the lease ends (the answer is relayed, or dropped).
    pub fn hold(&mut self, slot: tokio::sync::OwnedSemaphorePermit) {
        self.slot = Some(slot);
    }

    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    pub fn prefill_complete(&mut self) {
        if !self.prefilled && !self.freed {
            self.prefilled = true;
            if let Err(error) = self.router.prefill_complete(&self.request_id) {
                self.gone("prefill complete", &error);
            }
        }
    }

    pub fn free(&mut self) {
        if !self.freed {
            self.freed = true;
            if let Err(error) = self.router.free(&self.request_id) {
                self.gone("free", &error);
            }
        }
    }

    /// The booking was not there for `what`: expected when its worker left meanwhile
    /// (one such line per in-flight request of a leaving pod would flood the log), a
    /// warning otherwise.
    fn gone(&self, what: &str, error: &RouteError) {
        if matches!(
            error,
            RouteError::Accounting(AccountingError::WorkerLeft(_))
        ) {
            tracing::debug!(request = %self.request_id, %error, "{what}: the worker left");
        } else {
            tracing::warn!(request = %self.request_id, %error, "{what}: booking already gone");
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.free();
    }
}

/// What to tell a client of an engine that failed mid-answer: a timeout says so, with the
/// limit, rather than the HTTP client's "error decoding response body".
pub(super) fn upstream_failure(error: &reqwest::Error, timeout_secs: u64) -> (StatusCode, String) {
    if error.is_timeout() {
        (
            StatusCode::GATEWAY_TIMEOUT,
            format!("the engine's answer timed out after {timeout_secs} s (frontend.request_timeout_secs)"),
        )
    } else {
        (
            StatusCode::BAD_GATEWAY,
            format!("the engine failed mid-answer: {error}"),
        )
    }
}

/// The upstream body, relayed chunk by chunk as it arrives. The first chunk completes
/// prefill; the end frees; an upstream error frees and, for an event stream, ends it with
/// an SSE error event (the client has the status line already, so no other signal is
/// left). Dropping the stream (client gone) drops the lease and the upstream request.
pub(super) fn relay(
    upstream: impl Stream<Item = reqwest::Result<Bytes>> + Send + 'static,
    lease: Lease,
    sse: bool,
    router: &Arc<Router>,
    (arrived, engine): (std::time::Instant, Engine),
    timeout_secs: u64,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let router = router.clone();
    let upstream = Box::pin(upstream);
    // The state: the upstream body, the lease, and whether a byte was relayed yet.
    let engine = Arc::new(engine);
    futures_util::stream::unfold(Some((upstream, lease, false)), move |state| {
        let (router, engine) = (router.clone(), engine.clone());
        async move {
            let (mut upstream, mut lease, relayed) = state?;
            match upstream.next().await {
                Some(Ok(chunk)) => {
                    if !relayed {
                        router.metrics.record_ttfb(arrived.elapsed());
                    }
                    lease.prefill_complete();
                    Some((Ok(chunk), Some((upstream, lease, true))))
                }
                None => {
                    lease.free();
                    None
                }
                Some(Err(error)) => {
                    lease.free();
                    router.metrics.record_upstream_error();
                    let failure = Failure {
                        engine: &engine,
                        phase: Phase::Answer,
                        error: &error,
                    };
                    failure.record(
                        &router,
                        &lease.request_id,
                        "the answer is cut short (a stream ends with an error event)",
                    );
                    let (_, message) = upstream_failure(&error, timeout_secs);
                    if sse {
                        let event = json!({"error": {"message": message, "type": "server_error", "param": null, "code": "upstream_error"}});
                        Some((Ok(Bytes::from(format!("data: {event}\n\n"))), None))
                    } else {
                        Some((Err(std::io::Error::other(message)), None))
                    }
                }
            }
        }
    })
}
