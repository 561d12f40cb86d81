//! switchyard as an Envoy dynamic module (issue #49): `libswitchyard_envoy.so`, built from
//! `host/envoy-module`, loaded by a real Envoy 1.40 with the configuration `docs/envoy.md`
//! ships in "switchyard as an Envoy dynamic module" (read from the doc; only its addresses,
//! engines and config path changed), in front of `engine-sim` engines. The module's HTTP
//! API (`listen`) shows its bookings. Envoy comes from `scripts/install-test-tools`, as
//! for `tests/envoy.rs`.
//!
//! Covered: chat and completions, streamed and not; clients hanging up mid-stream; prefix
//! affinity; a refusal as Envoy's local reply; the same decisions as the ext_proc picker
//! on the same request sequence; an isolated plugin aborting under load; the body limit
//! (413) and a body that arrives in pieces; subset hints; an engine Envoy cannot reach;
//! Envoy's retries moving the booking to the engine that served; no booking left after
//! any of it. Operations (plugins of each language, reload, replicas, headers-only) are in
//! tests/envoy_module_ops.rs.

mod support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use support::module_envoy::*;
use support::real_envoy::Envoy;
use support::*;

/// A chat request for a model no worker serves (404 from the picker's code).
fn unknown_model() -> Value {
    json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]})
}

/// `count` streamed chats whose clients hang up after the first bytes.
fn hang_up(agent: &ureq::Agent, url: &str, count: usize) {
    for _ in 0..count {
        let response = agent
            .post(url)
            .send_json(json!({"model": "demo", "stream": true, "max_tokens": 200,
                              "messages": [{"role": "user", "content": "a long answer"}]}))
            .unwrap();
        let mut first = [0u8; 32];
        let _ = response.into_reader().read(&mut first);
    }
}

#[test]
fn chat_and_completions_streamed_or_not_hang_ups_and_prefix_affinity_through_the_module() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let engines = engine_sims(3, &[]);
    let engine_refs: Vec<&Process> = engines.iter().collect();
    let config = switchyard_config(dir.path(), &engine_refs, "");
    let module = start_module(dir.path(), &config, &engine_refs);
    let (agent, base) = (agent(), module.envoy.base.clone());
    let chat_url = format!("{base}/v1/chat/completions");

    let (status, engine, body) = post_json(&agent, &chat_url, &chat("hello", false));
    assert_eq!(status, 200, "{body}");
    assert!(
        engine.starts_with('e'),
        "answered by an engine-sim: {engine}"
    );
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["object"], "chat.completion", "{answer}");

    let completion = json!({"model": "demo", "prompt": "once upon a time", "max_tokens": 4});
    let (status, _, body) = post_json(&agent, &format!("{base}/v1/completions"), &completion);
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["object"], "text_completion", "{answer}");

    for url in [&chat_url, &format!("{base}/v1/completions")] {
        let body = if url.ends_with("/chat/completions") {
            chat("stream me", true)
        } else {
            json!({"model": "demo", "prompt": "stream me", "max_tokens": 6, "stream": true})
        };
        let (status, _, body) = post_json(&agent, url, &body);
        assert_eq!(status, 200, "{body}");
        let events: Vec<&str> = body
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .collect();
        assert!(events.len() >= 6, "{body}");
        assert_eq!(*events.last().unwrap(), "[DONE]");
    }

    // A refusal is Envoy's local reply with the picker's status and JSON error.
    let (status, _, body) = post_json(&agent, &chat_url, &unknown_model());
    assert_eq!(status, 404, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["error"]["code"], "model_not_found", "{error}");

    // Clients hanging up mid-stream leave no booking.
    hang_up(&agent, &chat_url, 5);
    wait_for_no_bookings(&module.api, Duration::from_secs(10));

    // Prefix affinity: one long conversation, asked again, goes back where it was cached.
    let long = "the same long system prompt about routing ".repeat(40);
    let mut served = std::collections::HashSet::new();
    for turn in 0..4 {
        let (status, engine, body) =
            post_json(&agent, &chat_url, &chat(&format!("{long}{turn}"), false));
        assert_eq!(status, 200, "{body}");
        served.insert(engine);
    }
    assert_eq!(
        served.len(),
        1,
        "a cached prefix is routed back to its engine: {served:?}"
    );
    wait_for_no_bookings(&module.api, Duration::from_secs(10));
    assert!(metric(&module.api, "switchyard_ext_proc_picks_total") >= 10.0);
}

/// The engine that answered each request of `sequence` through Envoy at `base`, each sent
/// once the router at `api` holds no booking (so that only the requests before it, not
/// their timing, decide).
fn served(base: &str, api: &str, sequence: &[Value]) -> Vec<(u16, String)> {
    let agent = agent();
    sequence
        .iter()
        .map(|request| {
            wait_for_no_bookings(api, Duration::from_secs(10));
            let (status, engine, _) =
                post_json(&agent, &format!("{base}/v1/chat/completions"), request);
            (status, engine)
        })
        .collect()
}

/// The built-in policy's cost with its random tie-breaks seeded, so that two routers
/// given the same requests must decide alike (and new prefixes still spread).
const DETERMINISTIC: &str = "worker_selection:\n  default: seeded\n  instances:\n    - name: seeded\n      scorers: [{type: builtin.default-cost}]\n      picker: {type: builtin.lowest-cost, parameters: {tie_break: random, seed: 7}}\n";

/// Conversations of three families, each growing, interleaved; and one refused request.
fn request_sequence() -> Vec<Value> {
    let families = [
        "you are a helpful assistant for routing questions. ",
        "translate the following paragraphs into French, carefully. ",
        "summarize the design document below in three bullet points. ",
    ];
    let mut sequence = Vec::new();
    for turn in 0..5 {
        for (f, family) in families.iter().enumerate() {
            let history = format!("{} turn {turn} of {f}", family.repeat(12 + turn));
            sequence.push(chat(&history, turn % 2 == 1));
        }
    }
    sequence.push(unknown_model());
    sequence
}

#[test]
fn the_module_decides_as_the_ext_proc_picker_on_the_same_requests() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let sequence = request_sequence();
    // Each router gets fresh engines of the same names: what an engine reports (its
    // metrics) after serving the other's requests would make the second start apart.
    let engines = engine_sims(3, &[]);
    let engine_refs: Vec<&Process> = engines.iter().collect();
    let picker_dir = dir.path().join("picker");
    std::fs::create_dir(&picker_dir).unwrap();
    let port = free_port();
    let router = serve_with_picker(
        &switchyard_config(&picker_dir, &engine_refs, DETERMINISTIC),
        port,
    );
    let envoy = Envoy::start(&picker_dir, port);
    eventually(
        "Envoy routes through the picker",
        Duration::from_secs(20),
        || {
            post_json(
                &agent(),
                &format!("{}/v1/chat/completions", envoy.base),
                &unknown_model(),
            )
            .0 == 404
        },
    );
    let by_picker = served(&envoy.base, &router.address, &sequence);
    drop(envoy);
    wait_for_no_bookings(&router.address, Duration::from_secs(10));
    drop(router);
    drop(engine_refs);
    drop(engines);

    let engines = engine_sims(3, &[]);
    let engine_refs: Vec<&Process> = engines.iter().collect();

    let module_dir = dir.path().join("module");
    std::fs::create_dir(&module_dir).unwrap();
    let config = switchyard_config(&module_dir, &engine_refs, DETERMINISTIC);
    let module = start_module(&module_dir, &config, &engine_refs);
    let by_module = served(&module.envoy.base, &module.api, &sequence);

    assert_eq!(
        by_module, by_picker,
        "the module and the picker decided differently"
    );
    let engines_used: std::collections::HashSet<&String> = by_picker
        .iter()
        .filter(|(s, _)| *s == 200)
        .map(|(_, e)| e)
        .collect();
    assert!(
        engines_used.len() >= 2,
        "the sequence exercised one engine only: {by_picker:?}"
    );
    assert_eq!(by_picker.last().unwrap().0, 404, "{by_picker:?}");
    wait_for_no_bookings(&module.api, Duration::from_secs(10));
}

/// switchyard's config with an isolated plugin scorer (`fixture.faulty`, tests/isolation.rs's
/// fixture built to abort while `flag` exists), `on_error: fallback`.
fn isolated_config(dir: &Path, engines: &[&Process], flag: &Path) -> PathBuf {
    let library = compile_c(
        dir,
        "faulty_ABORT",
        &repo().join("tests/fixtures/faulty_plugin.c"),
        &repo().join("include"),
        &["FAULT_ABORT"],
    );
    let extra = format!(
        "plugins:\n  - path: {}\n    isolation: process\n\
         isolation: {{call_deadline_ms: 300, kill_after_ms: 2000, restart_backoff_ms: 50}}\n\
         worker_selection:\n  default: faulty\n  instances:\n\
         \x20   - name: faulty\n      on_error: fallback\n\
         \x20     scorers: [{{type: fixture.faulty, parameters: {{flag: {}}}}}]\n\
         \x20     picker: {{type: builtin.lowest-cost}}\n",
        library.display(),
        flag.display()
    );
    switchyard_config(dir, engines, &extra)
}

#[test]
fn an_isolated_plugin_that_aborts_under_load_leaves_envoy_serving() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let engines = engine_sims(2, &[]);
    let engine_refs: Vec<&Process> = engines.iter().collect();
    let flag = dir.path().join("misbehave");
    let config = isolated_config(dir.path(), &engine_refs, &flag);
    let module = start_module(dir.path(), &config, &engine_refs);
    let url = format!("{}/v1/chat/completions", module.envoy.base);
    let answered = std::sync::atomic::AtomicUsize::new(0);
    // Four clients, 25 requests each; the plugin starts aborting after the first 10.
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..4)
            .map(|c| {
                let (url, answered) = (&url, &answered);
                scope.spawn(move || {
                    let agent = agent();
                    (0..25)
                        .map(|i| {
                            let request = chat(&format!("client {c} request {i}"), i % 2 == 0);
                            let status = post_json(&agent, url, &request).0;
                            answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            status
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        eventually("10 requests answered", Duration::from_secs(30), || {
            answered.load(std::sync::atomic::Ordering::Relaxed) >= 10
        });
        std::fs::write(&flag, "").unwrap();
        clients
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect()
    });
    assert!(
        statuses.iter().all(|s| *s == 200),
        "every request answered: {statuses:?}"
    );
    let exits = metric_sum(&module.api, "switchyard_isolated_process_exits_total");
    assert!(
        exits >= 1.0,
        "the plugin's process aborted (exits: {exits})"
    );
    assert!(metric_sum(&module.api, "switchyard_fallbacks_total") >= 1.0);
    // Envoy's process survived and serves on (the plugin routing again once it behaves).
    std::fs::remove_file(&flag).unwrap();
    let (status, _, body) = post_json(&agent(), &url, &chat("after the aborts", false));
    assert_eq!(status, 200, "{body}");
    wait_for_no_bookings(&module.api, Duration::from_secs(10));
}

/// The module's body limit (`ext_proc.max_body_bytes`): a body under it is routed; one
/// over it is the module's 413, naming the setting, whether it arrives in one piece or
/// in many; nothing stays booked. A body that reaches Envoy in pieces is decided whole
/// (the module reads Envoy's one chunk in place, and joins several): it is parsed and
/// routed as the same body sent at once.
#[test]
fn a_body_in_pieces_is_decided_whole_and_one_over_the_limit_is_answered_413() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let engines = engine_sims(2, &[]);
    let engine_refs: Vec<&Process> = engines.iter().collect();
    let limit = "ext_proc: {listen: \"127.0.0.1:0\", max_body_bytes: 4096}\n";
    let config = switchyard_config(dir.path(), &engine_refs, limit);
    let module = start_module(dir.path(), &config, &engine_refs);
    let agent = agent();
    let url = format!("{}/v1/chat/completions", module.envoy.base);
    let (status, _, body) = post_json(&agent, &url, &chat(&"x".repeat(3_000), false));
    assert_eq!(status, 200, "{body}");
    for size in [5_000, 300_000] {
        let (status, _, body) = post_json(&agent, &url, &chat(&"x".repeat(size), false));
        assert_eq!(status, 413, "{size} bytes: {body}");
        assert!(body.contains("ext_proc.max_body_bytes"), "{body}");
    }

    // A long prompt in one piece, then the same body in three writes, each after a
    // pause (so Envoy buffers the first pieces before the last arrives): a body joined
    // wrong would not parse (400), and one parsed whole has the prefix the first cached.
    let prompt = chat(&"a long prompt that arrives in pieces ".repeat(40), false);
    let (status, first, body) = post_json(&agent, &url, &prompt);
    assert_eq!(status, 200, "{body}");
    wait_for_no_bookings(&module.api, Duration::from_secs(10));
    let answer = in_pieces(&module.envoy.base, &prompt.to_string(), 3);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains(&format!("x-engine-name: {first}\r\n")),
        "the prefix cached by the same body in one piece: {first}\n{answer}"
    );
    wait_for_no_bookings(&module.api, Duration::from_secs(10));
}

/// POSTs the chat `body` to Envoy at `base` in `pieces` writes, with a pause after each
/// (Envoy reads each apart: its module sees the last with the others buffered); the
/// whole answer.
fn in_pieces(base: &str, body: &str, pieces: usize) -> String {
    use std::io::Write;
    let port = base.rsplit(':').next().unwrap();
    let mut client = std::net::TcpStream::connect(format!("127.0.0.1:{port}")).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: switchyard\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    client.write_all(head.as_bytes()).unwrap();
    for piece in body.as_bytes().chunks(body.len().div_ceil(pieces)) {
        client.write_all(piece).unwrap();
        client.flush().unwrap();
        // The client's own pace: Envoy reads each write apart.
        pacing::pace(Duration::from_millis(150));
    }
    let mut answer = String::new();
    client.read_to_string(&mut answer).unwrap();
    answer
}

/// A subset hint from the gateway: a `set_metadata` filter ahead of the module writes
/// `envoy.lb.subset_hint` (as tests/envoy.rs does ahead of ext_proc), every pick stays
/// inside it, and a hint naming no worker is answered 503.
#[test]
fn subset_hints_set_in_envoy_bound_the_modules_picks() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let engines = engine_sims(3, &[]);
    let engine_refs: Vec<&Process> = engines.iter().collect();
    let config = switchyard_config(dir.path(), &engine_refs, "");
    let addresses = addresses(&engine_refs);
    let with_hint = |subset: &str| {
        let filter = format!(
            "                  - name: envoy.filters.http.set_metadata\n                    typed_config:\n                      \"@type\": type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config\n                      metadata:\n                        - metadata_namespace: envoy.lb.subset_hint\n                          value:\n                            x-gateway-destination-endpoint-subset: [\"{subset}\"]\n"
        );
        let anchor = "                  - name: envoy.extensions.filters.http.dynamic_modules\n";
        start_module_with(dir.path(), &config, &engine_refs, |text| {
            assert!(text.contains(anchor), "docs/envoy.md's filter list changed");
            text.replacen(anchor, &format!("{filter}{anchor}"), 1)
        })
    };
    let hinted = with_hint(&addresses[1].to_string());
    let agent = agent();
    for i in 0..12 {
        let url = format!("{}/v1/chat/completions", hinted.envoy.base);
        let (status, engine, body) = post_json(&agent, &url, &chat(&format!("hinted {i}"), false));
        assert_eq!(status, 200, "{body}");
        assert_eq!(engine, "e1", "request {i} left the subset hint");
    }
    let nowhere = with_hint("192.0.2.1:9");
    let url = format!("{}/v1/chat/completions", nowhere.envoy.base);
    let (status, _, body) = post_json(&agent, &url, &chat("no such endpoint", false));
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("subset"), "{body}");
    for module in [&hinted, &nowhere] {
        wait_for_no_bookings(&module.api, Duration::from_secs(10));
    }
}

/// An engine Envoy cannot reach, before any health probe notices (probes every minute):
/// Envoy's router answers its own 503, the module hears of it (its local-reply hook) and
/// takes the worker out, so at most one request fails.
#[test]
fn an_upstream_failure_envoy_reports_takes_the_worker_out_of_the_modules_picks() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let mut engines = engine_sims(3, &[]);
    let engine_refs: Vec<&Process> = engines.iter().collect();
    let workers = demo_workers(engine_refs.iter().copied(), true);
    let config = write_config(
        dir.path(),
        &format!("frontend: {{health_interval_ms: 60000, unhealthy_cooldown_ms: 60000}}\nworkers:\n{workers}"),
    );
    let module = start_module(dir.path(), &config, &engine_refs);
    drop(engine_refs);
    let agent = agent();
    let url = format!("{}/v1/chat/completions", module.envoy.base);
    assert_eq!(
        post_json(&agent, &url, &chat("before the kill", false)).0,
        200
    );
    engines[0].kill();
    let mut failed = Vec::new();
    for i in 0..30 {
        let (status, engine, body) =
            post_json(&agent, &url, &chat(&format!("after the kill {i}"), false));
        if status == 200 {
            assert_ne!(engine, "e0", "request {i}");
        } else {
            assert!(
                body.contains("upstream connect error"),
                "request {i}: {status} {body}"
            );
            failed.push(i);
        }
    }
    assert!(
        failed.len() <= 1,
        "once Envoy reported the failure, no request went to the dead engine: failed {failed:?}"
    );
    wait_for_no_bookings(&module.api, Duration::from_secs(10));
}

/// docs/envoy.md's "Fallback endpoints" retry policy and override-host load balancer,
/// spliced into the module's config: the route retries, and the engines cluster goes
/// down the destination header's list. Not the page's served-endpoint header: the module
/// reads who served from Envoy itself.
fn with_retries(text: String) -> String {
    let doc = std::fs::read_to_string(repo().join("docs/envoy.md")).unwrap();
    let snippet = blocks(&doc, "yaml")
        .into_iter()
        .find(|b| b.contains("override_host_sources"))
        .expect("docs/envoy.md has the fallback endpoints' route and cluster");
    let (route, cluster) = snippet.split_once("---\n").unwrap();
    // The `key:` block of `yaml` (its line and the deeper ones after it), at `indent`.
    let part = |yaml: &str, key: &str, indent: usize| -> String {
        let depth = |l: &str| l.len() - l.trim_start().len();
        let mut lines = yaml
            .lines()
            .skip_while(|l| !l.trim_start().starts_with(key));
        let first = lines
            .next()
            .unwrap_or_else(|| panic!("no `{key}` in {yaml}"));
        let at = depth(first);
        std::iter::once(first)
            .chain(lines.take_while(|l| depth(l) > at))
            .map(|l| format!("{}{}\n", " ".repeat(indent), &l[at..]))
            .collect()
    };
    let anchor = "                            timeout: 0s            # answers stream for as long as they take\n";
    assert!(
        text.contains(anchor),
        "docs/envoy.md's module route changed"
    );
    let retry = part(route, "retry_policy:", 28);
    let mut text = text.replacen(anchor, &format!("{anchor}{retry}"), 1);
    assert!(
        text.trim_end().ends_with("} } }"),
        "the module config ends with the engines cluster's hosts"
    );
    text.push_str(&part(cluster, "load_balancing_policy:", 6));
    text
}

/// An engine killed between health probes, a route that retries and a pick with a
/// fallback: Envoy's router fails over to the other engine, and the module moves each
/// booking to the engine that served (the hosts Envoy's router attempted, read through
/// the ABI), so the next pick sees the served engine's load.
#[test]
fn after_envoy_retries_onto_another_engine_the_booking_is_on_the_one_that_served() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let mut engines = engine_sims(2, &["--decode-tps", "25"]);
    let engine_refs: Vec<&Process> = engines.iter().collect();
    let workers = demo_workers(engine_refs.iter().copied(), true);
    let config = write_config(
        dir.path(),
        &format!(
            "ext_proc: {{listen: \"127.0.0.1:0\", fallback_endpoints: 1}}\n\
             frontend: {{health_interval_ms: 60000, unhealthy_cooldown_ms: 60000}}\nworkers:\n{workers}"
        ),
    );
    let module = start_module_with(dir.path(), &config, &engine_refs, with_retries);
    drop(engine_refs);
    let (agent, url) = (
        agent(),
        format!("{}/v1/chat/completions", module.envoy.base),
    );
    assert_eq!(
        post_json(&agent, &url, &chat("before the kill", false)).0,
        200
    );
    wait_for_no_bookings(&module.api, Duration::from_secs(10));
    engines[0].kill();
    // Three long streams, each held open while the bookings are read: each pick sees the
    // dead engine idle (its worker is still a candidate) and the live one busy with the
    // streams before, so the dead one is picked and Envoy's retry serves it elsewhere.
    let mut open = Vec::new();
    for i in 0..3u64 {
        let long = json!({"model": "demo", "stream": true, "max_tokens": 150,
                          "messages": [{"role": "user", "content": format!("retried {i}")}]});
        let response = agent
            .post(&url)
            .send_json(long)
            .unwrap_or_else(|e| panic!("stream {i}: {e}"));
        assert_eq!(response.header("x-engine-name"), Some("e1"), "stream {i}");
        let mut reader = response.into_reader();
        let mut first = [0u8; 8];
        reader.read_exact(&mut first).unwrap();
        open.push(reader);
        assert_eq!(
            active_requests(&module.api),
            vec![0, i + 1],
            "stream {i}: every booking on the engine that served"
        );
    }
    assert!(metric(&module.api, "switchyard_ext_proc_rebooks_total") >= 2.0);
    drop(open);
    wait_for_no_bookings(&module.api, Duration::from_secs(10));
}
