//! What an engine's KV-event sockets may make the router hold (`router.kv_events:`): a
//! hostile or broken publisher is bounded per message and per replay, not by the
//! machine's memory.

use serde::{Deserialize, Serialize};

use super::Bounded;

/// Bounds on KV-event messages (`router.kv_events:`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvEventLimits {
    /// The largest message (all its frames together) taken from a publisher, live or
    /// replayed. A larger one is read past without being kept: dropped, counted
    /// (`switchyard_kv_event_oversized_total`) and logged once per publisher.
    #[serde(deserialize_with = "frame_bytes")]
    pub max_frame_bytes: usize,
    /// The most bytes one replay may bring (the batches a gap asks for). Past it the
    /// replay is given up (`switchyard_kv_event_replays_oversized_total`, logged once) and
    /// the worker's blocks are cleared, as when the gap cannot be replayed.
    #[serde(deserialize_with = "replay_bytes")]
    pub max_replay_bytes: usize,
}

impl KvEventLimits {
    pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 << 20;
    pub const DEFAULT_MAX_REPLAY_BYTES: usize = 64 << 20;
}

impl Default for KvEventLimits {
    fn default() -> Self {
        KvEventLimits {
            max_frame_bytes: Self::DEFAULT_MAX_FRAME_BYTES,
            max_replay_bytes: Self::DEFAULT_MAX_REPLAY_BYTES,
        }
    }
}

fn frame_bytes<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<usize, D::Error> {
    deserializer
        .deserialize_u64(Bounded(4096, 1 << 30, "max_frame_bytes is from {min} to {max} (got {got}): a message this large is held whole while it is applied; engine batches are a few KB to a few MB"))
        .map(|bytes| bytes as usize)
}

fn replay_bytes<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<usize, D::Error> {
    deserializer
        .deserialize_u64(Bounded(4096, 4 << 30, "max_replay_bytes is from {min} to {max} (got {got}): a replay is held whole until it is applied"))
        .map(|bytes| bytes as usize)
}
