//! KV state reaching the index: events over HTTP, from engines' ZeroMQ streams (through
//! the subscriber, which owns its connections), and predicted from routing; each worker
//! within its budget.

use super::*;

impl Router {
    /// For models with `kv_tracking: predicted`: the prompt's blocks are now assumed
    /// cached on `worker`.
    pub fn predict_cached(&self, model: &str, worker: WorkerId, hashes: &[u64]) {
        let generation = self.generation();
        let Some(settings) = generation.startup.source.config.models.get(model) else {
            return;
        };
        if settings.kv_tracking != KvTracking::Predicted || hashes.is_empty() {
            return;
        }
        let events = self.predicted.lock().routed(
            worker,
            hashes,
            settings.predicted_blocks_per_worker,
            Duration::from_secs(settings.predicted_ttl_secs),
            Instant::now(),
        );
        self.apply_kv(worker, &events);
    }

    /// Applies `worker`'s KV events within its budget (what it declared it can hold),
    /// counting and logging (once per worker) the blocks evicted past it.
    fn apply_kv(&self, worker: WorkerId, events: &[KvEvent]) {
        let Some(device) = self
            .state
            .read()
            .workers
            .get(worker)
            .map(|spec| spec.total_kv_blocks)
        else {
            return;
        };
        let offload = self
            .generation()
            .startup
            .source
            .config
            .router
            .max_offloaded_blocks_per_worker;
        let mut kv = self.kv.write();
        kv.set_budget(worker, [device, offload, offload]);
        let before = kv.evicted();
        for event in events {
            kv.apply(worker, event);
        }
        let evicted = kv.evicted() - before;
        drop(kv);
        if evicted > 0 {
            self.metrics.record_kv_evicted(evicted);
            if self.kv_overruns.lock().insert(worker) {
                tracing::warn!(
                    worker_id = worker.worker_id,
                    dp_rank = worker.dp_rank,
                    evicted,
                    total_kv_blocks = device,
                    max_offloaded_blocks_per_worker = offload,
                    "a worker's KV events store more blocks than it declared it can hold (lost removals, or a wrong total_kv_blocks); its oldest blocks are evicted from the index. Logged once per worker; switchyard_kv_blocks_evicted_total counts them"
                );
            }
        }
    }

    /// Applies KV events of one worker.
    pub fn kv_events(&self, worker: WorkerId, events: &[KvEvent]) -> Result<(), RouteError> {
        if self.state.read().workers.get(worker).is_none() {
            return Err(WorkerError::Unknown(worker).into());
        }
        self.apply_kv(worker, events);
        Ok(())
    }

    /// Starts following the KV events of every worker (of `workers`) whose engine
    /// publishes them; a worker already followed is left alone.
    pub fn subscribe_kv_events(self: &Arc<Self>, workers: &[WorkerSpec]) -> std::io::Result<()> {
        for spec in workers {
            let Some(source) = &spec.kv_events else {
                continue;
            };
            let mut subscriptions = self.subscriptions.lock();
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
        if self.state.read().workers.get(worker).is_none() {
            outcome.unknown_worker = true;
            return outcome;
        }
        let block_size = self.block_size();
        let mut translated = Vec::with_capacity(events.len());
        {
            let mut engines = self.engine_blocks.lock();
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
        self.apply_kv(worker, &translated);
        outcome
    }

    /// Forgets every block of a worker's engine (it restarted, or events were lost).
    pub fn clear_engine(&self, worker_id: u64, dp_rank: u32) {
        let worker = WorkerId { worker_id, dp_rank };
        self.engine_blocks.lock().remove(&worker);
        self.kv
            .write()
            .apply(worker, &KvEvent::Cleared { tier: None });
    }

    pub fn kv_blocks(&self) -> [usize; 3] {
        self.kv.read().blocks()
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
}
