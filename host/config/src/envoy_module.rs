//! The Envoy dynamic module's `filter_config` (docs/envoy.md, "switchyard as an Envoy
//! dynamic module"): the JSON object Envoy hands the module, read here so that the module
//! and `switchyard check --envoy-filter-config` read it alike.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

/// `{"config": PATH, "listen": "127.0.0.1:PORT", "probe": true, "headers_only": false,
/// "model_header": "x-gateway-model-name"}`.
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
    /// Decide at the request headers, the body neither buffered nor read: the model is
    /// named in `model_header`, and the policy sees no prompt (no prefix or KV signal).
    #[serde(default)]
    pub headers_only: bool,
    /// `headers_only`: the request header naming the model.
    #[serde(default)]
    pub model_header: Option<String>,
}

fn yes() -> bool {
    true
}

/// Where a headers-only filter reads the model by default: the header the Inference
/// Extension's body-based routing sets.
pub const DEFAULT_MODEL_HEADER: &str = "x-gateway-model-name";

/// Why a module filter config was refused.
#[derive(Debug, thiserror::Error)]
pub enum EnvoyModuleError {
    #[error("the switchyard filter's filter_config is not {{\"config\": \"/path/to/switchyard.yaml\", \"listen\": \"127.0.0.1:PORT\" (optional), \"probe\": true|false (optional), \"headers_only\": true|false (optional), \"model_header\": \"x-gateway-model-name\" (optional)}}: {0}")]
    Settings(String),
    #[error("the switchyard filter's `listen` {0} is not a loopback address: the module's HTTP API is plain HTTP without the listener's guards; serve it on 127.0.0.1 (or ::1)")]
    Exposed(SocketAddr),
    #[error("the switchyard filter's `model_header` is read only with `\"headers_only\": true` (the model is otherwise read from the body): add `\"headers_only\": true`, or drop `model_header`")]
    ModelHeaderUnused,
    #[error("the switchyard filter's `model_header` {0:?} is not a lowercase HTTP header name: name it as `x-gateway-model-name` is named")]
    ModelHeader(String),
    #[error("{config}: the switchyard filter is `\"headers_only\": true` (decided without the request body), but this config routes on the prompt ({reads}); drop `headers_only` from the filter config, or those settings from {config}")]
    NeedsPrompt { config: String, reads: String },
}

impl EnvoyModuleSettings {
    /// The settings in a filter config's JSON text, checked.
    pub fn parse(json: &[u8]) -> Result<EnvoyModuleSettings, EnvoyModuleError> {
        let settings: EnvoyModuleSettings =
            serde_json::from_slice(json).map_err(|e| EnvoyModuleError::Settings(e.to_string()))?;
        if let Some(listen) = settings.listen.filter(|l| !l.ip().is_loopback()) {
            return Err(EnvoyModuleError::Exposed(listen));
        }
        match &settings.model_header {
            Some(_) if !settings.headers_only => return Err(EnvoyModuleError::ModelHeaderUnused),
            Some(name) if !is_header_name(name) => {
                return Err(EnvoyModuleError::ModelHeader(name.clone()))
            }
            _ => {}
        }
        Ok(settings)
    }

    /// `headers_only`: the header naming the model; None when the body is read.
    pub fn model_header(&self) -> Option<&str> {
        self.headers_only
            .then(|| self.model_header.as_deref().unwrap_or(DEFAULT_MODEL_HEADER))
    }

    /// A headers-only filter against the switchyard config it names: refused when the
    /// config routes on the prompt (a predicted or event-fed KV index, a tokenizer),
    /// which a decision without the body cannot give it.
    pub fn check_config(&self, source: &crate::ConfigSource) -> Result<(), EnvoyModuleError> {
        if !self.headers_only {
            return Ok(());
        }
        let config = &source.config;
        let mut reads = Vec::new();
        for (model, settings) in &config.models {
            if settings.kv_tracking == crate::KvTracking::Predicted {
                reads.push(format!("models.{model}.kv_tracking: predicted"));
            }
            if settings.tokenizer.is_some() {
                reads.push(format!("models.{model}.tokenizer"));
            }
        }
        for worker in config.workers.iter().filter(|w| w.kv_events.is_some()) {
            reads.push(format!("worker {}'s kv_events", worker.worker_id));
        }
        // Pods found on Kubernetes publish KV events too when discovery says where.
        if let Some(discovery) = &config.discovery {
            if discovery.kubernetes.kv_events.is_some() {
                reads.push("discovery.kubernetes.kv_events".to_owned());
            }
        }
        if reads.is_empty() {
            return Ok(());
        }
        Err(EnvoyModuleError::NeedsPrompt {
            config: source.name.clone(),
            reads: reads.join(", "),
        })
    }
}

/// A lowercase HTTP header name (Envoy keeps request header names lowercase).
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(json: &str) -> Result<EnvoyModuleSettings, EnvoyModuleError> {
        EnvoyModuleSettings::parse(json.as_bytes())
    }

    #[test]
    fn headers_only_reads_the_model_from_its_header() {
        let body = settings(r#"{"config": "s.yaml"}"#).unwrap();
        assert_eq!(body.model_header(), None);
        let default = settings(r#"{"config": "s.yaml", "headers_only": true}"#).unwrap();
        assert_eq!(default.model_header(), Some(DEFAULT_MODEL_HEADER));
        let named =
            settings(r#"{"config": "s.yaml", "headers_only": true, "model_header": "x-model"}"#);
        assert_eq!(named.unwrap().model_header(), Some("x-model"));
        let unused = settings(r#"{"config": "s.yaml", "model_header": "x-model"}"#);
        assert!(matches!(unused, Err(EnvoyModuleError::ModelHeaderUnused)));
        let upper =
            settings(r#"{"config": "s.yaml", "headers_only": true, "model_header": "X-Model"}"#);
        assert!(matches!(upper, Err(EnvoyModuleError::ModelHeader(_))));
    }

    #[test]
    fn headers_only_is_refused_for_a_config_that_routes_on_the_prompt() {
        let source = |yaml: &str| {
            crate::ConfigSource::parse(yaml.to_owned(), "s.yaml".into(), ".".into()).unwrap()
        };
        let headers_only = settings(r#"{"config": "s.yaml", "headers_only": true}"#).unwrap();
        let workers = "workers:\n  - {model: demo, worker_id: 1, url: 'http://127.0.0.1:8000'}\n";
        let off = source(&format!("models:\n  demo: {{kv_tracking: off}}\n{workers}"));
        assert!(headers_only.check_config(&off).is_ok());
        let predicted = source(&format!(
            "models:\n  demo: {{kv_tracking: predicted}}\n{workers}"
        ));
        let error = headers_only
            .check_config(&predicted)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("s.yaml: ") && error.contains("models.demo.kv_tracking: predicted"),
            "{error}"
        );
        let reads_body = settings(r#"{"config": "s.yaml"}"#).unwrap();
        assert!(reads_body.check_config(&predicted).is_ok());
        let discovered = |kv_events: &str| {
            source(&format!(
                "models:\n  demo: {{kv_tracking: off}}\ndiscovery:\n  kubernetes: {{pool: sims, model: demo{kv_events}}}\n"
            ))
        };
        assert!(headers_only.check_config(&discovered("")).is_ok());
        let error = headers_only
            .check_config(&discovered(", kv_events: {port: 5557}"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("discovery.kubernetes.kv_events"), "{error}");
    }
}
