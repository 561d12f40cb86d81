//! Counters of one KV-event publisher: what its subscriber applied, refused and replayed
//! (rendered in `/metrics`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use super::ApplyOutcome;

/// Counters of one KV-event publisher (one engine's PUB socket).
#[derive(Default)]
pub struct KvSourceCounters {
    pub worker_id: u64,
    pub endpoint: String,
    pub batches: AtomicU64,
    pub events_applied: AtomicU64,
    pub decode_errors: AtomicU64,
    pub malformed_events: AtomicU64,
    pub gaps: AtomicU64,
    pub replays: AtomicU64,
    pub replays_failed: AtomicU64,
    pub duplicates: AtomicU64,
    pub reconnects: AtomicU64,
    pub unknown_worker: AtomicU64,
    /// Messages over `router.kv_events.max_frame_bytes`, read past and dropped.
    pub oversized: AtomicU64,
    /// Replays given up at `router.kv_events.max_replay_bytes`.
    pub replays_oversized: AtomicU64,
    /// By reason: restart, gap, engine (`AllBlocksCleared`).
    pub(crate) clears: [AtomicU64; 3],
    /// By `Ignored` reason, in its declaration order.
    pub(crate) ignored: [AtomicU64; 5],
    /// Of the last batch that carried a timestamp, in nanoseconds.
    pub(crate) last_lag_nanos: AtomicU64,
    pub(crate) block_size_error_logged: AtomicBool,
    pub(crate) oversized_logged: AtomicBool,
    pub(crate) replay_oversized_logged: AtomicBool,
}

pub(crate) const CLEAR_REASONS: [&str; 3] = ["restart", "gap", "engine"];

impl KvSourceCounters {
    pub fn record(&self, outcome: &ApplyOutcome) {
        self.events_applied
            .fetch_add(outcome.applied, Ordering::Relaxed);
        self.clears[2].fetch_add(outcome.engine_clears, Ordering::Relaxed);
        for reason in &outcome.ignored {
            self.ignored[*reason as usize].fetch_add(1, Ordering::Relaxed);
        }
        if outcome.unknown_worker {
            self.unknown_worker.fetch_add(1, Ordering::Relaxed);
        }
    }
    pub fn record_clear(&self, reason: &str) {
        if let Some(i) = CLEAR_REASONS.iter().position(|r| *r == reason) {
            self.clears[i].fetch_add(1, Ordering::Relaxed);
        }
    }
    pub fn record_lag(&self, lag: Duration) {
        self.last_lag_nanos
            .store(lag.as_nanos() as u64, Ordering::Relaxed);
    }
    /// True the first time only: a misconfiguration is logged once, counted always.
    pub fn first_block_size_error(&self) -> bool {
        !self.block_size_error_logged.swap(true, Ordering::Relaxed)
    }
    /// Counts a message dropped for its size; true the first time (to log it once).
    pub fn record_oversized(&self) -> bool {
        self.oversized.fetch_add(1, Ordering::Relaxed);
        !self.oversized_logged.swap(true, Ordering::Relaxed)
    }
    /// Counts a replay given up for its size; true the first time (to log it once).
    pub fn record_replay_oversized(&self) -> bool {
        self.replays_oversized.fetch_add(1, Ordering::Relaxed);
        !self.replay_oversized_logged.swap(true, Ordering::Relaxed)
    }
}
