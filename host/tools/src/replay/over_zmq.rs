//! `replay --kv-events zmq`: each simulated worker publishes its cache's events as an
//! engine does (vLLM's ZeroMQ msgpack format, a PUB socket and a replay socket on
//! loopback), and the router follows them through its real subscribers, hash agreement
//! included, instead of being handed the events in process.
//!
//! The simulation runs faster than real time, so after each batch it waits until the
//! router has applied it (the subscriber's batch counter): decisions then see exactly the
//! cache state they would see in process, and the two transports can be compared.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::trace::ReplayError;
use crate::fleet::kv_events::publisher::{self, Publisher, PublisherSettings};
use crate::fleet::kv_events::wire::{
    EngineEvent, EventForm, HashForm, RemovedBlocks, StoredBlocks,
};
use crate::fleet::kv_events::KvEventSource;
use crate::fleet::kv_events::KvSourceCounters;
use crate::fleet::router::Router;

/// How long one batch may take to reach the index before the replay gives up.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the first batch may take before it is sent again (the SUB socket may not be
/// connected yet: ZeroMQ's slow joiner).
const FIRST_BATCH_WAIT: Duration = Duration::from_millis(300);

/// The simulated workers' publishers, and what the router has applied of them.
pub struct ZmqFleet {
    /// Runs the publisher tasks; dropping it closes their sockets.
    _runtime: tokio::runtime::Runtime,
    publishers: Vec<Publisher>,
    counters: Vec<Arc<KvSourceCounters>>,
    /// Batches published, per worker.
    published: Vec<u64>,
    block_size: u32,
}

impl ZmqFleet {
    /// Binds a publisher per worker on loopback (ports chosen by the system); the
    /// sources to give the router's workers.
    pub fn bind(
        workers: usize,
        block_size: u32,
    ) -> Result<(Self, Vec<KvEventSource>), ReplayError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("replay-publishers")
            .enable_all()
            .build()
            .map_err(ReplayError::Runtime)?;
        let mut publishers = Vec::with_capacity(workers);
        for _ in 0..workers {
            let publisher = runtime
                .block_on(publisher::start(PublisherSettings {
                    endpoint: "tcp://127.0.0.1:0".into(),
                    replay_endpoint: Some("tcp://127.0.0.1:0".into()),
                    topic: String::new(),
                    form: EventForm::Map,
                    hash_form: HashForm::Int,
                    data_parallel_rank: 0,
                    buffer_steps: 10_000,
                    drop_sequences: Vec::new(),
                }))
                .map_err(ReplayError::Publisher)?;
            publishers.push(publisher);
        }
        let sources = publishers
            .iter()
            .map(|p| KvEventSource {
                endpoint: p.endpoint.clone(),
                replay_endpoint: p.replay_endpoint.clone(),
                topic: String::new(),
            })
            .collect();
        let fleet = ZmqFleet {
            _runtime: runtime,
            publishers,
            counters: Vec::new(),
            published: vec![0; workers],
            block_size,
        };
        Ok((fleet, sources))
    }

    /// Once the router subscribed: waits until every worker's stream reaches the index,
    /// sending a harmless first batch (`AllBlocksCleared` of an empty cache) again until
    /// one arrives.
    pub fn connect(&mut self, router: &Router) -> Result<(), ReplayError> {
        self.counters = self
            .publishers
            .iter()
            .enumerate()
            .map(|(w, p)| router.metrics.kv_source(&p.endpoint, w as u64))
            .collect();
        let deadline = Instant::now() + DELIVERY_TIMEOUT;
        for w in 0..self.publishers.len() {
            loop {
                self.publish(w, vec![EngineEvent::AllCleared]);
                let attempt = Instant::now() + FIRST_BATCH_WAIT;
                while self.applied(w) < self.published[w] && Instant::now() < attempt {
                    std::thread::sleep(Duration::from_micros(200));
                }
                if self.applied(w) >= self.published[w] {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(self.not_delivered(w));
                }
            }
        }
        Ok(())
    }

    fn applied(&self, w: usize) -> u64 {
        self.counters[w].batches.load(Ordering::Acquire)
    }

    fn publish(&mut self, w: usize, events: Vec<EngineEvent>) {
        self.publishers[w].publish(events);
        self.published[w] += 1;
    }

    fn not_delivered(&self, w: usize) -> ReplayError {
        ReplayError::NotDelivered {
            worker: w,
            applied: self.applied(w),
            published: self.published[w],
            endpoint: self.publishers[w].endpoint.clone(),
            timeout_secs: DELIVERY_TIMEOUT.as_secs(),
        }
    }

    /// Publishes what worker `w` evicted and stored (positions into `prompt`, in prefix
    /// order) as one engine step, and waits until the router has applied it.
    pub fn step(
        &mut self,
        w: usize,
        prompt: &[u64],
        evicted: &[u64],
        stored: &[usize],
    ) -> Result<(), ReplayError> {
        let mut events: Vec<EngineEvent> = evicted
            .iter()
            .map(|&hash| {
                EngineEvent::Removed(RemovedBlocks {
                    block_hashes: vec![hash],
                    medium: Some("GPU".into()),
                    group_idx: None,
                })
            })
            .collect();
        // One BlockStored per run of consecutive positions, chained to the block before it.
        let mut runs = stored.chunk_by(|a, b| b == &(a + 1));
        for run in &mut runs {
            let hashes: Vec<u64> = run.iter().map(|&i| prompt[i]).collect();
            events.push(EngineEvent::Stored(StoredBlocks {
                parent_block_hash: run[0].checked_sub(1).map(|p| prompt[p]),
                token_ids: hashes
                    .iter()
                    .flat_map(|&h| block_tokens(h, self.block_size))
                    .collect(),
                block_hashes: hashes,
                block_size: self.block_size,
                medium: Some("GPU".into()),
                ..Default::default()
            }));
        }
        if events.is_empty() {
            return Ok(());
        }
        self.publish(w, events);
        let deadline = Instant::now() + DELIVERY_TIMEOUT;
        while self.applied(w) < self.published[w] {
            if Instant::now() > deadline {
                return Err(self.not_delivered(w));
            }
            std::thread::yield_now();
        }
        Ok(())
    }
}

/// The tokens a trace block stands for: its hash id, spelled out, then zeros. Equal ids
/// give equal blocks, so the router's chained hashes of these tokens share exactly the
/// prefixes the trace's ids share.
pub fn block_tokens(hash_id: u64, block_size: u32) -> impl Iterator<Item = u32> {
    let (low, high) = (hash_id as u32, (hash_id >> 32) as u32);
    let head: Vec<u32> = if block_size == 1 {
        vec![low ^ high.rotate_left(16)]
    } else {
        vec![low, high]
    };
    head.into_iter()
        .chain(std::iter::repeat(0))
        .take(block_size as usize)
}
