//! The fleet's membership: adding and removing workers (each in its partition, its
//! addresses checked), and what the router knows of them.

use super::*;

impl Router {
    /// Registers a worker; a new partition gets one policy instance per configured
    /// instance, built now.
    ///
    /// Everything that can refuse the worker is checked before anything is built: a
    /// refused registration leaves no partition, policy or metric series behind.
    pub fn add_worker(&self, spec: WorkerSpec) -> Result<(), RouteError> {
        spec.validate().map_err(WorkerError::Invalid)?;
        self.check_destinations(&spec)?;
        let _changing = self.generations.changing.lock();
        if let Some(existing) = self.membership.state.read().workers.get(spec.id()) {
            return Err(WorkerError::AlreadyRegistered(spec.id(), existing.model.clone()).into());
        }
        let generation = self.generation();
        let partition = spec.partition();
        let built = !generation.has_partition(&partition);
        self.ensure_partition(&generation, &partition)?;
        if let Err(e) = self.change_workers(|workers| workers.add(spec)) {
            if built {
                for retired in generation.drop_partition(&partition) {
                    self.retirement.retire(retired);
                }
            }
            return Err(e.into());
        }
        Ok(())
    }

    /// Records the addresses the router's listeners answer on, and checks the workers
    /// registered so far against them (resolving host names: call it off the executor).
    pub fn set_own_addresses(&self, own: Vec<std::net::SocketAddr>) -> Result<(), RouteError> {
        *self.membership.own_addresses.write() = own;
        self.workers()
            .iter()
            .try_for_each(|spec| self.check_destinations(spec))
    }

    /// `spec` points inside `router.worker_networks` and not at the router itself. A host
    /// name is resolved to tell (up to `RESOLVE_TIMEOUT`): call it off the executor.
    pub(super) fn check_destinations(&self, spec: &WorkerSpec) -> Result<(), RouteError> {
        let networks = self.generation().startup.source.worker_networks();
        let own = self.membership.own_addresses.read().clone();
        spec.check_destinations(&networks, &own).map_err(|error| {
            RouteError::Worker(WorkerError::Destination {
                worker_id: spec.worker_id,
                error,
            })
        })
    }

    /// Builds `partition`'s policies into `generation` if it has none yet: before the
    /// worker is registered, and without the fleet's locks, so selections and metrics never
    /// wait for a plugin's `on_create`. The caller holds `changing`.
    pub(super) fn ensure_partition(
        &self,
        generation: &Generation,
        partition: &PartitionKey,
    ) -> Result<(), RouteError> {
        if generation.has_partition(partition) {
            return Ok(());
        }
        Ok(generation.build_partition(partition)?)
    }

    /// Every worker a gateway can send to (it has an `address`, or a `url` with an IP
    /// host), with that endpoint.
    pub fn endpoints(&self) -> Vec<(WorkerId, std::net::SocketAddr)> {
        self.endpoints_and_workers().0
    }

    /// `endpoints`, and how many workers there are (with an endpoint or not), read at
    /// once: a picker learns whether every worker is among them.
    pub fn endpoints_and_workers(&self) -> (Vec<(WorkerId, std::net::SocketAddr)>, usize) {
        let state = self.membership.state.read();
        (state.workers.endpoints().collect(), state.workers.len())
    }

    /// Whether every worker has an endpoint (`endpoints` lists them all).
    pub fn every_worker_has_an_endpoint(&self) -> bool {
        let state = self.membership.state.read();
        let every = state.workers.endpoints().len() == state.workers.len();
        every
    }

    /// `id`'s endpoint, when it has one (one lookup, not the list).
    pub fn endpoint_of(&self, id: WorkerId) -> Option<std::net::SocketAddr> {
        self.membership.state.read().workers.endpoint(id)
    }

    /// Removes a worker, its cached blocks and its bookings.
    /// A partition left without workers is dropped with its policies and metric series
    /// (built again if a worker of it comes back).
    pub fn remove_worker(&self, id: WorkerId) -> Result<WorkerSpec, RouteError> {
        let _changing = self.generations.changing.lock();
        self.remove_worker_changing(id)
    }

    /// `remove_worker`, for a caller that holds `changing` (a reload).
    pub(super) fn remove_worker_changing(&self, id: WorkerId) -> Result<WorkerSpec, RouteError> {
        let spec = self.change_workers(|workers| workers.remove(id))?;
        let partition = spec.partition();
        if !self
            .membership
            .state
            .read()
            .workers
            .uses_partition(&partition)
        {
            for retired in self.generation().drop_partition(&partition) {
                self.retirement.retire(retired);
            }
        }
        self.kv.index.write().remove_worker(id);
        self.bookings.book(|load| load.remove_worker(id));
        self.kv.predicted.lock().remove_worker(id);
        self.kv.engine_blocks.lock().remove(&id);
        self.kv.subscriptions.lock().remove(&id);
        self.kv.overruns.lock().remove(&id);
        self.membership.cooldown_until.lock().remove(&id);
        self.membership.health_errors.lock().remove(&id);
        let load = self.bookings.load.read();
        self.lifecycles.finish_unbooked(|id| load.is_booked(id));
        Ok(spec)
    }

    /// The models the workers serve, sorted.
    pub fn models(&self) -> Vec<String> {
        let state = self.membership.state.read();
        let models: std::collections::BTreeSet<_> =
            state.workers.all().map(|w| w.model.clone()).collect();
        models.into_iter().collect()
    }

    pub fn workers(&self) -> Vec<WorkerSpec> {
        self.membership
            .state
            .read()
            .workers
            .all()
            .cloned()
            .collect()
    }
}
