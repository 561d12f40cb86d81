//! The discovery layer on its own, through its public API: from an InferencePool's pod
//! (as the Kubernetes API gives it) to the workers it serves, without a cluster.

use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};
use switchyard_config::KubernetesDiscovery;
use switchyard_discovery::pods::{worker_id, workers, Skipped, POD_LABEL};
use switchyard_plugin_sdk::WorkerType;

fn settings() -> KubernetesDiscovery {
    serde_json::from_value(json!({"pool": "vllm"})).unwrap()
}

/// A pod named `name` at 10.0.0.7, Ready or not, with `labels`.
fn pod(name: &str, ready: bool, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "uid": format!("uid-{name}"), "labels": labels},
        "status": {
            "podIP": "10.0.0.7",
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        },
    }))
    .unwrap()
}

#[test]
fn a_ready_pod_serves_one_worker_per_target_port() {
    let labels = json!({"llm-d.ai/model": "llama", "llm-d.ai/role": "decode"});
    let found = workers(&pod("p0", true, labels), &settings(), &[8000, 8001]).unwrap();
    assert_eq!(found.len(), 2);
    for (rank, worker) in (0u32..).zip(&found) {
        assert_eq!(worker.model, "llama");
        assert_eq!(
            worker.worker_id,
            worker_id("uid-p0"),
            "stable: from the uid"
        );
        assert_eq!(worker.dp_rank, rank, "the port's index is the rank");
        assert_eq!(worker.worker_type, WorkerType::Decode);
        assert_eq!(worker.labels.get(POD_LABEL).map(String::as_str), Some("p0"));
        let url = serde_json::to_value(worker).unwrap()["url"].clone();
        assert_eq!(url, format!("http://10.0.0.7:{}", 8000 + rank), "{url}");
    }
}

#[test]
fn a_pod_not_ready_serves_none_and_a_bad_role_is_named() {
    let labels = json!({"llm-d.ai/model": "llama"});
    assert!(workers(&pod("p1", false, labels), &settings(), &[8000])
        .unwrap()
        .is_empty());
    let labels = json!({"llm-d.ai/model": "llama", "llm-d.ai/role": "encoder"});
    let skipped = workers(&pod("p2", true, labels), &settings(), &[8000]).unwrap_err();
    assert!(
        matches!(&skipped, Skipped::Role { value, .. } if value == "encoder"),
        "{skipped}"
    );
    assert!(skipped.to_string().contains("pod p2"), "{skipped}");
}
