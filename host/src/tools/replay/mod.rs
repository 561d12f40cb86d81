//! Trace replay: a request trace (Mooncake format) against simulated workers, through the
//! real router and the named policy instances, one policy at a time.
//!
//! The simulation model (docs/BENCHMARKS.md):
//! - each worker has a prefix cache of `cache_blocks` blocks with LRU eviction; a request's
//!   cache hit is the contiguous prefix of its blocks present on its worker when routed;
//! - a worker prefills one request at a time at `prefill_tokens_per_s`, first come first
//!   served; a request's time to first token is its queueing plus its prefill of the
//!   tokens not covered by the hit;
//! - decode runs beside prefill and takes `output_length / decode_tokens_per_s` seconds;
//! - when a prefill ends the worker stores the request's blocks (KV `stored` events, and
//!   `removed` events for what LRU evicts) and the router hears prefill-complete; when
//!   decode ends the router hears free.
//!
//! - with `--adapters N`, each request asks for one of N LoRA adapters (requests sharing a
//!   first block share an adapter); a worker holds `--max-loras` adapters (LRU), and a
//!   request whose adapter it does not hold pays `--adapter-load-ms` before its prefill;
//! - every worker reports its own load to the router as an engine's `/metrics` would
//!   (the ENGINE input group: waiting and running requests, KV usage, the adapters of its
//!   waiting and running requests), sampled every `--engine-sample-ms` of trace time.
//!
//! The KV events reach the router in process, or (`--kv-events zmq`) as an engine sends
//! them: over ZeroMQ on loopback, through the router's subscribers (`over_zmq`).

mod disaggregated;
mod over_zmq;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt::Write as _;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lru::LruCache;
use serde::Deserialize;
use switchyard_plugin_sdk::WorkerId;

use crate::config::ConfigSource;
use crate::fleet::admission::{Ticket, Turn};
use crate::fleet::kv_index::KvEvent;
use crate::fleet::router::{RouteError, RouteRequest, Router};
use crate::fleet::workers::{WorkerRole, WorkerSpec};
use crate::plugin::{EngineReport, EngineSample, PartitionKey, RequestAttributes};
use crate::startup::start;
use over_zmq::{block_tokens, ZmqFleet};
use switchyard_plugin_sdk::WorkerType;

/// The model name the simulated workers serve.
const MODEL: &str = "replay";

/// One request of a trace.
#[derive(Clone, Debug, Deserialize)]
pub struct TraceRequest {
    /// Arrival, in milliseconds.
    pub timestamp: u64,
    pub input_length: u64,
    pub output_length: u64,
    /// Prefix block hashes, one per block of `block_size` tokens.
    pub hash_ids: Vec<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("{}: cannot read the trace: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}:{line}: not a trace request: {message}. Each line must be a JSON object with timestamp (ms), input_length, output_length and hash_ids", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{}: the trace has no requests", path.display())]
    Empty { path: PathBuf },
    #[error("{}:{line}: timestamps go backwards ({previous} ms, then {found} ms); sort the trace by timestamp", path.display())]
    Unsorted {
        path: PathBuf,
        line: usize,
        previous: u64,
        found: u64,
    },
    #[error("policy `{policy}`: {error}")]
    Route { policy: String, error: RouteError },
    #[error("{0}")]
    Setup(String),
}

/// Reads a JSON-lines trace; blank lines are skipped.
pub fn read_trace(path: &Path) -> Result<Vec<TraceRequest>, ReplayError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReplayError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mut requests: Vec<TraceRequest> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let request: TraceRequest = serde_json::from_str(line).map_err(|e| ReplayError::Parse {
            path: path.to_owned(),
            line: i + 1,
            message: e.to_string(),
        })?;
        if let Some(previous) = requests
            .last()
            .map(|r| r.timestamp)
            .filter(|&p| p > request.timestamp)
        {
            return Err(ReplayError::Unsorted {
                path: path.to_owned(),
                line: i + 1,
                previous,
                found: request.timestamp,
            });
        }
        requests.push(request);
    }
    if requests.is_empty() {
        return Err(ReplayError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(requests)
}

/// The simulated fleet.
#[derive(Clone, Copy, Debug)]
pub struct SimParams {
    pub workers: usize,
    pub cache_blocks: usize,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    pub block_size: u32,
    pub kv_events: KvTransport,
    /// Router replicas the requests are spread over (round robin), and whether they share
    /// their bookings.
    pub replicas: usize,
    pub sync: ReplicaSync,
    /// LoRA adapters the requests ask for (0: none).
    pub adapters: u32,
    /// Adapters a worker holds at once.
    pub max_loras: usize,
    /// Seconds a worker takes to load an adapter it does not hold.
    pub adapter_load_s: f64,
    /// Trace time between two engine samples, in microseconds (0: before every request).
    pub engine_sample_us: u64,
    /// Arrivals come this many times faster than the trace's timestamps say.
    pub time_scale: f64,
    /// The share of requests of the low-priority `batch` tenant (0: no tenants).
    pub batch_share: f64,
}

/// Whether replicas count each other's bookings in replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReplicaSync {
    /// Each replica counts only its own bookings (no bus).
    None,
    /// Every booking change reaches every other replica before the next request, through
    /// the path the NATS bus feeds (`Router::apply_remote`): a bus without latency.
    Shared,
}

/// How the simulated workers' KV events reach the router.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KvTransport {
    /// Handed to the router's KV index directly, with the trace's hash ids as block hashes.
    InProcess,
    /// Published per worker over ZeroMQ on loopback in vLLM's format (token ids and engine
    /// hashes), followed by the router's subscribers; requests are sent as token ids.
    Zmq,
}

/// What one policy did with the trace.
#[derive(Clone, Debug)]
pub struct PolicyReport {
    pub policy: String,
    pub requests: usize,
    /// Prompt blocks served from the worker's prefix cache / all prompt blocks.
    pub hit_rate: f64,
    /// Mean over arrivals of max / mean active tokens per worker.
    pub imbalance: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    /// Router calls (select-and-reserve) per second of router time.
    pub selections_per_s: f64,
    /// Requests routed by the built-in policy after the instance failed.
    pub fallbacks: u64,
    /// Requests for an adapter routed to a worker that held it / all requests for one;
    /// `None` without `--adapters`.
    pub adapter_hit_rate: Option<f64>,
    /// Requests refused by the admission queue (full, or waited past its limit).
    pub refused: u64,
    /// Per tenant (`--batch-share`): TTFT of its served requests, and its refusals.
    pub tenants: Vec<TenantReport>,
}

/// One tenant's share of a policy's run.
#[derive(Clone, Debug)]
pub struct TenantReport {
    pub tenant: String,
    pub served: u64,
    pub refused: u64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
}

struct SimWorker {
    cache: LruCache<u64, ()>,
    prefill_free_at: f64,
    active_tokens: u64,
    /// Requests routed here whose prefill has not ended, and those decoding.
    waiting: u64,
    running: u64,
    /// The adapters it holds, least recently used first out.
    adapters: LruCache<u32, ()>,
    /// Per adapter: its (waiting, running) requests here.
    adapter_requests: std::collections::BTreeMap<u32, (u64, u64)>,
}

impl SimWorker {
    /// What this worker's engine would report on its `/metrics`.
    fn sample(&self, kv_capacity_tokens: f64) -> EngineSample {
        let names = |running: bool| -> Box<[Box<str>]> {
            self.adapter_requests
                .iter()
                .filter(|(_, &(w, r))| if running { r > 0 } else { r == 0 && w > 0 })
                .map(|(a, _)| adapter_name(*a).into_boxed_str())
                .collect()
        };
        EngineSample {
            running_requests: self.running as f64,
            waiting_requests: self.waiting as f64,
            kv_cache_usage: (self.active_tokens as f64 / kv_capacity_tokens).min(1.0),
            running_adapters: Some(names(true)),
            waiting_adapters: Some(names(false)),
        }
    }

    /// Moves one request for `adapter` (if any) from waiting to running, or (`running`
    /// false at the end) out.
    fn count_adapter(&mut self, adapter: Option<u32>, step: AdapterStep) {
        let Some(a) = adapter else { return };
        let entry = self.adapter_requests.entry(a).or_default();
        match step {
            AdapterStep::Arrive => entry.0 += 1,
            AdapterStep::Run => {
                entry.0 -= 1;
                entry.1 += 1;
            }
            AdapterStep::Leave => entry.1 -= 1,
        }
        if *entry == (0, 0) {
            self.adapter_requests.remove(&a);
        }
    }
}

#[derive(Clone, Copy)]
enum AdapterStep {
    Arrive,
    Run,
    Leave,
}

fn adapter_name(adapter: u32) -> String {
    format!("adapter-{adapter}")
}

/// The adapter a request asks for: requests sharing a first block (one application, one
/// adapter) ask for the same one.
fn adapter_of(request: &TraceRequest, adapters: u32) -> Option<u32> {
    if adapters == 0 {
        return None;
    }
    let key = request
        .hash_ids
        .first()
        .copied()
        .unwrap_or(request.timestamp);
    Some(((key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % u64::from(adapters)) as u32)
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    PrefillDone,
    DecodeDone,
}

/// A simulated event: time in microseconds (ordered), phase, request index.
type Event = Reverse<(u64, Phase, usize)>;

fn micros(seconds: f64) -> u64 {
    (seconds * 1e6).round() as u64
}

/// How much of `request`'s prompt a worker's LRU cache holds (blocks, touched as used),
/// and the prompt tokens left to prefill.
fn cached_prefix(
    cache: &mut LruCache<u64, ()>,
    request: &TraceRequest,
    block_size: u32,
) -> (u64, u64) {
    let hit = request
        .hash_ids
        .iter()
        .take_while(|h| cache.get(h).is_some())
        .count() as u64;
    let new_tokens = request
        .input_length
        .saturating_sub(hit * u64::from(block_size));
    (hit, new_tokens)
}

/// Stores a prefilled prompt's blocks in a worker's LRU cache: the blocks evicted, and
/// the positions of those it did not hold.
fn store_blocks(cache: &mut LruCache<u64, ()>, hashes: &[u64]) -> (Vec<u64>, Vec<usize>) {
    let mut stored = Vec::new();
    let mut removed = Vec::new();
    for (i, &hash) in hashes.iter().enumerate() {
        if cache.get(&hash).is_none() {
            if let Some((evicted, ())) = cache.push(hash, ()) {
                if evicted != hash {
                    removed.push(evicted);
                }
            }
            stored.push(i);
        }
    }
    (removed, stored)
}

/// One policy's run of the trace: the simulated workers, pending events and tallies.
struct Simulation<'a> {
    /// The replicas; request `i` is routed by replica `i % len`.
    routers: &'a [Arc<Router>],
    /// Each replica's booking changes, with `ReplicaSync::Shared`.
    feeds: Vec<tokio::sync::mpsc::Receiver<switchyard_fleet::load_accounting::BookingChange>>,
    /// The publishers, with `--kv-events zmq`.
    zmq: Option<ZmqFleet>,
    trace: &'a [TraceRequest],
    params: SimParams,
    policy: &'a str,
    workers: Vec<SimWorker>,
    events: BinaryHeap<Event>,
    /// Per request: the worker it was routed to.
    assigned: Vec<usize>,
    hit_blocks: u64,
    total_blocks: u64,
    /// Simulated times to first token, in microseconds (3 significant digits).
    ttfts: hdrhistogram::Histogram<u64>,
    imbalance_sum: f64,
    router_time: Duration,
    /// Per request: the adapter it asks for.
    adapter: Vec<Option<u32>>,
    adapter_hits: u64,
    adapter_requests: u64,
    /// Each replica's report cell of each worker (ENGINE), and when they were last set.
    reports: Vec<Vec<Arc<EngineReport>>>,
    sampled_at: Option<u64>,
    /// Requests waiting in the admission queue (`admission:`), in arrival order.
    waiting: Vec<(usize, Ticket)>,
    refused: u64,
    refused_by_tenant: std::collections::BTreeMap<&'static str, u64>,
    tenant_ttfts: std::collections::BTreeMap<&'static str, hdrhistogram::Histogram<u64>>,
}

impl<'a> Simulation<'a> {
    /// Registers `params.workers` simulated workers with the (fresh) router.
    fn new(
        routers: &'a [Arc<Router>],
        trace: &'a [TraceRequest],
        params: SimParams,
        policy: &'a str,
    ) -> Result<Self, ReplayError> {
        let router = &routers[0];
        let feeds = match params.sync {
            ReplicaSync::Shared if routers.len() > 1 => routers
                .iter()
                .map(|r| {
                    let (feed, changes) =
                        tokio::sync::mpsc::channel(switchyard_fleet::replicas::QUEUE);
                    r.share_bookings(feed);
                    changes
                })
                .collect(),
            _ => Vec::new(),
        };
        let capacity = NonZeroUsize::new(params.cache_blocks.max(1)).expect("non-zero");
        let lora_slots = NonZeroUsize::new(params.max_loras.max(1)).expect("non-zero");
        let (zmq, sources) = match params.kv_events {
            KvTransport::InProcess => (None, vec![None; params.workers]),
            KvTransport::Zmq => {
                let (fleet, sources) = ZmqFleet::bind(params.workers, params.block_size)
                    .map_err(ReplayError::Setup)?;
                (Some(fleet), sources.into_iter().map(Some).collect())
            }
        };
        let mut simulation = Simulation {
            routers,
            feeds,
            zmq,
            trace,
            params,
            policy,
            workers: (0..params.workers)
                .map(|_| SimWorker {
                    cache: LruCache::new(capacity),
                    prefill_free_at: 0.0,
                    active_tokens: 0,
                    waiting: 0,
                    running: 0,
                    adapters: LruCache::new(lora_slots),
                    adapter_requests: Default::default(),
                })
                .collect(),
            events: BinaryHeap::new(),
            assigned: vec![0; trace.len()],
            hit_blocks: 0,
            total_blocks: 0,
            ttfts: hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3)
                .expect("1 us to 1 h at 3 significant digits is valid"),
            imbalance_sum: 0.0,
            router_time: Duration::ZERO,
            adapter: trace
                .iter()
                .map(|r| adapter_of(r, params.adapters))
                .collect(),
            adapter_hits: 0,
            adapter_requests: 0,
            reports: Vec::new(),
            sampled_at: None,
            waiting: Vec::new(),
            refused: 0,
            refused_by_tenant: Default::default(),
            tenant_ttfts: Default::default(),
        };
        let mut specs = Vec::with_capacity(params.workers);
        for (id, kv_events) in (0..params.workers as u64).zip(sources) {
            let spec = WorkerSpec {
                kv_events,
                model: MODEL.into(),
                worker_id: id,
                dp_rank: 0,
                worker_type: WorkerRole::Aggregated,
                total_kv_blocks: params.cache_blocks as u64,
                max_batched_tokens: 8192,
                labels: Default::default(),
                preferred_taint_multiplier: None,
                url: None,
                address: None,
                bootstrap_port: None,
            };
            for replica in routers {
                replica
                    .add_worker(spec.clone())
                    .map_err(|e| simulation.failed(e))?;
            }
            specs.push(spec);
        }
        simulation.reports = routers
            .iter()
            .map(|r| {
                (0..params.workers as u64)
                    .map(|id| {
                        r.engine_report(WorkerId {
                            worker_id: id,
                            dp_rank: 0,
                        })
                    })
                    .collect()
            })
            .collect();
        if let Some(fleet) = &mut simulation.zmq {
            router
                .subscribe_kv_events(&specs)
                .map_err(|e| ReplayError::Setup(format!("cannot subscribe to KV events: {e}")))?;
            fleet.connect(router).map_err(ReplayError::Setup)?;
        }
        Ok(simulation)
    }

    /// The replica that routes (and books) request `index`.
    fn owner(&self, index: usize) -> &'a Arc<Router> {
        &self.routers[index % self.routers.len()]
    }

    /// Delivers every replica's booking changes to the others (`ReplicaSync::Shared`).
    fn sync(&mut self) {
        for (from, feed) in self.feeds.iter_mut().enumerate() {
            let replica = format!("replica-{from}");
            while let Ok(change) = feed.try_recv() {
                for (to, router) in self.routers.iter().enumerate() {
                    if to != from {
                        router.apply_remote(&replica, &change);
                    }
                }
            }
        }
    }

    fn failed(&self, error: RouteError) -> ReplayError {
        ReplayError::Route {
            policy: self.policy.into(),
            error,
        }
    }

    /// Applies simulated events up to `now` (microseconds): a finished prefill stores its
    /// blocks (KV events) and moves the booking to decode; a finished decode frees it.
    fn advance(&mut self, now: u64) -> Result<(), ReplayError> {
        while let Some(Reverse((at, _, _))) = self.events.peek() {
            if *at > now {
                break;
            }
            let Reverse((at, phase, index)) = self.events.pop().expect("peeked");
            let request = &self.trace[index];
            let w = self.assigned[index];
            let id = index.to_string();
            let result = match phase {
                Phase::PrefillDone => {
                    let (evicted, stored) = self.store(w, &request.hash_ids);
                    match &mut self.zmq {
                        Some(fleet) => fleet
                            .step(w, &request.hash_ids, &evicted, &stored)
                            .map_err(ReplayError::Setup)?,
                        None => {
                            let stored = stored.iter().map(|&i| request.hash_ids[i]).collect();
                            let worker = WorkerId {
                                worker_id: w as u64,
                                dp_rank: 0,
                            };
                            let events = KvEvent::evicted_then_stored(evicted, stored);
                            // Every replica follows every engine's events.
                            for router in self.routers {
                                router
                                    .kv_events(worker, &events)
                                    .map_err(|e| self.failed(e))?;
                            }
                        }
                    }
                    let worker = &mut self.workers[w];
                    worker.waiting -= 1;
                    worker.running += 1;
                    worker.count_adapter(self.adapter[index], AdapterStep::Run);
                    self.owner(index).prefill_complete(&id)
                }
                Phase::DecodeDone => {
                    let worker = &mut self.workers[w];
                    worker.active_tokens -= request.input_length + request.output_length;
                    worker.running -= 1;
                    worker.count_adapter(self.adapter[index], AdapterStep::Leave);
                    self.owner(index).free(&id)
                }
            };
            result.map_err(|e| self.failed(e))?;
            self.sync();
            if !self.waiting.is_empty() {
                self.expire_waiting(at);
                self.retry_granted(at)?;
            }
        }
        Ok(())
    }

    /// Caches `hashes` on worker `w`: the hashes evicted, and the positions in `hashes`
    /// newly stored.
    fn store(&mut self, w: usize, hashes: &[u64]) -> (Vec<u64>, Vec<usize>) {
        store_blocks(&mut self.workers[w].cache, hashes)
    }

    /// When request `index` arrives, in microseconds of trace time (`--time-scale`
    /// compresses the trace).
    fn arrival_us(&self, index: usize) -> u64 {
        (self.trace[index].timestamp as f64 * 1000.0 / self.params.time_scale).round() as u64
    }

    /// The request's tenant and priority (`--batch-share`): a share of the requests is
    /// the low-priority `batch` tenant, the rest the high-priority `interactive` one.
    fn tenant_of(&self, index: usize) -> (&'static str, i32) {
        let share = self.params.batch_share;
        if share <= 0.0 {
            return ("", 0);
        }
        let h = (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
        if (h as f64 / (1u64 << 53) as f64) < share {
            ("batch", 0)
        } else {
            ("interactive", 10)
        }
    }

    /// Routes request `index` when it arrives; with `admission:`, a request that finds
    /// every worker busy waits in the router's queue (in trace time).
    fn route(&mut self, index: usize) -> Result<(), ReplayError> {
        let now = self.arrival_us(index);
        self.advance(now)?;
        self.expire_waiting(now);
        if !self.try_route(index, now)? {
            let (tenant, priority) = self.tenant_of(index);
            let generation = self.owner(index).generation();
            let queue = generation
                .startup
                .source
                .config
                .admission
                .as_ref()
                .map(|a| a.queue.clone())
                .unwrap_or_default();
            let weight = queue.tenant_weights.get(tenant).copied().unwrap_or(1);
            let partition = PartitionKey::new(MODEL, WorkerType::Select);
            match self.owner(index).admission.enqueue(
                &partition,
                priority,
                tenant,
                weight,
                queue.max_queued,
                (queue.order == switchyard_config::QueueOrder::Deadline)
                    .then(|| Duration::from_millis(queue.max_wait_ms)),
            ) {
                Ok(ticket) => self.waiting.push((index, ticket)),
                Err(_) => self.refuse(index),
            }
        }
        Ok(())
    }

    /// Counts request `index` as refused (429 or 503).
    fn refuse(&mut self, index: usize) {
        let (tenant, _) = self.tenant_of(index);
        self.refused += 1;
        *self.refused_by_tenant.entry(tenant).or_default() += 1;
    }

    /// Waiting requests past `admission.queue.max_wait_ms` (in trace time) are refused.
    fn expire_waiting(&mut self, now: u64) {
        let max_wait_us = self.routers[0]
            .generation()
            .startup
            .source
            .config
            .admission
            .as_ref()
            .map_or(u64::MAX, |a| a.queue.max_wait_ms.saturating_mul(1000));
        let arrivals: Vec<u64> = self
            .waiting
            .iter()
            .map(|(i, _)| self.arrival_us(*i))
            .collect();
        for (k, arrival) in arrivals.iter().enumerate().rev() {
            if now.saturating_sub(*arrival) > max_wait_us {
                let (index, mut ticket) = self.waiting.remove(k);
                ticket.time_out();
                drop(ticket);
                self.refuse(index);
            }
        }
    }

    /// Waiting requests granted a try select again at `now`; those still refused go back
    /// to their place.
    fn retry_granted(&mut self, now: u64) -> Result<(), ReplayError> {
        loop {
            let mut evicted = Vec::new();
            let mut granted = None;
            for (k, (_, ticket)) in self.waiting.iter_mut().enumerate() {
                match ticket.try_granted() {
                    Some(Turn::Granted) if granted.is_none() => granted = Some(k),
                    Some(Turn::Evicted) => evicted.push(k),
                    _ => {}
                }
            }
            for &k in evicted.iter().rev() {
                let (index, _) = self.waiting.remove(k);
                self.refuse(index);
            }
            let Some(k) = granted.map(|k| k - evicted.iter().filter(|&&e| e < k).count()) else {
                return Ok(());
            };
            let index = self.waiting[k].0;
            if self.try_route(index, now)? {
                let (_, ticket) = self.waiting.remove(k);
                ticket.admitted();
            } else {
                self.waiting[k].1.requeue();
                return Ok(());
            }
        }
    }

    /// Selects for request `index` at `now` and simulates its prefill and decode; false
    /// when every worker is busy.
    fn try_route(&mut self, index: usize, now: u64) -> Result<bool, ReplayError> {
        let request = &self.trace[index];
        let (token_ids, block_hashes) = match self.params.kv_events {
            KvTransport::InProcess => (None, Some(request.hash_ids.clone())),
            // The router hashes the prompt's tokens, as it hashes the engines' blocks.
            KvTransport::Zmq => (
                Some(
                    request
                        .hash_ids
                        .iter()
                        .flat_map(|&h| block_tokens(h, self.params.block_size))
                        .collect(),
                ),
                None,
            ),
        };
        self.sample_engines(now);
        let adapter = self.adapter[index];
        let (tenant, priority) = self.tenant_of(index);
        let route = RouteRequest {
            model: MODEL.into(),
            strict_priority: priority,
            attributes: Some(Arc::new(RequestAttributes {
                request_id: index.to_string(),
                model: MODEL.into(),
                lora_adapter: adapter.map(adapter_name),
                tenant: (!tenant.is_empty()).then(|| tenant.to_owned()),
                ..Default::default()
            })),
            instance: Some(self.policy.into()),
            token_ids,
            block_hashes,
            request_id: Some(index.to_string()),
            expected_output_tokens: Some(request.output_length),
            tracks_prefill_tokens: true,
            ..Default::default()
        };
        let started = Instant::now();
        let decision = match self.owner(index).select_and_reserve(&route) {
            Err(RouteError::Saturated(_)) => {
                self.router_time += started.elapsed();
                return Ok(false);
            }
            decided => decided.map_err(|e| self.failed(e))?,
        };
        self.router_time += started.elapsed();
        self.sync();
        let w = decision.worker_id as usize;
        self.assigned[index] = w;
        let arrival = self.arrival_us(index) as f64 / 1e6;
        let worker = &mut self.workers[w];
        let (hit, new_tokens) = cached_prefix(&mut worker.cache, request, self.params.block_size);
        self.hit_blocks += hit;
        self.total_blocks += request.hash_ids.len() as u64;
        let start = worker.prefill_free_at.max(now as f64 / 1e6);
        let mut load_adapter = 0.0;
        if let Some(a) = adapter {
            self.adapter_requests += 1;
            if worker.adapters.get(&a).is_some() {
                self.adapter_hits += 1;
            } else {
                worker.adapters.push(a, ());
                load_adapter = self.params.adapter_load_s;
            }
        }
        worker.waiting += 1;
        worker.count_adapter(adapter, AdapterStep::Arrive);
        let prefill_end =
            start + load_adapter + new_tokens as f64 / self.params.prefill_tokens_per_s;
        worker.prefill_free_at = prefill_end;
        worker.active_tokens += request.input_length + request.output_length;
        self.ttfts.saturating_record(micros(prefill_end - arrival));
        if !tenant.is_empty() {
            self.tenant_ttfts
                .entry(tenant)
                .or_insert_with(|| {
                    hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3)
                        .expect("1 us to 1 h at 3 significant digits is valid")
                })
                .saturating_record(micros(prefill_end - arrival));
        }
        self.events
            .push(Reverse((micros(prefill_end), Phase::PrefillDone, index)));
        let decode_end =
            prefill_end + request.output_length as f64 / self.params.decode_tokens_per_s;
        self.events.push(Reverse((
            micros(decode_end).max(micros(prefill_end) + 1),
            Phase::DecodeDone,
            index,
        )));

        let total: u64 = self.workers.iter().map(|w| w.active_tokens).sum();
        let max = self
            .workers
            .iter()
            .map(|w| w.active_tokens)
            .max()
            .unwrap_or(0);
        if total > 0 {
            self.imbalance_sum += max as f64 / (total as f64 / self.workers.len() as f64);
        }
        Ok(true)
    }

    /// Each worker's engine report, as a scrape at `now` (microseconds) would set it, when
    /// `engine_sample_us` has passed since the last.
    fn sample_engines(&mut self, now: u64) {
        if self
            .sampled_at
            .is_some_and(|at| now < at.saturating_add(self.params.engine_sample_us.max(1)))
        {
            return;
        }
        self.sampled_at = Some(now);
        let capacity =
            (self.params.cache_blocks as f64 * f64::from(self.params.block_size)).max(1.0);
        let taken = Instant::now();
        for (w, worker) in self.workers.iter().enumerate() {
            let sample = worker.sample(capacity);
            for replica in &self.reports {
                replica[w].record(sample.clone(), taken);
            }
        }
    }

    fn report(self, fallbacks: u64) -> PolicyReport {
        let requests = self.trace.len();
        PolicyReport {
            policy: self.policy.into(),
            requests,
            hit_rate: if self.total_blocks == 0 {
                0.0
            } else {
                self.hit_blocks as f64 / self.total_blocks as f64
            },
            imbalance: self.imbalance_sum / requests as f64,
            ttft_p50_ms: self.ttfts.value_at_quantile(0.50) as f64 / 1e3,
            ttft_p99_ms: self.ttfts.value_at_quantile(0.99) as f64 / 1e3,
            selections_per_s: requests as f64 / self.router_time.as_secs_f64().max(1e-9),
            fallbacks,
            adapter_hit_rate: (self.adapter_requests > 0)
                .then(|| self.adapter_hits as f64 / self.adapter_requests as f64),
            refused: self.refused,
            tenants: self
                .tenant_ttfts
                .iter()
                .map(|(tenant, h)| TenantReport {
                    tenant: (*tenant).to_owned(),
                    served: h.len(),
                    refused: self.refused_by_tenant.get(tenant).copied().unwrap_or(0),
                    ttft_p50_ms: h.value_at_quantile(0.50) as f64 / 1e3,
                    ttft_p99_ms: h.value_at_quantile(0.99) as f64 / 1e3,
                })
                .collect(),
        }
    }
}

/// Replays `trace` through `router` (fresh, with no workers) using instance `policy`.
pub fn replay(
    routers: &[Arc<Router>],
    trace: &[TraceRequest],
    params: SimParams,
    policy: &str,
    mut progress: impl FnMut(usize),
) -> Result<PolicyReport, ReplayError> {
    let fallbacks = || -> u64 { routers.iter().map(|r| r.metrics.fallbacks(policy)).sum() };
    let fallbacks_before = fallbacks();
    let router = &routers[0];
    let mut simulation = Simulation::new(routers, trace, params, policy)?;
    for index in 0..trace.len() {
        simulation.route(index)?;
        progress(index + 1);
    }
    simulation.advance(u64::MAX)?;
    // Whoever still waits when the trace has ended and every request finished is refused.
    for (index, ticket) in std::mem::take(&mut simulation.waiting) {
        drop(ticket);
        simulation.refuse(index);
    }
    if simulation.zmq.is_some() {
        // Ends the subscriptions (their threads) before the publishers go away.
        for worker_id in 0..params.workers as u64 {
            let _ = router.remove_worker(WorkerId {
                worker_id,
                dp_rank: 0,
            });
        }
    }
    let mut report = simulation.report(fallbacks() - fallbacks_before);
    if routers.len() > 1 {
        let sync = match params.sync {
            ReplicaSync::None => "none",
            ReplicaSync::Shared => "shared",
        };
        report.policy = format!("{policy} x{} ({sync})", routers.len());
    }
    if params.time_scale != 1.0 {
        report.policy = format!("{} @{}x", report.policy, params.time_scale);
    }
    Ok(report)
}

/// One CSV row per policy (the `csv` crate quotes what needs it).
pub fn csv(reports: &[PolicyReport]) -> String {
    #[derive(serde::Serialize)]
    struct Row<'a> {
        policy: &'a str,
        requests: usize,
        prefix_hit_rate: String,
        load_imbalance: String,
        ttft_p50_ms: String,
        ttft_p99_ms: String,
        selections_per_s: String,
        fallbacks: u64,
        adapter_hit_rate: String,
        refused: u64,
    }
    let mut writer = csv::Writer::from_writer(Vec::new());
    for r in reports {
        // Writing to memory cannot fail.
        let _ = writer.serialize(Row {
            policy: &r.policy,
            requests: r.requests,
            prefix_hit_rate: format!("{:.4}", r.hit_rate),
            load_imbalance: format!("{:.3}", r.imbalance),
            ttft_p50_ms: format!("{:.1}", r.ttft_p50_ms),
            ttft_p99_ms: format!("{:.1}", r.ttft_p99_ms),
            selections_per_s: format!("{:.0}", r.selections_per_s),
            fallbacks: r.fallbacks,
            adapter_hit_rate: r
                .adapter_hit_rate
                .map_or(String::new(), |a| format!("{a:.4}")),
            refused: r.refused,
        });
        for t in &r.tenants {
            let _ = writer.serialize(Row {
                policy: &format!("{} [{}]", r.policy, t.tenant),
                requests: t.served as usize,
                prefix_hit_rate: String::new(),
                load_imbalance: String::new(),
                ttft_p50_ms: format!("{:.1}", t.ttft_p50_ms),
                ttft_p99_ms: format!("{:.1}", t.ttft_p99_ms),
                selections_per_s: String::new(),
                fallbacks: 0,
                adapter_hit_rate: String::new(),
                refused: t.refused,
            });
        }
    }
    String::from_utf8(writer.into_inner().unwrap_or_default()).unwrap_or_default()
}

pub fn table(reports: &[PolicyReport]) -> String {
    let mut out = format!(
        "{:<24} {:>9} {:>10} {:>10} {:>13} {:>13} {:>14}\n",
        "policy", "requests", "hit rate", "imbalance", "TTFT p50 ms", "TTFT p99 ms", "selections/s"
    );
    for r in reports {
        let _ = writeln!(
            out,
            "{:<24} {:>9} {:>9.1}% {:>10.2} {:>13.1} {:>13.1} {:>14.0}{}",
            r.policy,
            r.requests,
            r.hit_rate * 100.0,
            r.imbalance,
            r.ttft_p50_ms,
            r.ttft_p99_ms,
            r.selections_per_s,
            match (r.fallbacks, r.adapter_hit_rate) {
                (0, None) => String::new(),
                (0, Some(a)) => format!("  adapter hits {:.1}%", a * 100.0),
                (n, None) => format!("  ({n} fallbacks)"),
                (n, Some(a)) => format!("  ({n} fallbacks) adapter hits {:.1}%", a * 100.0),
            }
        );
        if r.refused > 0 && r.tenants.is_empty() {
            let _ = writeln!(
                out,
                "{:<24} refused by the admission queue: {}",
                "", r.refused
            );
        }
        for t in &r.tenants {
            let _ = writeln!(
                out,
                "{:<24} {:>9} {:>10} {:>10} {:>13.1} {:>13.1}   refused {}",
                format!("  [{}]", t.tenant),
                t.served,
                "",
                "",
                t.ttft_p50_ms,
                t.ttft_p99_ms,
                t.refused
            );
        }
    }
    out
}

/// Four bar charts side by side (hit rate, load imbalance, TTFT p50 and p99), one bar
/// per policy, with axes, units and a legend, drawn by `plotters` as SVG.
pub fn svg(reports: &[PolicyReport], title: &str) -> String {
    use plotters::prelude::*;
    type Panel = (&'static str, &'static str, fn(&PolicyReport) -> f64);
    let panels: [Panel; 4] = [
        ("prefix-cache hit rate", "%", |r| r.hit_rate * 100.0),
        ("load imbalance", "max / mean active tokens", |r| {
            r.imbalance
        }),
        ("TTFT p50", "ms", |r| r.ttft_p50_ms),
        ("TTFT p99", "ms", |r| r.ttft_p99_ms),
    ];
    let mut out = String::new();
    let legend_h = 24 * reports.len() as u32 + 16;
    {
        let root = SVGBackend::with_string(&mut out, (1120, 420 + legend_h)).into_drawing_area();
        let draw = || -> Result<(), Box<dyn std::error::Error + '_>> {
            root.fill(&WHITE)?;
            let (chart_area, legend) = root.split_vertically(420);
            let chart_area = chart_area.titled(title, ("sans-serif", 16))?;
            for (area, (name, unit, value)) in chart_area
                .split_evenly((1, panels.len()))
                .iter()
                .zip(panels)
            {
                let max = reports.iter().map(value).fold(0.0, f64::max).max(1e-9) * 1.15;
                let mut chart = ChartBuilder::on(area)
                    .caption(name, ("sans-serif", 14))
                    .margin(8)
                    .x_label_area_size(36)
                    .y_label_area_size(52)
                    .build_cartesian_2d((0..reports.len()).into_segmented(), 0.0..max)?;
                chart
                    .configure_mesh()
                    .disable_x_mesh()
                    .x_desc("policy")
                    .y_desc(unit)
                    .x_label_formatter(&|x| match x {
                        SegmentValue::CenterOf(i) if *i < reports.len() => format!("{}", i + 1),
                        _ => String::new(),
                    })
                    .draw()?;
                for (i, report) in reports.iter().enumerate() {
                    let color = Palette99::pick(i).mix(0.9).filled();
                    let bar = Rectangle::new(
                        [
                            (SegmentValue::Exact(i), 0.0),
                            (SegmentValue::Exact(i + 1), value(report)),
                        ],
                        color,
                    );
                    chart.draw_series(std::iter::once(bar))?;
                }
            }
            for (i, report) in reports.iter().enumerate() {
                let y = 12 + 24 * i as i32;
                legend.draw(&Rectangle::new(
                    [(20, y), (34, y + 14)],
                    Palette99::pick(i).filled(),
                ))?;
                legend.draw(&Text::new(
                    format!("{}: {}", i + 1, report.policy),
                    (42, y + 1),
                    ("sans-serif", 13),
                ))?;
            }
            root.present()?;
            Ok(())
        };
        if let Err(e) = draw() {
            tracing::warn!(error = %e, "drawing the replay chart failed");
        }
    }
    out
}

/// What `switchyard replay` takes.
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// The trace: one JSON object per line with timestamp (ms), input_length,
    /// output_length and hash_ids.
    #[arg(long)]
    pub trace: PathBuf,
    /// Simulated workers.
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// Instance names to compare (repeat). Without --config: default, least-busy,
    /// kv-overlap, load-only (built-in).
    #[arg(long = "policy", required = true)]
    pub policies: Vec<String>,
    /// A config whose instances (and plugins) the policies name.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Prefix-cache capacity of each worker, in blocks.
    #[arg(long, default_value_t = 4096)]
    pub cache_blocks: usize,
    /// Prefill throughput of each worker, tokens per second.
    #[arg(long, default_value_t = 20_000.0)]
    pub prefill_tps: f64,
    /// Decode speed of each request, tokens per second.
    #[arg(long, default_value_t = 40.0)]
    pub decode_tps: f64,
    /// Tokens per block of the trace's hash_ids.
    #[arg(long, default_value_t = 512)]
    pub block_size: u32,
    /// Where to write the CSV.
    #[arg(long, default_value = "replay.csv")]
    pub csv: PathBuf,
    /// Where to write the SVG chart.
    #[arg(long, default_value = "replay.svg")]
    pub svg: PathBuf,
    /// How the workers' KV events reach the router: in process, or over ZeroMQ on
    /// loopback in vLLM's wire format (through the router's real subscribers).
    #[arg(long, value_enum, default_value_t = KvTransport::InProcess)]
    pub kv_events: KvTransport,
    /// Spread the trace over this many router replicas (round robin), each a router of
    /// its own; repeatable to compare counts (e.g. --replicas 1 --replicas 4).
    #[arg(long = "replicas", default_value = "1")]
    pub replicas: Vec<usize>,
    /// Whether the replicas share their bookings (what `replicas:` does over NATS), or
    /// each counts only its own; repeatable to compare.
    #[arg(long = "sync", value_enum, default_value = "shared")]
    pub sync: Vec<ReplicaSync>,
    /// LoRA adapters the requests ask for (0: none); see the module's simulation model.
    #[arg(long, default_value_t = 0)]
    pub adapters: u32,
    /// Adapters each worker holds at once (LRU).
    #[arg(long, default_value_t = 4)]
    pub max_loras: usize,
    /// Time a worker takes to load an adapter it does not hold, in milliseconds.
    #[arg(long, default_value_t = 200.0)]
    pub adapter_load_ms: f64,
    /// Trace time between engine samples (what a scraper at this interval sees); 0
    /// samples before every request.
    #[arg(long, default_value_t = 0)]
    pub engine_sample_ms: u64,
    /// Arrivals this many times faster than the trace's timestamps (2: twice the load);
    /// repeatable to compare.
    #[arg(long = "time-scale", default_value = "1")]
    pub time_scales: Vec<f64>,
    /// The share of requests (0 to 1) sent as the low-priority `batch` tenant, the others
    /// as the high-priority `interactive` one; 0: no tenants. Per-tenant TTFT and refusals
    /// are reported beside each policy's row.
    #[arg(long, default_value_t = 0.0)]
    pub batch_share: f64,
    /// With --decode-workers: compare a disaggregated fleet of this many prefill workers
    /// against an aggregated fleet of the same total size (docs/disaggregation.md).
    #[arg(long, requires = "decode_workers")]
    pub prefill_workers: Option<usize>,
    /// The disaggregated fleet's decode workers.
    #[arg(long, requires = "prefill_workers")]
    pub decode_workers: Option<usize>,
    /// Disaggregated: time to move one block's KV from the prefill to the decode worker.
    #[arg(long, default_value_t = 2.0)]
    pub transfer_ms_per_block: f64,
    /// The share of decode speed a worker's prefill takes from the decodes it runs (both
    /// fleets; a decode worker never prefills).
    #[arg(long, default_value_t = 0.5)]
    pub prefill_interference: f64,
    /// Decodes a worker runs at full speed at once (both fleets); past it they share
    /// the worker's speed.
    #[arg(long, default_value_t = 16)]
    pub decode_batch: usize,
}

/// Instances `replay` offers without --config: built-in policies only.
const REPLAY_BUILTIN_CONFIG: &str = "worker_selection:
  instances:
    - {name: least-busy, type: builtin.least-busy}
    - name: kv-overlap
      scorers: [{type: builtin.kv-overlap}]
      picker: {type: builtin.lowest-cost, parameters: {seed: 1}}
    - name: load-only
      scorers: [{type: builtin.active-requests}]
      picker: {type: builtin.lowest-cost, parameters: {seed: 1}}
";

/// `switchyard replay`: every policy over the trace on a fresh router, a table on stdout,
/// a CSV and an SVG chart.
pub fn run(args: &ReplayArgs) -> Result<(), String> {
    let ReplayArgs {
        trace: ref trace_path,
        workers,
        ref policies,
        ref config,
        cache_blocks,
        prefill_tps,
        decode_tps,
        block_size,
        csv: ref csv_path,
        svg: ref svg_path,
        kv_events,
        ref replicas,
        ref sync,
        adapters,
        max_loras,
        adapter_load_ms,
        engine_sample_ms,
        ref time_scales,
        batch_share,
        prefill_workers,
        decode_workers,
        transfer_ms_per_block,
        prefill_interference,
        decode_batch,
    } = *args;
    if time_scales.iter().any(|&t| !(t.is_finite() && t > 0.0))
        || !(0.0..=1.0).contains(&batch_share)
    {
        return Err("--time-scale must be a positive number and --batch-share from 0 to 1".into());
    }
    if !(adapter_load_ms.is_finite() && adapter_load_ms >= 0.0) || max_loras == 0 {
        return Err("--adapter-load-ms must be a number >= 0 and --max-loras at least 1".into());
    }
    if replicas.contains(&0) {
        return Err("--replicas must be at least 1".into());
    }
    if kv_events == KvTransport::Zmq && replicas.iter().any(|&n| n > 1) {
        return Err("--replicas above 1 needs --kv-events in-process (each replica would need its own subscriptions to the simulated engines)".into());
    }
    for (name, value) in [("--prefill-tps", prefill_tps), ("--decode-tps", decode_tps)] {
        if !(value.is_finite() && value > 0.0) {
            return Err(format!("{name} must be a positive number, got {value}"));
        }
    }
    if workers == 0 || block_size == 0 || cache_blocks == 0 {
        return Err("--workers, --block-size and --cache-blocks must be at least 1".into());
    }
    let trace = read_trace(trace_path).map_err(|e| e.to_string())?;
    let params = SimParams {
        workers,
        cache_blocks,
        prefill_tokens_per_s: prefill_tps,
        decode_tokens_per_s: decode_tps,
        block_size,
        kv_events,
        replicas: 1,
        sync: ReplicaSync::Shared,
        adapters,
        max_loras,
        adapter_load_s: adapter_load_ms / 1e3,
        engine_sample_us: engine_sample_ms.saturating_mul(1000),
        time_scale: 1.0,
        batch_share,
    };
    let fresh_router = || -> Result<Arc<Router>, String> {
        let source = match config {
            Some(path) => ConfigSource::from_file(path),
            None => ConfigSource::parse(
                REPLAY_BUILTIN_CONFIG.into(),
                "<replay built-in config>".into(),
                PathBuf::new(),
            ),
        }
        .map_err(|e| e.to_string())?;
        let mut startup = start(source).map_err(|errors| {
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        })?;
        startup.source.config.workers.clear();
        startup.source.config.router.block_size = block_size;
        if let Some(unknown) = policies.iter().find(|p| startup.instance(p).is_none()) {
            let names: Vec<_> = startup.instances.iter().map(|i| i.name.as_str()).collect();
            return Err(format!(
                "--policy {unknown}: no such instance; available: {}",
                names.join(", ")
            ));
        }
        Router::new(startup)
            .map(Arc::new)
            .map_err(|e| e.to_string())
    };
    fresh_router()?;
    if let (Some(p), Some(d)) = (prefill_workers, decode_workers) {
        if p == 0 || d == 0 {
            return Err("--prefill-workers and --decode-workers must be at least 1".into());
        }
        let valid = (0.0..1.0).contains(&prefill_interference)
            && transfer_ms_per_block.is_finite()
            && transfer_ms_per_block.is_sign_positive();
        if !valid {
            return Err(
                "--prefill-interference is from 0 to below 1, --transfer-ms-per-block at least 0"
                    .into(),
            );
        }
        let mut reports = Vec::new();
        for policy in policies {
            for &time_scale in time_scales {
                for (prefill, decode, fleet) in [
                    (
                        p + d,
                        0,
                        format!("{policy} @{time_scale}x aggregated {}", p + d),
                    ),
                    (
                        p,
                        d,
                        format!("{policy} @{time_scale}x {p} prefill + {d} decode"),
                    ),
                ] {
                    let params = disaggregated::PairParams {
                        prefill_workers: prefill,
                        decode_workers: decode,
                        cache_blocks,
                        prefill_tokens_per_s: prefill_tps,
                        decode_tokens_per_s: decode_tps,
                        block_size,
                        transfer_ms_per_block,
                        interference: prefill_interference,
                        decode_batch: decode_batch.max(1),
                        time_scale,
                    };
                    let router = fresh_router()?;
                    reports.push(
                        disaggregated::replay_pairs(&router, &trace, params, policy, fleet)
                            .map_err(|e| e.to_string())?,
                    );
                }
            }
        }
        print!("{}", disaggregated::table(&reports));
        return Ok(());
    }
    let mut reports = Vec::new();
    // Each policy at each replica count; with several replicas, each sync mode.
    let mut runs = Vec::new();
    for policy in policies {
        for &count in replicas {
            let modes: &[ReplicaSync] = if count == 1 {
                &[ReplicaSync::Shared]
            } else {
                sync
            };
            for &mode in modes {
                for &scale in time_scales {
                    runs.push((policy, count, mode, scale));
                }
            }
        }
    }
    for (policy, count, mode, time_scale) in runs {
        let routers = (0..count)
            .map(|_| fresh_router())
            .collect::<Result<Vec<_>, _>>()?;
        let params = SimParams {
            replicas: count,
            sync: mode,
            time_scale,
            ..params
        };
        let bar = indicatif::ProgressBar::new(trace.len() as u64).with_message(policy.clone());
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg:>16} [{bar:40}] {pos}/{len} requests ({per_sec})",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        let report = replay(&routers, &trace, params, policy, |n| {
            bar.set_position(n as u64)
        })
        .map_err(|e| e.to_string())?;
        bar.finish_and_clear();
        reports.push(report);
    }
    print!("{}", table(&reports));
    std::fs::write(csv_path, csv(&reports))
        .map_err(|e| format!("{}: cannot write the CSV: {e}", csv_path.display()))?;
    let title = format!(
        "{} requests, {workers} workers, {cache_blocks}-block LRU caches, prefill {prefill_tps} tok/s, decode {decode_tps} tok/s",
        trace.len()
    );
    std::fs::write(svg_path, svg(&reports, &title))
        .map_err(|e| format!("{}: cannot write the SVG: {e}", svg_path.display()))?;
    println!("wrote {} and {}", csv_path.display(), svg_path.display());
    Ok(())
}
