//! The Envoy dynamic module's `filter_config` (docs/envoy.md, "switchyard as an Envoy
//! dynamic module"): the JSON object Envoy hands the module, read here so that the module
//! and `switchyard check --envoy-filter-config` read it alike.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

/// `{"config": PATH, "listen": "127.0.0.1:PORT", "probe": true}`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvoyModuleSettings {
    /// switchyard's YAML config, as `switchyard serve --config` reads it.
    pub config: PathBuf,
    /// Serve switchyard's HTTP API (`/v1/workers`, `/metrics`, `/v1/policies`) here.
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    /// Exercise each in-process plugin in a child process first, as `serve` does.
    #[serde(default = "yes")]
    pub probe: bool,
}

fn yes() -> bool {
    true
}

/// Why a module filter config was refused.
#[derive(Debug, thiserror::Error)]
pub enum EnvoyModuleError {
    #[error("the switchyard filter's filter_config is not {{\"config\": \"/path/to/switchyard.yaml\", \"listen\": \"127.0.0.1:PORT\" (optional), \"probe\": true|false (optional)}}: {0}")]
    Settings(String),
    #[error("the switchyard filter's `listen` {0} is not a loopback address: the module's HTTP API is plain HTTP without the listener's guards; serve it on 127.0.0.1 (or ::1)")]
    Exposed(SocketAddr),
}

impl EnvoyModuleSettings {
    /// The settings in a filter config's JSON text, checked.
    pub fn parse(json: &[u8]) -> Result<EnvoyModuleSettings, EnvoyModuleError> {
        let settings: EnvoyModuleSettings =
            serde_json::from_slice(json).map_err(|e| EnvoyModuleError::Settings(e.to_string()))?;
        if let Some(listen) = settings.listen.filter(|l| !l.ip().is_loopback()) {
            return Err(EnvoyModuleError::Exposed(listen));
        }
        Ok(settings)
    }
}
