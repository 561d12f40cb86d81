//! KV events straight from the engines: vLLM's and SGLang's ZeroMQ publisher format.
//!
//! - [`wire`]: the msgpack payload, both event encodings, decoded and encoded.
//! - [`hash_agreement`]: engine block hashes -> the router's chained hashes, per worker.
//! - [`subscriber`]: one SUB socket per publisher, sequence tracking, gap replay over
//!   the publisher's ROUTER socket, restarts; runs on its own thread.
//! - [`publisher`]: the engine side (PUB + replay ROUTER), for `engine-sim` and tests.
//! - `zmtp`: the subscriber's sockets, ZeroMQ's wire protocol read with size limits.

mod counters;
pub mod hash_agreement;
pub mod publisher;
pub mod subscriber;
pub mod wire;
mod zmtp;

pub use counters::KvSourceCounters;
pub(crate) use counters::CLEAR_REASONS;
pub use switchyard_config::KvEventSource;

/// What applying one batch's events did, for the publisher's counters.
#[derive(Debug, Default)]
pub struct ApplyOutcome {
    /// Events translated and applied to the KV index.
    pub applied: u64,
    /// `AllBlocksCleared` events among them.
    pub engine_clears: u64,
    /// Events not applied, by reason.
    pub ignored: Vec<hash_agreement::Ignored>,
    /// The engine's block size, when events were refused for it.
    pub block_size_refused: Option<u32>,
    /// The batch named a worker (id, dp_rank) the router does not know.
    pub unknown_worker: bool,
}
