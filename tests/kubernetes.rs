//! Discovery against a real kube-apiserver (docs/kubernetes.md): the pods of a Gateway API
//! Inference Extension InferencePool join and leave the fleet while requests flow through
//! the OpenAI frontend, and the watches resume after the API server restarts. etcd and
//! kube-apiserver come from scripts/install-test-tools; without them the tests say so and
//! pass, unless SWITCHYARD_KUBERNETES=required. Each pod's engine is an engine-sim on its
//! own loopback address (127.0.0.N, the pod's IP as the test writes it), all on one port:
//! the pool's target port.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Value};
use support::kubernetes::{Api, Cluster};
use support::{
    active_requests, engine_sim, eventually, eventually_ok, free_port, repo, run, serve_logging,
    switchyard_bin, Process,
};

const NS: &str = "serving";
const POOL: &str = "sims";
/// How long a change may take to reach the router: generous, for two noisy cores.
const PATIENCE: Duration = Duration::from_secs(30);

fn pod_ip(pod: usize) -> String {
    format!("127.0.0.{}", 10 + pod)
}

/// An engine-sim per pod, all on one port (the pool's target port).
fn engines(pods: usize) -> (Vec<Process>, u16) {
    let port = free_port();
    let engines = (0..pods)
        .map(|pod| {
            engine_sim(
                &format!("pod-{pod}"),
                &format!("{}:{port}", pod_ip(pod)),
                &[],
            )
        })
        .collect();
    (engines, port)
}

fn create_pool(api: &Api, port: u16) {
    let pool = json!({
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": POOL},
        "spec": {
            "selector": {"matchLabels": {"app": "sim"}},
            "targetPorts": [{"number": port}],
            "endpointPickerRef": {"name": "switchyard", "port": {"number": 9002}},
        },
    });
    let path = format!("/apis/inference.networking.k8s.io/v1/namespaces/{NS}/inferencepools");
    api.ok("POST", &path, Some(&pool));
}

/// Creates pod `pod` (not yet Ready: no kubelet writes its status).
fn create_pod(api: &Api, pod: usize) {
    let object = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{pod}"), "labels": {"app": "sim", "llm-d.ai/model": "demo"}},
        "spec": {"containers": [{"name": "engine", "image": "example.invalid/engine-sim"}]},
    });
    api.ok(
        "POST",
        &format!("/api/v1/namespaces/{NS}/pods"),
        Some(&object),
    );
}

/// Writes pod `pod`'s status as a kubelet would: its IP, and Ready or not.
fn set_ready(api: &Api, pod: usize, ready: bool) {
    let status = json!({"status": {
        "phase": "Running", "podIP": pod_ip(pod), "podIPs": [{"ip": pod_ip(pod)}],
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
    }});
    let path = format!("/api/v1/namespaces/{NS}/pods/pod-{pod}/status");
    api.ok("PATCH", &path, Some(&status));
}

fn delete_pod(api: &Api, pod: usize) {
    let path = format!("/api/v1/namespaces/{NS}/pods/pod-{pod}?gracePeriodSeconds=0");
    api.ok("DELETE", &path, None);
}

/// The router's workers by pod name (the label discovery gives them): worker ids.
fn listed(router: &str) -> BTreeMap<String, Vec<u64>> {
    let workers: Value = ureq::get(&format!("{router}/v1/workers"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    let mut by_pod: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for worker in workers.as_array().unwrap() {
        let pod = worker["labels"]["switchyard.io/pod"]
            .as_str()
            .unwrap_or("?");
        by_pod
            .entry(pod.to_owned())
            .or_default()
            .push(worker["worker_id"].as_u64().unwrap());
    }
    by_pod
}

fn serve_discovering(cluster: &Cluster) -> Process {
    serve_discovering_with(cluster, "switchyard", "")
}

/// `switchyard serve` discovering the test's pool, its config `NAME.yaml` with `extra`.
fn serve_discovering_with(cluster: &Cluster, name: &str, extra: &str) -> Process {
    let config = cluster.dir.path().join(format!("{name}.yaml"));
    let yaml = format!(
        "discovery:\n  kubernetes: {{pool: {POOL}, namespace: {NS}, model: demo, kubeconfig: {}}}\nfrontend: {{health_interval_ms: 200}}\n{extra}",
        cluster.kubeconfig.display()
    );
    std::fs::write(&config, yaml).unwrap();
    serve_logging(&config, "warn,switchyard_discovery=info")
}

/// One request sent through the frontend: when, and the worker that served it.
#[derive(Clone, Debug)]
struct Sent {
    at: Instant,
    worker: Option<u64>,
    status: u16,
    /// What a failed request answered.
    error: Option<String>,
    /// The engine-sim that answered (its name is its pod's).
    engine: Option<String>,
}

/// Chat completions from `streams` threads, each one after the other, until stopped.
struct Traffic {
    stop: Arc<AtomicBool>,
    sent: Arc<Mutex<Vec<Sent>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// One chat completion through the frontend.
fn send(url: &str, body: Value) -> Sent {
    let at = Instant::now();
    let (mut worker, mut engine, mut error) = (None, None, None);
    let status = match ureq::post(url).send_json(body) {
        Ok(answer) => {
            worker = answer
                .header("x-switchyard-worker")
                .and_then(|w| w.parse().ok());
            engine = answer.header("x-engine-name").map(str::to_owned);
            200
        }
        Err(ureq::Error::Status(status, answer)) => {
            error = answer.into_string().ok();
            status
        }
        Err(e) => {
            error = Some(e.to_string());
            0
        }
    };
    Sent {
        at,
        worker,
        status,
        error,
        engine,
    }
}

impl Traffic {
    fn start(router: &str, streams: usize) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..streams)
            .map(|stream| {
                let (stop, sent, url) = (
                    stop.clone(),
                    sent.clone(),
                    format!("{router}/v1/chat/completions"),
                );
                std::thread::spawn(move || {
                    for n in 0.. {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let body = json!({"model": "demo", "max_tokens": 2,
                            "messages": [{"role": "user", "content": format!("s{stream} n{n}")}]});
                        let sent_now = send(&url, body);
                        sent.lock().unwrap().push(sent_now);
                    }
                })
            })
            .collect();
        Traffic {
            stop,
            sent,
            threads,
        }
    }

    /// The first request sent after `since` that worker `id` served, if any yet.
    fn first_served(&self, id: u64, since: Instant) -> Option<Instant> {
        let sent = self.sent.lock().unwrap();
        sent.iter()
            .filter(|s| s.worker == Some(id) && s.at >= since)
            .map(|s| s.at)
            .min()
    }

    fn finish(self) -> Vec<Sent> {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            thread.join().unwrap();
        }
        Arc::try_unwrap(self.sent).unwrap().into_inner().unwrap()
    }
}

/// Makes pod `pod` Ready; waits until the router lists it and, with traffic, until a
/// request sent after the write is routed to it. Its worker id and both delays.
fn join(
    api: &Api,
    router: &str,
    traffic: Option<&Traffic>,
    pod: usize,
) -> (u64, Duration, Option<Duration>) {
    let name = format!("pod-{pod}");
    let written = Instant::now();
    set_ready(api, pod, true);
    let id = eventually_ok(&format!("{name} listed"), PATIENCE, || {
        listed(router).get(&name).map(|ids| ids[0]).ok_or("not yet")
    });
    let seen = written.elapsed();
    let routed = traffic.map(|traffic| {
        eventually_ok(&format!("a request routed to {name}"), PATIENCE, || {
            traffic.first_served(id, written).ok_or("not yet")
        }) - written
    });
    (id, seen, routed)
}

/// Waits until the router no longer lists pod `pod`: the moment the test saw it gone.
fn left(router: &str, pod: usize) -> Instant {
    let name = format!("pod-{pod}");
    eventually(&format!("{name} gone from the router"), PATIENCE, || {
        !listed(router).contains_key(&name)
    });
    Instant::now()
}

/// A stretch in which a worker was out of the fleet: from when the test saw it gone
/// until the test made its pod Ready again (never, for a deleted pod). A request sent
/// in it cannot have been routed to the worker.
struct Out {
    pod: usize,
    id: u64,
    from: Instant,
    until: Option<Instant>,
}

/// Every request answered 200, none routed to a worker while it was out.
fn check(sent: &[Sent], outs: &[Out]) {
    let failed: Vec<_> = sent
        .iter()
        .filter(|s| s.status != 200)
        .map(|s| (s.status, s.worker, s.error.as_deref().unwrap_or("")))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {failed:?}",
        failed.len(),
        sent.len()
    );
    for out in outs {
        let wrong = sent
            .iter()
            .filter(|s| s.worker == Some(out.id) && s.at > out.from)
            .filter(|s| out.until.is_none_or(|until| s.at < until))
            .count();
        assert_eq!(
            wrong, 0,
            "{wrong} requests were routed to pod-{} after it left",
            out.pod
        );
    }
}

/// Prints the delays from a pod's Ready write to the router listing it and to the first
/// request it served (no assertion on them: two noisy cores).
fn report(delays: &[(Duration, Duration)], requests: usize) {
    let summary = |mut values: Vec<Duration>| {
        values.sort();
        format!(
            "median {:?}, max {:?}",
            values[values.len() / 2],
            values[values.len() - 1]
        )
    };
    eprintln!(
        "{} joins, {requests} requests: Ready written -> listed by the router: {}; -> first request routed to it: {}",
        delays.len(),
        summary(delays.iter().map(|d| d.0).collect()),
        summary(delays.iter().map(|d| d.1).collect()),
    );
}

/// A cluster with the namespace, GIE's CRD, the pool and `pods` pods (not Ready), and an
/// engine per pod.
fn pool_with_pods(cluster: &Cluster, pods: usize) -> Vec<Process> {
    let api = cluster.api();
    api.namespace(NS);
    api.inference_pool_crd();
    let (engines, port) = engines(pods);
    create_pool(api, port);
    for pod in 0..pods {
        create_pod(api, pod);
    }
    engines
}

#[test]
fn pods_scale_up_flap_and_scale_down_while_requests_flow() {
    const PODS: usize = 20;
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let _engines = pool_with_pods(&cluster, PODS);
    let api = cluster.api();
    let router = serve_discovering(&cluster);
    let base = router.address.clone();
    let mut ids = vec![join(api, &base, None, 0).0];
    let traffic = Traffic::start(&base, 4);
    let mut delays = Vec::new();
    for pod in 1..PODS {
        let (id, seen, routed) = join(api, &base, Some(&traffic), pod);
        ids.push(id);
        delays.push((seen, routed.unwrap()));
    }
    let mut outs = Vec::new();
    // Flapping: Ready, not Ready, Ready again, a pod at a time.
    for (pod, &first_id) in ids.iter().enumerate().take(PODS / 2) {
        set_ready(api, pod, false);
        let from = left(&base, pod);
        let until = Some(Instant::now());
        let (id, seen, routed) = join(api, &base, Some(&traffic), pod);
        assert_eq!(id, first_id, "pod-{pod} came back under another worker id");
        outs.push(Out {
            pod,
            id,
            from,
            until,
        });
        delays.push((seen, routed.unwrap()));
    }
    // Scaling down: the other half deleted.
    for (pod, &id) in ids.iter().enumerate().skip(PODS / 2) {
        delete_pod(api, pod);
        let from = left(&base, pod);
        outs.push(Out {
            pod,
            id,
            from,
            until: None,
        });
    }
    let sent = traffic.finish();
    check(&sent, &outs);
    report(&delays, sent.len());
    let fleet = listed(&base);
    assert_eq!(fleet.len(), PODS / 2, "{fleet:?}");
    assert!(fleet.values().all(|ids| ids.len() == 1), "{fleet:?}");
}

#[test]
fn watches_resume_after_the_api_server_restarts() {
    let Some(mut cluster) = Cluster::start() else {
        return;
    };
    let _engines = pool_with_pods(&cluster, 4);
    for pod in 0..3 {
        set_ready(cluster.api(), pod, true);
    }
    let router = serve_discovering(&cluster);
    let base = router.address.clone();
    eventually("the three Ready pods listed", PATIENCE, || {
        listed(&base).len() == 3
    });
    let before = listed(&base);
    let traffic = Traffic::start(&base, 2);
    cluster.stop_apiserver();
    // Requests still flow to the pods the router knew while the API server is away.
    let stopped = Instant::now();
    eventually("requests served with the API server down", PATIENCE, || {
        (0..3).all(|pod| {
            traffic
                .first_served(before[&format!("pod-{pod}")][0], stopped)
                .is_some()
        })
    });
    cluster.start_apiserver();
    let api = cluster.api();
    assert_eq!(
        listed(&base),
        before,
        "the restart changed the fleet by itself"
    );
    // Changes made right after the restart: the watch resumes (or lists again) and sees them.
    set_ready(api, 1, false);
    set_ready(api, 3, true);
    delete_pod(api, 0);
    eventually("the fleet follows the changes", PATIENCE, || {
        listed(&base).into_keys().collect::<Vec<_>>() == ["pod-2", "pod-3"]
    });
    let sent = traffic.finish();
    check(&sent, &[]);
    assert!(listed(&base).values().all(|ids| ids.len() == 1));
}

/// The manifests a test applies, in order (gateway.yaml after the Gateway API's CRDs).
const MANIFESTS: [&str; 8] = [
    "namespace.yaml",
    "rbac.yaml",
    "configmap.yaml",
    "nats.yaml",
    "deployment.yaml",
    "service.yaml",
    "inferencepool.yaml",
    "model-server.yaml",
];

/// The objects of deploy/kubernetes/`file`.
fn manifests(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(repo().join("deploy/kubernetes").join(file)).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|document| Value::deserialize(document).unwrap())
        .filter(|object| !object.is_null())
        .collect()
}

/// Where `object` lives in the API (the plural of each kind here is its name in lower
/// case plus `s`).
fn object_path(object: &Value) -> String {
    let api_version = object["apiVersion"].as_str().unwrap();
    let base = if api_version.contains('/') {
        "apis"
    } else {
        "api"
    };
    let plural = format!("{}s", object["kind"].as_str().unwrap().to_lowercase());
    let name = object["metadata"]["name"].as_str().unwrap();
    match object["metadata"]["namespace"].as_str() {
        Some(ns) => format!("/{base}/{api_version}/namespaces/{ns}/{plural}/{name}"),
        None => format!("/{base}/{api_version}/{plural}/{name}"),
    }
}

/// Whether the API server lets switchyard's service account do `verb` on `resource`.
fn allowed(api: &Api, namespace: &str, verb: &str, group: &str, resource: &str) -> bool {
    let review = json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {
            "user": "system:serviceaccount:inference:switchyard",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:inference", "system:authenticated"],
            "resourceAttributes": {"namespace": namespace, "verb": verb, "group": group, "resource": resource},
        },
    });
    let path = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
    api.ok("POST", path, Some(&review))["status"]["allowed"] == json!(true)
}

/// rbac.yaml grants reading pods and pools in the namespace, and nothing more.
fn least_privilege(api: &Api) {
    const POOLS: &str = "inference.networking.k8s.io";
    for verb in ["get", "list", "watch"] {
        assert!(allowed(api, "inference", verb, "", "pods"), "{verb} pods");
        assert!(
            allowed(api, "inference", verb, POOLS, "inferencepools"),
            "{verb} pools"
        );
    }
    for (verb, group, resource) in [
        ("create", "", "pods"),
        ("delete", "", "pods"),
        ("patch", "", "pods"),
        ("get", "", "secrets"),
        ("list", "", "configmaps"),
        ("update", POOLS, "inferencepools"),
    ] {
        assert!(
            !allowed(api, "inference", verb, group, resource),
            "{verb} {resource}"
        );
    }
    assert!(
        !allowed(api, "default", "list", "", "pods"),
        "pods of another namespace"
    );
}

/// Applies deploy/kubernetes/`file` server-side (`dry_run`: validated, not stored).
/// The Gateway API's GatewayClass, Gateway and HTTPRoute CRDs (fetched by
/// scripts/install-test-tools), so gateway.yaml is validated by their schemas.
fn gateway_api_crds(api: &Api) {
    for plural in ["gatewayclasses", "gateways", "httproutes"] {
        let file = support::kubernetes::gateway_api_crd(plural)
            .unwrap_or_else(|why| panic!("{why}; run scripts/install-test-tools"));
        api.crd(&file, plural, "gateway.networking.k8s.io/v1");
    }
}

fn apply_file(api: &Api, file: &str, dry_run: bool) {
    for object in manifests(file) {
        let (status, answer) = api.apply(&object_path(&object), &object, dry_run);
        let what = format!(
            "deploy/kubernetes/{file}: {} {}",
            object["kind"], object["metadata"]["name"]
        );
        assert!(matches!(status, 200 | 201), "{what}: {status} {answer}");
    }
}

#[test]
fn the_manifests_validate_on_the_api_server() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let api = cluster.api();
    api.inference_pool_crd();
    for file in MANIFESTS {
        // The namespace and RBAC for real (the rest is checked in them); the rest dry-run.
        apply_file(api, file, !matches!(file, "namespace.yaml" | "rbac.yaml"));
    }
    gateway_api_crds(api);
    apply_file(api, "gateway.yaml", true);
    let gateway = manifests("gateway.yaml");
    let backend = &gateway[1]["spec"]["rules"][0]["backendRefs"][0];
    assert_eq!(backend["kind"], "InferencePool");
    assert_eq!(
        backend["name"],
        manifests("inferencepool.yaml")[0]["metadata"]["name"]
    );
    least_privilege(api);
    // The ConfigMap's config is one switchyard accepts (with the keys the Secret gives).
    let config = cluster.dir.path().join("config.yaml");
    let configmap = &manifests("configmap.yaml")[0];
    std::fs::write(&config, configmap["data"]["config.yaml"].as_str().unwrap()).unwrap();
    run(std::process::Command::new(switchyard_bin())
        .args(["check", "--config"])
        .arg(&config)
        .env("SWITCHYARD_GATEWAY_KEY", "gateway-key-for-the-test")
        .env("SWITCHYARD_OPERATOR_KEY", "operator-key-for-the-test"));
}

/// rbac.yaml's service account is enough for discovery: switchyard authenticated with its
/// token (as in its pod), the namespace taken from its context, finds the pool of
/// inferencepool.yaml and its Ready pod, and routes to it.
#[test]
fn discovery_runs_as_the_manifests_service_account() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let api = cluster.api();
    api.inference_pool_crd();
    for file in ["namespace.yaml", "rbac.yaml", "inferencepool.yaml"] {
        apply_file(api, file, false);
    }
    let pool = &manifests("inferencepool.yaml")[0];
    let port = pool["spec"]["targetPorts"][0]["number"].as_u64().unwrap();
    let _engine = engine_sim("vllm-0", &format!("127.0.0.40:{port}"), &[]);
    let account =
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}});
    api.ok(
        "POST",
        "/api/v1/namespaces/inference/serviceaccounts",
        Some(&account),
    );
    let labels = pool["spec"]["selector"]["matchLabels"].clone();
    let object = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "vllm-0", "labels": labels},
        "spec": {"containers": [{"name": "vllm", "image": "example.invalid/vllm"}]}});
    api.ok("POST", "/api/v1/namespaces/inference/pods", Some(&object));
    let status = json!({"status": {"podIP": "127.0.0.40", "conditions": [{"type": "Ready", "status": "True"}]}});
    api.ok(
        "PATCH",
        "/api/v1/namespaces/inference/pods/vllm-0/status",
        Some(&status),
    );
    let kubeconfig = cluster.service_account_kubeconfig("inference", "switchyard");
    let config = cluster.dir.path().join("as-service-account.yaml");
    let name = pool["metadata"]["name"].as_str().unwrap();
    let yaml = format!(
        "discovery:\n  kubernetes: {{pool: {name}, model: demo, kubeconfig: {}}}\n",
        kubeconfig.display()
    );
    std::fs::write(&config, yaml).unwrap();
    let router = serve_logging(&config, "warn");
    eventually("the pod listed", PATIENCE, || {
        listed(&router.address).contains_key("vllm-0")
    });
    let body =
        json!({"model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]});
    let sent = send(&format!("{}/v1/chat/completions", router.address), body);
    assert_eq!((sent.status, sent.error), (200, None));
}

/// Three picker replicas watching one pool over one NATS bus name its pods alike, so a
/// request booked through one is counted by the others on the same worker.
#[test]
fn three_replicas_watching_one_pool_share_its_workers_load() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let _engines = pool_with_pods(&cluster, 3);
    for pod in 0..3 {
        set_ready(cluster.api(), pod, true);
    }
    let nats = support::nats::Nats::start(free_port());
    let replicas: Vec<Process> = (0..3)
        .map(|i| {
            let bus = format!("replicas: {{nats: 'nats://127.0.0.1:{}', id: r{i}, heartbeat_ms: 100, peer_ttl_ms: 800}}\n", nats.port);
            serve_discovering_with(&cluster, &format!("replica-{i}"), &bus)
        })
        .collect();
    eventually("every replica lists the three pods", PATIENCE, || {
        replicas.iter().all(|r| listed(&r.address).len() == 3)
    });
    let fleets: Vec<_> = replicas.iter().map(|r| listed(&r.address)).collect();
    assert!(fleets.iter().all(|f| f == &fleets[0]), "{fleets:?}");
    // A long answer (2,000 tokens at the engine's 500 a second) booked through replica 0.
    let url = format!("{}/v1/chat/completions", replicas[0].address);
    let body = json!({"model": "demo", "max_tokens": 2000, "messages": [{"role": "user", "content": "long"}]});
    let long = std::thread::spawn(move || send(&url, body));
    for replica in &replicas[1..] {
        eventually("the other replicas count the booking", PATIENCE, || {
            active_requests(&replica.address).iter().sum::<u64>() == 1
        });
    }
    let sent = long.join().unwrap();
    assert_eq!((sent.status, sent.error), (200, None));
}

/// Through a real Envoy with switchyard as its endpoint picker (docs/envoy.md's config):
/// a pod flapping and a pod deleted while requests flow; none reaches a pod while it is
/// out, the flapped pod is picked again once Ready.
#[test]
fn through_envoy_pods_leave_and_come_back_while_requests_flow() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let _engines = pool_with_pods(&cluster, 4);
    for pod in 0..4 {
        set_ready(cluster.api(), pod, true);
    }
    let picker = free_port();
    let extra = format!("ext_proc: {{listen: '127.0.0.1:{picker}'}}\n");
    let router = serve_discovering_with(&cluster, "picker", &extra);
    eventually("the four pods listed", PATIENCE, || {
        listed(&router.address).len() == 4
    });
    let envoy = support::real_envoy::Envoy::start(cluster.dir.path(), picker);
    let traffic = Traffic::start(&envoy.base, 2);
    let api = cluster.api();
    set_ready(api, 0, false);
    let from = left(&router.address, 0);
    let until = Instant::now();
    let written = Instant::now();
    set_ready(api, 0, true);
    eventually("pod-0 picked again through Envoy", PATIENCE, || {
        traffic
            .sent
            .lock()
            .unwrap()
            .iter()
            .any(|s| s.at > written && s.engine.as_deref() == Some("pod-0"))
    });
    delete_pod(api, 3);
    let deleted = left(&router.address, 3);
    eventually("requests after the deletion", PATIENCE, || {
        traffic
            .sent
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.at > deleted)
            .count()
            >= 20
    });
    let sent = traffic.finish();
    let by_engine = |name: &str, from: Instant, until: Option<Instant>| {
        sent.iter()
            .filter(|s| s.engine.as_deref() == Some(name) && s.at > from)
            .filter(|s| until.is_none_or(|u| s.at < u))
            .count()
    };
    assert_eq!(
        by_engine("pod-0", from, Some(until)),
        0,
        "routed to pod-0 while it was not Ready"
    );
    assert_eq!(
        by_engine("pod-3", deleted, None),
        0,
        "routed to pod-3 after it was deleted"
    );
    let failed: Vec<_> = sent
        .iter()
        .filter(|s| s.status != 200)
        .map(|s| (s.status, s.error.clone()))
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
}

/// A pod whose engine publishes KV events (engine-sim here, vLLM with
/// `--kv-events-config` in a cluster) is subscribed to at the pool's `kv_events` port: the
/// blocks of the prompts it serves reach the router's KV index under its worker.
#[test]
fn discovered_pods_kv_events_reach_the_index() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let api = cluster.api();
    api.namespace(NS);
    api.inference_pool_crd();
    let (port, kv_port) = (free_port(), free_port());
    let publish = format!("tcp://{}:{kv_port}", pod_ip(0));
    let listen = format!("{}:{port}", pod_ip(0));
    let _engine = engine_sim("pod-0", &listen, &["--kv-events", &publish]);
    create_pool(api, port);
    create_pod(api, 0);
    set_ready(api, 0, true);
    let config = cluster.dir.path().join("kv.yaml");
    let yaml = format!(
        "discovery:\n  kubernetes: {{pool: {POOL}, namespace: {NS}, model: demo, kubeconfig: {}, kv_events: {{port: {kv_port}}}}}\n",
        cluster.kubeconfig.display()
    );
    std::fs::write(&config, yaml).unwrap();
    let router = serve_logging(&config, "warn");
    eventually("pod-0 listed", PATIENCE, || {
        listed(&router.address).contains_key("pod-0")
    });
    let url = format!("{}/v1/chat/completions", router.address);
    // Until the subscription is up, what the engine publishes reaches no one: ask again.
    let mut n = 0;
    eventually_ok(
        "the pod's blocks in the router's KV index",
        PATIENCE,
        || {
            n += 1;
            let prompt = format!(
                "request {n}: {}",
                "the quick brown fox jumps over the lazy dog ".repeat(20)
            );
            let body = json!({"model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": prompt}]});
            assert_eq!(send(&url, body).status, 200);
            let workers: Value = ureq::get(&format!("{}/v1/workers", router.address))
                .call()
                .unwrap()
                .into_json()
                .unwrap();
            let held = workers[0]["kv_index"]["held_blocks"][0]
                .as_u64()
                .unwrap_or(0);
            (held > 0).then_some(()).ok_or(workers)
        },
    );
}
