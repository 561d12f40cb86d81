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

mod cli;
mod disaggregated;
mod over_zmq;
mod report;
mod trace;
mod worker;

pub use cli::{run, ReplayArgs};
pub use report::{csv, svg, table};
pub use trace::{read_trace, ReplayError, TraceRequest};
use worker::{adapter_name, adapter_of, AdapterStep, SimWorker};

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
use crate::fleet::workers::WorkerSpec;
use crate::plugin::{EngineReport, EngineSample, PartitionKey, RequestAttributes};
use crate::startup::start;
use over_zmq::{block_tokens, ZmqFleet};
use switchyard_plugin_sdk::WorkerType;

/// The model name the simulated workers serve.
const MODEL: &str = "replay";

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

/// With shared bookings across replicas, each replica's feed of its booking changes.
fn booking_feeds(
    routers: &[Arc<Router>],
    sync: ReplicaSync,
) -> Vec<tokio::sync::mpsc::Receiver<switchyard_fleet::load_accounting::BookingChange>> {
    match sync {
        ReplicaSync::Shared if routers.len() > 1 => routers
            .iter()
            .map(|r| {
                let (feed, changes) = tokio::sync::mpsc::channel(switchyard_fleet::replicas::QUEUE);
                r.share_bookings(feed);
                changes
            })
            .collect(),
        _ => Vec::new(),
    }
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
        let feeds = booking_feeds(routers, params.sync);
        let capacity = NonZeroUsize::new(params.cache_blocks.max(1)).expect("non-zero");
        let lora_slots = NonZeroUsize::new(params.max_loras.max(1)).expect("non-zero");
        let (zmq, sources) = match params.kv_events {
            KvTransport::InProcess => (None, vec![None; params.workers]),
            KvTransport::Zmq => {
                let (fleet, sources) = ZmqFleet::bind(params.workers, params.block_size)?;
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
        let specs = simulation.add_workers(sources)?;
        if let Some(fleet) = &mut simulation.zmq {
            router
                .subscribe_kv_events(&specs)
                .map_err(ReplayError::Subscribe)?;
            fleet.connect(router)?;
        }
        Ok(simulation)
    }

    /// Registers a worker per KV-event source with every replica; their specs.
    fn add_workers(
        &mut self,
        sources: Vec<Option<switchyard_config::KvEventSource>>,
    ) -> Result<Vec<WorkerSpec>, ReplayError> {
        let mut specs = Vec::with_capacity(self.params.workers);
        for (id, kv_events) in (0..self.params.workers as u64).zip(sources) {
            let spec = WorkerSpec {
                kv_events,
                model: MODEL.into(),
                worker_id: id,
                dp_rank: 0,
                worker_type: WorkerType::Select,
                total_kv_blocks: Some(self.params.cache_blocks as u64),
                max_batched_tokens: 8192,
                labels: Default::default(),
                preferred_taint_multiplier: None,
                url: None,
                address: None,
                bootstrap_port: None,
            };
            for replica in self.routers {
                replica
                    .add_worker(spec.clone())
                    .map_err(|e| self.failed(e))?;
            }
            specs.push(spec);
        }
        self.reports = self
            .routers
            .iter()
            .map(|r| {
                (0..self.params.workers as u64)
                    .map(|id| {
                        r.engine_report(WorkerId {
                            worker_id: id,
                            dp_rank: 0,
                        })
                    })
                    .collect()
            })
            .collect();
        Ok(specs)
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
                        Some(fleet) => fleet.step(w, &request.hash_ids, &evicted, &stored)?,
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
                .config()
                .admission
                .as_ref()
                .map(|a| a.queue.clone())
                .unwrap_or_default();
            let weight = queue.tenant_weights.get(tenant).copied().unwrap_or(1);
            let partition = PartitionKey::new(MODEL, WorkerType::Select);
            match self.owner(index).admission.queue.enqueue(
                &partition,
                priority,
                tenant,
                weight,
                crate::fleet::admission::Capacity {
                    max_queued: queue.max_queued,
                    fair_share: queue.fair_share,
                },
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
            .config()
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
        self.sample_engines(now);
        let adapter = self.adapter[index];
        let (tenant, _) = self.tenant_of(index);
        let route = self.route_request(index);
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

        self.count_imbalance();
        Ok(true)
    }

    /// What the router is asked for request `index`: its prompt as block hashes (or, with
    /// KV events over ZeroMQ, as tokens the router hashes), adapter, tenant and priority.
    fn route_request(&self, index: usize) -> RouteRequest {
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
        let adapter = self.adapter[index];
        let (tenant, priority) = self.tenant_of(index);
        RouteRequest {
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
            block_hashes: block_hashes.map(Into::into),
            request_id: Some(index.to_string()),
            expected_output_tokens: Some(request.output_length),
            tracks_prefill_tokens: true,
            ..Default::default()
        }
    }

    /// The load imbalance after a request: the busiest worker's active tokens over the mean.
    fn count_imbalance(&mut self) {
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
