//! The Envoy endpoint picker end to end: `switchyard serve --ext-proc` started here, and a
//! gRPC client that drives each stream exactly as Envoy's ext_proc filter does in
//! `FULL_DUPLEX_STREAMED` mode (protocol config and metadata on the messages, request
//! headers, the body in several chunks, then the response path). There is no Envoy binary
//! on these machines; docs/envoy.md says what this does and does not cover.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value as Json};
use support::envoy::*;
use support::*;

/// `switchyard serve` with `workers` (id, address) of model `demo`, plus `extra` config,
/// the picker on a port of its own; returns the process, the HTTP base and the gRPC port.
fn serve(dir: &std::path::Path, workers: &[(u64, String)], extra: &str) -> (Process, String, u16) {
    let workers: String = workers
        .iter()
        .map(|(id, address)| {
            format!("  - {{model: demo, worker_id: {id}, address: \"{address}\"}}\n")
        })
        .collect();
    let config = write_config(
        dir,
        &format!("models:\n  demo: {{kv_tracking: predicted}}\n{extra}workers:\n{workers}"),
    );
    let port = free_port();
    let process = serve_with_picker(&config, port);
    let base = process.address.clone();
    (process, base, port)
}

fn endpoints(n: u64) -> Vec<(u64, String)> {
    (1..=n).map(|i| (i, listening_address())).collect()
}

fn chat(content: &str) -> Vec<u8> {
    json!({"model": "demo", "max_tokens": 16, "stream": true,
           "messages": [{"role": "user", "content": content}]})
    .to_string()
    .into_bytes()
}

/// Per worker address: (active requests, active prefill tokens).
async fn loads(base: &str) -> HashMap<String, (u64, u64)> {
    let workers: Json = support::get(format!("{base}/v1/workers"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    workers
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            let load = &w["load"];
            (
                w["address"].as_str().unwrap().to_owned(),
                (
                    load["active_requests"].as_u64().unwrap(),
                    load["active_prefill_tokens"].as_u64().unwrap(),
                ),
            )
        })
        .collect()
}

/// Waits (bounded) until nothing is booked anywhere.
async fn wait_for_zero_load(base: &str) {
    eventually_ok_async("no booking left", Duration::from_secs(5), || async {
        let loads = loads(base).await;
        let idle = loads
            .values()
            .all(|&(requests, tokens)| requests == 0 && tokens == 0);
        idle.then_some(()).ok_or_else(|| format!("{loads:?}"))
    })
    .await;
}

#[test]
fn a_request_is_picked_booked_moved_to_decode_and_freed_as_envoy_streams_it() {
    let dir = tempfile::tempdir().unwrap();
    let (_router, base, port) = serve(dir.path(), &endpoints(3), "");
    runtime().block_on(async {
        let mut client = client(port).await;
        let mut envoy = Envoy::open(&mut client, None).await;
        let body = chat(&"a long shared system prompt ".repeat(40));
        let Answer::Picked(endpoint) = envoy.request("/v1/chat/completions", None, &body, 3).await
        else {
            panic!("no pick");
        };
        let booked = loads(&base).await;
        assert_eq!(booked[&endpoint].0, 1, "booked on the pick: {booked:?}");
        assert!(booked[&endpoint].1 > 0, "prefill tokens booked: {booked:?}");
        envoy.response_headers(Some(&endpoint)).await;
        envoy
            .response_chunk(b"data: {\"choices\": []}\n\n", false)
            .await;
        let decoding = loads(&base).await;
        assert_eq!(
            decoding[&endpoint],
            (1, 0),
            "the first chunk ends prefill: {decoding:?}"
        );
        envoy.response_chunk(b"data: [DONE]\n\n", true).await;
        envoy.half_close();
        wait_for_zero_load(&base).await;

        // The same prompt again: its blocks are now predicted on that worker.
        let mut again = Envoy::open(&mut client, None).await;
        let Answer::Picked(second) = again.request("/v1/chat/completions", None, &body, 5).await
        else {
            panic!("no pick");
        };
        assert_eq!(second, endpoint, "prefix affinity through the picker");
        // Envoy resets the stream (client gone) before any response: freed.
        drop(again);
        wait_for_zero_load(&base).await;

        let metrics = support::get(format!("{base}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            metrics.contains("switchyard_ext_proc_picks_total 2"),
            "{metrics}"
        );
    });
}

#[test]
fn envoy_proxies_to_real_engines_at_the_picked_endpoint() {
    // Two engine-sim processes; the stand-in does what Envoy's ORIGINAL_DST cluster does
    // with the pick: it sends the body to that ip:port and streams the answer back
    // through the response path.
    let engines: Vec<Process> = ["a", "b"]
        .iter()
        .map(|name| engine_sim(name, "127.0.0.1:0", &[]))
        .collect();
    let workers: Vec<(u64, String)> = engines
        .iter()
        .enumerate()
        .map(|(i, e)| {
            (
                i as u64 + 1,
                e.address.trim_start_matches("http://").to_owned(),
            )
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let (_router, base, port) = serve(dir.path(), &workers, "");
    runtime().block_on(async {
        let mut client = client(port).await;
        let http = support::http_client();
        let names: HashMap<String, &str> = workers
            .iter()
            .map(|(_, address)| address.clone())
            .zip(["a", "b"])
            .collect();
        for i in 0..6 {
            let body = chat(&format!("a conversation of its own, number {i}"));
            let mut envoy = Envoy::open(&mut client, None).await;
            let Answer::Picked(endpoint) =
                envoy.request("/v1/chat/completions", None, &body, 2).await
            else {
                panic!("no pick");
            };
            let upstream = http
                .post(format!("http://{endpoint}/v1/chat/completions"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            assert!(upstream.status().is_success());
            envoy.response_headers(Some(&endpoint)).await;
            let mut stream = upstream.bytes_stream();
            let mut text = String::new();
            while let Some(chunk) = futures_util::StreamExt::next(&mut stream).await {
                let chunk = chunk.unwrap();
                text.push_str(&String::from_utf8_lossy(&chunk));
                envoy.response_chunk(&chunk, false).await;
            }
            envoy.response_chunk(b"", true).await;
            envoy.half_close();
            assert!(text.contains("[DONE]"), "{text}");
            // engine-sim names itself in every chunk: the picked engine answered.
            let name = format!("\"system_fingerprint\":\"{}\"", names[&endpoint]);
            assert!(text.contains(&name), "{endpoint}: {text}");
        }
        wait_for_zero_load(&base).await;
    });
    drop(engines);
}

#[test]
fn the_subset_hint_is_honoured_and_an_ineligible_subset_is_refused_with_503() {
    let dir = tempfile::tempdir().unwrap();
    let workers = endpoints(3);
    let (_router, base, port) = serve(dir.path(), &workers, "");
    runtime().block_on(async {
        let mut client = client(port).await;
        for target in [&workers[1].1, &workers[2].1] {
            for i in 0..3 {
                let mut envoy = Envoy::open(&mut client, Some(subset_hint(&[target]))).await;
                let answer = envoy
                    .request("/v1/chat/completions", None, &chat(&format!("p{i}")), 2)
                    .await;
                assert!(
                    matches!(&answer, Answer::Picked(e) if e == target),
                    "{answer:?}"
                );
            }
        }
        for subset in [vec!["10.9.9.9:8000"], vec![]] {
            let mut envoy = Envoy::open(&mut client, Some(subset_hint(&subset))).await;
            match envoy
                .request("/v1/chat/completions", None, &chat("x"), 1)
                .await
            {
                Answer::Refused { status, body } => {
                    assert_eq!(status, 503, "{body}");
                    assert!(
                        body["error"]["message"]
                            .as_str()
                            .unwrap()
                            .contains("subset"),
                        "{body}"
                    );
                }
                other => panic!("subset {subset:?}: {other:?}"),
            }
        }
        // A comma-joined string is a subset too (some gateways send that).
        let joined = metadata(
            "envoy.lb.subset_hint",
            "x-gateway-destination-endpoint-subset",
            string(&format!("10.9.9.9:1, {}", workers[0].1)),
        );
        let mut envoy = Envoy::open(&mut client, Some(joined)).await;
        let answer = envoy
            .request("/v1/chat/completions", None, &chat("y"), 1)
            .await;
        assert!(
            matches!(&answer, Answer::Picked(e) if *e == workers[0].1),
            "{answer:?}"
        );
        drop(envoy);
        wait_for_zero_load(&base).await;
    });
}

#[test]
fn the_served_endpoint_gets_the_booking_after_envoy_retried_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let workers = endpoints(2);
    let (_router, base, port) = serve(dir.path(), &workers, "");
    runtime().block_on(async {
        let mut client = client(port).await;
        let mut envoy = Envoy::open(&mut client, None).await;
        let Answer::Picked(picked) = envoy
            .request("/v1/chat/completions", None, &chat("retry me"), 2)
            .await
        else {
            panic!("no pick");
        };
        let other = workers
            .iter()
            .map(|(_, e)| e)
            .find(|e| **e != picked)
            .unwrap()
            .clone();
        envoy.response_headers(Some(&other)).await;
        let moved = loads(&base).await;
        assert_eq!(moved[&picked].0, 0, "{moved:?}");
        assert_eq!(moved[&other].0, 1, "{moved:?}");
        envoy.response_chunk(b"{}", true).await;
        wait_for_zero_load(&base).await;
        let metrics = support::get(format!("{base}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            metrics.contains("switchyard_ext_proc_rebooks_total 1"),
            "{metrics}"
        );
    });
}

#[test]
fn bad_bodies_and_unknown_models_get_openai_errors_as_immediate_responses() {
    let dir = tempfile::tempdir().unwrap();
    let (_router, base, port) = serve(
        dir.path(),
        &endpoints(1),
        "ext_proc: {listen: \"127.0.0.1:1\", max_body_bytes: 4096}\n",
    );
    runtime().block_on(async {
        let mut client = client(port).await;
        let cases: [(&[u8], i32, &str); 5] = [
            (b"not json", 400, "not valid JSON"),
            (br#"{"messages": []}"#, 400, "`model` is required"),
            (
                br#"{"model": "nope", "messages": [{"role": "user", "content": "hi"}]}"#,
                404,
                "nope",
            ),
            (br#"{"model": "demo", "messages": "hi"}"#, 400, "messages"),
            (&[b'x'; 5000], 413, "max_body_bytes"),
        ];
        for (body, expected, needle) in cases {
            let mut envoy = Envoy::open(&mut client, None).await;
            match envoy.request("/v1/chat/completions", None, body, 2).await {
                Answer::Refused { status, body } => {
                    assert_eq!(status, expected, "{body}");
                    let message = body["error"]["message"].as_str().unwrap();
                    assert!(message.contains(needle), "{message}");
                }
                other => panic!("{}: {other:?}", String::from_utf8_lossy(body)),
            }
        }
        wait_for_zero_load(&base).await;
        let metrics = support::get(format!("{base}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            metrics.contains("switchyard_ext_proc_refusals_total 5"),
            "{metrics}"
        );
    });
}

#[test]
fn requests_over_the_per_worker_limit_are_shed_with_429() {
    let dir = tempfile::tempdir().unwrap();
    let extra = "ext_proc: {listen: \"127.0.0.1:1\", max_requests_per_worker: 2}\n";
    let (_router, base, port) = serve(dir.path(), &endpoints(2), extra);
    runtime().block_on(async {
        let mut client = client(port).await;
        let mut open = Vec::new();
        for i in 0..4 {
            let mut envoy = Envoy::open(&mut client, None).await;
            let answer = envoy
                .request("/v1/chat/completions", None, &chat(&format!("r{i}")), 1)
                .await;
            assert!(matches!(answer, Answer::Picked(_)), "#{i}: {answer:?}");
            open.push(envoy);
        }
        let mut shed = Envoy::open(&mut client, None).await;
        match shed
            .request("/v1/chat/completions", None, &chat("one too many"), 1)
            .await
        {
            Answer::Refused { status, body } => {
                assert_eq!(status, 429, "{body}");
                assert!(
                    body["error"]["message"]
                        .as_str()
                        .unwrap()
                        .contains("max_requests_per_worker"),
                    "{body}"
                );
            }
            other => panic!("{other:?}"),
        }
        // One finishes: there is room again.
        let mut done = open.pop().unwrap();
        done.response_headers(None).await;
        done.response_chunk(b"{}", true).await;
        let mut again = Envoy::open(&mut client, None).await;
        let answer = again
            .request("/v1/chat/completions", None, &chat("room again"), 1)
            .await;
        assert!(matches!(answer, Answer::Picked(_)), "{answer:?}");
        drop((open, again));
        wait_for_zero_load(&base).await;
    });
}

#[test]
fn a_thousand_concurrent_streams_leave_every_worker_at_zero_load() {
    let dir = tempfile::tempdir().unwrap();
    let (_router, base, port) = serve(dir.path(), &endpoints(4), "");
    runtime().block_on(async {
        let clients: Vec<Client> =
            futures_util::future::join_all((0..8).map(|_| client(port))).await;
        let tasks = (0..1000).map(|i| {
            let mut client = clients[i % clients.len()].clone();
            tokio::spawn(async move {
                let mut envoy = Envoy::open(&mut client, None).await;
                let Answer::Picked(endpoint) = envoy
                    .request(
                        "/v1/chat/completions",
                        None,
                        &chat(&format!("conversation {}", i % 50)),
                        2,
                    )
                    .await
                else {
                    panic!("no pick");
                };
                match i % 3 {
                    // The whole exchange.
                    0 => {
                        envoy.response_headers(Some(&endpoint)).await;
                        envoy.response_chunk(b"data: 1\n\n", false).await;
                        envoy.response_chunk(b"data: [DONE]\n\n", true).await;
                        envoy.half_close();
                    }
                    // Reset after the response started.
                    1 => {
                        envoy.response_headers(None).await;
                        envoy.response_chunk(b"data: 1\n\n", false).await;
                    }
                    // Reset before any response.
                    _ => {}
                }
                endpoint
            })
        });
        let picks = futures_util::future::join_all(tasks).await;
        let mut per_endpoint: HashMap<String, usize> = HashMap::new();
        for pick in picks {
            *per_endpoint.entry(pick.unwrap()).or_default() += 1;
        }
        assert_eq!(per_endpoint.values().sum::<usize>(), 1000);
        assert!(per_endpoint.len() > 1, "the load spreads: {per_endpoint:?}");
        wait_for_zero_load(&base).await;
    });
}

#[test]
fn plugin_policies_pick_through_ext_proc_what_v1_select_picks() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = format!(
        "plugins:\n  - path: {}\n  - path: {}\n  - path: {}\nworker_selection:\n  instances:\n    - {{name: rust, type: least-busy}}\n    - {{name: c, type: c.least-busy}}\n    - {{name: cpp, type: cpp.least-busy}}\nrouter: {{block_size: 16}}\n# The gateway's clients choose the instance (x-switchyard-instance): off by default.\nauth: {{choose_instance: anyone}}\n",
        rust_plugin("least_busy").display(),
        cmake_plugin("least_busy_c").display(),
        cmake_plugin("least_busy_cpp").display(),
    );
    let workers = endpoints(3);
    let (_router, base, port) = serve(dir.path(), &workers, &plugins);
    let address: HashMap<u64, String> = workers.iter().cloned().collect();
    runtime().block_on(async {
        let mut client = client(port).await;
        let http = support::http_client();
        for instance in ["rust", "c", "cpp"] {
            let mut open = Vec::new();
            for i in 0..6 {
                let body = chat(&format!("{instance} request {i}"));
                // The prompt as the picker hashes it, for /v1/select.
                let prompt = switchyard::serve::frontend::prompt::parse(
                    switchyard::serve::frontend::prompt::Endpoint::ChatCompletions,
                    &body,
                    16,
                    |_| None,
                )
                .unwrap();
                let selected: Json = http
                    .post(format!("{base}/v1/select"))
                    .json(&json!({"model": "demo", "instance": instance, "block_hashes": prompt.block_hashes}))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                let expected = &address[&selected["worker_id"].as_u64().unwrap()];
                let mut envoy = Envoy::open(&mut client, None).await;
                let answer = envoy.request("/v1/chat/completions", Some(instance), &body, 2).await;
                assert!(matches!(&answer, Answer::Picked(e) if e == expected), "{instance} #{i}: /v1/select chose {expected}, ext_proc {answer:?}");
                open.push(envoy); // stays booked: the next pick must go elsewhere
            }
            let busy = loads(&base).await;
            assert!(busy.values().all(|&(requests, _)| requests == 2), "{instance}: least-busy spreads six requests two by two: {busy:?}");
            drop(open);
            wait_for_zero_load(&base).await;
        }
    });
}

#[test]
fn grpc_health_answers_for_liveness_readiness_and_the_picker() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let dir = tempfile::tempdir().unwrap();
    let (_router, _base, port) = serve(dir.path(), &endpoints(1), "");
    runtime().block_on(async {
        let _ = client(port).await; // waits until it is up
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
        ] {
            let status = health
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .unwrap()
                .into_inner()
                .status;
            assert_eq!(status, ServingStatus::Serving as i32, "{service}");
        }
        let unknown = health
            .check(HealthCheckRequest {
                service: "nope".into(),
            })
            .await;
        assert_eq!(unknown.unwrap_err().code(), tonic::Code::NotFound);
    });
}

/// With client keys configured, a stream needs one in its gRPC metadata; the gateway's
/// clients choose an instance only as far as the key's scope allows.
#[test]
fn streams_need_a_client_key_and_instance_choice_follows_its_scope() {
    let dir = tempfile::tempdir().unwrap();
    let (client_key, scoped_key, operator_key) = (
        "gateway-key-0123456789",
        "scoped-gateway-key-0123456789",
        "operator-key-0123456789",
    );
    std::fs::write(dir.path().join("clients.keys"), format!("{client_key}\n")).unwrap();
    std::fs::write(dir.path().join("scoped.keys"), format!("{scoped_key}\n")).unwrap();
    std::fs::write(
        dir.path().join("operators.keys"),
        format!("{operator_key}\n"),
    )
    .unwrap();
    let port = free_port();
    let engine = engine_sim("keyed", "127.0.0.1:0", &[]);
    let address = engine.address.trim_start_matches("http://").to_owned();
    let config = write_config(
        dir.path(),
        &format!("ext_proc: {{listen: 127.0.0.1:{port}}}\nworker_selection:\n  instances:\n    - {{name: other, type: default}}\nworkers:\n  - {{model: demo, worker_id: 1, address: '{address}'}}\nauth:\n  clients:\n    - {{name: gateway, key_file: clients.keys}}\n    - {{name: scoped, key_file: scoped.keys, instances: [other]}}\n  operators:\n    - {{name: ops, key_file: operators.keys}}\n"),
    );
    let _router = support::serve(&config);
    let body = br#"{"model": "demo", "messages": [{"role": "user", "content": "hi"}]}"#;
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut client = client(port).await;
        let refused = Envoy::open_with_key(&mut client, None, None)
            .await
            .err()
            .expect("refused without a key");
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
        assert!(
            refused.message().contains("initial_metadata"),
            "{refused:?}"
        );
        let refused = Envoy::open_with_key(&mut client, None, Some(operator_key))
            .await
            .err()
            .expect("refused with an operator key");
        assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");

        let mut envoy = Envoy::open_with_key(&mut client, None, Some(client_key))
            .await
            .unwrap();
        assert!(matches!(
            envoy.request("/v1/chat/completions", None, body, 1).await,
            Answer::Picked(_)
        ));
        let mut envoy = Envoy::open_with_key(&mut client, None, Some(client_key))
            .await
            .unwrap();
        match envoy
            .request("/v1/chat/completions", Some("other"), body, 1)
            .await
        {
            Answer::Refused { status, body } => {
                assert_eq!(status, 403, "{body}");
                assert_eq!(body["error"]["code"], "permission_denied", "{body}");
            }
            picked => panic!("a gateway client chose the instance: {picked:?}"),
        }
        let mut envoy = Envoy::open_with_key(&mut client, None, Some(scoped_key))
            .await
            .unwrap();
        assert!(
            matches!(
                envoy
                    .request("/v1/chat/completions", Some("other"), body, 1)
                    .await,
                Answer::Picked(_)
            ),
            "the key's scope names `other`"
        );
    });
}

/// llm-d's P/D convention: for a disaggregated model the picker's destination is a decode
/// worker and `x-prefiller-host-port` names the prefill worker its sidecar prefills on;
/// both are booked, the prefill until the decode answers, the decode until its end.
#[test]
fn a_disaggregated_pick_names_the_prefill_worker_for_the_decode_sidecar() {
    let dir = tempfile::tempdir().unwrap();
    let (prefill, decode) = (listening_address(), listening_address());
    let config = write_config(
        dir.path(),
        &format!(
            "models:\n  demo: {{disaggregation: vllm}}\nworkers:\n  - {{model: demo, worker_id: 1, worker_type: prefill, address: \"{prefill}\"}}\n  - {{model: demo, worker_id: 2, worker_type: decode, address: \"{decode}\"}}\n"
        ),
    );
    let port = free_port();
    let router = serve_with_picker(&config, port);
    let base = router.address.clone();
    runtime().block_on(async {
        let mut client = client(port).await;
        let mut envoy = Envoy::open(&mut client, None).await;
        let Answer::Picked(endpoint) = envoy
            .request(
                "/v1/chat/completions",
                None,
                &chat("a disaggregated prompt"),
                2,
            )
            .await
        else {
            panic!("no pick");
        };
        assert_eq!(endpoint, decode, "the destination is the decode worker");
        assert_eq!(
            envoy.pick_headers,
            [("x-prefiller-host-port".to_owned(), prefill.clone())],
            "the sidecar's prefill worker"
        );
        let booked = loads(&base).await;
        assert_eq!(
            (booked[&prefill].0, booked[&decode].0),
            (1, 1),
            "{booked:?}"
        );
        envoy.response_headers(Some(&endpoint)).await;
        envoy
            .response_chunk(b"data: {\"choices\": []}\n\n", false)
            .await;
        let decoding = loads(&base).await;
        assert_eq!(
            decoding[&prefill].0, 0,
            "the prefill ended with the decode's answer: {decoding:?}"
        );
        envoy.response_chunk(b"data: [DONE]\n\n", true).await;
        envoy.half_close();
        wait_for_zero_load(&base).await;
    });
}

/// A disaggregated side whose workers are all busy waits in its own partition's queue
/// while Envoy holds the stream: the second request is picked only when the first one's
/// decode booking ends.
#[test]
fn a_busy_decode_side_waits_in_its_own_queue_behind_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let (prefill, decode) = (listening_address(), listening_address());
    let config = write_config(
        dir.path(),
        &format!(
            "models:\n  demo: {{disaggregation: vllm}}\nadmission:\n  busy: {{max_active_requests: 1}}\n  queue: {{max_wait_ms: 20000}}\nworkers:\n  - {{model: demo, worker_id: 1, worker_type: prefill, address: \"{prefill}\"}}\n  - {{model: demo, worker_id: 2, worker_type: decode, address: \"{decode}\"}}\n"
        ),
    );
    let port = free_port();
    let router = serve_with_picker(&config, port);
    let base = router.address.clone();
    runtime().block_on(async {
        let mut client = client(port).await;
        let mut first = Envoy::open(&mut client, None).await;
        let Answer::Picked(endpoint) = first
            .request("/v1/chat/completions", None, &chat("first"), 1)
            .await
        else {
            panic!("no pick");
        };
        first.response_headers(Some(&endpoint)).await;
        first
            .response_chunk(b"data: {\"choices\": []}\n\n", false)
            .await;
        // The prefill booking ended with the decode's first bytes; the decode worker is
        // still at its threshold.
        let mut second_client = client.clone();
        let second = tokio::spawn(async move {
            let mut envoy = Envoy::open(&mut second_client, None).await;
            let answer = envoy
                .request("/v1/chat/completions", None, &chat("second"), 1)
                .await;
            (envoy, answer)
        });
        // Observed, not slept on: the second is in the admission queue, and not picked.
        eventually_async(
            "the second request waits in the queue",
            Duration::from_secs(10),
            || async {
                let policies: Json = support::get(format!("{base}/v1/policies"))
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                policies["admission"]["waiting"] == 1
            },
        )
        .await;
        assert!(
            !second.is_finished(),
            "the second waits for the decode worker"
        );
        first.response_chunk(b"data: [DONE]\n\n", true).await;
        first.half_close();
        let (mut envoy, answer) = tokio::time::timeout(Duration::from_secs(10), second)
            .await
            .expect("granted once the first ended")
            .unwrap();
        let Answer::Picked(picked) = answer else {
            panic!("expected a pick, got {answer:?}");
        };
        assert_eq!(picked, decode);
        assert_eq!(
            envoy.pick_headers,
            [("x-prefiller-host-port".to_owned(), prefill.clone())]
        );
        envoy.response_headers(Some(&decode)).await;
        envoy.response_chunk(b"data: [DONE]\n\n", true).await;
        envoy.half_close();
        wait_for_zero_load(&base).await;
    });
}
