//! KV state reaching the index: events over HTTP, from engines' ZeroMQ streams (through
//! the subscriber, which owns its connections), and predicted from routing; each worker
//! within its bound (`kv_bound.rs`), the fleet within `router.max_kv_index_pairs`.

use super::*;
use crate::kv_bound::{kv_bound, KvBound};
use crate::kv_index::{BoundPassed, Forgotten};

impl Router {
    /// For models with `kv_tracking: predicted`: the prompt's blocks are now assumed
    /// cached on `worker`.
    pub fn predict_cached(&self, model: &str, worker: WorkerId, hashes: &[u64]) {
        let generation = self.generation();
        let Some(settings) = generation.config().models.get(model) else {
            return;
        };
        if settings.kv_tracking != KvTracking::Predicted || hashes.is_empty() {
            return;
        }
        let events = self.kv.predicted.lock().routed(
            worker,
            hashes,
            settings.predicted_blocks_per_worker,
            Duration::from_secs(settings.predicted_ttl_secs),
            Instant::now(),
        );
        self.apply_kv(&generation, worker, &events);
    }

    /// The KV index's bound for `worker` and where it came from (`None`: no such
    /// worker). Shown by `GET /v1/workers`.
    pub fn kv_bound(&self, worker: WorkerId) -> Option<KvBound> {
        self.kv_bound_in(&self.generation(), worker)
    }

    /// `kv_bound` under `generation`'s config.
    fn kv_bound_in(&self, generation: &Generation, worker: WorkerId) -> Option<KvBound> {
        let state = self.membership.state.read();
        let spec = state.workers.get(worker)?;
        let engine = state
            .workers
            .engine(worker)
            .read()
            .and_then(|reading| reading.sample.kv_capacity_tokens);
        Some(kv_bound(generation.config(), spec, engine))
    }

    /// Applies `worker`'s KV events within its bound, counting and logging (once per
    /// worker, once for the fleet's bound) what the index had to forget.
    fn apply_kv(&self, generation: &Generation, worker: WorkerId, events: &[KvEvent]) {
        let Some(bound) = self.kv_bound_in(generation, worker) else {
            return;
        };
        let max_pairs = generation.config().router.max_kv_index_pairs;
        let mut kv = self.kv.index.write();
        kv.set_max_pairs(max_pairs);
        kv.set_budget(worker, bound.per_tier());
        for event in events {
            kv.apply(worker, event);
        }
        let forgotten = kv.take_forgotten();
        drop(kv);
        for gone in forgotten {
            self.metrics.record_kv_evicted(gone.pairs);
            self.log_forgotten(gone, bound, max_pairs);
        }
    }

    /// Logs the first time each worker passes its own bound, and the first time the fleet
    /// passes `max_kv_index_pairs`: with the numbers, and what to do.
    fn log_forgotten(&self, gone: Forgotten, bound: KvBound, max_pairs: u64) {
        let key = match gone.bound {
            BoundPassed::Worker => gone.worker,
            // One entry stands for the fleet's bound.
            BoundPassed::Fleet => WorkerId {
                worker_id: u64::MAX,
                dp_rank: u32::MAX,
            },
        };
        if !self.kv.overruns.lock().insert(key) {
            return;
        }
        match gone.bound {
            BoundPassed::Worker => tracing::warn!(
                worker_id = gone.worker.worker_id,
                dp_rank = gone.worker.dp_rank,
                tier = gone.tier.as_str(),
                forgotten_blocks = gone.pairs,
                bound_blocks = bound.per_tier()[gone.tier as usize],
                bound_source = ?bound.source,
                "a worker's KV events stored more blocks than its KV index bound, far above what its engine can hold (removals lost, or a wrong total_kv_blocks): the router forgot its blocks in that tier and rebuilds them from its next events. Raise total_kv_blocks or router.kv_bound_blocks_per_worker if the engine really holds more. Logged once per worker; switchyard_kv_blocks_evicted_total counts the blocks"
            ),
            BoundPassed::Fleet => tracing::warn!(
                worker_id = gone.worker.worker_id,
                dp_rank = gone.worker.dp_rank,
                tier = gone.tier.as_str(),
                forgotten_blocks = gone.pairs,
                max_kv_index_pairs = max_pairs,
                "the KV index reached router.max_kv_index_pairs (its memory bound) in one tier: the router forgot the blocks of the worker holding the most there. Raise max_kv_index_pairs (about 14-28 bytes a pair) if the fleet's caches are this large. Logged once; switchyard_kv_blocks_evicted_total counts the blocks"
            ),
        }
    }

    /// Applies KV events of one worker.
    pub fn kv_events(&self, worker: WorkerId, events: &[KvEvent]) -> Result<(), RouteError> {
        if self.membership.state.read().workers.get(worker).is_none() {
            return Err(WorkerError::Unknown(worker).into());
        }
        self.apply_kv(&self.generation(), worker, events);
        Ok(())
    }

    /// Starts following the KV events of every worker (of `workers`) whose engine
    /// publishes them; a worker already followed is left alone.
    pub fn subscribe_kv_events(self: &Arc<Self>, workers: &[WorkerSpec]) -> std::io::Result<()> {
        for spec in workers {
            let Some(source) = &spec.kv_events else {
                continue;
            };
            let mut subscriptions = self.kv.subscriptions.lock();
            if subscriptions.contains_key(&spec.id()) {
                continue;
            }
            let subscription =
                subscriber::subscribe(self.clone(), spec.worker_id, spec.dp_rank, source.clone())?;
            subscriptions.insert(spec.id(), subscription);
        }
        Ok(())
    }

    /// Applies events an engine published for worker (`worker_id`, `dp_rank`).
    pub fn apply_engine_events(
        &self,
        worker_id: u64,
        dp_rank: u32,
        events: &[EngineEvent],
    ) -> ApplyOutcome {
        let worker = WorkerId { worker_id, dp_rank };
        let mut outcome = ApplyOutcome::default();
        if self.membership.state.read().workers.get(worker).is_none() {
            outcome.unknown_worker = true;
            return outcome;
        }
        let block_size = self.block_size();
        let mut translated = Vec::with_capacity(events.len());
        {
            let mut engines = self.kv.engine_blocks.lock();
            let blocks = engines.entry(worker).or_default();
            for event in events {
                match blocks.translate(event, block_size, &mut translated) {
                    Ok(()) => {
                        outcome.applied += 1;
                        if matches!(event, EngineEvent::AllCleared) {
                            outcome.engine_clears += 1;
                        }
                    }
                    Err(reason) => {
                        if reason == Ignored::BlockSize {
                            if let EngineEvent::Stored(s) = event {
                                outcome.block_size_refused = Some(s.block_size);
                            }
                        }
                        outcome.ignored.push(reason);
                    }
                }
            }
        }
        self.apply_kv(&self.generation(), worker, &translated);
        outcome
    }

    /// Forgets every block of a worker's engine (it restarted, or events were lost).
    pub fn clear_engine(&self, worker_id: u64, dp_rank: u32) {
        let worker = WorkerId { worker_id, dp_rank };
        self.kv.engine_blocks.lock().remove(&worker);
        self.kv
            .index
            .write()
            .apply(worker, &KvEvent::Cleared { tier: None });
    }

    /// The blocks the index holds of `worker`, per tier (device, host, disk).
    pub fn kv_held(&self, worker: WorkerId) -> [u64; 3] {
        let kv = self.kv.index.read();
        crate::kv_index::Tier::ALL.map(|tier| kv.held(worker, tier))
    }

    pub fn kv_blocks(&self) -> [usize; 3] {
        self.kv.index.read().blocks()
    }
}

impl subscriber::EventSink for Router {
    fn apply_engine_events(
        &self,
        worker_id: u64,
        dp_rank: u32,
        events: &[EngineEvent],
    ) -> ApplyOutcome {
        Router::apply_engine_events(self, worker_id, dp_rank, events)
    }
    fn clear_engine(&self, worker_id: u64, dp_rank: u32) {
        Router::clear_engine(self, worker_id, dp_rank)
    }
    fn block_size(&self) -> u32 {
        Router::block_size(self)
    }
    fn kv_source(
        &self,
        endpoint: &str,
        worker_id: u64,
    ) -> Arc<super::super::kv_events::KvSourceCounters> {
        self.metrics.kv_source(endpoint, worker_id)
    }
    fn record_kv_event_lag(&self, lag: Duration) {
        self.metrics.record_kv_event_lag(lag)
    }
    fn kv_event_limits(&self) -> switchyard_config::KvEventLimits {
        self.generations.serving.read().config().router.kv_events
    }
}
