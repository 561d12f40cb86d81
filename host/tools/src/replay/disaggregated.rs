//! `replay --prefill-workers P --decode-workers D`: the trace through a disaggregated
//! fleet and through an aggregated fleet of the same size, each routed by the policy
//! under test (the prefill and decode partitions each by their own instance build).
//!
//! The model adds what disaggregation exists for: a worker's prefill slows the decodes it
//! runs. While an aggregated worker prefills, its decodes advance at `1 - interference`
//! of their speed (a step that carries a prefill chunk takes longer); a decode worker
//! never prefills, a prefill worker never decodes. And a worker's decode capacity is
//! finite: past `decode_batch` decodes at once they share its speed (processor sharing),
//! so few decode workers are a bottleneck. Prefill is one queue
//! per worker at `prefill_tps`, over the blocks its LRU cache does not hold; a
//! disaggregated request's KV then crosses to its decode worker at
//! `transfer_ms_per_block`, and its first token comes after the first decode step.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::num::NonZeroUsize;
use std::sync::Arc;

use lru::LruCache;

use super::{cached_prefix, micros, store_blocks, ReplayError, TraceRequest};
use crate::fleet::kv_index::KvEvent;
use crate::fleet::router::{RouteError, RouteRequest, Router};
use crate::fleet::workers::WorkerSpec;
use switchyard_plugin_sdk::WorkerId;
use switchyard_plugin_sdk::WorkerType;

/// The fleet: its size, the engines' speeds, and the interference between a worker's
/// prefill and its decodes.
#[derive(Clone, Copy, Debug)]
pub struct PairParams {
    /// Disaggregated: this many prefill workers and `decode_workers` decode workers;
    /// `decode_workers == 0`: one aggregated pool of `prefill_workers`.
    pub prefill_workers: usize,
    pub decode_workers: usize,
    pub cache_blocks: usize,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    pub block_size: u32,
    pub transfer_ms_per_block: f64,
    /// The share of decode speed a worker's prefill takes from it (0 to below 1).
    pub interference: f64,
    /// Decodes a worker runs at full speed at once; past it they share its speed.
    pub decode_batch: usize,
    pub time_scale: f64,
}

/// What one fleet did with the trace.
#[derive(Clone, Debug)]
pub struct PairReport {
    pub fleet: String,
    pub hit_rate: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    /// Time per output token of a request's decode (its decode time / its tokens).
    pub tpot_p50_ms: f64,
    pub tpot_p99_ms: f64,
    /// Output tokens per second from the first arrival to the last token.
    pub tokens_per_s: f64,
}

struct Worker {
    cache: LruCache<u64, ()>,
    /// When its prefill queue is next free, in seconds.
    prefill_free_at: f64,
    /// Its prefill runs, in order: (start, end) in seconds; the past ones dropped.
    prefills: std::collections::VecDeque<(f64, f64)>,
    /// Requests decoding here now.
    active: Vec<usize>,
    /// When `active`'s progress was last brought up to date.
    updated_at: f64,
}

impl Worker {
    fn prefilling(&mut self, at: f64) -> bool {
        while self.prefills.front().is_some_and(|&(_, end)| end <= at) {
            self.prefills.pop_front();
        }
        self.prefills.front().is_some_and(|&(start, _)| start <= at)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    PrefillDone,
    /// A worker's decode speed may change: one of its prefill runs starts or ends.
    Reschedule,
    DecodeStart,
    /// Valid only while the request's version is this event's.
    DecodeDone(u32),
}

struct Pairs<'a> {
    router: &'a Router,
    policy: String,
    trace: &'a [TraceRequest],
    params: PairParams,
    workers: Vec<Worker>,
    events: BinaryHeap<Reverse<(u64, Phase, usize)>>,
    prefill_worker: Vec<usize>,
    decode_worker: Vec<usize>,
    decode_start: Vec<f64>,
    /// Output tokens each decoding request has left.
    remaining: Vec<f64>,
    version: Vec<u32>,
    hit_blocks: u64,
    total_blocks: u64,
    ttfts: hdrhistogram::Histogram<u64>,
    tpots: hdrhistogram::Histogram<u64>,
    last_token: f64,
}

fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3)
        .expect("1 us to 1 h at 3 significant digits is valid")
}

impl Pairs<'_> {
    fn disaggregated(&self) -> bool {
        self.params.decode_workers > 0
    }

    fn request(&self, index: usize, role: WorkerType, id: String) -> RouteRequest {
        let request = &self.trace[index];
        RouteRequest {
            model: super::MODEL.into(),
            instance: Some(self.policy.clone()),
            worker_type: role,
            block_hashes: Some(request.hash_ids.as_slice().into()),
            request_id: Some(id),
            expected_output_tokens: Some(request.output_length),
            tracks_prefill_tokens: true,
            ..Default::default()
        }
    }

    fn arrival(&self, index: usize) -> f64 {
        self.trace[index].timestamp as f64 / 1e3 / self.params.time_scale
    }

    fn failed(&self, error: RouteError) -> ReplayError {
        ReplayError::Route {
            policy: self.policy.clone(),
            error,
        }
    }

    fn route(&mut self, index: usize) -> Result<(), ReplayError> {
        let arrival = self.arrival(index);
        self.advance(micros(arrival))?;
        let role = if self.disaggregated() {
            WorkerType::Prefill
        } else {
            WorkerType::Select
        };
        let request = self.request(index, role, format!("{index}-p"));
        let decision = self
            .router
            .select_and_reserve(&request)
            .map_err(|e| self.failed(e))?;
        let w = decision.worker_id as usize;
        self.prefill_worker[index] = w;
        let request = &self.trace[index];
        let worker = &mut self.workers[w];
        let (hit, new_tokens) = cached_prefix(&mut worker.cache, request, self.params.block_size);
        self.hit_blocks += hit;
        self.total_blocks += request.hash_ids.len() as u64;
        let start = worker.prefill_free_at.max(arrival);
        let end = start + new_tokens as f64 / self.params.prefill_tokens_per_s;
        worker.prefill_free_at = end;
        if end > start {
            worker.prefills.push_back((start, end));
            for at in [start, end] {
                self.events
                    .push(Reverse((micros(at), Phase::Reschedule, w)));
            }
        }
        self.events
            .push(Reverse((micros(end), Phase::PrefillDone, index)));
        if !self.disaggregated() {
            // Aggregated: the first token comes with the prefill's end, and the request
            // decodes on the same worker.
            self.ttfts.saturating_record(micros(end - arrival));
            self.decode_worker[index] = w;
            self.events
                .push(Reverse((micros(end), Phase::DecodeStart, index)));
        }
        Ok(())
    }

    /// The speed (tokens/s) of each decode on worker `w` at `at`: `decode_tps`, shared
    /// once more than `decode_batch` decode there, and slowed while it prefills.
    fn rate(&mut self, w: usize, at: f64) -> f64 {
        let params = self.params;
        let worker = &mut self.workers[w];
        let shared = (params.decode_batch as f64 / worker.active.len().max(1) as f64).min(1.0);
        let slowed = if worker.prefilling(at) {
            1.0 - params.interference
        } else {
            1.0
        };
        params.decode_tokens_per_s * shared * slowed
    }

    /// Brings worker `w`'s decodes up to `at` at the speed they had since the last change.
    fn catch_up(&mut self, w: usize, at: f64) {
        let since = self.workers[w].updated_at;
        if at > since {
            let rate = self.rate(w, since);
            for &j in &self.workers[w].active {
                self.remaining[j] = (self.remaining[j] - rate * (at - since)).max(0.0);
            }
        }
        self.workers[w].updated_at = at;
    }

    /// New ends for worker `w`'s decodes at their speed from `at` on.
    fn reschedule(&mut self, w: usize, at: f64) {
        let rate = self.rate(w, at);
        for &j in &self.workers[w].active {
            self.version[j] = self.version[j].wrapping_add(1);
            let end = at + self.remaining[j] / rate;
            self.events.push(Reverse((
                micros(end),
                Phase::DecodeDone(self.version[j]),
                j,
            )));
        }
    }

    fn advance(&mut self, now: u64) -> Result<(), ReplayError> {
        while let Some(Reverse((at, phase, index))) = self.events.peek().copied() {
            if at > now {
                break;
            }
            self.events.pop();
            let t = at as f64 / 1e6;
            match phase {
                Phase::PrefillDone => self.prefill_done(index, t)?,
                Phase::Reschedule => {
                    self.catch_up(index, t);
                    self.reschedule(index, t);
                }
                Phase::DecodeStart => {
                    let w = self.decode_worker[index];
                    self.catch_up(w, t);
                    self.decode_start[index] = t;
                    self.remaining[index] = self.trace[index].output_length.max(1) as f64;
                    self.workers[w].active.push(index);
                    self.reschedule(w, t);
                }
                Phase::DecodeDone(version) => {
                    if version != self.version[index] {
                        continue; // its worker's speed changed since
                    }
                    let w = self.decode_worker[index];
                    self.catch_up(w, t);
                    self.workers[w].active.retain(|&j| j != index);
                    self.reschedule(w, t);
                    let tokens = self.trace[index].output_length.max(1) as f64;
                    self.tpots
                        .saturating_record(micros((t - self.decode_start[index]) / tokens));
                    self.last_token = self.last_token.max(t);
                    let id = if self.disaggregated() {
                        format!("{index}-d")
                    } else {
                        format!("{index}-p")
                    };
                    self.router.free(&id).map_err(|e| self.failed(e))?;
                }
            }
        }
        Ok(())
    }

    /// The prefill of `index` ended at `t`: its blocks are cached there (and reported);
    /// disaggregated, its decode worker is chosen, and the KV crosses to it.
    fn prefill_done(&mut self, index: usize, t: f64) -> Result<(), ReplayError> {
        let p = self.prefill_worker[index];
        let hashes = &self.trace[index].hash_ids;
        let (evicted, stored) = store_blocks(&mut self.workers[p].cache, hashes);
        let stored = stored.iter().map(|&i| hashes[i]).collect();
        let events = KvEvent::evicted_then_stored(evicted, stored);
        let worker = WorkerId {
            worker_id: p as u64,
            dp_rank: 0,
        };
        self.router
            .kv_events(worker, &events)
            .map_err(|e| self.failed(e))?;
        let prefill_id = format!("{index}-p");
        self.router
            .prefill_complete(&prefill_id)
            .map_err(|e| self.failed(e))?;
        if !self.disaggregated() {
            return Ok(());
        }
        self.router.free(&prefill_id).map_err(|e| self.failed(e))?;
        let request = self.request(index, WorkerType::Decode, format!("{index}-d"));
        let decode = self
            .router
            .select_and_reserve(&request)
            .map_err(|e| self.failed(e))?;
        let d = decode.worker_id as usize;
        self.decode_worker[index] = d;
        let blocks = self.trace[index].hash_ids.len() as f64;
        let landed = t + blocks * self.params.transfer_ms_per_block / 1e3;
        // The client's first token is the decode worker's first step after the transfer.
        let first_token = landed + 1.0 / self.params.decode_tokens_per_s;
        self.ttfts
            .saturating_record(micros(first_token - self.arrival(index)));
        self.events
            .push(Reverse((micros(landed), Phase::DecodeStart, index)));
        Ok(())
    }
}

/// Replays `trace` through `router` (fresh, with no workers) on the fleet `params`
/// describes, with instance `policy` as the router's default.
pub fn replay_pairs(
    router: &Arc<Router>,
    trace: &[TraceRequest],
    params: PairParams,
    policy: &str,
    fleet: String,
) -> Result<PairReport, ReplayError> {
    let total = params.prefill_workers + params.decode_workers;
    for id in 0..total {
        let role = match (params.decode_workers, id < params.prefill_workers) {
            (0, _) => WorkerType::Select,
            (_, true) => WorkerType::Prefill,
            (_, false) => WorkerType::Decode,
        };
        let mut spec: WorkerSpec = serde_json::from_value(serde_json::json!({
            "model": super::MODEL, "worker_id": id,
            "total_kv_blocks": params.cache_blocks,
        }))
        .map_err(ReplayError::WorkerSpec)?;
        spec.worker_type = role;
        router
            .add_worker(spec)
            .map_err(|error| ReplayError::Route {
                policy: policy.to_owned(),
                error,
            })?;
    }
    let capacity = NonZeroUsize::new(params.cache_blocks.max(1)).expect("non-zero");
    let n = trace.len();
    let mut pairs = Pairs {
        router,
        policy: policy.to_owned(),
        trace,
        params,
        workers: (0..total)
            .map(|_| Worker {
                cache: LruCache::new(capacity),
                prefill_free_at: 0.0,
                prefills: std::collections::VecDeque::new(),
                active: Vec::new(),
                updated_at: 0.0,
            })
            .collect(),
        events: BinaryHeap::new(),
        prefill_worker: vec![0; n],
        decode_worker: vec![0; n],
        decode_start: vec![0.0; n],
        remaining: vec![0.0; n],
        version: vec![0; n],
        hit_blocks: 0,
        total_blocks: 0,
        ttfts: histogram(),
        tpots: histogram(),
        last_token: 0.0,
    };
    for index in 0..n {
        pairs.route(index)?;
    }
    pairs.advance(u64::MAX)?;
    let first = trace
        .first()
        .map_or(0.0, |r| r.timestamp as f64 / 1e3 / params.time_scale);
    let tokens: u64 = trace.iter().map(|r| r.output_length.max(1)).sum();
    let ms = |h: &hdrhistogram::Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1e3;
    Ok(PairReport {
        fleet,
        hit_rate: pairs.hit_blocks as f64 / pairs.total_blocks.max(1) as f64,
        ttft_p50_ms: ms(&pairs.ttfts, 0.5),
        ttft_p99_ms: ms(&pairs.ttfts, 0.99),
        tpot_p50_ms: ms(&pairs.tpots, 0.5),
        tpot_p99_ms: ms(&pairs.tpots, 0.99),
        tokens_per_s: tokens as f64 / (pairs.last_token - first).max(1e-9),
    })
}

/// The comparison as a table.
pub fn table(reports: &[PairReport]) -> String {
    let mut out = format!(
        "{:<40} {:>9} {:>12} {:>12} {:>12} {:>12} {:>10}\n",
        "fleet", "hit rate", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms", "tokens/s"
    );
    for r in reports {
        out += &format!(
            "{:<40} {:>8.1}% {:>12.1} {:>12.1} {:>12.2} {:>12.2} {:>10.0}\n",
            r.fleet,
            r.hit_rate * 100.0,
            r.ttft_p50_ms,
            r.ttft_p99_ms,
            r.tpot_p50_ms,
            r.tpot_p99_ms,
            r.tokens_per_s
        );
    }
    out
}
