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

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use super::wire::{decode, split_frames, EngineEvent, END_SEQUENCE};
use super::ApplyOutcome;
use super::KvEventSource;
use super::KvSourceCounters;

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

/// What a waiting subscriber heard first.
enum Heard {
    /// The socket's monitor: an event, or None once it closed.
    Monitor(Option<zeromq::SocketEvent>),
    /// The socket: a message, a receive error, or the silence ran out.
    Socket(Result<zeromq::ZmqResult<ZmqMessage>, tokio::time::error::Elapsed>),
}

/// The monitor's next event; never resolves once the monitor is gone.
async fn next_event<S>(monitor: &mut Option<S>) -> Option<zeromq::SocketEvent>
where
    S: futures_util::Stream<Item = zeromq::SocketEvent> + Unpin,
{
    match monitor {
        Some(events) => futures_util::StreamExt::next(events).await,
        None => std::future::pending().await,
    }
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
    /// Batches applied from the last replay, until the live stream passes them: their
    /// live copies may still be on the way.
    replayed: Vec<(u64, Bytes)>,
    dealer: Option<zeromq::DealerSocket>,
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
            let Some(mut socket) = self.connect().await else {
                return;
            };
            if first && self.source.replay_endpoint.is_some() {
                // What was published before this subscriber joined.
                self.replay_from(0).await;
            } else if !first {
                self.check_continuity().await;
            }
            first = false;
            // The socket reconnects by itself when the engine goes away and comes back
            // (a restart): each time, check what the publisher has (the monitor tells).
            let mut monitor = Some(socket.monitor());
            while !self.stopped() {
                let heard = tokio::select! {
                    () = self.stop.asked() => return,
                    event = next_event(&mut monitor) => Heard::Monitor(event),
                    received = tokio::time::timeout(silence, socket.recv()) => Heard::Socket(received),
                };
                let message = match heard {
                    Heard::Monitor(Some(zeromq::SocketEvent::Connected(..))) => {
                        tracing::debug!(endpoint = %self.source.endpoint, worker_id = self.worker_id, "kv events: reconnected");
                        self.counters.reconnects.fetch_add(1, Ordering::Relaxed);
                        self.check_continuity().await;
                        continue;
                    }
                    Heard::Monitor(Some(_)) => continue,
                    Heard::Monitor(None) => {
                        monitor = None;
                        continue;
                    }
                    Heard::Socket(Err(_)) => {
                        // An engine that went away and came back is not always noticed
                        // by the socket: after a while of silence, connect afresh (what
                        // was missed meanwhile shows as a gap and is replayed), and
                        // wait twice as long before the next such check.
                        silence = (silence * 2).min(MAX_SILENCE);
                        break;
                    }
                    Heard::Socket(Ok(Ok(message))) => message,
                    Heard::Socket(Ok(Err(e))) => {
                        tracing::warn!(endpoint = %self.source.endpoint, error = %e, "kv events: receive failed; reconnecting");
                        break;
                    }
                };
                silence = RECONNECT_AFTER_SILENCE;
                let frames = message.into_vec();
                let Some((sequence, payload)) = split_frames(&frames) else {
                    self.counters.decode_errors.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                self.live(sequence, payload).await;
            }
        }
    }

    /// Connects and subscribes, retrying with backoff; None once stopped.
    async fn connect(&mut self) -> Option<zeromq::SubSocket> {
        let mut backoff = Duration::from_millis(100);
        loop {
            if self.stopped() {
                return None;
            }
            let mut socket = zeromq::SubSocket::new();
            let connected = tokio::time::timeout(Duration::from_secs(2), async {
                socket.connect(&self.source.endpoint).await?;
                socket.subscribe(&self.source.topic).await
            })
            .await;
            match connected {
                Ok(Ok(())) => {
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
        if self
            .replayed
            .iter()
            .any(|(s, p)| *s == sequence && p.as_ref() == payload)
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
    /// not be asked.
    async fn fetch_replay(&mut self, start: u64) -> Option<Vec<(u64, Bytes)>> {
        let endpoint = self.source.replay_endpoint.clone()?;
        let outcome = tokio::time::timeout(REPLAY_TIMEOUT, async {
            if self.dealer.is_none() {
                let mut dealer = zeromq::DealerSocket::new();
                dealer.connect(&endpoint).await.map_err(|e| e.to_string())?;
                self.dealer = Some(dealer);
            }
            let dealer = self.dealer.as_mut().expect("just set");
            let request = vec![Bytes::new(), Bytes::copy_from_slice(&start.to_be_bytes())];
            dealer
                .send(ZmqMessage::try_from(request).expect("two frames"))
                .await
                .map_err(|e| e.to_string())?;
            let mut replies = Vec::new();
            loop {
                let mut frames = dealer.recv().await.map_err(|e| e.to_string())?.into_vec();
                if frames.first().is_some_and(|f| f.is_empty()) {
                    frames.remove(0); // the REQ-style delimiter
                }
                match split_frames(&frames) {
                    Some((END_SEQUENCE, _)) => return Ok::<_, String>(replies),
                    Some((sequence, payload)) => {
                        replies.push((sequence, Bytes::copy_from_slice(payload)))
                    }
                    None => return Err("a malformed replay reply".to_owned()),
                }
            }
        })
        .await;
        match outcome {
            Ok(Ok(replies)) => {
                self.counters.replays.fetch_add(1, Ordering::Relaxed);
                Some(replies)
            }
            Ok(Err(problem)) => {
                tracing::warn!(%endpoint, %problem, "kv events: replay failed");
                self.dealer = None;
                None
            }
            Err(_) => {
                tracing::warn!(%endpoint, "kv events: replay timed out");
                self.dealer = None;
                None
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
            self.replayed.push((sequence, payload));
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
            *sequence == expected - 1 && decode(payload).is_ok_and(|b| b.ts == last_ts)
        });
        if same {
            for (sequence, payload) in replies.into_iter().skip(1) {
                if self.expected == Some(sequence) {
                    self.apply(sequence, &payload);
                    self.replayed.push((sequence, payload));
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
        let batch = match decode(payload) {
            Ok(batch) => batch,
            Err(e) => {
                self.counters.decode_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(endpoint = %self.source.endpoint, sequence, error = %e, "kv events: undecodable batch");
                return;
            }
        };
        self.last_ts = Some(batch.ts);
        if !batch.malformed.is_empty() {
            self.counters
                .malformed_events
                .fetch_add(batch.malformed.len() as u64, Ordering::Relaxed);
            tracing::warn!(endpoint = %self.source.endpoint, sequence, problems = ?batch.malformed, "kv events: malformed events skipped");
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        if batch.ts > 0.0 && now >= batch.ts {
            let lag = Duration::from_secs_f64(now - batch.ts);
            self.router.record_kv_event_lag(lag);
            self.counters.record_lag(lag);
        }
        let rank = batch.data_parallel_rank.unwrap_or(self.default_rank);
        self.ranks.insert(rank);
        let outcome = self
            .router
            .apply_engine_events(self.worker_id, rank, &batch.events);
        self.counters.record(&outcome);
        if let Some(size) = outcome.block_size_refused {
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
