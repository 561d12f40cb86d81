//! Request bodies, read whole before any handler runs: at most `http.max_body_bytes`
//! (413 past it, without reading the rest) and within `http.body_read_timeout_secs` of
//! the headers (408 after), so a client trickling a body holds nothing for long.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::errors::refusal;

/// The body limits of the HTTP listener.
#[derive(Clone, Copy, Debug)]
pub struct BodyLimits {
    pub max_bytes: usize,
    pub read_timeout: Duration,
}

/// Middleware: buffers the request body under the limits.
pub async fn buffered(State(limits): State<BodyLimits>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path().to_owned();
    let reading = Limited::new(body, limits.max_bytes).collect();
    let bytes = match tokio::time::timeout(limits.read_timeout, reading).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return refusal(
                &path,
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!(
                    "the request body is larger than {} bytes (http.max_body_bytes)",
                    limits.max_bytes
                ),
            )
        }
        Ok(Err(e)) => {
            return refusal(
                &path,
                StatusCode::BAD_REQUEST,
                "body_unreadable",
                format!("the request body could not be read: {e}"),
            )
        }
        Err(_) => {
            return refusal(
                &path,
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!(
                    "the request body did not arrive within {} s of its headers (http.body_read_timeout_secs)",
                    limits.read_timeout.as_secs()
                ),
            )
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}
