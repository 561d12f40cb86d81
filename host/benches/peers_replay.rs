//! A trace replay through each router in front of the same engine fleet: the public
//! Mooncake trace's first requests, sent at their (scaled) times by `switchyard
//! send-trace`'s client as streamed completions, through switchyard (its default policy,
//! engines' KV events), sglang-router and vllm-router (cache-aware) and vllm-router's
//! round robin, each in front of 8 fresh `engine-sim` engines (cold caches). Per router:
//! TTFT p50 / p90 / p99, the engines' prefix-cache hit rate (vLLM's
//! `vllm:prefix_cache_hits` / `_queries` counters, in tokens), failures and the router's
//! CPU.
//!
//! `make bench-peers` runs it after the proxy and decision comparisons. Each router's run
//! lasts as long as the scaled trace (one run each, not interleaved: a replay cannot be
//! cut into rounds without changing what the caches hold). SWITCHYARD_TRACE names the
//! trace (`../shared/data/mooncake/synthetic_trace.jsonl` beside the repository),
//! SWITCHYARD_REPLAY_REQUESTS how many of its requests (3000), SWITCHYARD_REPLAY_TIME_SCALE
//! how much faster than recorded (10), SWITCHYARD_REPLAY_ROUTERS which routers (names or
//! their beginnings, comma-separated; all), SWITCHYARD_REPLAY_CONFIG more YAML for
//! switchyard's config (a sweep's knobs). Loopback only; every process is killed when it
//! ends.

#[path = "common/peer_routers.rs"]
mod peer_routers;
#[path = "common/process.rs"]
mod process;
#[path = "../../tests/support/real_envoy.rs"]
mod real_envoy;
// Its waits, as the tests' support module gives them to it.
#[path = "../../tests/support/eventually.rs"]
mod eventually;
// The cargo it builds the Envoy module with.
#[path = "../../tests/support/nested_cargo.rs"]
mod nested_cargo;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use peer_routers::start_peer;
use process::{cpu_seconds, serve, start, Process};
use real_envoy::free_port;
use serde_json::json;
use switchyard::tools::send_trace::{self, SendTraceArgs};

const ENGINES: usize = 8;
/// Each engine's prefill throughput: the trace at 10x asks about 290k uncached tokens/s
/// of the fleet at the best hit rate, so this keeps the engines busy, not drowned.
const PREFILL_TPS: &str = "60000";
/// 2M tokens of prefix cache per engine (blocks of 16), as `switchyard replay` models.
const CACHE_BLOCKS: &str = "131072";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The fleet: engines with KV events on; their URLs and event endpoints.
struct Fleet {
    engines: Vec<(Process, String)>,
    events: Vec<(String, String)>,
}

fn fleet() -> Fleet {
    let mut engines = Vec::new();
    let mut events = Vec::new();
    for i in 0..ENGINES {
        let (publish, replay) = (
            format!("tcp://127.0.0.1:{}", free_port()),
            format!("tcp://127.0.0.1:{}", free_port()),
        );
        engines.push(start(
            &[
                "engine-sim",
                "--name",
                &format!("e{i}"),
                "--prefill-tps",
                PREFILL_TPS,
                "--decode-tps",
                "1000",
                "--cache-blocks",
                CACHE_BLOCKS,
                "--kv-events",
                &publish,
                "--kv-replay",
                &replay,
            ],
            "engine-sim listening on ",
        ));
        events.push((publish, replay));
    }
    Fleet { engines, events }
}

/// The fleet's prefix-cache hits and queries, summed.
fn hit_rate(fleet: &Fleet) -> f64 {
    let (mut hits, mut queries) = (0.0, 0.0);
    for (_, url) in &fleet.engines {
        let text = ureq::get(&format!("{url}/metrics"))
            .call()
            .ok()
            .and_then(|r| r.into_string().ok())
            .unwrap_or_default();
        for line in text.lines() {
            let value = || line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
            if line.starts_with("vllm:prefix_cache_hits_total") {
                hits += value().unwrap_or(0.0);
            } else if line.starts_with("vllm:prefix_cache_queries_total") {
                queries += value().unwrap_or(0.0);
            }
        }
    }
    hits / queries.max(1.0)
}

/// A router in front of `fleet`: its process and base URL, or why not.
fn router(name: &str, fleet: &Fleet, dir: &Path) -> Result<(Process, String), String> {
    let urls: Vec<&str> = fleet.engines.iter().map(|(_, u)| u.as_str()).collect();
    if name == "switchyard default" {
        let workers: String = urls
            .iter()
            .zip(&fleet.events)
            .enumerate()
            .map(|(i, (url, (publish, replay)))| {
                format!(
                    "  - {{model: demo, worker_id: {}, url: \"{url}\", kv_events: {{endpoint: \"{publish}\", replay_endpoint: \"{replay}\"}}}}\n",
                    i + 1
                )
            })
            .collect();
        let config = dir.join("switchyard.yaml");
        // SWITCHYARD_REPLAY_CONFIG: more of switchyard's config (a sweep's knobs).
        let extra = std::env::var("SWITCHYARD_REPLAY_CONFIG").unwrap_or_default();
        std::fs::write(&config, format!("workers:\n{workers}{extra}\n")).unwrap();
        return Ok(serve(&config, &[]));
    }
    let (program, policy) = name.split_once(' ').unwrap();
    let urls: Vec<String> = urls.iter().map(|u| (*u).to_owned()).collect();
    start_peer(program, policy, &urls)
}

/// Waits until a one-word completion goes through `base` (the router has found its
/// workers healthy); the prompt fills no cache block.
fn ready(base: &str, name: &str) {
    let started = Instant::now();
    let body = json!({"model": "demo", "prompt": "hi", "max_tokens": 1});
    while ureq::post(&format!("{base}/v1/completions"))
        .send_json(&body)
        .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{name} never answered"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("peers_replay: bench");
        return;
    }
    let trace: PathBuf = std::env::var_os("SWITCHYARD_TRACE").map_or_else(
        || {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../shared/data/mooncake/synthetic_trace.jsonl")
        },
        PathBuf::from,
    );
    if !trace.exists() {
        println!(
            "skipped the trace replay: {} does not exist (set SWITCHYARD_TRACE to a Mooncake JSONL trace)",
            trace.display()
        );
        return;
    }
    let trace = trace.canonicalize().unwrap_or(trace);
    let requests: usize = env_or("SWITCHYARD_REPLAY_REQUESTS", 3000);
    let time_scale: f64 = env_or("SWITCHYARD_REPLAY_TIME_SCALE", 10.0);
    let dir = tempfile::tempdir().unwrap();
    println!(
        "\nTrace replay: the first {requests} requests of {}, {time_scale}x, streamed completions, {ENGINES} engine-sims (prefill {PREFILL_TPS} tokens/s, {CACHE_BLOCKS} blocks of 16 each), fresh per router",
        trace.display()
    );
    println!("| router | TTFT p50 (ms) | p90 (ms) | p99 (ms) | engines' hit rate | failures | router CPU (s) | run (s) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let only = std::env::var("SWITCHYARD_REPLAY_ROUTERS").unwrap_or_default();
    for name in [
        "switchyard default",
        "sglang-router cache_aware",
        "vllm-router cache_aware",
        "vllm-router round_robin",
    ]
    .into_iter()
    .filter(|name| only.is_empty() || only.split(',').any(|o| name.starts_with(o.trim())))
    {
        let fleet = fleet();
        let (process, base) = match router(name, &fleet, dir.path()) {
            Ok(router) => router,
            Err(why) => {
                println!("skipped {name}: {why}");
                continue;
            }
        };
        ready(&base, name);
        let pid = process.0.id().to_string();
        let cpu = cpu_seconds(&pid);
        let args = SendTraceArgs {
            trace: trace.clone(),
            url: base,
            model: "demo".into(),
            requests: Some(requests),
            time_scale,
            block_tokens: 512,
            max_output_tokens: 64,
            request_timeout_secs: 120,
            csv: None,
        };
        let summary = match send_trace::run(&args) {
            Ok(summary) => summary,
            Err(e) => {
                println!("skipped {name}: {e}");
                continue;
            }
        };
        println!(
            "| {name} | {:.0} | {:.0} | {:.0} | {:.1} % | {} | {:.1} | {:.0} |",
            summary.ttft_p50_ms,
            summary.ttft_p90_ms,
            summary.ttft_p99_ms,
            100.0 * hit_rate(&fleet),
            summary.failures,
            cpu_seconds(&pid) - cpu,
            summary.seconds
        );
        drop(process);
        drop(fleet);
    }
}
