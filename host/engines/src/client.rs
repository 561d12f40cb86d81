//! The HTTP clients that talk to engines: the engines' CA, no redirects, the connect
//! timeout of `frontend.connect_timeout_ms`, idle connections kept below what engines
//! keep (`frontend.pool_idle_timeout_ms`).

use std::time::Duration;

use switchyard_config::ConfigSource;

use crate::tls::TlsError;

/// Why an engine client cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot set up the upstream client: {0}")]
    Build(reqwest::Error),
}

/// A host's two engine clients: `pooled` keeps idle connections; `fresh` never reuses
/// one, for a request (or probe) whose kept-alive connection the engine closed before
/// answering, sent again.
#[derive(Clone)]
pub struct EngineClients {
    pub pooled: reqwest::Client,
    pub fresh: reqwest::Client,
}

impl EngineClients {
    pub fn new(source: &ConfigSource) -> Result<EngineClients, ClientError> {
        Ok(EngineClients {
            pooled: engine_client(source)?,
            fresh: keeping(source, 0)?,
        })
    }
}

/// The pooled engine client alone (the metrics scraper's, made on its own runtime: a
/// client's connections belong to the runtime that made them).
pub fn engine_client(source: &ConfigSource) -> Result<reqwest::Client, ClientError> {
    keeping(source, source.config.frontend.pool_idle_timeout_ms)
}

/// An engine client keeping idle connections `idle_ms` (0: none).
fn keeping(source: &ConfigSource, idle_ms: u64) -> Result<reqwest::Client, ClientError> {
    let tls = crate::tls::engine_client_config(source)?;
    let builder = reqwest::Client::builder();
    let builder = if idle_ms == 0 {
        builder.pool_max_idle_per_host(0)
    } else {
        builder.pool_idle_timeout(Duration::from_millis(idle_ms))
    };
    builder
        .connect_timeout(Duration::from_millis(
            source.config.frontend.connect_timeout_ms,
        ))
        .tcp_nodelay(true)
        // Engine URLs never carry credentials, and a redirect would take a prompt
        // to a host no one checked against `router.worker_networks`.
        .redirect(reqwest::redirect::Policy::none())
        .tls_backend_preconfigured(tls)
        .build()
        .map_err(ClientError::Build)
}
