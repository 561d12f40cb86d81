//! Refusals made before a route's handler runs (credentials, limits, unknown methods),
//! in the shape the route's clients read: OpenAI's on the OpenAI routes, the HTTP API's
//! `{"error": ...}` elsewhere. Always JSON.

use axum::http::StatusCode;
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
