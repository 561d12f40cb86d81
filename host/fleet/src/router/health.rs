//! Worker health: probes and refused connections take a worker out of the candidates
//! for a cool-down.

use super::*;

/// Why a worker failed its health probe.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HealthFailure {
    /// The engine's `GET /health` answered a status that is not success.
    #[error("GET /health answered {0}")]
    Status(u16),
    /// The engine's `GET /health` got no answer (the HTTP client's account of why).
    #[error("{0}")]
    NoAnswer(String),
    /// A TCP connect to an address-only worker failed.
    #[error("cannot connect to {address}: {error}")]
    Connect { address: String, error: String },
    #[error("connecting to {0} timed out")]
    ConnectTimedOut(String),
}

impl Router {
    /// The engine address of a worker, if it has one.
    pub fn worker_url(&self, id: WorkerId) -> Option<String> {
        self.membership
            .state
            .read()
            .workers
            .get(id)
            .and_then(|w| w.url.clone())
    }

    /// What the config (or `POST /v1/workers`) says of a worker.
    pub fn worker_spec(&self, id: WorkerId) -> Option<WorkerSpec> {
        self.membership.state.read().workers.get(id).cloned()
    }

    /// Every worker with an engine address.
    /// Workers known only by `address` (the gateway's form): probed by TCP connect.
    pub fn worker_addresses(&self) -> Vec<(WorkerId, std::net::SocketAddr)> {
        let state = self.membership.state.read();
        state
            .workers
            .all()
            .filter(|w| w.url.is_none())
            .filter_map(|w| Some((w.id(), w.endpoint()?)))
            .collect()
    }

    pub fn worker_urls(&self) -> Vec<(WorkerId, String)> {
        let state = self.membership.state.read();
        state
            .workers
            .all()
            .filter_map(|w| Some((w.id(), w.url.clone()?)))
            .collect()
    }

    /// Every worker with a `url`, and the report its engine's scrapes go to (ENGINE).
    pub fn engine_reports(
        &self,
    ) -> Vec<(
        WorkerId,
        String,
        Arc<switchyard_plugin_host::plugin::EngineReport>,
    )> {
        self.membership.state.read().workers.engines()
    }

    /// The worker's engine report cell (ENGINE): what the scraper, or a simulation,
    /// writes and selections read.
    pub fn engine_report(&self, id: WorkerId) -> Arc<switchyard_plugin_host::plugin::EngineReport> {
        self.membership.state.read().workers.engine(id)
    }

    pub fn is_healthy(&self, id: WorkerId) -> bool {
        self.membership.state.read().workers.is_healthy(id)
    }

    /// Takes a worker out of the candidates for at least `cooldown` (its engine refused a
    /// connection).
    pub fn mark_unhealthy(&self, id: WorkerId, cooldown: Duration) {
        self.membership
            .cooldown_until
            .lock()
            .insert(id, Instant::now() + cooldown);
        if self.change_workers(|workers| workers.set_healthy(id, false)) {
            tracing::warn!(
                worker = id.worker_id,
                dp_rank = id.dp_rank,
                "worker unhealthy"
            );
        }
    }

    /// Why the worker's last health probe failed, while it is unhealthy.
    pub fn health_error(&self, id: WorkerId) -> Option<String> {
        self.membership.health_errors.lock().get(&id).cloned()
    }

    /// A health probe's result: a failed probe (and why) takes the worker out; a good one
    /// brings it back once its cool-down is over.
    pub fn record_probe(&self, id: WorkerId, outcome: Result<(), HealthFailure>) {
        let healthy = outcome.is_ok();
        let reason = match outcome {
            Ok(()) => {
                self.membership.health_errors.lock().remove(&id);
                None
            }
            Err(failure) => {
                let reason = failure.to_string();
                self.membership
                    .health_errors
                    .lock()
                    .insert(id, reason.clone());
                Some(reason)
            }
        };
        if healthy {
            let mut cooldowns = self.membership.cooldown_until.lock();
            if cooldowns
                .get(&id)
                .is_some_and(|until| Instant::now() < *until)
            {
                return;
            }
            cooldowns.remove(&id);
        }
        if self.change_workers(|workers| workers.set_healthy(id, healthy)) {
            match healthy {
                true => tracing::info!(
                    worker = id.worker_id,
                    dp_rank = id.dp_rank,
                    "worker healthy again"
                ),
                false => tracing::warn!(
                    worker = id.worker_id,
                    dp_rank = id.dp_rank,
                    reason = reason.unwrap_or_default(),
                    "worker failed its health probe"
                ),
            }
        }
    }
}
