//! The Gateway API Inference Extension's `InferencePool` (`inference.networking.k8s.io/v1`),
//! written from its CRD (GIE v1.6.0, `config/crd/bases/inference.networking.k8s.io_inferencepools.yaml`;
//! a copy is in tests/fixtures/kubernetes/): the fields a picker reads. Fields this
//! router does not use are kept as they came, so nothing a newer CRD adds is refused.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// An InferencePool: which pods serve (by label, in its namespace), on which ports, and
/// the endpoint picker the gateway asks.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct InferencePool {
    pub metadata: ObjectMeta,
    pub spec: InferencePoolSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolSpec {
    /// Pods in the pool's namespace with every one of these labels are its members.
    pub selector: LabelSelector,
    /// The ports of each member, 1 to 8 (several: one engine rank per port).
    pub target_ports: Vec<Port>,
    /// `http` (default) or `kubernetes.io/h2c`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
    /// The endpoint picker (this router, as the gateway reaches it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_picker_ref: Option<EndpointPickerRef>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    pub match_labels: BTreeMap<String, String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct Port {
    pub number: i32,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPickerRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<Port>,
    /// `FailOpen` or `FailClose` (the default): what the gateway does without a picker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_mode: Option<String>,
}

impl k8s_openapi::Resource for InferencePool {
    const API_VERSION: &'static str = "inference.networking.k8s.io/v1";
    const GROUP: &'static str = "inference.networking.k8s.io";
    const KIND: &'static str = "InferencePool";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "inferencepools";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for InferencePool {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl InferencePool {
    /// The Kubernetes label selector of its members: `k1=v1,k2=v2`.
    pub fn label_selector(&self) -> String {
        self.spec
            .selector
            .match_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Its target ports that are valid port numbers, in order (the rank is the index).
    pub fn ports(&self) -> Vec<u16> {
        self.spec
            .target_ports
            .iter()
            .filter_map(|p| u16::try_from(p.number).ok().filter(|&n| n != 0))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_as_the_api_server_returns_it_reads() {
        let pool: InferencePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": "llama", "namespace": "serving"},
            "spec": {
                "selector": {"matchLabels": {"app": "vllm", "tier": "gpu"}},
                "targetPorts": [{"number": 8000}, {"number": 8001}],
                "endpointPickerRef": {"name": "switchyard", "port": {"number": 9002}, "failureMode": "FailOpen"},
                "somethingNewer": true
            },
            "status": {"parents": []}
        }))
        .unwrap();
        assert_eq!(pool.label_selector(), "app=vllm,tier=gpu");
        assert_eq!(pool.ports(), [8000, 8001]);
        let picker = pool.spec.endpoint_picker_ref.unwrap();
        assert_eq!(picker.failure_mode.as_deref(), Some("FailOpen"));
        assert_eq!(
            <InferencePool as kube::Resource>::plural(&()),
            "inferencepools"
        );
    }
}
