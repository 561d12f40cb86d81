//! The Gateway API Inference Extension's data-plane contract for endpoint pickers,
//! checked locally (issue 52 item 4). GIE's conformance suite certifies gateways and needs
//! a cluster; its endpoint-picker checks are replayed here with a real Envoy (docs/envoy.md's
//! configs, read from the page), the `switchyard` binary as picker and `engine-sim`
//! engines standing for pods on loopback addresses (`127.0.0.2`, `127.0.0.3`, ...: a pod's
//! IP, one engine per data-parallel rank, each named `pod{i}-r{rank}` in `x-engine-name`,
//! which plays the echo server's pod name).
//!
//! Followed field by field from GIE's sources, kubernetes-sigs/gateway-api-inference-extension
//! at commit 84436a96b9e6ce2b59ddacd3d04c31b4fbd442de (main, 2026-08-18; v1.6.0 is
//! 992e5c292afb) for `conformance/` and the protocol
//! (`docs/proposals/004-endpoint-picker-protocol/README.md`), and at
//! 1748e829d1161147aaf35e76699ec86fd88406d2 (the last with the full picker in `pkg/epp`)
//! for its test-only plugins:
//! - `conformance/tests/gateway_following_epp_routing.go`: each pod pinned alone by
//!   `test-epp-endpoint-selection: IP`, then one, two and three pods named: every answer
//!   200 and from a named pod (GIE sends 100 at 10 at once; 20 at 4 here).
//! - `conformance/tests/gateway_following_epp_routing_dp.go`: the same with several
//!   target ports (ranks) per pod, entries `IP` (any rank) and `IP:port` (that rank).
//! - `conformance/tests/gateway_destination_endpoint_served.go` with
//!   `pkg/epp/framework/plugins/requestcontrol/test/responsereceived/destination_endpoint_served_verifier.go`:
//!   `x-conformance-test-served-endpoint` is `envoy.lb` /
//!   `x-gateway-destination-endpoint-served` as the gateway reported it (`IP:port`).
//! - `pkg/epp/framework/plugins/scheduling/test/filter/request_header_based_filter.go`
//!   and `consts.go`: how the header is parsed (`IP`, `IP:port`, IPv6 with or without
//!   brackets); `pkg/lwepp/handlers/request.go`: a header that matches nothing leaves no
//!   candidate (503, as the protocol says of an empty subset).
//! - `conformance/tests/epp_unavailable_fail_open.go`: pinned while the picker is up, still
//!   served (by any pod) once it is down, with the pool's `failureMode: FailOpen`; the
//!   default FailClose refuses.
//! - the protocol's "Destination Endpoint": one endpoint or an ordered fallback list in
//!   the header and `envoy.lb` metadata alike; 503 with no ready endpoint, 429 for a
//!   request dropped, both as immediate responses; its "Health Checking": `liveness`,
//!   `readiness` and `envoy.service.ext_proc.v3.ExternalProcessor` answer SERVING, and
//!   `conformance/resources/base.yaml` probes `inference-extension`.
//!
//! Where switchyard's reading differs: GIE's filter keeps one endpoint per IP (its
//! de-duplication), so `IP:3000,IP:3002` would keep the first rank only; here both are
//! kept. The header narrows the gateway's subset hint (as the full picker's filter runs
//! after it; the lightweight picker lets the header replace it). The header is taken only
//! with `ext_proc.test_endpoint_selection: true`, as GIE's picker takes it only with its
//! test plugin configured.
//!
//! Envoy comes from `scripts/install-test-tools`, as for tests/envoy.rs.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::json;
use support::real_envoy::{blocks, envoy_config, fallback_config, Envoy};
use support::*;

const SELECTION: &str = "test-epp-endpoint-selection";
const SERVED_REPORT: &str = "x-conformance-test-served-endpoint";
const PICKED_HEADER: &str = "x-test-picked-in-header";
const PICKED_METADATA: &str = "x-test-picked-in-metadata";

/// A pod: its loopback IP and one engine per rank.
struct Pod {
    ip: String,
    ranks: Vec<Process>,
}

/// `count` pods of `ranks` engines each, at 127.0.0.2, 127.0.0.3, ...
fn pods(count: usize, ranks: usize) -> Vec<Pod> {
    (0..count)
        .map(|i| {
            let ip = format!("127.0.0.{}", i + 2);
            let ranks = (0..ranks)
                .map(|r| engine_sim(&format!("pod{i}-r{r}"), &format!("{ip}:0"), &[]))
                .collect();
            Pod { ip, ranks }
        })
        .collect()
}

fn address(engine: &Process) -> SocketAddr {
    engine
        .address
        .trim_start_matches("http://")
        .parse()
        .unwrap()
}

fn names(pod: usize, ranks: usize) -> Vec<String> {
    (0..ranks).map(|r| format!("pod{pod}-r{r}")).collect()
}

/// switchyard as the picker on `port`, every pod's engines its workers (ids from 1, pod
/// by pod), with `settings` (the `ext_proc:` line and any other section). `check` must
/// pass on the config; its warnings are returned.
fn picker(dir: &Path, port: u16, pods: &[Pod], settings: &str) -> (Process, String) {
    let workers = demo_workers(pods.iter().flat_map(|p| &p.ranks), true);
    let config = write_config(dir, &format!("{settings}workers:\n{workers}"));
    let warnings = check_passes(&config);
    (serve_with_picker(&config, port), warnings)
}

/// The picker's settings for these checks: GIE's test header taken, engines probed often.
fn conformance_settings(port: u16, ext_proc: &str) -> String {
    format!(
        "frontend: {{health_interval_ms: 100, unhealthy_cooldown_ms: 300, health_timeout_ms: 200}}\n\
         ext_proc: {{listen: \"127.0.0.1:{port}\", test_endpoint_selection: true{ext_proc}}}\n"
    )
}

/// What the client saw of one request.
#[derive(Debug)]
struct Reply {
    status: u16,
    /// The engine (`pod{i}-r{rank}`) that answered, if one did.
    engine: String,
    /// `x-conformance-test-served-endpoint`.
    served: Option<String>,
    /// The pick as Envoy held it in the request header and in the `envoy.lb` metadata
    /// (`echoing_the_pick`'s response headers).
    picked: (Option<String>, Option<String>),
    retry_after: Option<String>,
    body: String,
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(20))
        .build()
}

/// GIE's request (a completion of its prompt) through Envoy at `base`, the pods named by
/// `selection` when given; `user` is the OpenAI `user` (the tenant).
fn send(base: &str, selection: Option<&str>, n: usize, user: Option<&str>) -> Reply {
    let mut body = json!({"model": "demo", "max_tokens": 4,
        "prompt": format!("Write as if you were a critic: San Francisco {n}")});
    if let Some(user) = user {
        body["user"] = json!(user);
    }
    let mut request = agent().post(&format!("{base}/v1/completions"));
    if let Some(selection) = selection {
        request = request.set(SELECTION, selection);
    }
    let response = match request.send_json(body) {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => {
            return Reply {
                status: 0,
                engine: String::new(),
                served: None,
                picked: (None, None),
                retry_after: None,
                body: e.to_string(),
            }
        }
    };
    let header = |name: &str| response.header(name).map(str::to_owned);
    let (engine, served, retry_after) = (
        header("x-engine-name"),
        header(SERVED_REPORT),
        header("retry-after"),
    );
    Reply {
        status: response.status(),
        engine: engine.unwrap_or_default(),
        served,
        picked: (header(PICKED_HEADER), header(PICKED_METADATA)),
        retry_after,
        body: response.into_string().unwrap_or_default(),
    }
}

/// Envoy sends to the picker once its gRPC health check passes; until then requests fail.
fn wait_until_routing(envoy: &Envoy) {
    eventually(
        "Envoy routes through the picker",
        Duration::from_secs(20),
        || send(&envoy.base, None, 0, None).status == 200,
    );
}

/// GIE's `assertTrafficOnlyReachesToExpectedPods`, bounded: 4 clients send 5 requests
/// each naming `selection`; every one is answered 200 by an engine of `allowed`.
fn only_reaches(envoy: &Envoy, selection: &str, allowed: &[String]) {
    let replies: Vec<Reply> = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..4)
            .map(|c| {
                scope.spawn(move || {
                    (0..5)
                        .map(|i| send(&envoy.base, Some(selection), c * 5 + i, None))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        clients
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect()
    });
    for reply in replies {
        assert_eq!(reply.status, 200, "{selection}: {reply:?}");
        assert!(
            allowed.contains(&reply.engine),
            "{SELECTION}: {selection} reached {}, not one of {allowed:?}",
            reply.engine
        );
    }
}

/// `GatewayFollowingEPPRouting`: each pod pinned alone, then one, two and all three named.
#[test]
fn header_selection_keeps_traffic_on_the_named_pods() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let pods = pods(3, 1);
    let port = free_port();
    let (_router, warnings) = picker(dir.path(), port, &pods, &conformance_settings(port, ""));
    assert!(
        warnings.contains("ext_proc.test_endpoint_selection is on"),
        "check warns while clients may choose endpoints: {warnings}"
    );
    let envoy = Envoy::start(dir.path(), port);
    wait_until_routing(&envoy);
    for (i, pod) in pods.iter().enumerate() {
        let reply = send(&envoy.base, Some(&pod.ip), i, None);
        assert_eq!(
            (reply.status, reply.engine.as_str()),
            (200, names(i, 1)[0].as_str()),
            "{reply:?}"
        );
    }
    let ip = |i: usize| pods[i].ip.as_str();
    only_reaches(&envoy, ip(2), &names(2, 1));
    only_reaches(
        &envoy,
        &format!("{},{}", ip(0), ip(1)),
        &[names(0, 1), names(1, 1)].concat(),
    );
    let all = format!("{}, {} ,{}", ip(0), ip(1), ip(2));
    only_reaches(
        &envoy,
        &all,
        &[names(0, 1), names(1, 1), names(2, 1)].concat(),
    );
}

/// `GatewayFollowingEPPRoutingWithDataParallelism`: pods of two ranks (ports) each; `IP`
/// names every rank of a pod, `IP:port` the one.
#[test]
fn header_selection_with_data_parallel_ranks() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let pods = pods(3, 2);
    let port = free_port();
    let _router = picker(dir.path(), port, &pods, &conformance_settings(port, "")).0;
    let envoy = Envoy::start(dir.path(), port);
    wait_until_routing(&envoy);
    for (i, pod) in pods.iter().enumerate() {
        let reply = send(&envoy.base, Some(&pod.ip), i, None);
        assert_eq!(reply.status, 200, "{reply:?}");
        assert!(names(i, 2).contains(&reply.engine), "pod {i}: {reply:?}");
    }
    let rank = |pod: usize, r: usize| address(&pods[pod].ranks[r]).to_string();
    // One pod, any rank.
    only_reaches(&envoy, &pods[1].ip, &names(1, 2));
    // Two pods, one of them at a fixed rank.
    only_reaches(
        &envoy,
        &format!("{},{}", pods[0].ip, rank(2, 1)),
        &[names(0, 2), vec!["pod2-r1".to_owned()]].concat(),
    );
    // Every pod, one restricted to its rank 0 (GIE's `3000,3004` of three).
    only_reaches(
        &envoy,
        &format!("{},{},{}", pods[0].ip, rank(1, 0), pods[2].ip),
        &[names(0, 2), vec!["pod1-r0".to_owned()], names(2, 2)].concat(),
    );
}

/// docs/envoy.md's served-endpoint report (its conformance section) added to `config`:
/// the route names the host that served (unless it does already), and a
/// `header_to_metadata` filter before the router moves that into `envoy.lb`.
fn reporting_served(config: &str) -> String {
    let doc = std::fs::read_to_string(repo().join("docs/envoy.md")).unwrap();
    let snippet = blocks(&doc, "yaml")
        .into_iter()
        .find(|b| b.contains("header_to_metadata"))
        .expect("docs/envoy.md has the served-endpoint report");
    let (route, filter) = snippet.split_once("---\n").expect("route, `---`, filter");
    let indent = |text: &str, by: usize| -> String {
        text.lines()
            .map(|l| format!("{}{l}\n", " ".repeat(by)))
            .collect()
    };
    let mut config = config.to_owned();
    if !config.contains("x-gateway-destination-endpoint-served") {
        let timeout = "                            timeout: 0s            # answers stream for as long as they take\n";
        assert!(config.contains(timeout), "docs/envoy.md's route changed");
        config = config.replacen(timeout, &format!("{timeout}{}", indent(route, 26)), 1);
    }
    let router = "                  - name: envoy.filters.http.router\n";
    assert!(
        config.contains(router),
        "docs/envoy.md's filter list changed"
    );
    config.replacen(router, &format!("{}{router}", indent(filter, 18)), 1)
}

/// `config` (with the route's served-endpoint header) whose route also tells the client
/// the pick as Envoy held it: the request header and the `envoy.lb` metadata.
fn echoing_the_pick(config: &str) -> String {
    let served =
        "- header: { key: x-gateway-destination-endpoint-served, value: \"%UPSTREAM_HOST%\" }\n";
    let at = config.find(served).expect("the route reports who served") + served.len();
    let indent = &config[config[..at - served.len()].rfind('\n').unwrap() + 1..at - served.len()];
    let echo = format!(
        "{indent}- header: {{ key: {PICKED_HEADER}, value: \"%REQ(x-gateway-destination-endpoint)%\" }}\n\
         {indent}- header: {{ key: {PICKED_METADATA}, value: \"%DYNAMIC_METADATA(envoy.lb:x-gateway-destination-endpoint)%\" }}\n"
    );
    let mut config = config.to_owned();
    config.insert_str(at, &echo);
    config
}

/// `GatewayDestinationEndpointServed`: each pod pinned, and the response says it served
/// (`IP:port`, from the `envoy.lb` metadata Envoy reports). Then the protocol's fallback
/// list: with two pods named, the first refusing connections, Envoy's retry goes down the
/// list to the second, which the report and the booking follow.
#[test]
fn the_served_endpoint_is_reported_and_fallbacks_stay_in_the_selection() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let mut pods = pods(3, 1);
    let port = free_port();
    // Probed at start only: a killed engine stays the policy's first choice (lowest id).
    let settings = format!(
        "frontend: {{health_interval_ms: 600000}}\n\
         ext_proc: {{listen: \"127.0.0.1:{port}\", test_endpoint_selection: true, fallback_endpoints: 1}}\n\
         worker_selection:\n  default: by-id\n  instances:\n    - name: by-id\n      \
         picker: {{type: builtin.lowest-cost, parameters: {{tie_break: worker-id}}}}\n"
    );
    let (router, _) = picker(dir.path(), port, &pods, &settings);
    let engines: Vec<SocketAddr> = pods.iter().map(|p| address(&p.ranks[0])).collect();
    let listen = free_port();
    let config = echoing_the_pick(&reporting_served(&fallback_config(listen, port, &engines)));
    let envoy = Envoy::start_with(dir.path(), listen, &config);
    wait_until_routing(&envoy);
    for (i, pod) in pods.iter().enumerate() {
        let reply = send(&envoy.base, Some(&pod.ip), i, None);
        assert_eq!(
            (reply.status, reply.engine.as_str()),
            (200, names(i, 1)[0].as_str()),
            "{reply:?}"
        );
        assert_eq!(reply.served, Some(engines[i].to_string()), "{reply:?}");
        // One pod named: no fallback outside it, in the header and the metadata alike.
        let pick = Some(engines[i].to_string());
        assert_eq!(reply.picked, (pick.clone(), pick), "{reply:?}");
    }
    // Pods 1 and 2 named, pod 1 gone: picked (lowest id named), its fallback pod 2 serves.
    pods[1].ranks[0].kill();
    wait_for_no_bookings(&router.address, Duration::from_secs(10));
    let rebooks = metric(&router.address, "switchyard_ext_proc_rebooks_total");
    let named = format!("{},{}", pods[1].ip, pods[2].ip);
    for n in 0..3 {
        let reply = send(&envoy.base, Some(&named), n, None);
        assert_eq!(
            (reply.status, reply.engine.as_str()),
            (200, "pod2-r0"),
            "{reply:?}"
        );
        assert_eq!(reply.served, Some(engines[2].to_string()), "{reply:?}");
        let list = Some(format!("{},{}", engines[1], engines[2]));
        assert_eq!(
            reply.picked,
            (list.clone(), list),
            "the ordered list: {reply:?}"
        );
        wait_for_no_bookings(&router.address, Duration::from_secs(10));
    }
    assert_eq!(
        metric(&router.address, "switchyard_ext_proc_rebooks_total") - rebooks,
        3.0,
        "each booking moved to the endpoint that served"
    );
}

/// docs/envoy.md's FailOpen: `failure_mode_allow: true` on its override-host config, and
/// the picker cluster's panic threshold at 0 (read from the page); the picker's health
/// checked every 200 ms, with traffic or without, and out at the first failure, so the
/// test need not wait the minute of Envoy's default `no_traffic_interval`.
fn fail_open_config(listen: u16, picker: u16, engines: &[SocketAddr]) -> String {
    let doc = std::fs::read_to_string(repo().join("docs/envoy.md")).unwrap();
    let threshold = blocks(&doc, "yaml")
        .into_iter()
        .find(|b| b.contains("healthy_panic_threshold"))
        .expect("docs/envoy.md has FailOpen's panic threshold");
    let mut config = fallback_config(listen, picker, engines);
    for (from, to) in [
        ("failure_mode_allow: false", "failure_mode_allow: true".to_owned()),
        (
            "      health_checks:\n        - timeout: 1s\n          interval: 5s\n          unhealthy_threshold: 3\n",
            format!(
                "{}      health_checks:\n        - timeout: 1s\n          interval: 0.2s\n          no_traffic_interval: 0.2s\n          unhealthy_threshold: 1\n",
                threshold.lines().map(|l| format!("      {l}\n")).collect::<String>()
            ),
        ),
    ] {
        assert!(config.contains(from), "docs/envoy.md's config no longer has `{from}`");
        config = config.replacen(from, &to, 1);
    }
    config
}

/// `EppUnAvailableFailOpen`: pinned while the picker is up; once it is down, a pool with
/// `failureMode: FailOpen` is still served, by any pod (eventually, as GIE expects: once
/// Envoy's health check has seen the picker go), and GIE's default FailClose (the main
/// config) refuses.
#[test]
fn fail_open_serves_without_the_picker_and_fail_closed_does_not() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let pods = pods(2, 1);
    let port = free_port();
    let mut router = picker(dir.path(), port, &pods, &conformance_settings(port, "")).0;
    let engines: Vec<SocketAddr> = pods.iter().map(|p| address(&p.ranks[0])).collect();
    let listen = free_port();
    let open = Envoy::start_with(
        dir.path(),
        listen,
        &fail_open_config(listen, port, &engines),
    );
    let closed = Envoy::start(dir.path(), port);
    wait_until_routing(&open);
    wait_until_routing(&closed);
    // Phase 1: the picker is up, so the header pins.
    for envoy in [&open, &closed] {
        let reply = send(&envoy.base, Some(&pods[1].ip), 1, None);
        assert_eq!(
            (reply.status, reply.engine.as_str()),
            (200, "pod1-r0"),
            "{reply:?}"
        );
    }
    // Phase 2: the picker down.
    router.kill();
    let all = [names(0, 1), names(1, 1)].concat();
    // Converged as gateway-api's conformance helper does: several answers in a row (one
    // stream may fail open at once, and the next few fail until the health check sees).
    let mut in_a_row = 0;
    eventually_ok(
        "fail-open serves without the picker",
        Duration::from_secs(20),
        || {
            let reply = send(&open.base, Some(&pods[1].ip), 0, None);
            in_a_row = if reply.status == 200 { in_a_row + 1 } else { 0 };
            (in_a_row == 3).then_some(()).ok_or(format!("{reply:?}"))
        },
    );
    for n in 0..4 {
        let reply = send(&open.base, Some(&pods[1].ip), n, None);
        assert_eq!(reply.status, 200, "fail-open, picker down: {reply:?}");
        assert!(all.contains(&reply.engine), "{reply:?}");
        let reply = send(&closed.base, Some(&pods[1].ip), n, None);
        assert!(reply.status >= 500, "fail-closed, picker down: {reply:?}");
        assert!(reply.engine.is_empty(), "no engine answered: {reply:?}");
    }
}

/// The protocol's errors as immediate responses through Envoy: a selection naming no
/// eligible endpoint is 503 (with a body, as Envoy relays the picker's), for a request
/// with a body and one without; a request the admission drops (its tenant over its rate)
/// is 429 with `retry-after`.
#[test]
fn no_named_endpoint_is_503_and_an_admission_refusal_429() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let pods = pods(2, 1);
    let port = free_port();
    let settings = format!(
        "{}admission: {{rate_limits: {{capped: {{requests_per_s: 0.001, request_burst: 1}}}}}}\n",
        conformance_settings(port, "")
    );
    let _router = picker(dir.path(), port, &pods, &settings).0;
    let envoy = Envoy::start(dir.path(), port);
    wait_until_routing(&envoy);
    for nowhere in ["127.0.0.9", "127.0.0.2:1", "[::1]", "pod-0"] {
        let reply = send(&envoy.base, Some(nowhere), 0, None);
        assert_eq!(reply.status, 503, "{nowhere}: {reply:?}");
        assert!(reply.engine.is_empty(), "{reply:?}");
        assert!(
            reply.body.contains(SELECTION),
            "the picker says why: {reply:?}"
        );
    }
    // Without a body (GET /v1/models) the answer comes at the request headers.
    let models = |selection: &str| match agent()
        .get(&format!("{}/v1/models", envoy.base))
        .set(SELECTION, selection)
        .call()
    {
        Ok(r) | Err(ureq::Error::Status(_, r)) => {
            (r.status(), r.header(SERVED_REPORT).map(str::to_owned))
        }
        Err(e) => panic!("{e}"),
    };
    assert_eq!(models("127.0.0.9").0, 503);
    let (status, served) = models(&pods[1].ip);
    assert_eq!(status, 200);
    assert!(served.is_some(), "the report is on every answered response");
    // Admission: the first of the capped tenant's requests passes, the next is dropped.
    assert_eq!(send(&envoy.base, None, 1, Some("capped")).status, 200);
    let reply = send(&envoy.base, Some(&pods[0].ip), 2, Some("capped"));
    assert_eq!(reply.status, 429, "{reply:?}");
    assert!(reply.retry_after.is_some(), "{reply:?}");
    assert!(reply.body.contains("rate_limit_exceeded"), "{reply:?}");
}

/// The protocol's health services (and the `inference-extension` GIE's conformance
/// manifests probe) answer SERVING over gRPC health, as a gateway's or kubelet's probe
/// asks.
#[test]
fn grpc_health_answers_serving_for_every_service_gie_probes() {
    let _one = one_at_a_time();
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let dir = tempfile::tempdir().unwrap();
    let pods = pods(1, 1);
    let port = free_port();
    let _router = picker(dir.path(), port, &pods, &conformance_settings(port, "")).0;
    runtime().block_on(async {
        let _ = support::envoy::client(port).await; // waits until it is up
        let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut health = HealthClient::new(channel);
        for service in [
            "liveness",
            "readiness",
            "envoy.service.ext_proc.v3.ExternalProcessor",
            "inference-extension",
        ] {
            let request = HealthCheckRequest {
                service: service.into(),
            };
            let status = health.check(request).await.unwrap().into_inner().status;
            assert_eq!(status, ServingStatus::Serving as i32, "{service}");
        }
    });
}

/// Off (the default), the header chooses nothing and nothing is reported: the by-id
/// policy's choice (worker 1, pod 0) stands against a header naming pod 2.
#[test]
fn without_the_setting_the_header_chooses_nothing() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let pods = pods(3, 1);
    let port = free_port();
    let settings = format!(
        "ext_proc: {{listen: \"127.0.0.1:{port}\"}}\n\
         worker_selection:\n  default: by-id\n  instances:\n    - name: by-id\n      \
         picker: {{type: builtin.lowest-cost, parameters: {{tie_break: worker-id}}}}\n"
    );
    let (router, warnings) = picker(dir.path(), port, &pods, &settings);
    assert!(!warnings.contains("test_endpoint_selection"), "{warnings}");
    let listen = free_port();
    let envoy = Envoy::start_with(
        dir.path(),
        listen,
        &reporting_served(&envoy_config(listen, port)),
    );
    wait_until_routing(&envoy);
    wait_for_no_bookings(&router.address, Duration::from_secs(10));
    let reply = send(&envoy.base, Some(&pods[2].ip), 0, None);
    assert_eq!(
        (reply.status, reply.engine.as_str()),
        (200, "pod0-r0"),
        "{reply:?}"
    );
    assert_eq!(reply.served, None, "{reply:?}");
}

/// The setting is `true` or `false`; anything else is refused at its line, saying what it
/// does.
#[test]
fn the_setting_takes_true_or_false_and_names_its_line() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    for (value, got) in [
        ("yes", "(got \"yes\")"),
        ("1", "(got 1)"),
        ("", "(got nothing)"),
    ] {
        let error = start_error(
            dir.path(),
            &format!("ext_proc:\n  listen: 127.0.0.1:0\n  test_endpoint_selection: {value}\n"),
        );
        assert!(error.contains("config.yaml:3"), "{error}");
        assert!(
            error.contains(&format!("test_endpoint_selection is true or false {got}")),
            "{error}"
        );
        assert!(error.contains("conformance tests only"), "{error}");
    }
}
