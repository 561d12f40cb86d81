//! Workers found on Kubernetes (`discovery:`): the ready pods a Gateway API Inference
//! Extension `InferencePool` selects join the fleet, and leave it when they stop being
//! ready or are deleted (docs/kubernetes.md).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::SectionInvalid;

/// The `discovery:` section; absent: workers come from `workers:` and `POST /v1/workers`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DiscoverySettings {
    pub kubernetes: KubernetesDiscovery,
}

/// `discovery.kubernetes`: one InferencePool (`inference.networking.k8s.io/v1`) and the
/// pods its selector matches.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesDiscovery {
    /// The InferencePool's name.
    pub pool: String,
    /// Its namespace (the pods are in the same one); default: the service account's
    /// namespace in a cluster, the kubeconfig context's otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The pod label whose value is the model a pod serves.
    #[serde(default = "default_model_label")]
    pub model_label: String,
    /// The model of pods without `model_label`; without it such pods are left out (logged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The pod label whose value is its role: `prefill`, `decode`, or `both` /
    /// `aggregated` (the default when absent), as llm-d labels its pods.
    #[serde(default = "default_role_label")]
    pub role_label: String,
    /// A kubeconfig file, relative to the config's folder; default: the service account
    /// in a cluster, else `KUBECONFIG` or `~/.kube/config`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<PathBuf>,
    /// Where each pod's engine publishes KV events (vLLM's `--kv-events-config`), if it
    /// does: the same ports on every pod, plus the rank for each data-parallel rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_events: Option<PodKvEvents>,
}

/// `discovery.kubernetes.kv_events`: the ports of each pod's KV-event sockets.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PodKvEvents {
    /// The engine's PUB socket (vLLM: `"endpoint": "tcp://*:5557"`).
    pub port: u16,
    /// Its replay ROUTER socket, if any (vLLM: `"replay_endpoint": "tcp://*:5558"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_port: Option<u16>,
    /// The topic the engine publishes on (vLLM's default: empty).
    #[serde(default)]
    pub topic: String,
}

fn default_model_label() -> String {
    "llm-d.ai/model".to_owned()
}
fn default_role_label() -> String {
    "llm-d.ai/role".to_owned()
}

/// A Kubernetes object name (RFC 1123 subdomain) or namespace (RFC 1123 label).
fn valid_name(name: &str, max: usize, dots: bool) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !name.is_empty()
        && name.len() <= max
        && name.starts_with(alnum)
        && name.ends_with(alnum)
        && name
            .chars()
            .all(|c| alnum(c) || c == '-' || (dots && c == '.'))
}

/// A label key: an optional DNS prefix and `/`, then a name of at most 63 characters.
fn valid_label_key(key: &str) -> bool {
    let (prefix, name) = key
        .rsplit_once('/')
        .map_or((None, key), |(p, n)| (Some(p), n));
    let name_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    prefix.is_none_or(|p| valid_name(p, 253, true))
        && !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(name_char)
}

impl DiscoverySettings {
    /// Checks what serde cannot; the message names the setting.
    pub fn validate(&self) -> Result<(), SectionInvalid> {
        let k = &self.kubernetes;
        if !valid_name(&k.pool, 253, true) {
            return Err(SectionInvalid::KubernetesName("pool", k.pool.clone()));
        }
        if let Some(namespace) = k.namespace.as_ref().filter(|n| !valid_name(n, 63, false)) {
            return Err(SectionInvalid::KubernetesName(
                "namespace",
                namespace.clone(),
            ));
        }
        for (field, key) in [
            ("model_label", &k.model_label),
            ("role_label", &k.role_label),
        ] {
            if !valid_label_key(key) {
                return Err(SectionInvalid::LabelKey(field, key.clone()));
            }
        }
        if let Some(kv) = &k.kv_events {
            if kv.port == 0 || kv.replay_port == Some(0) {
                return Err(SectionInvalid::KvEventPort);
            }
        }
        if k.model.as_ref().is_some_and(|m| m.trim().is_empty()) {
            return Err(SectionInvalid::EmptyDiscoveryModel);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_label_keys_follow_kubernetes_rules() {
        assert!(valid_name("vllm-llama3-8b", 253, true));
        assert!(!valid_name("Pool", 253, true));
        assert!(!valid_name("-pool", 253, true));
        assert!(!valid_name("a.b", 63, false));
        assert!(valid_label_key("llm-d.ai/role"));
        assert!(valid_label_key("app"));
        assert!(!valid_label_key("llm-d.ai/"));
        assert!(!valid_label_key("bad key"));
    }
}
