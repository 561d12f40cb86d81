//! engine-sim as one side of a disaggregated pair (`--role prefill|decode`), speaking both
//! engine families' fields as their own servers read them:
//!
//! - vLLM (KV connector, as its NIXL connector answers): a prefill engine asked with
//!   `kv_transfer_params.do_remote_decode` runs the prefill, keeps the blocks, and answers
//!   one token with `kv_transfer_params` (`do_remote_prefill`, `remote_block_ids`,
//!   `remote_engine_id`, `remote_request_id`, `remote_host`, `remote_port`); a decode
//!   engine asked with `do_remote_prefill` pulls those blocks from `remote_host:remote_port`
//!   (refused: unknown transfer) and decodes.
//! - SGLang (bootstrap): both engines get `bootstrap_host`, `bootstrap_port` and
//!   `bootstrap_room`; the prefill engine keeps the room's blocks once prefilled, the
//!   decode engine waits for the room at the bootstrap address, then decodes.
//!
//! The transfer is a real loopback exchange (`POST /switchyard-sim/kv/{id}/pull` on the
//! prefill engine) plus a delay per block; what the decode engine pulled it names in the
//! `x-kv-transfer-from` header of its answer.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use parking_lot::Mutex;
use serde_json::{json, Value};

/// What a simulated engine does in a disaggregated pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// Serves whole requests.
    Aggregated,
    /// Prefills and keeps the KV for a decode engine to pull.
    Prefill,
    /// Pulls the KV a prefill engine kept, then decodes.
    Decode,
}

/// What one request asks of this engine's part in a pair.
#[derive(Debug, PartialEq, Eq)]
pub enum Handoff {
    /// A whole request (or not a disaggregated one).
    None,
    /// vLLM: prefill, keep the blocks as transfer `id`, answer `kv_transfer_params`.
    VllmPrefill { id: String },
    /// vLLM: pull transfer `id` from `from` (`host:port`), the prefill engine `engine`
    /// says it is, and decode.
    VllmDecode {
        from: String,
        id: String,
        engine: Option<String>,
    },
    /// SGLang: prefill and keep the blocks for `room`.
    SglangPrefill { room: u64 },
    /// SGLang: wait for `room` at `from` (`host:port`) and decode.
    SglangDecode { from: String, room: u64 },
}

/// Why a disaggregated request cannot be served here: a body asking for a part this
/// engine's role does not play, or a transfer the prefill engine could not hand over.
#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    #[error("this engine decodes: `do_remote_decode` asks a prefill engine")]
    NotPrefill,
    #[error("this engine prefills: `do_remote_prefill` asks a decode engine")]
    NotDecode,
    #[error("`kv_transfer_params` with `do_remote_prefill` needs `remote_host`, `remote_port` and `remote_request_id`")]
    VllmPeerMissing,
    #[error("`bootstrap_room` needs `bootstrap_host` and `bootstrap_port`")]
    SglangPeerMissing,
    #[error("cannot reach the prefill engine at {from}: {source}")]
    Unreachable {
        from: String,
        source: reqwest::Error,
    },
    #[error("the prefill engine at {from} answered no transfer: {source}")]
    BadAnswer {
        from: String,
        source: reqwest::Error,
    },
    #[error("the prefill engine at {from} has no KV transfer `{id}` (unknown, or already taken)")]
    NoTransfer { from: String, id: String },
}

/// The request body's own fields saying which part this is; an error for a body that
/// asks for a part this engine's role does not play.
pub fn handoff(role: Role, body: &[u8], headers: &HeaderMap) -> Result<Handoff, HandoffError> {
    if role == Role::Aggregated {
        return Ok(Handoff::None);
    }
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(body) else {
        return Ok(Handoff::None);
    };
    if let Some(params) = body.get("kv_transfer_params").and_then(Value::as_object) {
        let flag = |name: &str| params.get(name).and_then(Value::as_bool) == Some(true);
        if flag("do_remote_decode") {
            if role != Role::Prefill {
                return Err(HandoffError::NotPrefill);
            }
            let id = headers
                .get("x-request-id")
                .and_then(|v| v.to_str().ok())
                .map_or_else(|| format!("sim-{}", rand::random::<u64>()), str::to_owned);
            return Ok(Handoff::VllmPrefill { id });
        }
        if flag("do_remote_prefill") {
            if role != Role::Decode {
                return Err(HandoffError::NotDecode);
            }
            let text = |name: &str| params.get(name).and_then(Value::as_str);
            let (Some(host), Some(port), Some(id)) = (
                text("remote_host"),
                params.get("remote_port").and_then(Value::as_u64),
                text("remote_request_id"),
            ) else {
                return Err(HandoffError::VllmPeerMissing);
            };
            return Ok(Handoff::VllmDecode {
                from: format!("{host}:{port}"),
                id: id.to_owned(),
                engine: text("remote_engine_id").map(str::to_owned),
            });
        }
    }
    let Some(room) = body.get("bootstrap_room").and_then(Value::as_u64) else {
        return Ok(Handoff::None);
    };
    match role {
        Role::Prefill => Ok(Handoff::SglangPrefill { room }),
        _ => {
            let host = body.get("bootstrap_host").and_then(Value::as_str);
            let port = body.get("bootstrap_port").and_then(Value::as_u64);
            let (Some(host), Some(port)) = (host, port) else {
                return Err(HandoffError::SglangPeerMissing);
            };
            Ok(Handoff::SglangDecode {
                from: format!("{host}:{port}"),
                room,
            })
        }
    }
}

/// The KV a prefill engine keeps until its decode engine pulls it: transfer id ->
/// blocks. Bounded: the oldest goes when full, and none outlives `KEEP`.
#[derive(Default)]
pub struct Transfers {
    kept: Mutex<HashMap<String, (u64, Instant)>>,
    /// A decode engine's: transfers received, per prefill engine.
    received: Mutex<std::collections::BTreeMap<String, u64>>,
    /// A prefill engine's: transfers handed over.
    taken: std::sync::atomic::AtomicU64,
}

const KEEP: Duration = Duration::from_secs(60);
const MAX_KEPT: usize = 65_536;

impl Transfers {
    pub fn keep(&self, id: String, blocks: u64) {
        let mut kept = self.kept.lock();
        let now = Instant::now();
        kept.retain(|_, (_, at)| now.duration_since(*at) < KEEP);
        if kept.len() >= MAX_KEPT {
            if let Some(oldest) = kept
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone())
            {
                kept.remove(&oldest);
            }
        }
        kept.insert(id, (blocks, now));
    }

    /// The blocks of transfer `id`, handed over once.
    pub fn take(&self, id: &str) -> Option<u64> {
        let taken = self.kept.lock().remove(id).map(|(blocks, _)| blocks);
        if taken.is_some() {
            self.taken
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        taken
    }

    pub fn received(&self, from: &str) {
        *self.received.lock().entry(from.to_owned()).or_default() += 1;
    }

    /// `/metrics` lines: transfers kept (not yet pulled), handed over, and received.
    pub fn metrics(&self) -> String {
        let mut text = format!(
            "# TYPE switchyard_sim_kv_transfers_kept gauge\nswitchyard_sim_kv_transfers_kept {}\n# TYPE switchyard_sim_kv_transfers_taken_total counter\nswitchyard_sim_kv_transfers_taken_total {}\n# TYPE switchyard_sim_kv_transfers_received_total counter\n",
            self.kept.lock().len(),
            self.taken.load(std::sync::atomic::Ordering::Relaxed)
        );
        for (from, n) in self.received.lock().iter() {
            text.push_str(&format!(
                "switchyard_sim_kv_transfers_received_total{{from=\"{from}\"}} {n}\n"
            ));
        }
        text
    }
}

/// SGLang's transfer id for a room.
pub fn room_id(room: u64) -> String {
    format!("room-{room}")
}

/// What a vLLM prefill engine answers in `kv_transfer_params` for `blocks` kept as `id`.
pub fn vllm_params(name: &str, id: &str, blocks: u64, address: std::net::SocketAddr) -> Value {
    json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_block_ids": (0..blocks).collect::<Vec<_>>(),
        "remote_engine_id": name,
        "remote_request_id": id,
        "remote_host": address.ip().to_string(),
        "remote_port": address.port(),
        "tp_size": 1,
    })
}

/// Pulls transfer `id` from the prefill engine at `from`, waiting up to `wait` for it to
/// exist (SGLang's decode waits for its room; vLLM's transfer exists when asked): the
/// blocks and the prefill engine's name.
pub async fn pull(
    client: &reqwest::Client,
    from: &str,
    id: &str,
    wait: Duration,
) -> Result<(u64, String), HandoffError> {
    let url = format!("http://{from}/switchyard-sim/kv/{id}/pull");
    let deadline = Instant::now() + wait;
    loop {
        let answer = client
            .post(&url)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .map_err(|source| HandoffError::Unreachable {
                from: from.to_owned(),
                source,
            })?;
        if answer.status().is_success() {
            let body: Value = answer
                .json()
                .await
                .map_err(|source| HandoffError::BadAnswer {
                    from: from.to_owned(),
                    source,
                })?;
            let blocks = body["blocks"].as_u64().unwrap_or(0);
            let engine = body["engine"].as_str().unwrap_or("").to_owned();
            return Ok((blocks, engine));
        }
        if Instant::now() >= deadline {
            return Err(HandoffError::NoTransfer {
                from: from.to_owned(),
                id: id.to_owned(),
            });
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
