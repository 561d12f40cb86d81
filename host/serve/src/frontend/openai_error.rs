//! Errors in OpenAI's shape, and what each of the router's refusals becomes in it.

use super::*;

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
pub struct OpenAiError {
    pub(super) status: StatusCode,
    pub(super) message: String,
    pub(super) kind: &'static str,
    pub(super) param: Option<&'static str>,
    pub(super) code: Option<&'static str>,
    /// Seconds for `Retry-After` (overload and rate-limit answers).
    pub(super) retry_after: Option<u64>,
}

impl From<request_attributes::BadHeader> for OpenAiError {
    fn from(e: request_attributes::BadHeader) -> Self {
        OpenAiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            e.to_string(),
        )
    }
}

impl OpenAiError {
    #[cold]
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        OpenAiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The same error, telling the client to come back in `seconds` (`Retry-After`).
    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds.max(1));
        self
    }

    pub fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

impl From<Refused> for OpenAiError {
    fn from(refused: Refused) -> Self {
        match refused {
            Refused::OverRate(over) => OpenAiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_exceeded",
                over.to_string(),
            )
            .with_code("rate_limit_exceeded")
            .with_retry_after(over.retry_after.as_secs_f64().ceil() as u64),
            Refused::Rejected(rejection) => {
                let status =
                    StatusCode::from_u16(rejection.status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
                let kind = match status.as_u16() {
                    429 => "rate_limit_exceeded",
                    401 | 403 => "permission_error",
                    500.. => "server_error",
                    _ => "invalid_request_error",
                };
                let error = OpenAiError::new(status, kind, rejection.message)
                    .with_code("admission_rejected");
                match rejection.retry_after_seconds {
                    0 => error,
                    seconds => error.with_retry_after(u64::from(seconds)),
                }
            }
        }
    }
}

impl From<prompt::InvalidRequest> for OpenAiError {
    fn from(invalid: prompt::InvalidRequest) -> Self {
        let mut error = OpenAiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            invalid.message,
        );
        error.param = invalid.param;
        error
    }
}

impl From<RouteError> for OpenAiError {
    fn from(error: RouteError) -> Self {
        let (status, kind, code) = match &error {
            RouteError::BadRequest(_) | RouteError::Partition(_) => {
                (StatusCode::BAD_REQUEST, "invalid_request_error", None)
            }
            RouteError::UnknownModel(_) => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("model_not_found"),
            ),
            RouteError::UnknownInstance { .. } => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("instance_not_found"),
            ),
            RouteError::NoWorker(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("no_healthy_worker"),
            ),
            RouteError::Saturated(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("overloaded"),
            ),
            RouteError::PolicyFailed { .. }
            | RouteError::Unfinished { .. }
            | RouteError::Accounting(_)
            | RouteError::Worker(_) => (StatusCode::INTERNAL_SERVER_ERROR, "server_error", None),
        };
        OpenAiError {
            status,
            message: error.to_string(),
            kind,
            param: None,
            code,
            retry_after: None,
        }
    }
}

/// A 503 for a request no endpoint can take, in the shape `RouteError::NoWorker` has:
/// for what the host that received the request knows and the router does not (a
/// gateway's subset hint, an endpoint it cannot reach).
#[cold]
pub fn no_endpoint(why: impl std::fmt::Display) -> OpenAiError {
    OpenAiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        format!("no eligible worker: {why}"),
    )
    .with_code("no_healthy_worker")
}

/// A 403 for what a caller may not route with, in OpenAI's shape.
#[cold]
pub fn forbidden(why: crate::caller::Forbidden) -> OpenAiError {
    OpenAiError::new(
        StatusCode::FORBIDDEN,
        "invalid_request_error",
        why.to_string(),
    )
    .with_code("permission_denied")
}

/// The OpenAI-shaped error of a refusal: 429 when the queue is full, 503 when the wait
/// ran out.
pub fn refusal_error(refusal: &switchyard_fleet::admission::QueueRefusal) -> OpenAiError {
    let (status, kind, code) = match refusal {
        switchyard_fleet::admission::QueueRefusal::Full { .. }
        | switchyard_fleet::admission::QueueRefusal::Evicted => (
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_exceeded",
            "rate_limit_exceeded",
        ),
        switchyard_fleet::admission::QueueRefusal::TimedOut { .. } => (
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "overloaded",
        ),
    };
    OpenAiError::new(status, kind, refusal.to_string())
        .with_code(code)
        .with_retry_after(1)
}

/// [`refusal_error`] as a response.
pub fn refusal_response(refusal: &switchyard_fleet::admission::QueueRefusal) -> Response {
    refusal_error(refusal).into_response()
}
