//! KV events from engines in vLLM's ZeroMQ/msgpack format: golden bytes made by vLLM's
//! own code (tests/fixtures/kv_events/make_golden.py, from the released wheels of v0.23.0
//! and v0.33.0) decode to what vLLM meant; and end to end, `engine-sim` processes publish
//! on loopback ZeroMQ sockets while `switchyard serve` subscribes, replays a lost batch,
//! and clears a restarted engine. Every wait is bounded.

mod support;

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use support::*;
use switchyard::fleet::kv_events::wire::{decode, split_frames, EngineEvent, END_SEQUENCE};

fn golden(name: &str) -> Vec<u8> {
    std::fs::read(repo().join("tests/fixtures/kv_events").join(name)).unwrap()
}

/// What the golden manifest says an event is, in the decoder's terms.
fn expected_event(e: &Value) -> EngineEvent {
    use switchyard::fleet::kv_events::wire::{RemovedBlocks, StoredBlocks};
    let hashes = |v: &Value| -> Vec<u64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_u64().unwrap())
            .collect()
    };
    let string = |v: &Value| v.as_str().map(str::to_owned);
    match e["type"].as_str().unwrap() {
        "BlockStored" => EngineEvent::Stored(StoredBlocks {
            block_hashes: hashes(&e["block_hashes"]),
            parent_block_hash: e["parent_block_hash"].as_u64(),
            token_ids: hashes(&e["token_ids"])
                .into_iter()
                .map(|t| t as u32)
                .collect(),
            block_size: e["block_size"].as_u64().unwrap() as u32,
            lora_id: e["lora_id"].as_i64(),
            lora_name: None,
            medium: string(&e["medium"]),
            extra_keys: Vec::new(),
            group_idx: e["group_idx"].as_i64(),
            kv_cache_spec_kind: string(&e["kv_cache_spec_kind"]),
        }),
        "BlockRemoved" => EngineEvent::Removed(RemovedBlocks {
            block_hashes: hashes(&e["block_hashes"]),
            medium: string(&e["medium"]),
            group_idx: e["group_idx"].as_i64(),
        }),
        "AllBlocksCleared" => EngineEvent::AllCleared,
        other => panic!("unknown golden event {other}"),
    }
}

#[test]
fn golden_payloads_from_vllm_0_23_and_0_33_decode_as_vllm_meant() {
    for version in ["0.23.0", "0.33.0"] {
        let manifest: Value = serde_json::from_slice(&golden(&format!("v{version}.json"))).unwrap();
        let mut payloads = 0;
        for case in manifest["cases"].as_array().unwrap() {
            let file = case["file"].as_str().unwrap();
            let bytes = golden(file);
            match case["kind"].as_str().unwrap() {
                "payload" => {
                    payloads += 1;
                    let batch = decode(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
                    assert!(batch.malformed.is_empty(), "{file}: {:?}", batch.malformed);
                    assert_eq!(batch.data_parallel_rank, Some(1), "{file}");
                    assert_eq!(batch.ts, 1_700_000_000.5, "{file}");
                    let expected: Vec<EngineEvent> = case["events"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(expected_event)
                        .collect();
                    assert_eq!(batch.events, expected, "{file}");
                }
                kind => {
                    // Frames as the publisher sent them: live [topic, seq, payload];
                    // replay replies [delimiter, (topic,) seq, payload], then the end marker.
                    let messages: Vec<Vec<serde_bytes_frames::Frame>> =
                        serde_bytes_frames::decode(&bytes);
                    let mut sequences = Vec::new();
                    for mut frames in messages {
                        if kind == "replay-frames" {
                            assert!(frames.remove(0).is_empty(), "{file}: no delimiter");
                        }
                        let (sequence, payload) =
                            split_frames(&frames).unwrap_or_else(|| panic!("{file}"));
                        sequences.push(sequence);
                        if sequence != END_SEQUENCE {
                            decode(payload).unwrap_or_else(|e| panic!("{file}: {e}"));
                        } else {
                            assert!(payload.is_empty());
                        }
                    }
                    let expected: &[u64] = if kind == "live-frames" {
                        &[0, 1]
                    } else {
                        &[1, END_SEQUENCE]
                    };
                    assert_eq!(sequences, expected, "{file}");
                }
            }
        }
        assert_eq!(payloads, 4, "v{version}");
    }
    // The two versions really differ on the wire: positional arrays, then maps.
    assert_ne!(
        golden("v0.23.0-int-hashes.bin"),
        golden("v0.33.0-int-hashes.bin")
    );
}

/// The golden frame files are msgpack lists of lists of binary frames.
mod serde_bytes_frames {
    pub type Frame = Vec<u8>;
    pub fn decode(bytes: &[u8]) -> Vec<Vec<Frame>> {
        let value = rmpv::decode::read_value(&mut &bytes[..]).unwrap();
        value
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                m.as_array()
                    .unwrap()
                    .iter()
                    .map(|f| f.as_slice().unwrap().to_vec())
                    .collect()
            })
            .collect()
    }
}

fn engine(ports: (u16, u16), extra: &[&str]) -> Process {
    Process::start(
        Command::new(switchyard_bin())
            .args(["engine-sim", "--model", "demo", "--listen", "127.0.0.1:0"])
            .args(["--kv-events", &format!("tcp://127.0.0.1:{}", ports.0)])
            .args(["--kv-replay", &format!("tcp://127.0.0.1:{}", ports.1)])
            .args(extra)
            .env("RUST_LOG", "warn"),
        "engine-sim listening on ",
    )
}

fn post(url: &str, body: &Value) -> Value {
    ureq::post(url)
        .send_json(body.clone())
        .unwrap_or_else(|e| panic!("POST {url}: {e}"))
        .into_json()
        .unwrap()
}

/// A prompt of `blocks` full 16-token blocks, distinct per `seed`.
fn prompt(seed: u32, blocks: u32) -> Vec<u32> {
    (0..blocks * 16).map(|i| seed * 100_000 + i).collect()
}

/// Sends a prompt straight to the engine (not through the router): the engine caches
/// it and publishes the events; the router learns of it only through them.
fn prefill(engine: &Process, tokens: &[u32]) {
    post(
        &format!("{}/v1/completions", engine.address),
        &json!({"model": "demo", "prompt": tokens, "max_tokens": 1}),
    );
}

/// Worker 1's device overlap for `tokens`, as `/v1/select` reports it.
fn overlap(router: &Process, tokens: &[u32]) -> u64 {
    let decision = post(
        &format!("{}/v1/select", router.address),
        &json!({"model": "demo", "token_ids": tokens, "instance": "default"}),
    );
    if decision["worker_id"] == 1 {
        decision["device_overlap_blocks"].as_u64().unwrap()
    } else {
        0
    }
}

/// Waits (bounded) until `tokens` overlaps `want` blocks on worker 1.
fn wait_overlap(router: &Process, tokens: &[u32], want: u64, what: &str) {
    eventually_ok(what, Duration::from_secs(10), || {
        let overlap = overlap(router, tokens);
        (overlap == want)
            .then_some(())
            .ok_or_else(|| format!("overlap {overlap}, expected {want}"))
    });
}

/// The sum of the series of `name` (a metric name, optionally with the start of its
/// labels) whose line also contains every one of `labels`.
fn metric_with(router: &Process, name: &str, labels: &[&str]) -> f64 {
    metrics_text(&router.address)
        .lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn metric(router: &Process, name: &str) -> f64 {
    metric_with(router, name, &[])
}

#[test]
fn engine_events_over_zeromq_feed_the_index_with_replay_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ports = (free_port(), free_port());
    // The engine's cache holds 8 blocks; batch 1 is "lost" on the live socket.
    let mut engine_process = engine(ports, &["--cache-blocks", "8", "--kv-drop-seq", "1"]);
    let config = write_config(
        dir.path(),
        &format!(
            "workers:\n  - {{model: demo, worker_id: 1, kv_events: {{endpoint: \"tcp://127.0.0.1:{}\", replay_endpoint: \"tcp://127.0.0.1:{}\"}}}}\n  - {{model: demo, worker_id: 2}}\n",
            ports.0, ports.1
        ),
    );
    let router = serve(&config);
    let (a, b, c) = (prompt(1, 4), prompt(2, 4), prompt(3, 4));
    assert_eq!(overlap(&router, &a), 0);

    // Stored: batch 0.
    prefill(&engine_process, &a);
    wait_overlap(&router, &a, 4, "after the engine stored prompt a");

    // Batch 1 (prompt b) never arrives live; batch 2 (prompt c, which evicts a's four
    // blocks) reveals the gap, and the replay socket fills it.
    prefill(&engine_process, &b);
    prefill(&engine_process, &c);
    wait_overlap(&router, &c, 4, "prompt c");
    wait_overlap(&router, &b, 4, "prompt b, recovered by replay");
    wait_overlap(&router, &a, 0, "prompt a, evicted by the engine");
    assert!(metric(&router, "switchyard_kv_event_gaps_total") >= 1.0);
    assert!(metric(&router, "switchyard_kv_event_replays_total") >= 1.0);
    assert_eq!(
        metric(&router, "switchyard_kv_event_replays_failed_total"),
        0.0
    );

    // The engine restarts on the same ports: sequence 0 again; the router clears what
    // the old engine held.
    engine_process.kill();
    let engine_process = engine(ports, &["--cache-blocks", "8"]);
    // The router connects afresh, finds that the publisher no longer has its last
    // batch, and starts over from the new engine's replay buffer.
    let d = prompt(4, 2);
    prefill(&engine_process, &d);
    wait_overlap(&router, &d, 2, "prompt d, stored by the restarted engine");
    wait_overlap(&router, &b, 0, "prompt b, cleared by the engine's restart");
    assert!(
        metric_with(
            &router,
            "switchyard_kv_event_clears_total{worker_id=\"1\",endpoint",
            &["reason=\"restart\""]
        ) >= 1.0
    );
    let applied = metric(&router, "switchyard_kv_events_applied_total");
    assert!(applied >= 5.0, "{applied}");
    assert_eq!(
        metric(&router, "switchyard_kv_event_decode_errors_total"),
        0.0
    );
}

/// The engine's first batch is lost on the live socket (ZeroMQ's slow joiner, forced with
/// `--kv-drop-seq 0`; vLLM 0.23's array encoding). Whatever starts first, the router,
/// the engine, or a second router joining later, every router ends with the index of one
/// that saw every batch.
#[test]
fn every_start_order_yields_the_index_of_a_router_that_saw_every_batch() {
    let dir = tempfile::tempdir().unwrap();
    let ports = (free_port(), free_port());
    let config = write_config(
        dir.path(),
        &format!(
            "workers:\n  - {{model: demo, worker_id: 1, kv_events: {{endpoint: \"tcp://127.0.0.1:{}\", replay_endpoint: \"tcp://127.0.0.1:{}\"}}}}\n  - {{model: demo, worker_id: 2}}\n",
            ports.0, ports.1
        ),
    );
    let (a, b, c) = (prompt(11, 3), prompt(12, 3), prompt(13, 3));
    let vllm_0_23 = ["--kv-event-form", "array", "--kv-drop-seq", "0"];

    // The router first: its start replay finds no engine; the engine comes up, its batch 0
    // never arrives live, batch 1 does.
    // `serve` returns once the router listens, and its subscriber starts before that (with
    // the router): the engine below starts after it, with nothing to wait for.
    let router_first = serve(&config);
    let engine_process = engine(ports, &vllm_0_23);
    // Until the subscriber is connected, a live batch would be lost to the socket itself
    // and only a later one would reveal it: wait for the connection.
    eventually(
        "the subscriber reaches the engine",
        Duration::from_secs(10),
        || metric(&router_first, "switchyard_kv_event_replays_total") >= 1.0,
    );
    prefill(&engine_process, &a);
    prefill(&engine_process, &b);
    wait_overlap(&router_first, &b, 3, "router first: batch 1, live");
    wait_overlap(
        &router_first,
        &a,
        3,
        "router first: batch 0, lost live, replayed",
    );

    // A router started after the engine: the start replay has both batches.
    let router_after = serve(&config);
    wait_overlap(&router_after, &a, 3, "engine first: batch 0");
    wait_overlap(&router_after, &b, 3, "engine first: batch 1");
    prefill(&engine_process, &c);
    for router in [&router_first, &router_after] {
        wait_overlap(router, &c, 3, "batch 2, live to both");
    }

    // A router restarted: the same index again.
    drop(router_after);
    let restarted = serve(&config);
    for (tokens, what) in [(&a, "a"), (&b, "b"), (&c, "c")] {
        wait_overlap(
            &restarted,
            tokens,
            3,
            &format!("restarted router: prompt {what}"),
        );
    }
    assert_eq!(
        metric(&restarted, "switchyard_kv_event_replays_failed_total"),
        0.0
    );
}

/// The replay socket absent (configured, but nothing answers there): a failed replay does
/// not stall the stream, the live batches after the lost one are applied, and nothing
/// stale is kept (the lost batch's blocks are simply not known).
#[test]
fn without_a_replay_socket_the_live_stream_goes_on_after_a_lost_first_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (events, nobody) = (free_port(), free_port());
    let config = write_config(
        dir.path(),
        &format!(
            "workers:\n  - {{model: demo, worker_id: 1, kv_events: {{endpoint: \"tcp://127.0.0.1:{events}\", replay_endpoint: \"tcp://127.0.0.1:{nobody}\"}}}}\n  - {{model: demo, worker_id: 2}}\n"
        ),
    );
    let router = serve(&config);
    let engine_process = Process::start(
        Command::new(switchyard_bin())
            .args(["engine-sim", "--model", "demo", "--listen", "127.0.0.1:0"])
            .args([
                "--kv-events",
                &format!("tcp://127.0.0.1:{events}"),
                "--kv-drop-seq",
                "0",
            ])
            .env("RUST_LOG", "warn"),
        "engine-sim listening on ",
    );
    let (a, b) = (prompt(21, 2), prompt(22, 2));
    prefill(&engine_process, &a); // batch 0: never sent live, and no replay has it
                                  // Until the subscriber has joined (it reconnects with backoff), batches are lost to the
                                  // socket too: publish fresh prompts until the router counts a batch received.
    let mut seed = 100;
    eventually(
        "a live batch reaches the router",
        Duration::from_secs(15),
        || {
            if metric_sum(&router.address, "switchyard_kv_event_batches_total") >= 1.0 {
                return true;
            }
            prefill(&engine_process, &prompt(seed, 1));
            seed += 1;
            false
        },
    );
    prefill(&engine_process, &b);
    wait_overlap(&router, &b, 2, "a live batch after the failed replay");
    assert_eq!(overlap(&router, &a), 0, "batch 0 was never delivered");
}
