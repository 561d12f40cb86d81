//! Discovery's side of the fleet through its public API, on a real router: pods become
//! workers, a relist changes nothing, pods that stop being Ready or move leave (and come
//! back at their new address), and a taken worker id is refused without harm.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use switchyard_config::{ConfigSource, KubernetesDiscovery};
use switchyard_discovery::members::{Changes, Members};
use switchyard_discovery::pods::workers;
use switchyard_fleet::router::Router;
use switchyard_fleet::workers::WorkerSpec;
use switchyard_plugin_sdk::WorkerId;

fn router(yaml: &str) -> Arc<Router> {
    let source = ConfigSource::parse(yaml.into(), "test.yaml".into(), ".".into()).unwrap();
    Arc::new(Router::new(switchyard_policy::startup::start(source).unwrap()).unwrap())
}

fn pod(name: &str, ip: &str, ready: bool) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "uid": format!("uid-{name}"), "labels": {"app": "vllm"}},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
    }))
    .unwrap()
}

/// The workers `pods` serve on two ports (two ranks each).
fn desired(pods: &[Pod]) -> BTreeMap<WorkerId, WorkerSpec> {
    let settings: KubernetesDiscovery =
        serde_json::from_value(json!({"pool": "pool", "model": "llama"})).unwrap();
    pods.iter()
        .flat_map(|pod| workers(pod, &settings, &[8000, 8001]).unwrap())
        .map(|worker| (worker.id(), worker))
        .collect()
}

fn urls(router: &Router) -> Vec<String> {
    let mut urls: Vec<String> = router.workers().into_iter().filter_map(|w| w.url).collect();
    urls.sort();
    urls
}

#[test]
fn pods_join_stay_through_a_relist_and_leave() {
    let router = router("frontend: {}\n");
    let mut members = Members::default();
    let fleet = desired(&[pod("a", "10.0.0.1", true), pod("b", "10.0.0.2", true)]);
    let added = members.reconcile(&router, &fleet);
    assert_eq!(
        added,
        Changes {
            added: 4,
            removed: 0
        }
    );
    assert_eq!(urls(&router).len(), 4);
    // A relist (after a disconnect) that finds the same pods changes nothing.
    assert_eq!(members.reconcile(&router, &fleet), Changes::default());
    // b stops being Ready; a moves to another IP: b leaves, a leaves and comes back.
    let moved = desired(&[pod("a", "10.0.0.9", true), pod("b", "10.0.0.2", false)]);
    let changes = members.reconcile(&router, &moved);
    assert_eq!(
        changes,
        Changes {
            added: 2,
            removed: 4
        }
    );
    assert_eq!(
        urls(&router),
        ["http://10.0.0.9:8000", "http://10.0.0.9:8001"]
    );
    assert_eq!(members.len(), 2);
    // The pool gone: every discovered worker leaves.
    members.reconcile(&router, &BTreeMap::new());
    assert!(router.workers().is_empty() && members.is_empty());
}

#[test]
fn a_taken_worker_id_is_refused_and_the_configured_worker_kept() {
    let fleet = desired(&[pod("a", "10.0.0.1", true)]);
    let taken = fleet.keys().next().unwrap().worker_id;
    let router = router(&format!(
        "workers:\n  - {{model: other, worker_id: {taken}, url: \"http://10.1.1.1:80\"}}\n"
    ));
    let mut members = Members::default();
    let changes = members.reconcile(&router, &fleet);
    assert_eq!(
        changes,
        Changes {
            added: 1,
            removed: 0
        },
        "rank 1 joins, rank 0 is taken"
    );
    // The configured worker is not discovery's to remove.
    members.reconcile(&router, &BTreeMap::new());
    assert_eq!(urls(&router), ["http://10.1.1.1:80"]);
}
