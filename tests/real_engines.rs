//! Real engines behind `switchyard serve` (issue 50): llama.cpp servers (PyPI xllamacpp,
//! SmolLM2-135M, one thread each; `tests/support/llama.rs`), the built-in `default` policy
//! with `kv_tracking: predicted`; directly through the frontend, and through a real Envoy
//! with switchyard as its endpoint picker (`tests/support/real_envoy.rs`, docs/envoy.md's
//! config). Each test skips, saying why, when
//! `scripts/install-test-tools` could not install llama.cpp or the model (CI requires
//! them: `SWITCHYARD_REAL_ENGINES=required`). Answers are kept short (a few tokens).

mod support;

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::llama::{self, MODEL};
use support::real_envoy::Envoy;
use support::{metric, post_json, wait_for, write_config, Process};

/// `count` llama.cpp servers (2 slots each) behind a router; `None` (skipped) when
/// llama.cpp is not installed.
fn fleet(dir: &std::path::Path, count: usize) -> Option<(Vec<Process>, Process)> {
    fleet_cooling(dir, count, 60_000)
}

/// `fleet`, a worker that failed kept out `cooldown_ms`.
fn fleet_cooling(
    dir: &std::path::Path,
    count: usize,
    cooldown_ms: u64,
) -> Option<(Vec<Process>, Process)> {
    if !llama::available() {
        return None;
    }
    let engines = llama::servers(count, 2);
    let yaml = format!(
        "models:\n  {MODEL}: {{kv_tracking: predicted}}\n\
         engine_metrics: {{interval_ms: 200}}\n\
         frontend: {{health_interval_ms: 200, unhealthy_cooldown_ms: {cooldown_ms}}}\n\
         workers:\n{}",
        llama::workers(&engines)
    );
    let router = support::serve(&write_config(dir, &yaml));
    Some((engines, router))
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(120))
        .build()
}

/// A streamed answer as the client read it.
#[derive(Debug, Default)]
struct Streamed {
    worker: u64,
    content: String,
    /// From sending the request to the first content.
    ttft: Duration,
    /// llama.cpp's `timings` (its last chunk): `prompt_n`, `cache_n`, ...
    timings: Option<Value>,
    done: bool,
    error: Option<Value>,
}

/// Streams `body` (made `stream: true`) to the router's chat completions;
/// `at_first_content` runs once, when the first content arrives.
fn stream(base: &str, mut body: Value, at_first_content: impl FnOnce()) -> Streamed {
    body["stream"] = json!(true);
    let sent = Instant::now();
    let url = format!("{base}/v1/chat/completions");
    let response = match agent().post(&url).send_json(body) {
        Ok(response) => response,
        Err(ureq::Error::Status(status, r)) => {
            panic!("{status}: {}", r.into_string().unwrap_or_default())
        }
        Err(e) => panic!("{url}: {e}"),
    };
    let mut read = Streamed {
        // 0 through Envoy: the engine answers it directly, without the router's header.
        worker: response
            .header("x-switchyard-worker")
            .map_or(0, |w| w.parse().unwrap()),
        ..Streamed::default()
    };
    let mut at_first_content = Some(at_first_content);
    // A cut connection ends the reading as the end of the body does.
    for line in BufReader::new(response.into_reader())
        .lines()
        .map_while(Result::ok)
    {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            read.done = true;
            continue;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        if chunk.get("error").is_some() {
            read.error = Some(chunk);
            continue;
        }
        if let Some(text) = chunk["choices"][0]["delta"]["content"].as_str() {
            if let Some(first) = at_first_content.take() {
                read.ttft = sent.elapsed();
                first();
            }
            read.content.push_str(text);
        }
        if chunk.get("timings").is_some() {
            read.timings = Some(chunk["timings"].clone());
        }
    }
    read
}

fn chat(messages: &[Value], max_tokens: u64) -> Value {
    json!({"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "messages": messages})
}

fn workers(base: &str) -> Vec<Value> {
    let value: Value = ureq::get(&format!("{base}/v1/workers"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    value.as_array().unwrap().clone()
}

/// Chat completions through the frontend (raw HTTP and the official OpenAI client), not
/// streamed and streamed, answered by
/// llama.cpp; its load read from its own `/metrics` (`llamacpp:requests_processing`)
/// into `GET /v1/workers`, KV usage unknown (llama.cpp exports none).
#[test]
fn chat_through_the_frontend_and_the_engines_own_load() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_engines, router)) = fleet(dir.path(), 2) else {
        return;
    };
    let hello = [json!({"role": "user", "content": "Say hello."})];
    let url = format!("{}/v1/chat/completions", router.address);
    let (status, _, body) = post_json(&agent(), &url, &chat(&hello, 4));
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert!(
        answer["choices"][0]["message"]["content"].is_string(),
        "{answer}"
    );
    assert!(
        answer["usage"]["completion_tokens"].as_u64().unwrap() <= 4,
        "{answer}"
    );
    assert!(
        answer["timings"]["prompt_n"].is_u64(),
        "llama.cpp's own timings: {answer}"
    );
    let streamed = stream(&router.address, chat(&hello, 4), || {});
    assert!(streamed.done && streamed.error.is_none(), "{streamed:?}");
    assert!(!streamed.content.is_empty(), "{streamed:?}");
    openai_client_chats(&router.address);

    // A long answer (llama.cpp's `ignore_eos`) holds a slot while the scrapes run.
    let mut long = chat(&hello, 300);
    long["ignore_eos"] = json!(true);
    let base = router.address.clone();
    let streamed = stream(&router.address, long, || {
        wait_for(
            "the engine's own running request in GET /v1/workers",
            || {
                workers(&base).iter().any(|w| {
                    w["engine"]["state"] == "fresh" && w["engine"]["running_requests"] == 1.0
                })
            },
        );
    });
    assert!(streamed.done, "{streamed:?}");
    for worker in workers(&router.address) {
        let engine = &worker["engine"];
        assert_eq!(engine["state"], "fresh", "{worker}");
        assert_eq!(engine["waiting_requests"], 0.0, "{worker}");
        assert!(
            engine["kv_cache_usage"].is_null(),
            "none exported: {worker}"
        );
        assert!(worker.get("engine_error").is_none(), "{worker}");
    }
    support::wait_for_no_bookings(&router.address, Duration::from_secs(30));
}

/// The official OpenAI Python client (in the test venv) through the frontend to
/// llama.cpp: a whole answer and a streamed one.
fn openai_client_chats(base: &str) {
    let script = r#"
import sys, openai
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", max_retries=0)
messages = [{"role": "user", "content": "Say hello."}]
answer = client.chat.completions.create(model=sys.argv[2], messages=messages, max_tokens=4)
print("whole", answer.choices[0].finish_reason, answer.usage.completion_tokens)
chunks = client.chat.completions.create(model=sys.argv[2], messages=messages, max_tokens=4, stream=True)
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
print("streamed", len(text) > 0)
"#;
    let python = support::repo().join("target/test-venv/bin/python");
    let out = std::process::Command::new(python)
        .args(["-c", script, base, MODEL])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("whole "), "{stdout}");
    assert!(stdout.contains("streamed True"), "{stdout}");
}

/// A system prompt of about 200 tokens, different per conversation.
fn system_prompt(conversation: usize) -> String {
    let topics = ["rivers", "mountains", "deserts", "forests"];
    let topic = topics[conversation % topics.len()];
    let facts: String = (0..12)
        .map(|i| format!("Fact {i} about {topic}: they are studied by geographers in region {conversation}-{i}. "))
        .collect();
    format!("You are a helpful guide to {topic}. {facts}Answer in one short sentence.")
}

/// The second turn of a conversation lands on the engine that served the first, and
/// llama.cpp reuses the first turn's prompt from its slot (`timings.cache_n`).
#[test]
fn a_second_turn_lands_where_its_prefix_is_cached() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_engines, router)) = fleet(dir.path(), 2) else {
        return;
    };
    for conversation in 0..3 {
        let mut messages = vec![
            json!({"role": "system", "content": system_prompt(conversation)}),
            json!({"role": "user", "content": "Where are they found?"}),
        ];
        let first = stream(&router.address, chat(&messages, 6), || {});
        messages.push(json!({"role": "assistant", "content": first.content}));
        messages.push(json!({"role": "user", "content": "And why?"}));
        let second = stream(&router.address, chat(&messages, 6), || {});
        let prompt_n = |s: &Streamed| s.timings.as_ref().unwrap()["prompt_n"].as_u64().unwrap();
        let cache_n = |s: &Streamed| s.timings.as_ref().unwrap()["cache_n"].as_u64().unwrap();
        eprintln!(
            "conversation {conversation}: turn 1 worker {} ttft {:?} prompt_n {} cache_n {}; turn 2 worker {} ttft {:?} prompt_n {} cache_n {}",
            first.worker, first.ttft, prompt_n(&first), cache_n(&first),
            second.worker, second.ttft, prompt_n(&second), cache_n(&second),
        );
        assert_eq!(second.worker, first.worker, "conversation {conversation}");
        // Turn 1's whole prompt is turn 2's prefix; llama.cpp evaluated it already.
        let turn_one = prompt_n(&first) + cache_n(&first);
        assert!(
            cache_n(&second) * 10 >= turn_one * 9,
            "conversation {conversation}: turn 2 reused {} of turn 1's {turn_one} prompt tokens",
            cache_n(&second)
        );
    }
}

/// An engine killed mid-answer: the client's stream ends with an error event (no hang,
/// no [DONE]), the failure is counted, and the router keeps serving on the other engine.
#[test]
fn an_engine_killed_mid_stream_ends_the_stream_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let Some((mut engines, router)) = fleet(dir.path(), 2) else {
        return;
    };
    let hello = [json!({"role": "user", "content": "Tell me a long story."})];
    let mut long = chat(&hello, 300);
    long["ignore_eos"] = json!(true);
    let worker = std::cell::Cell::new(0u64);
    let base = router.address.clone();
    let streamed = stream(&router.address, long, || {
        // The answering worker is the one with a booking.
        let active = support::active_requests(&base);
        let busy = active.iter().position(|&n| n > 0).unwrap();
        worker.set(busy as u64 + 1);
        engines[busy].kill();
    });
    assert_eq!(streamed.worker, worker.get());
    assert!(!streamed.done, "{streamed:?}");
    let error = streamed.error.expect("an SSE error event ends the stream");
    assert_eq!(error["error"]["code"], "upstream_error", "{error}");
    let mid_answer = "switchyard_upstream_failures_total{kind=\"mid_answer\"}";
    assert_eq!(metric(&router.address, mid_answer), 1.0);
    let url = format!("{}/v1/chat/completions", router.address);
    let hello = [json!({"role": "user", "content": "Say hello."})];
    for turn in 0..3 {
        let (status, engine, body) = post_json(&agent(), &url, &chat(&hello, 3));
        assert_eq!(
            status, 200,
            "request {turn} after the kill: {body} ({engine})"
        );
    }
    support::wait_for_no_bookings(&router.address, Duration::from_secs(30));
}

/// An engine killed and restarted at its address: once its health probe passes again,
/// every request is answered (none lost to a connection of the process that died), and
/// the router counts no failure it did not retry.
#[test]
fn an_engine_restarted_costs_no_request() {
    let dir = tempfile::tempdir().unwrap();
    let Some((mut engines, router)) = fleet_cooling(dir.path(), 1, 300) else {
        return;
    };
    let url = format!("{}/v1/chat/completions", router.address);
    let hello = [json!({"role": "user", "content": "Say hello."})];
    let (status, _, body) = post_json(&agent(), &url, &chat(&hello, 3));
    assert_eq!(status, 200, "{body}");
    llama::restart(&mut engines[0], 2);
    wait_for("the restarted engine healthy again", || {
        workers(&router.address)[0]["healthy"] == true
    });
    for turn in 0..4 {
        let (status, _, body) = post_json(&agent(), &url, &chat(&hello, 3));
        assert_eq!(status, 200, "request {turn} after the restart: {body}");
    }
    assert_eq!(
        metric(&router.address, "switchyard_upstream_errors_total"),
        0.0
    );
}

/// Through a real Envoy with switchyard as its endpoint picker (docs/envoy.md's config,
/// the engines registered by address): llama.cpp answers the official OpenAI client,
/// whole and streamed, and a conversation's second turn goes to the engine that served
/// its first, which reuses the first turn's prompt (its own `timings.cache_n`).
#[test]
fn through_a_real_envoy_a_second_turn_lands_where_its_prefix_is_cached() {
    if !llama::available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let engines = llama::servers(3, 2);
    let by_address: String = engines
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let address = e.address.trim_start_matches("http://");
            format!(
                "  - {{model: {MODEL}, worker_id: {}, address: \"{address}\"}}\n",
                i + 1
            )
        })
        .collect();
    let yaml = format!("models:\n  {MODEL}: {{kv_tracking: predicted}}\nworkers:\n{by_address}");
    let port = support::free_port();
    let _router = support::serve_with_picker(&write_config(dir.path(), &yaml), port);
    let envoy = Envoy::start(dir.path(), port);
    let url = format!("{}/v1/chat/completions", envoy.base);
    let hello = [json!({"role": "user", "content": "Say hello."})];
    // Until the picker's gRPC health check passes, Envoy may fail the first requests.
    wait_for("Envoy routing through the picker", || {
        post_json(&agent(), &url, &chat(&hello, 2)).0 == 200
    });
    openai_client_chats(&envoy.base);
    for conversation in 0..2 {
        let mut messages = vec![
            json!({"role": "system", "content": system_prompt(conversation)}),
            json!({"role": "user", "content": "Where are they found?"}),
        ];
        let before = generated(&engines);
        let first = stream(&envoy.base, chat(&messages, 6), || {});
        let first_engine = engine_that_answered(&engines, &before);
        messages.push(json!({"role": "assistant", "content": first.content}));
        messages.push(json!({"role": "user", "content": "And why?"}));
        let before = generated(&engines);
        let second = stream(&envoy.base, chat(&messages, 6), || {});
        assert!(first.done && second.done, "{first:?} {second:?}");
        assert_eq!(
            engine_that_answered(&engines, &before),
            first_engine,
            "conversation {conversation}"
        );
        let timings = |s: &Streamed, key: &str| s.timings.as_ref().unwrap()[key].as_u64().unwrap();
        let turn_one = timings(&first, "prompt_n") + timings(&first, "cache_n");
        assert!(
            timings(&second, "cache_n") * 10 >= turn_one * 9,
            "conversation {conversation}: turn 2 reused {} of turn 1's {turn_one} prompt tokens",
            timings(&second, "cache_n")
        );
    }
}

/// Each engine's count of generated tokens (llama.cpp's `/metrics`).
fn generated(engines: &[Process]) -> Vec<f64> {
    let name = "llamacpp:tokens_predicted_total";
    engines.iter().map(|e| metric(&e.address, name)).collect()
}

/// The one engine whose count grew since `before` (llama.cpp counts a request's tokens
/// as its slot is released, which may come just after the answer's last byte).
fn engine_that_answered(engines: &[Process], before: &[f64]) -> usize {
    let grew = || -> Vec<usize> {
        let now = generated(engines);
        (0..now.len()).filter(|&i| now[i] > before[i]).collect()
    };
    wait_for("an engine counting the answer's tokens", || {
        !grew().is_empty()
    });
    let grew = grew();
    assert_eq!(grew.len(), 1, "one engine answered: {grew:?}");
    grew[0]
}

/// llama.cpp has no prefill/decode disaggregation: configured as a vLLM pair anyway, the
/// request is still answered (the decode engine computes the prompt again) and the router
/// says once, naming the prefill worker, that disaggregation does not apply and what to
/// set.
#[test]
fn disaggregation_does_not_apply_to_llama_cpp_and_the_router_says_so() {
    if !llama::available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let engines = llama::servers(2, 1);
    let yaml = format!(
        "models:\n  {MODEL}: {{disaggregation: vllm, kv_tracking: predicted}}\n\
         workers:\n  - {{model: {MODEL}, worker_id: 1, worker_type: prefill, url: \"{}\"}}\n  \
         - {{model: {MODEL}, worker_id: 2, worker_type: decode, url: \"{}\"}}\n",
        engines[0].address, engines[1].address
    );
    let log = dir.path().join("router.log");
    let router = Process::start(
        std::process::Command::new(support::switchyard_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(write_config(dir.path(), &yaml))
            .env("RUST_LOG", "warn")
            .stderr(std::fs::File::create(&log).unwrap()),
        "switchyard listening on ",
    );
    let url = format!("{}/v1/chat/completions", router.address);
    let hello = [json!({"role": "user", "content": "Say hello."})];
    for turn in 0..2 {
        let (status, _, body) = post_json(&agent(), &url, &chat(&hello, 3));
        assert_eq!(status, 200, "request {turn}: {body}");
    }
    let said = std::fs::read_to_string(&log).unwrap();
    let told: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("disaggregation does not apply"))
        .collect();
    assert_eq!(told.len(), 1, "said once: {said}");
    for field in ["worker=1", "disaggregation: off", "llama.cpp"] {
        assert!(told[0].contains(field), "`{field}` missing: {}", told[0]);
    }
    support::wait_for_no_bookings(&router.address, Duration::from_secs(30));
}
