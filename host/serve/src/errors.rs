//! Refusals made before a route's handler runs (credentials, limits, unknown methods),
//! in the shape the route's clients read: OpenAI's on the OpenAI routes, the HTTP API's
//! `{"error": ...}` elsewhere. Always JSON.

use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::frontend::{is_openai_path, OpenAiError};

/// A refusal of a request to `path`; `code` is machine-readable, `message` says what to do.
pub fn refusal(path: &str, status: StatusCode, code: &'static str, message: String) -> Response {
    if is_openai_path(path) {
        let kind = match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::NOT_FOUND => {
                "invalid_request_error"
            }
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_exceeded",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        };
        OpenAiError::new(status, kind, message)
            .with_code(code)
            .into_response()
    } else {
        (status, Json(json!({ "error": message, "code": code }))).into_response()
    }
}

/// The most of a plain-text error answer kept as the message of its JSON form.
const MAX_MESSAGE_BYTES: usize = 16 << 10;

/// Every error answer of the HTTP API is JSON: one made as text by axum itself (an
/// extractor's rejection, such as a path segment that is not UTF-8) or with no body is
/// answered again in the route's shape, its text kept as the message and its other
/// headers (`Retry-After`, ...) kept. The probes' answers (`/healthz`, `/readyz`) stay
/// text, and so do the OpenAI routes' relayed engine answers (the engine's own words).
pub async fn json_error_bodies(request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"application/json"));
    if is_json
        || !(status.is_client_error() || status.is_server_error())
        || matches!(path.as_str(), "/healthz" | "/readyz")
        || is_openai_path(&path)
    {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, MAX_MESSAGE_BYTES)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let message = if text.is_empty() {
        format!(
            "{}; see docs/http-api.md",
            status.canonical_reason().unwrap_or("refused")
        )
    } else {
        text
    };
    let mut answer = refusal(&path, status, code_of(status), message);
    parts.headers.remove(header::CONTENT_TYPE);
    parts.headers.remove(header::CONTENT_LENGTH);
    answer.headers_mut().extend(parts.headers);
    answer
}

/// A machine-readable code for an error answer that came without one.
fn code_of(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST => "bad_request",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_exceeded",
        s if s.is_server_error() => "server_error",
        _ => "request_refused",
    }
}
