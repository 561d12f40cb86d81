//! The OpenAI-compatible frontend end to end: `switchyard serve` in front of several
//! `switchyard engine-sim` processes on loopback, started and killed (by PID) here. Real
//! HTTP all the way; every request loop is bounded in count and time.

mod support;

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};
use support::*;

/// A router whose workers 1..=n are the given engine addresses, predicted KV tracking,
/// and fast health probes.
fn router(dir: &std::path::Path, engines: &[&str]) -> Process {
    let workers: String = engines
        .iter()
        .enumerate()
        .map(|(i, url)| {
            format!(
                "  - {{model: demo, worker_id: {}, url: \"{url}\"}}\n",
                i + 1
            )
        })
        .collect();
    let yaml = format!(
        "models:\n  demo: {{kv_tracking: predicted}}\n\
         frontend: {{health_interval_ms: 100, unhealthy_cooldown_ms: 300, connect_timeout_ms: 500, connect_retries: 3}}\n\
         workers:\n{workers}"
    );
    serve(&write_config(dir, &yaml))
}

fn chat(content: &str, stream: bool, max_tokens: u64) -> Value {
    json!({"model": "demo", "stream": stream, "max_tokens": max_tokens,
           "messages": [{"role": "system", "content": "You are a routing test."}, {"role": "user", "content": content}]})
}

async fn workers(client: &reqwest::Client, base: &str) -> Vec<Value> {
    let value = get_json(client, &format!("{base}/v1/workers")).await;
    value.as_array().unwrap().clone()
}

async fn metrics(client: &reqwest::Client, base: &str) -> String {
    client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Waits (bounded) until every worker's booked load is zero; panics with the loads if not.
async fn wait_for_zero_load(client: &reqwest::Client, base: &str) {
    eventually_ok_async("no booking left", Duration::from_secs(10), || async {
        let workers = workers(client, base).await;
        let busy = workers.iter().any(|w| {
            let load = &w["load"];
            load["active_requests"] != 0
                || load["active_prefill_tokens"] != 0
                || load["active_decode_blocks"] != 0
        });
        if busy {
            Err(format!("{workers:#?}"))
        } else {
            Ok(())
        }
    })
    .await;
}

/// Splits complete SSE events (`data: ...\n\n`) off the front of `buffer`.
fn events(buffer: &mut String) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(end) = buffer.find("\n\n") {
        let event: String = buffer.drain(..end + 2).collect();
        if let Some(data) = event.trim().strip_prefix("data: ") {
            out.push(data.to_owned());
        }
    }
    out
}

#[test]
fn a_streamed_answer_is_relayed_while_the_engine_still_produces_it() {
    let dir = tempfile::tempdir().unwrap();
    // 8 tokens at 10 tokens/s: the engine needs ~0.8 s for the whole answer.
    let engine = engine_sim("solo", "127.0.0.1:0", &["--decode-tps", "10"]);
    let router = router(dir.path(), &[&engine.address]);
    runtime().block_on(async {
        let client = support::http_client();
        let base = &router.address;
        let response = client
            .post(format!("{base}/v1/chat/completions"))
            .json(&chat("stream me", true, 8))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let headers = response.headers().clone();
        assert_eq!(headers["content-type"], "text/event-stream");
        assert_eq!(headers["x-switchyard-worker"], "1");
        assert_eq!(headers["x-switchyard-instance"], "default");
        assert_eq!(headers["x-switchyard-fallback"], "false");
        let mut body = response.bytes_stream();
        let mut buffer = String::new();
        let mut received = Vec::new();
        while received.is_empty() {
            let chunk = body.next().await.expect("a first chunk").unwrap();
            buffer.push_str(std::str::from_utf8(&chunk).unwrap());
            received.extend(events(&mut buffer));
        }
        // The first token is here and the answer is not: the router still holds the
        // booking, already past prefill. A buffering proxy would have freed it by now.
        let load = workers(&client, base).await[0]["load"].clone();
        assert_eq!(load["active_requests"], 1, "{load}");
        assert_eq!(
            load["active_prefill_tokens"], 0,
            "prefill completes at the first token: {load}"
        );
        let first: Value = serde_json::from_str(&received[0]).unwrap();
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(first["choices"][0]["delta"]["content"], "tok0 ");
        while let Some(chunk) = body.next().await {
            buffer.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
            received.extend(events(&mut buffer));
        }
        assert_eq!(received.len(), 9, "8 tokens and [DONE]: {received:?}");
        assert_eq!(received.last().unwrap(), "[DONE]");
        wait_for_zero_load(&client, base).await;
    });
}

#[test]
fn a_repeated_prompt_goes_back_to_the_worker_that_cached_it() {
    let dir = tempfile::tempdir().unwrap();
    let engines: Vec<_> = (0..3)
        .map(|i| engine_sim(&format!("e{i}"), "127.0.0.1:0", &[]))
        .collect();
    let urls: Vec<&str> = engines.iter().map(|e| e.address.as_str()).collect();
    let router = router(dir.path(), &urls);
    runtime().block_on(async {
        let client = support::http_client();
        let url = format!("{}/v1/chat/completions", router.address);
        let prompt = "Summarise the following report. ".repeat(40);
        let first = client
            .post(&url)
            .json(&chat(&prompt, false, 4))
            .send()
            .await
            .unwrap();
        assert_eq!(first.status(), 200);
        assert_eq!(first.headers()["x-switchyard-overlap-blocks"], "0");
        let served_by = first.headers()["x-switchyard-worker"]
            .to_str()
            .unwrap()
            .to_owned();
        let answer: Value = first.json().await.unwrap();
        assert_eq!(answer["object"], "chat.completion");
        for _ in 0..5 {
            let again = client
                .post(&url)
                .json(&chat(&prompt, false, 4))
                .send()
                .await
                .unwrap();
            assert_eq!(again.headers()["x-switchyard-worker"], served_by.as_str());
            let overlap: u64 = again.headers()["x-switchyard-overlap-blocks"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!(
                overlap >= 20,
                "the prompt's blocks are predicted cached: {overlap}"
            );
            again.bytes().await.unwrap();
        }
        // Completions go through the same frontend (their prompt renders differently
        // from a chat's, so they find their own worker, then stay on it).
        let completion = |prompt: String| {
            client
                .post(format!("{}/v1/completions", router.address))
                .json(&json!({"model": "demo", "prompt": prompt, "max_tokens": 2}))
                .send()
        };
        let first = completion(prompt.clone()).await.unwrap();
        let completion_worker = first.headers()["x-switchyard-worker"].clone();
        assert_eq!(
            first.json::<Value>().await.unwrap()["object"],
            "text_completion"
        );
        let again = completion(prompt.clone()).await.unwrap();
        assert_eq!(again.headers()["x-switchyard-worker"], completion_worker);
        assert_ne!(again.headers()["x-switchyard-overlap-blocks"], "0");
        again.bytes().await.unwrap();
        let models: Value = client
            .get(format!("{}/v1/models", router.address))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(models["data"][0]["id"], "demo");
        wait_for_zero_load(&client, &router.address).await;
        // One time-to-first-byte sample per answered request: 6 chats, 2 completions.
        let metrics = metrics(&client, &router.address).await;
        assert!(
            metrics.contains("switchyard_frontend_ttfb_seconds_count 8\n"),
            "{metrics}"
        );
    });
}

#[test]
fn bad_requests_get_openai_errors_and_book_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_sim("e", "127.0.0.1:0", &[]);
    let router = router(dir.path(), &[&engine.address]);
    runtime().block_on(async {
        let client = support::http_client();
        let url = format!("{}/v1/chat/completions", router.address);
        for (body, status, param) in [
            ("{not json", 400, Value::Null),
            (
                r#"{"messages":[{"role":"user","content":"x"}]}"#,
                400,
                json!("model"),
            ),
            (r#"{"model":"demo","messages":"x"}"#, 400, json!("messages")),
            (
                r#"{"model":"demo","messages":[{"role":"user","content":"x"}],"stream":"yes"}"#,
                400,
                json!("stream"),
            ),
            (
                r#"{"model":"elsewhere","messages":[{"role":"user","content":"x"}]}"#,
                404,
                Value::Null,
            ),
        ] {
            let response = client.post(&url).body(body).send().await.unwrap();
            assert_eq!(response.status(), status, "{body}");
            let error: Value = response.json().await.unwrap();
            assert!(
                error["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty()),
                "{error}"
            );
            assert!(error["error"]["type"].is_string(), "{error}");
            assert_eq!(error["error"]["param"], param, "{body}: {error}");
        }
        let unknown_instance = client
            .post(&url)
            .header("x-switchyard-instance", "nope")
            .json(&chat("x", false, 1))
            .send()
            .await
            .unwrap();
        assert_eq!(unknown_instance.status(), 404);
        wait_for_zero_load(&client, &router.address).await;
    });
    // An engine's own error passes through with its status and body, and frees.
    let failing = engine_failing();
    let router = self::router(dir.path(), &[&failing.address]);
    runtime().block_on(async {
        let client = support::http_client();
        let response = client
            .post(format!("{}/v1/chat/completions", router.address))
            .json(&chat("x", true, 4))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 500);
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["message"], "simulated engine failure");
        wait_for_zero_load(&client, &router.address).await;
    });
}

fn engine_failing() -> Process {
    engine_sim("failing", "127.0.0.1:0", &["--fail", "http500"])
}

#[test]
fn a_refused_engine_is_skipped_marked_unhealthy_and_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let down = format!("http://127.0.0.1:{port}");
    let up = engine_sim("up", "127.0.0.1:0", &[]);
    let router = router(dir.path(), &[&down, &up.address]);
    let rt = runtime();
    rt.block_on(async {
        let client = support::http_client();
        let url = format!("{}/v1/chat/completions", router.address);
        for i in 0..10 {
            let response = client
                .post(&url)
                .json(&chat(&format!("p{i}"), false, 2))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            assert_eq!(response.headers()["x-switchyard-worker"], "2");
            response.bytes().await.unwrap();
        }
        let listed = workers(&client, &router.address).await;
        assert_eq!(listed[0]["healthy"], false, "{listed:#?}");
        assert_eq!(listed[0]["url"], down.as_str());
        assert_eq!(listed[1]["healthy"], true);
        wait_for_zero_load(&client, &router.address).await;
    });
    // The engine comes up on that port; probes bring the worker back after its cool-down.
    let _back = engine_sim("back", &format!("127.0.0.1:{port}"), &[]);
    rt.block_on(async {
        let client = support::http_client();
        eventually_async("the worker comes back", Duration::from_secs(10), || async {
            workers(&client, &router.address).await[0]["healthy"] == true
        })
        .await;
        let url = format!("{}/v1/chat/completions", router.address);
        let mut to_first = 0;
        for i in 0..40 {
            let response = client
                .post(&url)
                .json(&chat(&format!("fresh {i}"), false, 1))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            to_first += usize::from(response.headers()["x-switchyard-worker"] == "1");
            response.bytes().await.unwrap();
        }
        assert!(to_first > 0, "no request reached the recovered worker");
    });
}

enum Outcome {
    Completed,
    Disconnected,
    /// An OpenAI error body, or an SSE error event after the stream began.
    ClearError,
    /// Anything else: a failure without a message.
    Unclear(String),
}

/// How a streamed request ended, and the worker that answered it (its
/// `x-switchyard-worker` header) when one did.
async fn streamed_request(
    client: reqwest::Client,
    url: String,
    i: usize,
    started: Arc<AtomicUsize>,
) -> (Outcome, Option<String>) {
    let disconnect = i.is_multiple_of(10);
    let prompt = format!("{} request {i}", "shared context ".repeat(i % 5 * 20));
    let response = match client
        .post(&url)
        .json(&chat(&prompt, true, 20))
        .send()
        .await
    {
        Ok(response) => response,
        Err(e) => return (Outcome::Unclear(format!("request failed: {e}")), None),
    };
    let worker = response
        .headers()
        .get("x-switchyard-worker")
        .and_then(|w| w.to_str().ok())
        .map(str::to_owned);
    (stream_outcome(response, disconnect, &started).await, worker)
}

/// How the stream of `response` ended (hanging up after the first event if `disconnect`).
async fn stream_outcome(
    response: reqwest::Response,
    disconnect: bool,
    started: &AtomicUsize,
) -> Outcome {
    if !response.status().is_success() {
        return match response.json::<Value>().await {
            Ok(error) if error["error"]["message"].is_string() => Outcome::ClearError,
            other => Outcome::Unclear(format!("error without a body: {other:?}")),
        };
    }
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let mut first = true;
    while let Some(chunk) = body.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => return Outcome::Unclear(format!("stream broke without an error event: {e}")),
        };
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        for event in events(&mut buffer) {
            if first {
                first = false;
                started.fetch_add(1, Ordering::Relaxed);
                if disconnect {
                    return Outcome::Disconnected; // drops the body: the client hangs up
                }
            }
            if event == "[DONE]" {
                return Outcome::Completed;
            }
            if serde_json::from_str::<Value>(&event)
                .is_ok_and(|v| v["error"]["message"].is_string())
            {
                return Outcome::ClearError;
            }
        }
    }
    Outcome::Unclear("the stream ended without [DONE] or an error event".into())
}

/// Only the killed engine's (worker `victim`'s) streams fail: every stream a surviving
/// engine answered completes, or hangs up as planned.
fn no_stream_of_a_survivor_failed(outcomes: &[(Outcome, Option<String>)], victim: &str) {
    let failed_on_survivors: Vec<&Option<String>> = outcomes
        .iter()
        .filter(|(o, worker)| {
            matches!(o, Outcome::ClearError) && worker.as_deref().is_some_and(|w| w != victim)
        })
        .map(|(_, worker)| worker)
        .collect();
    assert!(
        failed_on_survivors.is_empty(),
        "streams of surviving engines failed: {failed_on_survivors:?}"
    );
}

/// Kills `victim` (by PID) once `streams` have started.
async fn kill_after(victim: u32, started: Arc<AtomicUsize>, streams: usize) {
    eventually_async("the streams start", Duration::from_secs(30), || {
        std::future::ready(started.load(Ordering::Relaxed) >= streams)
    })
    .await;
    let status = Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn a_thousand_streams_with_hangups_and_a_killed_engine_leave_no_booking() {
    let dir = tempfile::tempdir().unwrap();
    let mut engines: Vec<_> = (0..3)
        .map(|i| engine_sim(&format!("e{i}"), "127.0.0.1:0", &["--decode-tps", "100"]))
        .collect();
    let urls: Vec<String> = engines.iter().map(|e| e.address.clone()).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let router = router(dir.path(), &urls);
    let victim = engines[2].pid();
    let started = Arc::new(AtomicUsize::new(0));
    // reqwest's rustls needs a process-wide provider (another test may not have run).
    switchyard::engines::tls::install_default_provider();
    let outcomes = runtime().block_on(async {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        let url = format!("{}/v1/chat/completions", router.address);
        let tasks: Vec<_> = (0..1000)
            .map(|i| {
                tokio::spawn(streamed_request(
                    client.clone(),
                    url.clone(),
                    i,
                    started.clone(),
                ))
            })
            .collect();
        // Kill one engine (by PID) once a few hundred streams are under way.
        let killer = tokio::spawn(kill_after(victim, started.clone(), 300));
        let mut outcomes = Vec::new();
        for task in tasks {
            let outcome = tokio::time::timeout(Duration::from_secs(120), task)
                .await
                .expect("every request ends within the time bound")
                .unwrap();
            outcomes.push(outcome);
        }
        killer.await.unwrap();
        wait_for_zero_load(&client, &router.address).await;
        let listed = workers(&client, &router.address).await;
        assert_eq!(
            listed[2]["healthy"], false,
            "the killed engine is out: {listed:#?}"
        );
        outcomes
    });
    engines[2].kill();
    let count = |f: fn(&Outcome) -> bool| outcomes.iter().filter(|(o, _)| f(o)).count();
    let unclear: Vec<&str> = outcomes
        .iter()
        .filter_map(|(o, _)| match o {
            Outcome::Unclear(reason) => Some(reason.as_str()),
            _ => None,
        })
        .collect();
    assert!(
        unclear.is_empty(),
        "{} requests ended without a clear outcome: {:?}",
        unclear.len(),
        &unclear[..unclear.len().min(5)]
    );
    let hung_up = count(|o| matches!(o, Outcome::Disconnected));
    let completed = count(|o| matches!(o, Outcome::Completed));
    let errors = count(|o| matches!(o, Outcome::ClearError));
    // A request meant to hang up after its first token may have failed before it.
    assert!((50..=100).contains(&hung_up), "{hung_up} hung up");
    assert_eq!(completed + errors + hung_up, 1000);
    no_stream_of_a_survivor_failed(&outcomes, "3");
    // A burst of a thousand selections at once is not spread evenly (selections running
    // together read the same bookings), so the killed engine can hold up to about half
    // of the streams: 465 to 765 completed in this session's runs.
    assert!(
        completed >= 400,
        "the surviving engines' requests complete: {completed} completed, {errors} clear errors"
    );
    println!(
        "1000 streams: {completed} completed, {hung_up} hung up, {errors} ended with a clear error"
    );
}

#[test]
fn a_model_with_a_tokenizer_routes_on_its_tokens_and_refuses_what_its_template_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_sim("e", "127.0.0.1:0", &[]);
    let tokenizer = repo().join("tests/fixtures/tokenizer/tokenizer.json");
    let yaml = format!(
        "models:\n  demo: {{kv_tracking: predicted, tokenizer: {}}}\nworkers:\n  - {{model: demo, worker_id: 1, url: \"{}\"}}\n",
        tokenizer.display(),
        engine.address
    );
    let router = serve(&write_config(dir.path(), &yaml));
    runtime().block_on(async {
        let client = support::http_client();
        let url = format!("{}/v1/chat/completions", router.address);
        let messages = json!([{"role": "system", "content": "You are a helpful assistant."},
                              {"role": "user", "content": "Summarise the following report in three sentences."}]);
        let body = json!({"model": "demo", "max_tokens": 2, "messages": messages});
        for expected_overlap in ["0", "2"] {
            // 40 tokens (golden.json): two full blocks of 16, cached after the first.
            let response = client.post(&url).json(&body).send().await.unwrap();
            assert_eq!(response.status(), 200);
            assert_eq!(response.headers()["x-switchyard-overlap-blocks"], expected_overlap);
            response.bytes().await.unwrap();
        }
        let refused = client
            .post(&url)
            .json(&json!({"model": "demo", "messages": [{"role": "tool", "content": "x"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 400);
        let error: Value = refused.json().await.unwrap();
        assert!(
            error["error"]["message"].as_str().unwrap().contains("Conversation roles must be system, user or assistant"),
            "{error}"
        );
        wait_for_zero_load(&client, &router.address).await;
    });
    // `check` loads tokenizers too, and names the config line of one that does not load.
    let broken = format!(
        "models:\n  demo:\n    tokenizer: {}\n",
        repo()
            .join("tests/fixtures/tokenizer/golden.json")
            .display()
    );
    let config = write_config(dir.path(), &broken);
    let output = Command::new(switchyard_bin())
        .args(["check", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("config.yaml:3: model `demo`:"), "{stderr}");
    assert!(
        stderr.contains("golden.json: not a loadable Hugging Face tokenizer.json"),
        "{stderr}"
    );
}

#[test]
fn an_engine_dying_mid_stream_ends_the_stream_with_an_error_event_and_frees() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_sim("dying", "127.0.0.1:0", &["--fail", "abort-mid-stream"]);
    let router = router(dir.path(), &[&engine.address]);
    runtime().block_on(async {
        let client = support::http_client();
        let response = client
            .post(format!("{}/v1/chat/completions", router.address))
            .json(&chat("die halfway", true, 10))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let mut body = response.bytes_stream();
        let (mut buffer, mut received) = (String::new(), Vec::new());
        while let Some(chunk) = body.next().await {
            buffer.push_str(
                std::str::from_utf8(&chunk.expect("the router ends the stream cleanly")).unwrap(),
            );
            received.extend(events(&mut buffer));
        }
        // Up to the 5 tokens sent before the engine died (the last may die with the
        // connection), then the error event.
        assert!((2..=6).contains(&received.len()), "{received:?}");
        let error: Value = serde_json::from_str(received.last().unwrap()).unwrap();
        assert_eq!(error["error"]["code"], "upstream_error", "{error}");
        wait_for_zero_load(&client, &router.address).await;
        let metrics = metrics(&client, &router.address).await;
        assert!(
            metrics.contains("switchyard_upstream_errors_total 1\n"),
            "{metrics}"
        );
    });
}

#[test]
fn requests_over_max_in_flight_get_429_and_the_slots_come_back() {
    let dir = tempfile::tempdir().unwrap();
    // 8 tokens at 20 tokens/s: each answer takes ~0.4 s, so six sent at once overlap.
    let engine = engine_sim("slow", "127.0.0.1:0", &["--decode-tps", "20"]);
    let yaml = format!(
        "frontend: {{max_in_flight: 2}}\nworkers:\n  - {{model: demo, worker_id: 1, url: \"{}\"}}\n",
        engine.address
    );
    let router = serve(&write_config(dir.path(), &yaml));
    let base = router.address.clone();
    runtime().block_on(async {
        let client = support::http_client();
        let send = |content: String| {
            let (client, base) = (client.clone(), base.clone());
            tokio::spawn(async move {
                let response = client
                    .post(format!("{base}/v1/chat/completions"))
                    .json(&chat(&content, true, 8))
                    .send()
                    .await
                    .unwrap();
                let status = response.status().as_u16();
                (status, response.text().await.unwrap())
            })
        };
        let answers: Vec<(u16, String)> =
            futures_util::future::join_all((0..6).map(|i| send(format!("request {i}"))))
                .await
                .into_iter()
                .map(Result::unwrap)
                .collect();
        let ok = answers.iter().filter(|(s, _)| *s == 200).count();
        let shed: Vec<&String> = answers
            .iter()
            .filter(|(s, _)| *s == 429)
            .map(|(_, b)| b)
            .collect();
        assert_eq!((ok, shed.len()), (2, 4), "{answers:?}");
        let error: Value = serde_json::from_str(shed[0]).unwrap();
        assert_eq!(error["error"]["code"], "rate_limit_exceeded", "{error}");
        assert!(error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_in_flight"));
        // The answers are over: their slots are free again.
        let (status, body) = send("after".into()).await.unwrap();
        assert_eq!(status, 200, "{body}");
        wait_for_zero_load(&client, &base).await;
        assert!(metrics(&client, &base)
            .await
            .contains("switchyard_frontend_shed_total 4"));
    });
}

/// An engine that fails before its answer's first byte (it sends a JSON answer's
/// headers, then closes), asked for a stream: the client gets a 502 with an OpenAI error
/// as JSON, not an SSE event inside a JSON body. An engine slower than
/// `request_timeout_secs` ends a stream with an SSE error that says it timed out, and
/// how long the limit is. Nothing stays booked.
#[test]
fn streams_end_honestly_when_the_engine_fails_before_or_during_them() {
    let dir = tempfile::tempdir().unwrap();
    let closing = engine_sim("closing", "127.0.0.1:0", &["--fail", "close-after-headers"]);
    let router = router(dir.path(), &[&closing.address]);
    runtime().block_on(async {
        let client = support::http_client();
        for stream in [true, false] {
            let response = client
                .post(format!("{}/v1/chat/completions", router.address))
                .json(&chat("closed early", stream, 4))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 502, "stream: {stream}");
            assert!(response.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("application/json"));
            let error: Value = response.json().await.unwrap();
            assert_eq!(error["error"]["type"], "server_error", "{error}");
            assert!(
                error["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("worker 1: the engine failed mid-answer"),
                "{error}"
            );
        }
        wait_for_zero_load(&client, &router.address).await;
    });

    let slow = engine_sim("slow", "127.0.0.1:0", &["--decode-tps", "4"]);
    let yaml = format!(
        "frontend: {{request_timeout_secs: 1}}\nworkers:\n  - {{model: demo, worker_id: 1, url: \"{}\"}}\n",
        slow.address
    );
    let router = serve(&write_config(dir.path(), &yaml));
    runtime().block_on(async {
        let client = support::http_client();
        let response = client
            .post(format!("{}/v1/chat/completions", router.address))
            .json(&chat("too slow", true, 40))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let text = response.text().await.expect("the stream ends cleanly");
        let last = text
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .last()
            .unwrap()
            .to_owned();
        let error: Value = serde_json::from_str(&last).unwrap();
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains("timed out after 1 s"),
            "{error}"
        );
        wait_for_zero_load(&client, &router.address).await;
    });
}
