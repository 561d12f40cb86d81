//! From a pod to the workers it serves: one per target port of its pool (the port's index
//! is the data-parallel rank) while it is Ready, has an IP and is not being deleted; none
//! otherwise. The same pod always gives the same worker ids, so every picker replica
//! watching the pool names its workers alike.

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use sha2::{Digest, Sha256};
use switchyard_config::KubernetesDiscovery;
use switchyard_fleet::workers::WorkerSpec;

/// The label each discovered worker carries with its pod's name.
pub const POD_LABEL: &str = "switchyard.io/pod";

/// Why a Ready pod gives no workers: said once per pod.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Skipped {
    #[error("pod {pod} has no `{label}` label and discovery.kubernetes.model is not set: label the pod with the model it serves, or set discovery.kubernetes.model")]
    NoModel { pod: String, label: String },
    #[error(
        "pod {pod}: `{label}: {value}` is not a role; expected prefill, decode, both or aggregated"
    )]
    Role {
        pod: String,
        label: String,
        value: String,
    },
    #[error("pod {pod}: its IP `{ip}` is not an IP address")]
    Ip { pod: String, ip: String },
    #[error("pod {pod} has no uid")]
    NoUid { pod: String },
    #[error("pod {pod}: {error}")]
    Invalid { pod: String, error: String },
}

/// A worker id from a pod's uid: the first 52 bits of its SHA-256, so that it is stable
/// across restarts and replicas and exact in JSON numbers.
pub fn worker_id(uid: &str) -> u64 {
    let digest = Sha256::digest(uid.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first) >> 12
}

/// Ready: its `Ready` condition is `True`, and it is not being deleted.
pub fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
}

/// The workers `pod` serves on `ports` (empty while it is not Ready or has no IP).
pub fn workers(
    pod: &Pod,
    settings: &KubernetesDiscovery,
    ports: &[u16],
) -> Result<Vec<WorkerSpec>, Skipped> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref());
    let Some(ip) = ip.filter(|ip| !ip.is_empty() && is_ready(pod)) else {
        return Ok(Vec::new());
    };
    let ip: std::net::IpAddr = ip.parse().map_err(|_| Skipped::Ip {
        pod: name.clone(),
        ip: ip.to_owned(),
    })?;
    let uid = pod
        .metadata
        .uid
        .as_deref()
        .ok_or_else(|| Skipped::NoUid { pod: name.clone() })?;
    let mut labels = pod.metadata.labels.clone().unwrap_or_default();
    let model = labels
        .get(&settings.model_label)
        .or(settings.model.as_ref())
        .cloned()
        .ok_or_else(|| Skipped::NoModel {
            pod: name.clone(),
            label: settings.model_label.clone(),
        })?;
    let role = match labels.get(&settings.role_label).map(String::as_str) {
        None | Some("both" | "aggregated") => "aggregated",
        Some("prefill") => "prefill",
        Some("decode") => "decode",
        Some(other) => {
            return Err(Skipped::Role {
                pod: name,
                label: settings.role_label.clone(),
                value: other.to_owned(),
            })
        }
    };
    labels.insert(POD_LABEL.to_owned(), name.clone());
    let worker_id = worker_id(uid);
    // Through WorkerSpec's own deserializer, as `POST /v1/workers` takes a worker: its
    // defaults apply to what a pod does not say.
    (0u32..)
        .zip(ports)
        .map(|(rank, &port)| {
            let url = format!("http://{}", std::net::SocketAddr::new(ip, port));
            let invalid = |error: String| Skipped::Invalid {
                pod: name.clone(),
                error,
            };
            let kv_events = kv_events(settings, ip, rank).map_err(invalid)?;
            serde_json::from_value(json!({
                "model": model, "worker_id": worker_id, "dp_rank": rank,
                "worker_type": role, "labels": labels, "url": url, "kv_events": kv_events,
            }))
            .map_err(|e| invalid(e.to_string()))
        })
        .collect()
}

/// The KV-event sockets of rank `rank` at `ip` (`kv_events`' ports plus the rank, as vLLM
/// offsets them for data-parallel ranks), or null.
fn kv_events(
    settings: &KubernetesDiscovery,
    ip: std::net::IpAddr,
    rank: u32,
) -> Result<serde_json::Value, String> {
    let Some(kv) = &settings.kv_events else {
        return Ok(serde_json::Value::Null);
    };
    let socket = |port: u16| {
        u16::try_from(u32::from(port) + rank)
            .map(|p| format!("tcp://{}", std::net::SocketAddr::new(ip, p)))
            .map_err(|_| format!("kv_events port {port} + rank {rank} is past 65535"))
    };
    Ok(json!({
        "endpoint": socket(kv.port)?,
        "replay_endpoint": kv.replay_port.map(socket).transpose()?,
        "topic": kv.topic,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> KubernetesDiscovery {
        serde_yaml_like(json!({"pool": "p"}))
    }

    fn serde_yaml_like(value: serde_json::Value) -> KubernetesDiscovery {
        serde_json::from_value(value).unwrap()
    }

    fn pod(ready: &str, labels: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "vllm-0", "uid": "7c1e", "labels": labels},
            "status": {"podIP": "10.1.2.3", "conditions": [{"type": "Ready", "status": ready}]}
        }))
        .unwrap()
    }

    #[test]
    fn a_ready_pod_is_one_worker_per_port_with_its_model_and_role() {
        let labels = json!({"llm-d.ai/model": "llama", "llm-d.ai/role": "decode"});
        let workers = workers(&pod("True", labels), &settings(), &[8000, 8001]).unwrap();
        assert_eq!(workers.len(), 2);
        assert_eq!(workers[1].dp_rank, 1);
        assert_eq!(workers[1].url.as_deref(), Some("http://10.1.2.3:8001"));
        assert_eq!(workers[0].model, "llama");
        assert_eq!(workers[0].worker_id, worker_id("7c1e"));
        assert_eq!(workers[0].labels[POD_LABEL], "vllm-0");
        assert_eq!(
            workers[0].worker_type,
            switchyard_plugin_sdk::WorkerType::Decode
        );
    }

    #[test]
    fn not_ready_unlabelled_and_unknown_roles() {
        let model = json!({"llm-d.ai/model": "llama"});
        assert!(workers(&pod("False", model.clone()), &settings(), &[80])
            .unwrap()
            .is_empty());
        assert!(matches!(
            workers(&pod("True", json!({})), &settings(), &[80]),
            Err(Skipped::NoModel { .. })
        ));
        let fallback = serde_yaml_like(json!({"pool": "p", "model": "m"}));
        assert_eq!(
            workers(&pod("True", json!({})), &fallback, &[80]).unwrap()[0].model,
            "m"
        );
        let odd = json!({"llm-d.ai/model": "llama", "llm-d.ai/role": "encode"});
        assert!(matches!(
            workers(&pod("True", odd), &settings(), &[80]),
            Err(Skipped::Role { .. })
        ));
        assert!(worker_id("any uid") < 1 << 52);
    }

    #[test]
    fn kv_event_sockets_are_the_pods_ports_plus_the_rank() {
        let with_kv =
            serde_yaml_like(json!({"pool": "p", "kv_events": {"port": 5557, "replay_port": 5600}}));
        let labels = json!({"llm-d.ai/model": "llama"});
        let found = workers(&pod("True", labels), &with_kv, &[8000, 8001]).unwrap();
        let kv = found[1].kv_events.as_ref().unwrap();
        assert_eq!(kv.endpoint, "tcp://10.1.2.3:5558");
        assert_eq!(kv.replay_endpoint.as_deref(), Some("tcp://10.1.2.3:5601"));
        assert!(workers(
            &pod("True", json!({"llm-d.ai/model": "m"})),
            &settings(),
            &[80]
        )
        .unwrap()[0]
            .kv_events
            .is_none());
    }
}
