//! `switchyard engine-sim`: a simulated OpenAI-compatible inference engine, what the
//! frontend's tests, benchmark and demo run against on loopback.
//!
//! It serves `/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/health` and
//! `/metrics` (vLLM's gauges: running and waiting requests, KV-cache usage, prefix-cache
//! queries and hits in tokens, and LoRA
//! adapters in `vllm:lora_requests_info`; `--lora-adapters` names the adapters it
//! serves, as vLLM's `--lora-modules` does). A
//! prompt's blocks (hashed as the router hashes prompt text) go through an LRU prefix
//! cache; cached blocks skip prefill. Prefill is one queue per engine at `prefill_tps`
//! tokens/s (a request waits for the ones before it); decode streams one token per
//! `1 / decode_tps` seconds per request, concurrently. `--fail` makes it answer 500, or
//! break the connection halfway through a streamed answer.
//!
//! With `--role prefill` or `--role decode` it plays one side of a disaggregated pair in
//! vLLM's or SGLang's fields (`disaggregation`).
//!
//! With `--kv-events tcp://127.0.0.1:PORT` it publishes its cache's KV events as vLLM
//! does (ZeroMQ PUB, msgpack; a replay socket with `--kv-replay`): blocks stored on
//! prefill, removed on eviction. Its block hashes are its own (chained sha256, like
//! vLLM's), not the router's: the router must agree on them from the token ids.

mod answer;
mod disaggregation;
mod metrics;

use answer::{answer_streamed, answer_whole, Chunk};

use metrics::metrics_text;

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::{Json, Router as HttpRouter};
use lru::LruCache;
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::fleet::kv_events::publisher::{self, Publisher, PublisherSettings};
use crate::fleet::kv_events::wire::{
    EngineEvent, EventForm, HashForm, RemovedBlocks, StoredBlocks,
};
use crate::serve::frontend::prompt::{self, Endpoint, Prompt};
use crate::serve::http_service::shutdown_signal;

/// How a simulated engine misbehaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FailMode {
    /// Answers every request.
    None,
    /// Answers every completion with HTTP 500 and an OpenAI error body.
    Http500,
    /// Breaks the connection after half of a streamed answer's tokens.
    AbortMidStream,
    /// Sends the headers of a JSON answer (200), then breaks the connection.
    CloseAfterHeaders,
}

/// What `switchyard engine-sim` takes.
#[derive(clap::Args, Clone, Debug)]
pub struct EngineSimArgs {
    /// Address to listen on (port 0: any free port; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// The model it serves.
    #[arg(long, default_value = "demo")]
    pub model: String,
    /// Its name, returned in the `x-engine-name` header and `system_fingerprint`.
    #[arg(long, default_value = "engine-sim")]
    pub name: String,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: u32,
    /// Prefix-cache capacity in blocks (LRU).
    #[arg(long, default_value_t = 4096)]
    pub cache_blocks: usize,
    /// Prefill throughput of the engine, tokens per second.
    #[arg(long, default_value_t = 100_000.0)]
    pub prefill_tps: f64,
    /// Decode speed of each request, tokens per second.
    #[arg(long, default_value_t = 500.0)]
    pub decode_tps: f64,
    /// Output tokens when the request sets no `max_tokens`.
    #[arg(long, default_value_t = 16)]
    pub default_max_tokens: u64,
    #[arg(long, value_enum, default_value = "none")]
    pub fail: FailMode,
    /// Publish KV events on this ZeroMQ PUB endpoint (e.g. tcp://127.0.0.1:5557).
    #[arg(long)]
    pub kv_events: Option<String>,
    /// The replay ROUTER endpoint (e.g. tcp://127.0.0.1:5558).
    #[arg(long, requires = "kv_events")]
    pub kv_replay: Option<String>,
    #[arg(long, default_value = "")]
    pub kv_topic: String,
    /// Event encoding: `map` (vLLM 0.24 and later) or `array` (up to 0.23).
    #[arg(long, value_enum, default_value = "map")]
    pub kv_event_form: EventForm,
    /// Block hashes as 64-bit integers or as 32-byte digests.
    #[arg(long, value_enum, default_value = "int")]
    pub kv_hash: HashForm,
    /// The data-parallel rank its batches carry.
    #[arg(long, default_value_t = 0)]
    pub dp_rank: u32,
    /// Never send the batch with this sequence number live (it stays in the replay
    /// buffer): a lost message, for tests. Repeatable.
    #[arg(long)]
    pub kv_drop_seq: Vec<u64>,
    /// Serve HTTPS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// LoRA adapters it serves besides the base model (a request names one as its
    /// `model`), comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub lora_adapters: Vec<String>,
    /// Its part in a disaggregated pair: `prefill` keeps the KV of the requests that ask
    /// for remote decode, `decode` pulls it (vLLM's `kv_transfer_params`, SGLang's
    /// `bootstrap_*` fields).
    #[arg(long, value_enum, default_value = "aggregated")]
    pub role: disaggregation::Role,
    /// A decode engine's time to receive one KV block from its prefill engine, ms.
    #[arg(long, default_value_t = 0.05)]
    pub transfer_ms_per_block: f64,
    /// Append each completion request it receives (path, `x-request-id`, body) and each
    /// `kv_transfer_params` it answers to this file, one JSON object per line: what a
    /// router sent, for tests and for debugging a router.
    #[arg(long)]
    pub record: Option<std::path::PathBuf>,
}

/// The engine's own chained block hashes: sha256 over the parent's hash and the block's
/// tokens, the last 8 bytes as an integer (vLLM's `sha256` hashing with integer hashes).
fn engine_block_hashes(tokens: &[u32], block_size: u32) -> Vec<u64> {
    use sha2::{Digest, Sha256};
    let mut parent = [0u8; 8];
    tokens
        .chunks_exact(block_size.max(1) as usize)
        .map(|block| {
            let mut sha = Sha256::new();
            sha.update(parent);
            for token in block {
                sha.update(token.to_le_bytes());
            }
            let digest = sha.finalize();
            parent.copy_from_slice(&digest[24..]);
            u64::from_be_bytes(parent)
        })
        .collect()
}

struct Engine {
    args: EngineSimArgs,
    /// Engine block hash -> nothing, least recently used first out.
    cache: Mutex<LruCache<u64, ()>>,
    events: Option<Publisher>,
    /// When the prefill queue is next free.
    prefill_free_at: Mutex<Instant>,
    requests: AtomicU64,
    /// Prompt tokens looked up in the prefix cache, and those found: vLLM's
    /// `vllm:prefix_cache_queries` / `vllm:prefix_cache_hits` counters.
    prefix_queries: AtomicU64,
    prefix_hits: AtomicU64,
    /// What `/metrics` reports.
    load: Mutex<Load>,
    /// A prefill engine's KV kept for decode engines to pull.
    transfers: disaggregation::Transfers,
    /// Where it listens (what a vLLM prefill engine names as `remote_host:remote_port`).
    address: SocketAddr,
    /// A decode engine's client to its prefill engines (one pool for every pull).
    client: reqwest::Client,
    /// `--record`'s file.
    record: Option<Mutex<std::fs::File>>,
}

impl Engine {
    /// One line of `--record` (a failed write is reported, not fatal: the engine serves on).
    fn record(&self, line: Value) {
        let Some(file) = &self.record else { return };
        let mut text = line.to_string();
        text.push('\n');
        if let Err(e) = std::io::Write::write_all(&mut *file.lock(), text.as_bytes()) {
            eprintln!("engine-sim: cannot write --record: {e}");
        }
    }
}

/// The engine's requests by phase, as vLLM's scheduler gauges count them.
#[derive(Default)]
struct Load {
    waiting: u64,
    running: u64,
    /// Prompt blocks of running requests (KV-cache usage against `cache_blocks`).
    running_blocks: u64,
    /// Per adapter: (waiting, running).
    adapters: std::collections::BTreeMap<String, (u64, u64)>,
    /// When the adapter sets last changed (vLLM's `lora_requests_info` value).
    adapters_changed: f64,
}

/// One request's place in `Load`: waiting until `run`, running until dropped (also when
/// the client hangs up).
struct Occupancy {
    engine: Arc<Engine>,
    adapter: Option<String>,
    blocks: u64,
    running: bool,
}

impl Occupancy {
    fn wait(engine: &Arc<Engine>, adapter: Option<String>, blocks: u64) -> Occupancy {
        let mut load = engine.load.lock();
        load.waiting += 1;
        if let Some(a) = &adapter {
            load.adapters.entry(a.clone()).or_default().0 += 1;
            load.adapters_changed = unix_seconds();
        }
        drop(load);
        Occupancy {
            engine: engine.clone(),
            adapter,
            blocks,
            running: false,
        }
    }

    fn run(&mut self) {
        let mut load = self.engine.load.lock();
        load.waiting -= 1;
        load.running += 1;
        load.running_blocks += self.blocks;
        if let Some(a) = &self.adapter {
            let entry = load.adapters.entry(a.clone()).or_default();
            entry.0 -= 1;
            entry.1 += 1;
            load.adapters_changed = unix_seconds();
        }
        self.running = true;
    }
}

impl Drop for Occupancy {
    fn drop(&mut self) {
        let mut load = self.engine.load.lock();
        if self.running {
            load.running -= 1;
            load.running_blocks -= self.blocks;
        } else {
            load.waiting -= 1;
        }
        if let Some(a) = &self.adapter {
            if let Some(entry) = load.adapters.get_mut(a) {
                if self.running {
                    entry.1 -= 1;
                } else {
                    entry.0 -= 1;
                }
                if *entry == (0, 0) {
                    load.adapters.remove(a);
                }
            }
            load.adapters_changed = unix_seconds();
        }
    }
}

fn unix_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Engine {
    /// How long receiving `blocks` KV blocks from a prefill engine takes.
    fn transfer_delay(&self, blocks: u64) -> Duration {
        Duration::from_secs_f64(blocks as f64 * self.args.transfer_ms_per_block.max(0.0) / 1e3)
    }

    /// Looks the prompt's blocks up in the prefix cache (storing them); returns the
    /// prefill delay: the queue ahead of it plus its uncached tokens.
    fn prefill_delay(&self, prompt: &Prompt) -> Duration {
        let block_size = self.args.block_size;
        let hashes = engine_block_hashes(&prompt.tokens, block_size);
        let mut cache = self.cache.lock();
        let hit = hashes
            .iter()
            .take_while(|h| cache.get(*h).is_some())
            .count();
        let mut removed = Vec::new();
        for hash in &hashes[hit..] {
            if let Some((evicted, ())) = cache.push(*hash, ()) {
                if evicted != *hash {
                    removed.push(evicted);
                }
            }
        }
        if let Some(events) = &self.events {
            // As vLLM reports them: one BlockRemoved per evicted block, then the stored
            // blocks with their parent and tokens. Published under the cache lock, so
            // batches follow the cache's order.
            let mut batch: Vec<EngineEvent> = removed
                .into_iter()
                .map(|hash| {
                    EngineEvent::Removed(RemovedBlocks {
                        block_hashes: vec![hash],
                        medium: Some("GPU".into()),
                        group_idx: Some(0),
                    })
                })
                .collect();
            if hit < hashes.len() {
                let size = block_size as usize;
                batch.push(EngineEvent::Stored(StoredBlocks {
                    block_hashes: hashes[hit..].to_vec(),
                    parent_block_hash: hit.checked_sub(1).map(|i| hashes[i]),
                    token_ids: prompt.tokens[hit * size..hashes.len() * size].to_vec(),
                    block_size,
                    medium: Some("GPU".into()),
                    group_idx: Some(0),
                    kv_cache_spec_kind: Some("full_attention".into()),
                    ..Default::default()
                }));
            }
            events.publish(batch);
        }
        drop(cache);
        let hit = hit as u64;
        let cached = (hit * u64::from(block_size)).min(prompt.tokens.len() as u64);
        self.prefix_queries
            .fetch_add(prompt.tokens.len() as u64, Ordering::Relaxed);
        self.prefix_hits.fetch_add(cached, Ordering::Relaxed);
        let tokens = prompt.request_blocks.saturating_sub(hit) * u64::from(self.args.block_size);
        let work = Duration::from_secs_f64(tokens as f64 / self.args.prefill_tps);
        let now = Instant::now();
        let mut free_at = self.prefill_free_at.lock();
        let start = (*free_at).max(now);
        *free_at = start + work;
        *free_at - now
    }
}

fn openai_error(status: StatusCode, message: &str, kind: &str) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": null}});
    (status, Json(body)).into_response()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn complete(
    engine: Arc<Engine>,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    use disaggregation::Handoff;
    let (prompt, handoff, adapter) = match accept(&engine, endpoint, &headers, &body) {
        Ok(accepted) => accepted,
        Err(refused) => return *refused,
    };
    let number = engine.requests.fetch_add(1, Ordering::Relaxed);
    // A prefill engine computes the KV and answers after one token.
    let prefill_only = matches!(
        handoff,
        Handoff::VllmPrefill { .. } | Handoff::SglangPrefill { .. }
    );
    let tokens = if prefill_only {
        1
    } else {
        prompt
            .expected_output_tokens
            .unwrap_or(engine.args.default_max_tokens)
    };
    let (prefill, transferred_from) = match kv_ready_in(&engine, &handoff, &prompt).await {
        Ok(ready) => ready,
        Err(refused) => return refused,
    };
    let chunk = Chunk {
        endpoint,
        id: number,
        created: unix_now(),
        model: engine.args.model.clone(),
        name: engine.args.name.clone(),
    };
    let mut name = HeaderMap::new();
    for (header, value) in [
        ("x-engine-name", Some(engine.args.name.clone())),
        ("x-kv-transfer-from", transferred_from),
    ] {
        if let Some(value) = value.and_then(|v| v.parse().ok()) {
            name.insert(header, value);
        }
    }
    let occupancy = Occupancy::wait(&engine, adapter, prompt.request_blocks);
    let timing = (prefill, tokens);
    if !prompt.stream || prefill_only {
        let answer = answer_whole(&engine, &prompt, handoff, chunk, occupancy, timing).await;
        return (name, Json(answer)).into_response();
    }
    (name, answer_streamed(&engine, chunk, occupancy, timing)).into_response()
}

/// Records the request, parses it, and refuses what this engine would: a bad body, another
/// model, a simulated failure (`--fail`). The prompt, its handoff and its adapter.
fn accept(
    engine: &Engine,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(Prompt, disaggregation::Handoff, Option<String>), Box<Response>> {
    let request_id = headers.get("x-request-id").and_then(|v| v.to_str().ok());
    engine.record(json!({
        "path": endpoint.path(),
        "x-request-id": request_id,
        "body": serde_json::from_slice::<Value>(body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned())),
    }));
    let prompt = match prompt::parse(endpoint, body, engine.args.block_size, |_| None) {
        Ok(prompt) => prompt,
        Err(e) => {
            return Err(Box::new(openai_error(
                StatusCode::BAD_REQUEST,
                &e.message,
                "invalid_request_error",
            )))
        }
    };
    let handoff = match disaggregation::handoff(engine.args.role, body, headers) {
        Ok(handoff) => handoff,
        Err(e) => {
            return Err(Box::new(openai_error(
                StatusCode::BAD_REQUEST,
                &e.to_string(),
                "invalid_request_error",
            )))
        }
    };
    let adapter = engine
        .args
        .lora_adapters
        .iter()
        .find(|a| **a == prompt.model)
        .cloned();
    if prompt.model != engine.args.model && adapter.is_none() {
        let message = format!(
            "model `{}` is not served here (this engine serves `{}`)",
            prompt.model, engine.args.model
        );
        return Err(Box::new(openai_error(
            StatusCode::NOT_FOUND,
            &message,
            "invalid_request_error",
        )));
    }
    if engine.args.fail == FailMode::Http500 {
        return Err(Box::new(openai_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "simulated engine failure",
            "server_error",
        )));
    }
    if engine.args.fail == FailMode::CloseAfterHeaders {
        // The pause lets the headers go out first, as an engine's would.
        let broken = futures_util::stream::once(async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Err::<Bytes, _>(std::io::Error::other("simulated close after headers"))
        });
        return Err(Box::new(
            (
                [(header::CONTENT_TYPE, "application/json")],
                Body::from_stream(broken),
            )
                .into_response(),
        ));
    }
    Ok((prompt, handoff, adapter))
}

/// When the prompt's KV is ready: a decode engine receives it from the prefill engine (and
/// names it), every other computes it.
async fn kv_ready_in(
    engine: &Engine,
    handoff: &disaggregation::Handoff,
    prompt: &Prompt,
) -> Result<(Duration, Option<String>), Response> {
    use disaggregation::Handoff;
    let ready = match handoff {
        Handoff::VllmDecode {
            from,
            id,
            engine: named,
        } => match disaggregation::pull(&engine.client, from, id, Duration::ZERO).await {
            Ok((_, source)) if named.as_ref().is_some_and(|n| *n != source) => {
                let message = format!(
                    "`remote_engine_id` names `{}`, but {from} is `{source}`",
                    named.as_deref().unwrap_or("")
                );
                return Err(openai_error(
                    StatusCode::BAD_REQUEST,
                    &message,
                    "invalid_request_error",
                ));
            }
            Ok((blocks, source)) => {
                engine.transfers.received(&source);
                (engine.transfer_delay(blocks), Some(source))
            }
            Err(e) => {
                return Err(openai_error(
                    StatusCode::BAD_REQUEST,
                    &e.to_string(),
                    "invalid_request_error",
                ))
            }
        },
        Handoff::SglangDecode { from, room } => {
            let id = disaggregation::room_id(*room);
            match disaggregation::pull(&engine.client, from, &id, Duration::from_secs(30)).await {
                Ok((blocks, source)) => {
                    engine.transfers.received(&source);
                    (engine.transfer_delay(blocks), Some(source))
                }
                Err(e) => {
                    return Err(openai_error(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        &e.to_string(),
                        "server_error",
                    ))
                }
            }
        }
        Handoff::VllmPrefill { .. } | Handoff::SglangPrefill { .. } | Handoff::None => {
            (engine.prefill_delay(prompt), None)
        }
    };
    Ok(ready)
}

/// Runs the simulator until SIGINT or SIGTERM.
pub async fn run(args: EngineSimArgs) -> std::io::Result<()> {
    for (name, value) in [
        ("--prefill-tps", args.prefill_tps),
        ("--decode-tps", args.decode_tps),
    ] {
        if !(value.is_finite() && value > 0.0) {
            return Err(std::io::Error::other(format!(
                "{name} must be a positive number, got {value}"
            )));
        }
    }
    let capacity = NonZeroUsize::new(args.cache_blocks)
        .ok_or_else(|| std::io::Error::other("--cache-blocks must be at least 1"))?;
    if args.block_size == 0 {
        return Err(std::io::Error::other("--block-size must be at least 1"));
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| {
            std::io::Error::new(e.kind(), format!("cannot listen on {}: {e}", args.listen))
        })?;
    let events = match &args.kv_events {
        Some(endpoint) => {
            let publisher = publisher::start(PublisherSettings {
                endpoint: endpoint.clone(),
                replay_endpoint: args.kv_replay.clone(),
                topic: args.kv_topic.clone(),
                form: args.kv_event_form,
                hash_form: args.kv_hash,
                data_parallel_rank: args.dp_rank,
                buffer_steps: 10_000,
                drop_sequences: args.kv_drop_seq.clone(),
            })
            .await?;
            println!("engine-sim publishing KV events on {}", publisher.endpoint);
            Some(publisher)
        }
        None => None,
    };
    let engine_tls = (args.tls_cert.clone(), args.tls_key.clone());
    let record = open_record(args.record.as_deref())?;
    let address = listener.local_addr()?;
    let engine = Arc::new(Engine {
        transfers: disaggregation::Transfers::default(),
        address,
        client: reqwest::Client::new(),
        cache: Mutex::new(LruCache::new(capacity)),
        events,
        prefill_free_at: Mutex::new(Instant::now()),
        requests: AtomicU64::new(0),
        prefix_queries: AtomicU64::new(0),
        prefix_hits: AtomicU64::new(0),
        load: Mutex::new(Load::default()),
        record,
        args,
    });
    let app = routes(engine);
    let shutdown = shutdown_signal()?;
    if let (Some(cert), Some(key)) = (&engine_tls.0, &engine_tls.1) {
        return serve_https(listener, app, cert, key, shutdown).await;
    }
    println!("engine-sim listening on http://{}", listener.local_addr()?);
    // Tokens stream as small writes: no Nagle delay (see serve::http_service).
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// The engine's HTTP API: OpenAI completions, models, health, KV pulls, metrics.
fn routes(engine: Arc<Engine>) -> HttpRouter {
    let models = json!({"object": "list", "data": [{"id": engine.args.model, "object": "model", "created": 0, "owned_by": "switchyard-engine-sim"}]});
    HttpRouter::new()
        .route(
            "/v1/chat/completions",
            post(
                |State(e): State<Arc<Engine>>, headers: HeaderMap, body: Bytes| {
                    complete(e, Endpoint::ChatCompletions, headers, body)
                },
            ),
        )
        .route(
            "/v1/completions",
            post(
                |State(e): State<Arc<Engine>>, headers: HeaderMap, body: Bytes| {
                    complete(e, Endpoint::Completions, headers, body)
                },
            ),
        )
        .route("/v1/models", get(move || async move { Json(models) }))
        .route("/health", get(|| async { "ok\n" }))
        .route(
            "/switchyard-sim/kv/{id}/pull",
            post(
                |State(e): State<Arc<Engine>>,
                 axum::extract::Path(id): axum::extract::Path<String>| async move {
                    match e.transfers.take(&id) {
                        Some(blocks) => {
                            Json(json!({"blocks": blocks, "engine": e.args.name})).into_response()
                        }
                        None => StatusCode::NOT_FOUND.into_response(),
                    }
                },
            ),
        )
        .route(
            "/metrics",
            get(|State(e): State<Arc<Engine>>| async move {
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    metrics_text(&e),
                )
            }),
        )
        .with_state(engine)
}

/// `--record`: the file every request is appended to, as JSON lines.
fn open_record(record: Option<&std::path::Path>) -> std::io::Result<Option<Mutex<std::fs::File>>> {
    Ok(match record {
        Some(path) => Some(Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("--record {}: cannot open: {e}", path.display()),
                    )
                })?,
        )),
        None => None,
    })
}

/// Serves `app` over HTTPS through the router's own listener (TLS, limits).
async fn serve_https(
    tcp: tokio::net::TcpListener,
    app: HttpRouter,
    cert: &std::path::Path,
    key: &std::path::Path,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use switchyard_engines::tls::{server_config_from_files, ServerTls};
    use switchyard_serve::listener::{serve_http, ConnectionTable, Limits, Listener};
    let config = server_config_from_files("--tls", cert, key, None, &[b"http/1.1"])
        .map_err(std::io::Error::other)?;
    let limits = Limits {
        handshake_timeout: std::time::Duration::from_secs(10),
        header_read_timeout: std::time::Duration::from_secs(30),
        idle_timeout: std::time::Duration::from_secs(90),
        max_connections: 16_384,
        max_connections_per_peer: 16_384,
    };
    println!("engine-sim listening on https://{}", tcp.local_addr()?);
    let listener = Listener::new(
        tcp,
        Some(ServerTls::new(config)),
        ConnectionTable::new("engine-sim", limits.clone()),
    );
    let (stop, stopping) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop.send(true);
    });
    let drain = stopping.clone();
    listener
        .run(stopping, move |connection| {
            tokio::spawn(serve_http(
                connection,
                app.clone(),
                limits.clone(),
                drain.clone(),
            ));
        })
        .await;
    Ok(())
}
