//! One subscription per engine publisher, on its own thread (a current-thread tokio
//! runtime: decoding and applying never run on the HTTP service's executor).
//!
//! - Sequence numbers are tracked per publisher. A batch after a gap asks the replay
//!   socket for the missing range (`[empty, start_seq]` from a DEALER, as vLLM's REQ
//!   clients do); batches replayed twice are skipped by sequence. If there is no replay
//!   socket, or its buffer no longer has the range, the worker's blocks are cleared
//!   (stale cache state is worse than none) and the subscription goes on from there.
//! - A live sequence that goes backwards is an engine restart (vLLM starts again at 0):
//!   the worker's blocks are cleared. The exception is a batch that a replay has just
//!   delivered (the live copy of a batch published while the replay ran): the same bytes
//!   under the same sequence are a duplicate, skipped.
//! - At start the subscriber asks for a replay from 0: a SUB socket misses what was
//!   published before it joined (ZeroMQ's slow joiner), the replay buffer has it. When
//!   that replay finds nothing (the engine had published nothing yet, or was not up),
//!   the first live batch, unless it is sequence 0, asks again: the batches before it
//!   were lost to the slow joiner, and taking it as the start would lose them for good.
//! - The SUB socket reconnects (with backoff) when the publisher goes away, and after 3 s
//!   of silence, since a restarted publisher is not always noticed by the socket.
//! - Both sockets are read with limits (`router.kv_events`, `zmtp.rs`): a message
//!   over `max_frame_bytes` is read past unkept, a replay over `max_replay_bytes` given
//!   up; each counted and logged once per publisher. A batch is decoded a chunk of
//!   events at a time ([`wire::decode_events`]), so it costs its bytes and one chunk.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use switchyard_config::KvEventLimits;

use super::wire::{self, split_frames, EngineEvent, END_SEQUENCE};
use super::zmtp::{Peer, Received};
use super::ApplyOutcome;
use super::KvEventSource;
use super::KvSourceCounters;

/// What one replayed batch costs beyond its payload (its entry, the allocation's header),
/// counted against `max_replay_bytes`.
const REPLY_OVERHEAD: usize = 64;
/// How long a replay may take before it counts as failed.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(2);
/// Silence after which the SUB socket is connected afresh, after the engine last spoke:
/// a backstop, for a restart the socket's own reconnection did not report.
const RECONNECT_AFTER_SILENCE: Duration = Duration::from_secs(3);
/// The longest silence between two such checks of an engine that stays idle: each check
/// doubles the wait, so a thousand idle engines cost a reconnect each per this long, not
/// hundreds per second.
const MAX_SILENCE: Duration = Duration::from_secs(48);

/// Tells a subscriber's thread to stop; it wakes at once, whatever it waits on, so an
/// idle subscription costs no periodic wake-ups.
#[derive(Default)]
struct Stop {
    flag: AtomicBool,
    wake: tokio::sync::Notify,
}

impl Stop {
    fn stopped(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }

    /// Resolves once stop is asked (at once if it was).
    async fn asked(&self) {
        while !self.stopped() {
            self.wake.notified().await;
        }
    }
}

/// A running subscription; dropping it stops the thread.
pub struct Subscription {
    stop: Arc<Stop>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.stop.flag.store(true, Ordering::Relaxed);
        // Stores a permit if the thread is not waiting yet: the wake-up is not lost.
        self.stop.wake.notify_one();
    }
}

/// What a subscription feeds: the router, seen only through what a subscriber needs, so
/// the subscriber does not depend on the router (which owns the subscriptions).
pub trait EventSink: Send + Sync + 'static {
    /// Applies events an engine published for worker (`worker_id`, `dp_rank`).
    fn apply_engine_events(
        &self,
        worker_id: u64,
        dp_rank: u32,
        events: &[EngineEvent],
    ) -> ApplyOutcome;
    /// Forgets every block of the worker's engine (it restarted, or events were lost).
    fn clear_engine(&self, worker_id: u64, dp_rank: u32);
    fn block_size(&self) -> u32;
    /// The counters of the publisher at `endpoint` for `worker_id` (made on first use).
    fn kv_source(&self, endpoint: &str, worker_id: u64) -> Arc<KvSourceCounters>;
    /// How old a batch was when it arrived.
    fn record_kv_event_lag(&self, lag: Duration);
    /// The bounds on messages and replays (`router.kv_events`), read per message so a
    /// reload applies them.
    fn kv_event_limits(&self) -> KvEventLimits;
}

/// Starts a subscription to `source` for worker `worker_id` (`dp_rank` unless a batch
/// names its own rank).
pub fn subscribe(
    router: Arc<dyn EventSink>,
    worker_id: u64,
    dp_rank: u32,
    source: KvEventSource,
) -> std::io::Result<Subscription> {
    let stop = Arc::new(Stop::default());
    let counters = router.kv_source(&source.endpoint, worker_id);
    let mut subscriber = Subscriber {
        router,
        worker_id,
        default_rank: dp_rank,
        ranks: BTreeSet::new(),
        source,
        stop: stop.clone(),
        expected: None,
        last_ts: None,
        replayed: Vec::new(),
        dealer: None,
        counters,
    };
    std::thread::Builder::new()
        .name(format!("kv-events-{worker_id}"))
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            match runtime {
                Ok(runtime) => runtime.block_on(subscriber.run()),
                Err(e) => tracing::error!(error = %e, "kv events: cannot start a runtime"),
            }
        })?;
    Ok(Subscription { stop })
}

struct Subscriber {
    router: Arc<dyn EventSink>,
    worker_id: u64,
    default_rank: u32,
    /// Every dp_rank this publisher's batches named: what a clear applies to.
    ranks: BTreeSet<u32>,
    source: KvEventSource,
    stop: Arc<Stop>,
    /// The next sequence number; None before the first batch.
    expected: Option<u64>,
    /// The timestamp of the last batch applied.
    last_ts: Option<f64>,
    /// Batches applied from the last replay (sequence, digest of the payload), until the
    /// live stream passes them: their live copies may still be on the way.
    replayed: Vec<(u64, u64)>,
    dealer: Option<Peer>,
    counters: Arc<KvSourceCounters>,
}

impl Subscriber {
    fn stopped(&self) -> bool {
        self.stop.stopped()
    }

    async fn run(&mut self) {
        let mut first = true;
        let mut silence = RECONNECT_AFTER_SILENCE;
        while !self.stopped() {
            let Some(mut socket) = self.connect(first).await else {
                return;
            };
            if first && self.source.replay_endpoint.is_some() {
                // What was published before this subscriber joined.
                self.replay_from(0).await;
            } else if !first {
                // Connected afresh: the engine may have restarted meanwhile.
                self.check_continuity().await;
            }
            first = false;
            while !self.stopped() {
                let limit = self.router.kv_event_limits().max_frame_bytes;
                // A receive dropped half-way leaves the connection mid-frame: every way
                // out of this select but a message leaves the connection.
                let received = tokio::select! {
                    () = self.stop.asked() => return,
                    received = tokio::time::timeout(silence, socket.recv(limit)) => received,
                };
                let frames = match received {
                    Err(_) => {
                        // An engine that went away and came back is not always noticed
                        // by the socket: after a while of silence, connect afresh (what
                        // was missed meanwhile shows as a gap and is replayed), and
                        // wait twice as long before the next such check.
                        silence = (silence * 2).min(MAX_SILENCE);
                        break;
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(endpoint = %self.source.endpoint, error = %e, "kv events: the publisher's connection ended; reconnecting");
                        break;
                    }
                    Ok(Ok(Received::Oversized { bytes })) => {
                        self.oversized(bytes, limit, "live");
                        continue;
                    }
                    Ok(Ok(Received::Message(frames))) => frames,
                };
                silence = RECONNECT_AFTER_SILENCE;
                let Some((sequence, payload)) = split_frames(&frames) else {
                    self.counters.decode_errors.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                self.live(sequence, payload).await;
            }
        }
    }

    /// A message over `max_frame_bytes` was read past: counted, logged once.
    fn oversized(&self, bytes: u64, limit: usize, socket: &str) {
        if self.counters.record_oversized() {
            tracing::warn!(
                endpoint = %self.source.endpoint, worker_id = self.worker_id, bytes, limit, socket,
                "kv events: a message over router.kv_events.max_frame_bytes was dropped unread (logged once per publisher; counted in switchyard_kv_event_oversized_total)"
            );
        }
    }

    /// Connects and subscribes, retrying with backoff; None once stopped.
    async fn connect(&mut self, first: bool) -> Option<Peer> {
        let mut backoff = Duration::from_millis(100);
        if !first {
            self.counters.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        loop {
            if self.stopped() {
                return None;
            }
            let connected = tokio::time::timeout(Duration::from_secs(2), async {
                let mut socket = Peer::connect(&self.source.endpoint, "SUB").await?;
                socket.subscribe(self.source.topic.as_bytes()).await?;
                Ok::<_, std::io::Error>(socket)
            })
            .await;
            match connected {
                Ok(Ok(socket)) => {
                    tracing::debug!(endpoint = %self.source.endpoint, worker_id = self.worker_id, "kv events: subscribed");
                    return Some(socket);
                }
                Ok(Err(e)) => {
                    tracing::debug!(endpoint = %self.source.endpoint, error = %e, "kv events: connect failed; retrying")
                }
                Err(_) => {
                    tracing::debug!(endpoint = %self.source.endpoint, "kv events: connect timed out; retrying")
                }
            }
            self.counters.reconnects.fetch_add(1, Ordering::Relaxed);
            tokio::select! {
                () = self.stop.asked() => return None,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    /// A batch from the live stream.
    async fn live(&mut self, sequence: u64, payload: &[u8]) {
        if self.expected.is_none() && sequence > 0 && self.source.replay_endpoint.is_some() {
            // The first batch seen, and not the engine's first: the ones before it were
            // published before this socket joined (the start replay found nothing yet,
            // or could not be asked). Where the stream begins is the replay buffer's
            // oldest batch, not this one.
            tracing::debug!(endpoint = %self.source.endpoint, worker_id = self.worker_id, sequence, "kv events: the first live batch is not the engine's first; replaying from 0");
            self.replay_from(0).await;
        }
        let digest = wire::digest(payload);
        if self
            .replayed
            .iter()
            .any(|&(s, d)| s == sequence && d == digest)
        {
            self.counters.duplicates.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.replayed.clear();
        match self.expected {
            Some(expected) if sequence < expected => {
                // The live stream never repeats: the engine restarted.
                tracing::warn!(endpoint = %self.source.endpoint, worker_id = self.worker_id, sequence, expected, "kv events: sequence went back; the engine restarted: clearing its blocks");
                self.clear("restart");
                self.expected = Some(0);
                if sequence > 0 {
                    self.fill_gap(sequence).await;
                }
            }
            Some(expected) if sequence > expected => self.fill_gap(sequence).await,
            _ => {}
        }
        if self.expected.is_none_or(|e| e == sequence) {
            self.apply(sequence, payload);
        }
    }

    /// Batches `expected..sequence` were lost: replay them, or clear.
    async fn fill_gap(&mut self, sequence: u64) {
        let expected = self.expected.unwrap_or(0);
        self.counters.gaps.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(endpoint = %self.source.endpoint, worker_id = self.worker_id, missing_from = expected, missing_to = sequence - 1, "kv events: gap");
        if self.source.replay_endpoint.is_some() {
            self.replay_from(expected).await;
        }
        if self.expected.is_some_and(|e| e < sequence) {
            self.counters.replays_failed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(endpoint = %self.source.endpoint, worker_id = self.worker_id, "kv events: the gap could not be replayed: clearing the worker's blocks");
            self.clear("gap");
            self.expected = Some(sequence);
        }
    }

    /// Every batch the replay socket still buffers from `start` on; None if it could
    /// not be asked, or its answer was over `max_replay_bytes`.
    async fn fetch_replay(&mut self, start: u64) -> Option<Vec<(u64, Bytes)>> {
        let endpoint = self.source.replay_endpoint.clone()?;
        let limits = self.router.kv_event_limits();
        let outcome =
            tokio::time::timeout(REPLAY_TIMEOUT, self.ask_replay(&endpoint, start, limits)).await;
        let problem = match outcome {
            Ok(Ok(replies)) => {
                self.counters.replays.fetch_add(1, Ordering::Relaxed);
                return Some(replies);
            }
            Ok(Err(ReplayFailed::Oversized(bytes))) => {
                if self.counters.record_replay_oversized() {
                    tracing::warn!(
                        %endpoint, worker_id = self.worker_id, bytes, limit = limits.max_replay_bytes,
                        "kv events: a replay brought more than router.kv_events.max_replay_bytes; given up (logged once per publisher; counted in switchyard_kv_event_replays_oversized_total)"
                    );
                }
                "over max_replay_bytes".to_owned()
            }
            Ok(Err(ReplayFailed::Io(e))) => e.to_string(),
            Err(_) => "timed out".to_owned(),
        };
        tracing::warn!(%endpoint, %problem, "kv events: replay failed");
        // A connection left mid-answer cannot be read on: connect afresh next time.
        self.dealer = None;
        None
    }

    /// Sends the replay request and gathers the answer, at most `max_replay_bytes` of it.
    async fn ask_replay(
        &mut self,
        endpoint: &str,
        start: u64,
        limits: KvEventLimits,
    ) -> Result<Vec<(u64, Bytes)>, ReplayFailed> {
        if self.dealer.is_none() {
            self.dealer = Some(Peer::connect(endpoint, "DEALER").await?);
        }
        let dealer = self.dealer.as_mut().expect("just set");
        dealer.send(&[b"", &start.to_be_bytes()]).await?;
        let (mut replies, mut bytes) = (Vec::new(), 0usize);
        loop {
            let mut frames = match dealer.recv(limits.max_frame_bytes).await? {
                Received::Message(frames) => frames,
                Received::Oversized { bytes } => {
                    self.oversized(bytes, limits.max_frame_bytes, "replay");
                    return Err(ReplayFailed::Oversized(bytes));
                }
            };
            if frames.first().is_some_and(|f| f.is_empty()) {
                frames.remove(0); // the REQ-style delimiter
            }
            match split_frames(&frames) {
                Some((END_SEQUENCE, _)) => return Ok(replies),
                Some((sequence, payload)) => {
                    // Each reply kept costs its entry too: a flood of empty batches
                    // is bounded as well as one of large ones.
                    bytes += payload.len() + REPLY_OVERHEAD;
                    if bytes > limits.max_replay_bytes {
                        return Err(ReplayFailed::Oversized(bytes as u64));
                    }
                    replies.push((sequence, Bytes::copy_from_slice(payload)));
                }
                None => {
                    return Err(ReplayFailed::Io(std::io::Error::other(
                        "a malformed replay reply",
                    )))
                }
            }
        }
    }

    /// Asks the replay socket for every buffered batch from `start` on and applies the
    /// ones not applied yet.
    async fn replay_from(&mut self, start: u64) {
        let Some(replies) = self.fetch_replay(start).await else {
            return;
        };
        for (sequence, payload) in replies {
            match self.expected {
                // Before any batch, the oldest buffered one is where we start.
                None => self.apply(sequence, &payload),
                Some(e) if e == sequence => self.apply(sequence, &payload),
                Some(e) if sequence < e => {
                    self.counters.duplicates.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Some(_) => break, // the buffer does not reach back far enough
            }
            self.replayed.push((sequence, wire::digest(&payload)));
        }
    }

    /// After connecting afresh: is it the same publisher? Its buffer must still hold the
    /// last batch applied, with the same timestamp; otherwise the engine restarted (and
    /// may have published past the old sequence meanwhile), or the buffer moved on.
    async fn check_continuity(&mut self) {
        let (Some(expected), Some(last_ts)) = (self.expected, self.last_ts) else {
            return;
        };
        if expected == 0 {
            return;
        }
        let Some(replies) = self.fetch_replay(expected - 1).await else {
            return;
        };
        let same = replies.first().is_some_and(|(sequence, payload)| {
            *sequence == expected - 1 && wire::head(payload).is_ok_and(|b| b.ts == last_ts)
        });
        if same {
            for (sequence, payload) in replies.into_iter().skip(1) {
                if self.expected == Some(sequence) {
                    self.apply(sequence, &payload);
                    self.replayed.push((sequence, wire::digest(&payload)));
                }
            }
        } else {
            tracing::warn!(endpoint = %self.source.endpoint, worker_id = self.worker_id, "kv events: the publisher no longer has the last batch applied; it restarted: clearing its blocks");
            self.clear("restart");
            self.expected = None;
            self.last_ts = None;
            self.replay_from(0).await;
        }
    }

    fn apply(&mut self, sequence: u64, payload: &[u8]) {
        self.expected = Some(sequence + 1);
        self.apply_payload(sequence, payload);
        // Counted once applied: a batch counted is in the index (replay waits on this).
        self.counters.batches.fetch_add(1, Ordering::Release);
    }

    fn apply_payload(&mut self, sequence: u64, payload: &[u8]) {
        let head = match wire::head(payload) {
            Ok(head) => head,
            Err(e) => {
                self.counters.decode_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(endpoint = %self.source.endpoint, sequence, error = %e, "kv events: undecodable batch");
                return;
            }
        };
        self.last_ts = Some(head.ts);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        if head.ts > 0.0 && now >= head.ts {
            let lag = Duration::from_secs_f64(now - head.ts);
            self.router.record_kv_event_lag(lag);
            self.counters.record_lag(lag);
        }
        let rank = head.data_parallel_rank.unwrap_or(self.default_rank);
        self.ranks.insert(rank);
        let (router, counters) = (&self.router, &self.counters);
        let (mut block_size_refused, mut unknown_worker) = (None, false);
        let skipped = wire::decode_events(payload, 4, |events| {
            let mut outcome = router.apply_engine_events(self.worker_id, rank, events);
            block_size_refused = block_size_refused.or(outcome.block_size_refused);
            // A batch for an unknown worker is counted once, whatever its chunks.
            if unknown_worker {
                outcome.unknown_worker = false;
            }
            unknown_worker |= outcome.unknown_worker;
            counters.record(&outcome);
        });
        if let Some(skipped) = skipped.ok().filter(|s| s.count > 0) {
            self.counters
                .malformed_events
                .fetch_add(skipped.count, Ordering::Relaxed);
            tracing::warn!(endpoint = %self.source.endpoint, sequence, skipped = skipped.count, first_problems = ?skipped.problems, "kv events: malformed events skipped");
        }
        if let Some(size) = block_size_refused {
            if self.counters.first_block_size_error() {
                tracing::error!(
                    endpoint = %self.source.endpoint, worker_id = self.worker_id, engine_block_size = size,
                    router_block_size = self.router.block_size(),
                    "kv events: the engine's block_size differs from router.block_size; its events are ignored. Set router.block_size to the engine's"
                );
            }
        }
    }

    fn clear(&mut self, reason: &'static str) {
        let ranks: Vec<u32> = if self.ranks.is_empty() {
            vec![self.default_rank]
        } else {
            self.ranks.iter().copied().collect()
        };
        for rank in ranks {
            self.router.clear_engine(self.worker_id, rank);
        }
        self.counters.record_clear(reason);
    }
}

/// Why a replay was not taken.
enum ReplayFailed {
    /// Its answer (or one message of it) was over the limits, with the bytes seen.
    Oversized(u64),
    Io(std::io::Error),
}

impl From<std::io::Error> for ReplayFailed {
    fn from(e: std::io::Error) -> Self {
        ReplayFailed::Io(e)
    }
}
