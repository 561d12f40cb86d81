//! Prefill/decode disaggregation through the frontend, against engine-sim processes in
//! both roles speaking vLLM's and SGLang's fields: the decode worker gets exactly what the
//! prefill returned (vLLM: it pulls the transfer the prefill engine named, and refuses
//! one it does not know) or the room the prefill was given (SGLang); streamed and not;
//! a refused prefill worker is skipped; a failing prefill answers 502, a decode failing
//! mid-stream ends the stream with an error event; a client hanging up frees both; no
//! booking stays behind.

mod support;

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build()
}

fn chat(content: &str, stream: bool) -> Value {
    json!({"model": "demo", "max_tokens": 4, "stream": stream,
           "messages": [{"role": "user", "content": content}]})
}

/// A router over `prefill` and `decode` engines (ids from 1, prefill first) for `mode`.
fn pd_router(
    dir: &std::path::Path,
    mode: &str,
    prefill: &[&Process],
    decode: &[&Process],
) -> Process {
    let mut workers = String::new();
    for (i, (engine, role)) in prefill
        .iter()
        .map(|e| (e, "prefill"))
        .chain(decode.iter().map(|e| (e, "decode")))
        .enumerate()
    {
        workers += &format!(
            "  - {{model: demo, worker_id: {}, worker_type: {role}, url: \"{}\"}}\n",
            i + 1,
            engine.address
        );
    }
    let yaml = format!(
        "frontend: {{connect_retries: 1}}\nmodels:\n  demo: {{disaggregation: {mode}}}\nworkers:\n{workers}"
    );
    let config = write_config(dir, &yaml);
    check_passes(&config);
    serve(&config)
}

fn post(router: &Process, body: &Value) -> (u16, Option<String>, String) {
    match agent()
        .post(&format!("{}/v1/chat/completions", router.address))
        .send_json(body.clone())
    {
        Ok(r) => {
            let prefill = r.header("x-switchyard-prefill-worker").map(str::to_owned);
            (r.status(), prefill, r.into_string().unwrap_or_default())
        }
        Err(ureq::Error::Status(code, r)) => (code, None, r.into_string().unwrap_or_default()),
        Err(e) => (0, None, e.to_string()),
    }
}

fn served_on_both_paths(mode: &str) {
    let dir = tempfile::tempdir().unwrap();
    let p0 = engine_sim("p0", "127.0.0.1:0", &["--role", "prefill"]);
    let d0 = engine_sim("d0", "127.0.0.1:0", &["--role", "decode"]);
    let d1 = engine_sim("d1", "127.0.0.1:0", &["--role", "decode"]);
    let router = pd_router(dir.path(), mode, &[&p0], &[&d0, &d1]);
    let (status, prefill, body) = post(&router, &chat("whole", false));
    assert_eq!((status, prefill.as_deref()), (200, Some("1")), "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        answer["choices"][0]["message"]["content"], "tok0 tok1 tok2 tok3 ",
        "the decode worker's whole answer: {answer}"
    );
    let fingerprint = answer["system_fingerprint"].as_str().unwrap_or("");
    assert!(
        fingerprint.starts_with('d'),
        "a decode engine answered: {answer}"
    );
    let (status, _, body) = post(&router, &chat("streamed", true));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body.matches("data: {").count(), 4, "{body}");
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    // Each decode pulled its KV from p0, as the prefill's answer (vLLM) or the shared room
    // (SGLang) told it; p0 keeps nothing behind.
    let received = |d: &Process| {
        metric(
            &d.address,
            "switchyard_sim_kv_transfers_received_total{from=\"p0\"}",
        )
    };
    assert_eq!(received(&d0) + received(&d1), 2.0);
    assert_eq!(
        metric(&p0.address, "switchyard_sim_kv_transfers_taken_total"),
        2.0
    );
    assert_eq!(metric(&p0.address, "switchyard_sim_kv_transfers_kept"), 0.0);
    wait_for_no_bookings(&router.address, Duration::from_secs(10));
}

#[test]
fn vllm_pairs_serve_streamed_and_whole_answers() {
    served_on_both_paths("vllm");
}

#[test]
fn sglang_pairs_serve_streamed_and_whole_answers() {
    served_on_both_paths("sglang");
}

/// The decode engine refuses a transfer it was not handed: what the router passes on is
/// what the prefill returned, not something it made up.
#[test]
fn a_decode_engine_refuses_an_unknown_transfer() {
    let p0 = engine_sim("p0", "127.0.0.1:0", &["--role", "prefill"]);
    let d0 = engine_sim("d0", "127.0.0.1:0", &["--role", "decode"]);
    let (host, port) = p0
        .address
        .trim_start_matches("http://")
        .rsplit_once(':')
        .unwrap();
    let mut body = chat("forged", false);
    body["kv_transfer_params"] = json!({"do_remote_prefill": true, "remote_engine_id": "p0",
        "remote_request_id": "never-prefilled", "remote_host": host, "remote_port": port.parse::<u16>().unwrap()});
    let refused = agent()
        .post(&format!("{}/v1/chat/completions", d0.address))
        .send_json(body);
    match refused {
        Err(ureq::Error::Status(400, r)) => {
            let text = r.into_string().unwrap();
            assert!(text.contains("no KV transfer `never-prefilled`"), "{text}");
        }
        other => panic!("expected 400, got {other:?}"),
    }
}

fn failures_leave_nothing_booked(mode: &str) {
    let dir = tempfile::tempdir().unwrap();
    // A prefill worker that answers 500.
    let broken = engine_sim(
        "p-broken",
        "127.0.0.1:0",
        &["--role", "prefill", "--fail", "http500"],
    );
    let d0 = engine_sim("d0", "127.0.0.1:0", &["--role", "decode"]);
    let router = pd_router(dir.path(), mode, &[&broken], &[&d0]);
    let (status, _, body) = post(&router, &chat("p fails", false));
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("prefill worker 1"), "{body}");
    wait_for_no_bookings(&router.address, Duration::from_secs(10));
    drop(router);
    // A prefill worker whose engine is gone: skipped for the other one.
    let mut gone = engine_sim("p-gone", "127.0.0.1:0", &["--role", "prefill"]);
    let p1 = engine_sim("p1", "127.0.0.1:0", &["--role", "prefill"]);
    let router = pd_router(dir.path(), mode, &[&gone, &p1], &[&d0]);
    gone.kill();
    for n in 0..3 {
        let (status, prefill, body) = post(&router, &chat(&format!("retry {n}"), false));
        assert_eq!((status, prefill.as_deref()), (200, Some("2")), "{body}");
    }
    wait_for_no_bookings(&router.address, Duration::from_secs(10));
    drop(router);
    // A decode engine that breaks its stream halfway: the stream ends with an error event.
    let aborting = engine_sim(
        "d-abort",
        "127.0.0.1:0",
        &["--role", "decode", "--fail", "abort-mid-stream"],
    );
    let router = pd_router(dir.path(), mode, &[&p1], &[&aborting]);
    let (status, _, body) = post(&router, &chat("d fails", true));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"error\""), "an SSE error event: {body}");
    wait_for_no_bookings(&router.address, Duration::from_secs(10));
    drop(router);
    // A client that hangs up mid-stream frees both bookings.
    let slow = engine_sim(
        "d-slow",
        "127.0.0.1:0",
        &["--role", "decode", "--decode-tps", "5"],
    );
    let router = pd_router(dir.path(), mode, &[&p1], &[&slow]);
    let address = router.address.trim_start_matches("http://").to_owned();
    let mut socket = std::net::TcpStream::connect(&address).unwrap();
    let body = json!({"model": "demo", "max_tokens": 200, "stream": true,
                      "messages": [{"role": "user", "content": "hang up"}]})
    .to_string();
    write!(
        socket,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 256];
    let read = socket.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..read]).starts_with("HTTP/1.1 200"));
    assert!(
        active_requests(&router.address).iter().sum::<u64>() >= 1,
        "the decode is booked"
    );
    drop(socket);
    wait_for_no_bookings(&router.address, Duration::from_secs(10));
}

#[test]
fn vllm_failures_and_hang_ups_leave_nothing_booked() {
    failures_leave_nothing_booked("vllm");
}

#[test]
fn sglang_failures_and_hang_ups_leave_nothing_booked() {
    failures_leave_nothing_booked("sglang");
}

/// docs/disaggregation.md's config and the demo's pass `switchyard check`.
#[test]
fn the_guide_and_demo_configs_pass_check() {
    let markdown = std::fs::read_to_string(repo().join("docs/disaggregation.md")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    check_passes(&write_config(dir.path(), &blocks(&markdown, "yaml")[0]));
    check_passes(&repo().join("examples/demo-pd.yaml"));
}

/// With `admission:`, a pair's side whose workers are all busy waits in that side's queue,
/// as an aggregated request does: two requests for one slow decode worker are both served,
/// the second after waiting.
#[test]
fn a_busy_side_waits_in_the_admission_queue() {
    let dir = tempfile::tempdir().unwrap();
    let p0 = engine_sim("p0", "127.0.0.1:0", &["--role", "prefill"]);
    let d0 = engine_sim(
        "d0",
        "127.0.0.1:0",
        &["--role", "decode", "--decode-tps", "20"],
    );
    let yaml = format!(
        "models:\n  demo: {{disaggregation: vllm}}\nadmission:\n  busy: {{max_active_requests: 1}}\n  queue: {{max_wait_ms: 20000}}\nworkers:\n  - {{model: demo, worker_id: 1, worker_type: prefill, url: \"{}\"}}\n  - {{model: demo, worker_id: 2, worker_type: decode, url: \"{}\"}}\n",
        p0.address, d0.address
    );
    let router = serve(&write_config(dir.path(), &yaml));
    let request = |i: u32| {
        let base = router.address.clone();
        std::thread::spawn(move || {
            let body = json!({"model": "demo", "max_tokens": 10, "stream": true,
                              "messages": [{"role": "user", "content": format!("q{i}")}]});
            match agent()
                .post(&format!("{base}/v1/chat/completions"))
                .send_json(body)
            {
                Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
                Err(e) => (0, e.to_string()),
            }
        })
    };
    let first = request(0);
    // The second comes while the first holds a worker.
    eventually(
        "the first request is booked",
        Duration::from_secs(10),
        || active_requests(&router.address).iter().sum::<u64>() >= 1,
    );
    let threads = [first, request(1)];
    for t in threads {
        let (status, body) = t.join().unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    }
    let metrics = agent()
        .get(&format!("{}/metrics", router.address))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let waited = metrics
        .lines()
        .find_map(|l| l.strip_prefix("switchyard_admission_wait_seconds_count "))
        .and_then(|v| v.parse::<f64>().ok());
    assert!(
        waited.is_some_and(|n| n >= 1.0),
        "one waited for the decode worker:\n{metrics}"
    );
    wait_for_no_bookings(&router.address, Duration::from_secs(10));
}

/// `aggregated_fallback`: when the prefill side fails, a decode worker serves the request
/// whole, in both flows; nothing stays booked.
#[test]
fn a_failed_prefill_falls_back_to_the_decode_worker_when_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let broken = engine_sim(
        "p-broken",
        "127.0.0.1:0",
        &["--role", "prefill", "--fail", "http500"],
    );
    let d0 = engine_sim("d0", "127.0.0.1:0", &["--role", "decode"]);
    for mode in ["vllm", "sglang"] {
        let yaml = format!(
            "models:\n  demo: {{disaggregation: {mode}, aggregated_fallback: true}}\nworkers:\n  - {{model: demo, worker_id: 1, worker_type: prefill, url: \"{}\"}}\n  - {{model: demo, worker_id: 2, worker_type: decode, url: \"{}\"}}\n",
            broken.address, d0.address
        );
        let router = serve(&write_config(dir.path(), &yaml));
        let (status, prefill, body) = post(&router, &chat("whole on decode", false));
        assert_eq!(
            (status, prefill.as_deref()),
            (200, Some("none")),
            "{mode}: {body}"
        );
        let answer: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(answer["system_fingerprint"], "d0", "{mode}: {answer}");
        wait_for_no_bookings(&router.address, Duration::from_secs(10));
    }
}

/// The fields of the engine family's protocol a prefill or decode request carries: the
/// rest of a peer router's request is its own typed request's defaults (`logprobs`,
/// `skip_special_tokens`, ...), which switchyard does not add: it passes the client's.
const VLLM_FIELDS: &[&str] = &[
    "kv_transfer_params",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "min_tokens",
];
const SGLANG_FIELDS: &[&str] = &[
    "stream",
    "stream_options",
    "bootstrap_host",
    "bootstrap_port",
];

/// What an engine-sim recorded (`--record`), one JSON object per line.
fn recorded(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// The requests a recording engine received (not the answers it recorded).
fn received(records: &[Value]) -> Vec<&Value> {
    records.iter().filter(|r| r.get("body").is_some()).collect()
}

/// One exchange of the golden file and what switchyard's engines received for it.
struct Seen<'a> {
    golden: &'a Value,
    client: &'a Value,
    prefill_records: &'a [Value],
    n: usize,
    prefill: (&'a str, u16),
    context: &'a str,
}

impl Seen<'_> {
    /// The two sides of one request are tied as the peer ties them: one `x-request-id`
    /// (SGLang's router sends none; the bootstrap room is what ties the pair there).
    fn one_pair(
        &self,
        mode: &str,
        [ours_p, ours_d]: [&Value; 2],
        [theirs_p, theirs_d]: [&Value; 2],
    ) {
        if theirs_p["x-request-id"].is_string() {
            assert_eq!(
                theirs_p["x-request-id"], theirs_d["x-request-id"],
                "{}",
                self.context
            );
        }
        assert!(ours_p["x-request-id"].is_string(), "{}", self.context);
        assert_eq!(
            ours_p["x-request-id"], ours_d["x-request-id"],
            "{}",
            self.context
        );
        if mode == "sglang" {
            for side in [theirs_p, theirs_d, ours_p, ours_d] {
                let room = side["body"]["bootstrap_room"].as_u64();
                assert!(
                    room.is_some_and(|r| r < 1 << 63),
                    "a room below 2^63: {}",
                    self.context
                );
            }
            assert_eq!(
                theirs_p["body"]["bootstrap_room"],
                theirs_d["body"]["bootstrap_room"]
            );
            assert_eq!(
                ours_p["body"]["bootstrap_room"], ours_d["body"]["bootstrap_room"],
                "{}",
                self.context
            );
        }
    }

    /// One side's request (`ours`) against the peer's (`theirs`): the protocol's `fields`
    /// alike, everything else the client's.
    fn same_request(&self, ours: &Value, theirs: &Value, fields: &[&str]) {
        assert_eq!(ours["path"], theirs["path"], "{}", self.context);
        for field in fields {
            let (o, t) = (&ours["body"][field], &theirs["body"][field]);
            if *field == "kv_transfer_params" && t["do_remote_prefill"] == true {
                // The decode carries what its prefill answered, whole.
                assert_eq!(
                    *t, self.golden["prefill_answer_kv_transfer_params"],
                    "{}",
                    self.context
                );
                let answered = self
                    .prefill_records
                    .iter()
                    .filter_map(|r| r.get("answered_kv_transfer_params"))
                    .nth(self.n)
                    .unwrap_or_else(|| {
                        panic!("p0 answered no kv_transfer_params: {}", self.context)
                    });
                assert_eq!(o, answered, "{field}: {}", self.context);
            } else if *field == "bootstrap_host" || *field == "bootstrap_port" {
                let bootstrap = &self.golden["prefill_bootstrap"];
                assert_eq!(
                    t,
                    &bootstrap[&field["bootstrap_".len()..]],
                    "{}",
                    self.context
                );
                let ours_expected = if *field == "bootstrap_host" {
                    json!(self.prefill.0)
                } else {
                    json!(self.prefill.1)
                };
                assert_eq!(*o, ours_expected, "{field}: {}", self.context);
            } else if *field == "max_tokens" && t.is_null() {
                // SGLang's router writes the client's `max_tokens` as
                // `max_completion_tokens` (its own request type); both mean one limit.
                assert_eq!(*o, self.client["max_tokens"], "{}", self.context);
                let renamed = &theirs["body"]["max_completion_tokens"];
                assert!(
                    renamed.is_null() || *renamed == self.client["max_tokens"],
                    "{}",
                    self.context
                );
            } else if *field == "stream" {
                // Absent is not streamed (the peers write their default, `false`).
                let streamed = |v: &Value| v.as_bool().unwrap_or(false);
                assert_eq!(streamed(o), streamed(t), "{field}: {}", self.context);
            } else if *field == "max_completion_tokens" && self.client.get(*field).is_none() {
                assert!(o.is_null(), "{field}: {}", self.context);
            } else {
                assert_eq!(o, t, "{field}: {}", self.context);
            }
        }
        // Everything else is the client's, as it sent it.
        for (key, value) in self.client.as_object().unwrap() {
            if !fields.contains(&key.as_str()) {
                assert_eq!(&ours["body"][key], value, "{key}: {}", self.context);
            }
        }
    }
}

/// Sends the golden file's client requests through switchyard (`mode`) in front of
/// recording engine-sims, and checks each side's request against what the peer router
/// sent: the protocol's fields alike, one `x-request-id` for both sides, and every other
/// field the client's own.
fn matches_the_peer_router(mode: &str, golden: &str) {
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("tests/fixtures/disaggregation").join(golden))
            .unwrap(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (p_log, d_log) = (dir.path().join("p.jsonl"), dir.path().join("d.jsonl"));
    let p_arg = p_log.to_str().unwrap();
    let d_arg = d_log.to_str().unwrap();
    let p0 = engine_sim(
        "p0",
        "127.0.0.1:0",
        &["--role", "prefill", "--record", p_arg],
    );
    let d0 = engine_sim(
        "d0",
        "127.0.0.1:0",
        &["--role", "decode", "--record", d_arg],
    );
    let p_url = reqwest::Url::parse(&p0.address).unwrap();
    let (p_host, p_port) = (p_url.host_str().unwrap(), p_url.port().unwrap());
    let yaml = format!(
        "models:\n  demo: {{disaggregation: {mode}}}\nworkers:\n  \
         - {{model: demo, worker_id: 1, worker_type: prefill, url: \"{}\", bootstrap_port: {p_port}}}\n  \
         - {{model: demo, worker_id: 2, worker_type: decode, url: \"{}\"}}\n",
        p0.address, d0.address
    );
    let router = serve(&write_config(dir.path(), &yaml));
    let fields = if mode == "vllm" {
        VLLM_FIELDS
    } else {
        SGLANG_FIELDS
    };
    let exchanges = golden["exchanges"].as_array().unwrap();
    assert_eq!(exchanges.len(), 3, "the golden file's exchanges");
    for (n, exchange) in exchanges.iter().enumerate() {
        let path = exchange["path"].as_str().unwrap();
        let client = &exchange["client"];
        let answer = agent()
            .post(&format!("{}{path}", router.address))
            .send_json(client.clone());
        let answer = answer.unwrap_or_else(|e| panic!("{path} {client}: {e}"));
        let _ = answer.into_string();
        wait_for("both engines to record the request", || {
            received(&recorded(&p_log)).len() > n && received(&recorded(&d_log)).len() > n
        });
        let (p_records, d_records) = (recorded(&p_log), recorded(&d_log));
        let (ours_p, ours_d) = (received(&p_records)[n], received(&d_records)[n]);
        let (theirs_p, theirs_d) = (&exchange["prefill"], &exchange["decode"]);
        let context = format!(
            "{} vs switchyard, {path} {client}:\n  theirs: {theirs_p}\n          {theirs_d}\n  ours:   {ours_p}\n          {ours_d}",
            golden["router"]
        );
        let seen = Seen {
            golden: &golden,
            client,
            prefill_records: &p_records,
            n,
            prefill: (p_host, p_port),
            context: &context,
        };
        for (ours, theirs) in [(ours_p, theirs_p), (ours_d, theirs_d)] {
            seen.same_request(ours, theirs, fields);
        }
        seen.one_pair(mode, [ours_p, ours_d], [theirs_p, theirs_d]);
    }
    wait_for_no_bookings(&router.address, Duration::from_secs(10));
}

#[test]
fn vllm_requests_carry_what_vllm_router_sends() {
    matches_the_peer_router("vllm", "vllm-router.json");
}

#[test]
fn sglang_requests_carry_what_sglang_router_sends() {
    matches_the_peer_router("sglang", "sglang-router.json");
}

/// Both sides' lifecycle notifications, from a scorer that logs them
/// (`tests/fixtures/lifecycle_plugin.c`) built against `include`: a router of the
/// partitions' default instance, one request through `mode`, the log's lines once both
/// sides finished.
fn pair_notifications(mode: &str, include: &std::path::Path) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let lib = compile_c(
        dir.path(),
        "lifecycle",
        &repo().join("tests/fixtures/lifecycle_plugin.c"),
        include,
        &[],
    );
    let log = dir.path().join("notifications.log");
    let p0 = engine_sim("p0", "127.0.0.1:0", &["--role", "prefill"]);
    let d0 = engine_sim("d0", "127.0.0.1:0", &["--role", "decode"]);
    let yaml = format!(
        "plugins:\n  - path: {}\nmodels:\n  demo: {{disaggregation: {mode}}}\nworkers:\n  \
         - {{model: demo, worker_id: 1, worker_type: prefill, url: \"{}\"}}\n  \
         - {{model: demo, worker_id: 2, worker_type: decode, url: \"{}\"}}\n\
         worker_selection:\n  default: logged\n  instances:\n    - name: logged\n      \
         scorers: [{{type: fixture.lifecycle-log, parameters: {{log: \"{}\"}}}}]\n      \
         picker: {{type: builtin.lowest-cost}}\n",
        lib.display(),
        p0.address,
        d0.address,
        log.display()
    );
    let router = serve(&write_config(dir.path(), &yaml));
    let (status, prefill, body) = post(&router, &chat("paired", true));
    assert_eq!((status, prefill.as_deref()), (200, Some("1")), "{body}");
    let mut lines = Vec::new();
    wait_for("both sides' on_finished", || {
        lines = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect();
        lines.iter().filter(|l| l.starts_with("finished")).count() == 2
    });
    wait_for_no_bookings(&router.address, Duration::from_secs(10));
    lines
}

/// The line of `event` about worker `worker` (1: prefill, 2: decode).
fn line_of<'a>(lines: &'a [String], event: &str, worker: &str) -> &'a str {
    lines
        .iter()
        .find(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            fields[0] == event && fields[2] == worker
        })
        .unwrap_or_else(|| panic!("no `{event}` for worker {worker}: {lines:#?}"))
}

#[test]
fn lifecycle_notifications_name_the_pair() {
    for mode in ["vllm", "sglang"] {
        let lines = pair_notifications(mode, &repo().join("include"));
        // Each side's on_finished names the other.
        assert!(
            line_of(&lines, "finished", "1").ends_with(" paired 2"),
            "{mode}: {lines:#?}"
        );
        assert!(
            line_of(&lines, "finished", "2").ends_with(" paired 1"),
            "{mode}: {lines:#?}"
        );
        // on_selected names it when the other side was chosen first: vLLM's flow
        // chooses the prefill first, SGLang's the decode.
        let (first, second, other) = if mode == "vllm" {
            ("1", "2", "1")
        } else {
            ("2", "1", "2")
        };
        assert!(
            line_of(&lines, "selected", first).ends_with(" -"),
            "{mode}: {lines:#?}"
        );
        let paired = line_of(&lines, "selected", second);
        assert!(
            paired.ends_with(&format!(" paired {other}")),
            "{mode}: {lines:#?}"
        );
    }
}

#[test]
fn a_plugin_built_against_the_frozen_1_3_header_hears_no_pair_and_works() {
    let frozen = repo().join("tests/fixtures/abi-1.3");
    let header = std::fs::read_to_string(frozen.join("switchyard/plugin.h")).unwrap();
    assert!(
        header.contains("#define SWITCHYARD_ABI_MINOR 3"),
        "the frozen header is 1.3"
    );
    assert!(!header.contains("paired_worker_id"));
    let lines = pair_notifications("vllm", &frozen);
    assert_eq!(
        lines.len(),
        6,
        "selected, prefill and finished on each side: {lines:#?}"
    );
    assert!(lines.iter().all(|l| !l.contains("paired")), "{lines:#?}");
}
