//! What a request to the HTTP service passes before any handler runs.
//!
//! Its credentials: each route belongs to an audience (inference clients or operators;
//! `/healthz` and `/readyz` to no one), and a request to it needs `Authorization: Bearer
//! KEY` with a key of that audience, whenever the serving config has keys for it. 401
//! without a valid key, 403 with the other audience's. Keys come from the serving
//! generation, so a reload rotates them.
//!
//! Its body, read whole: at most `http.max_body_bytes` (413 past it, without reading the
//! rest) and within `http.body_read_timeout_secs` of the headers (408 after), so a client
//! trickling a body holds nothing for long.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::caller::{is_loopback, Caller};
use crate::errors::refusal;
use crate::frontend::OPENAI_PATHS;
use switchyard_config::auth::{Audience, Grant, Keyring};
use switchyard_fleet::router::Router;

/// The audience a path belongs to; None: open to everyone.
pub fn audience_of(path: &str, keyring: &Keyring) -> Option<Audience> {
    match path {
        "/healthz" | "/readyz" => None,
        "/metrics" if keyring.metrics_open => None,
        "/v1/select" => Some(Audience::Client),
        p if OPENAI_PATHS.contains(&p) => Some(Audience::Client),
        // Everything else, unknown paths included (they answer 401 before 404, so an
        // unauthenticated client learns nothing of the routes).
        _ => Some(Audience::Operator),
    }
}

/// The bearer token of a request, if it sent one.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Why a request's credential does not do.
#[derive(Debug)]
pub enum Denied {
    Missing(Audience),
    Invalid,
    WrongAudience { needed: Audience, found: Audience },
}

impl Denied {
    pub fn status(&self) -> StatusCode {
        match self {
            Denied::Missing(_) | Denied::Invalid => StatusCode::UNAUTHORIZED,
            Denied::WrongAudience { .. } => StatusCode::FORBIDDEN,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            Denied::Missing(_) => "missing_api_key",
            Denied::Invalid => "invalid_api_key",
            Denied::WrongAudience { .. } => "wrong_audience",
        }
    }
}

impl std::fmt::Display for Denied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Denied::Missing(a) => write!(f, "this route needs {} API key: send `Authorization: Bearer KEY` with a key of `auth.{}s`", article(*a), a.as_str()),
            Denied::Invalid => f.write_str("the API key is not valid (unknown, or rotated out by a reload)"),
            Denied::WrongAudience { needed, found } => write!(f, "this is {} API key; this route needs {} key (`auth.{}s`)", article(*found), article(*needed), needed.as_str()),
        }
    }
}

fn article(audience: Audience) -> &'static str {
    match audience {
        Audience::Client => "a client",
        Audience::Operator => "an operator",
    }
}

/// Checks `token` for a route of `audience`. An audience with no keys configured is open.
pub fn check(
    keyring: &Keyring,
    audience: Audience,
    token: Option<&str>,
) -> Result<Option<Arc<Grant>>, Denied> {
    if !keyring.has(audience) {
        return Ok(None);
    }
    let token = token
        .filter(|t| !t.is_empty())
        .ok_or(Denied::Missing(audience))?;
    let grant = keyring.verify(token).ok_or(Denied::Invalid)?;
    if grant.audience != audience {
        return Err(Denied::WrongAudience {
            needed: audience,
            found: grant.audience,
        });
    }
    Ok(Some(grant.clone()))
}

/// Middleware: refuses what the credential does not allow; otherwise records the
/// `Caller` for the handler.
pub async fn authorize(
    State(router): State<Arc<Router>>,
    mut request: Request,
    next: Next,
) -> Response {
    let loopback = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .is_none_or(|peer| is_loopback(&peer.0));
    let generation = router.generation();
    let keyring = &generation.startup.keyring;
    let path = request.uri().path();
    let grant = match audience_of(path, keyring) {
        None => None,
        Some(audience) => match check(keyring, audience, bearer(request.headers())) {
            Ok(grant) => grant,
            Err(denied) => {
                tracing::debug!(%path, code = denied.code(), "request refused: credentials");
                let mut response =
                    refusal(path, denied.status(), denied.code(), denied.to_string());
                if denied.status() == StatusCode::UNAUTHORIZED {
                    response
                        .headers_mut()
                        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                }
                return response;
            }
        },
    };
    let choice = keyring.choose_instance;
    drop(generation);
    request.extensions_mut().insert(Caller {
        grant,
        loopback,
        choice,
    });
    next.run(request).await
}

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
