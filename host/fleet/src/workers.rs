//! The worker registry: workers added and removed at run time, grouped into partitions
//! (model x worker type). Aggregated workers form the `select` partition of their model.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use switchyard_plugin_sdk::WorkerId;

pub use switchyard_config::WorkerSpec;
use switchyard_plugin_host::plugin::{EngineReport, Labels, PartitionKey};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum WorkerError {
    #[error("worker {} (dp_rank {}) is already registered for model `{}`; remove it first", .0.worker_id, .0.dp_rank, .1)]
    AlreadyRegistered(WorkerId, String),
    #[error("no worker {} (dp_rank {})", .0.worker_id, .0.dp_rank)]
    Unknown(WorkerId),
    #[error("invalid worker: {0}")]
    Invalid(switchyard_config::WorkerInvalid),
    /// Where the worker points is not allowed (outside `router.worker_networks`, or
    /// the router itself).
    #[error("invalid worker: worker {worker_id}: {error}")]
    Destination {
        worker_id: u64,
        error: switchyard_config::WorkerInvalid,
    },
}

#[derive(Default)]
pub struct Workers {
    by_id: HashMap<WorkerId, WorkerSpec>,
    /// Each worker's labels as components read them (LABELS), made once per add.
    labels: HashMap<WorkerId, Arc<Labels>>,
    /// Each worker's `ip:port` as a gateway sends to it, parsed once per add: a picker
    /// looks up its pick's on every request (a fleet of thousands is not copied per
    /// request).
    endpoints: rustc_hash::FxHashMap<WorkerId, std::net::SocketAddr>,
    /// Each worker's engine report (ENGINE), written by the metrics scraper (workers with
    /// a `url`) or a simulation.
    engine: HashMap<WorkerId, Arc<EngineReport>>,
    /// The healthy workers of each partition: the candidates of its requests.
    partitions: BTreeMap<PartitionKey, Vec<WorkerId>>,
    /// Workers left out of their partition's candidates until healthy again.
    unhealthy: HashSet<WorkerId>,
    /// Partitions whose members or their specs changed since `take_changed`, and whether
    /// the change only appended members.
    changed: Vec<(PartitionKey, bool)>,
}

impl Workers {
    /// Adds a worker; returns true when its partition is new.
    pub fn add(&mut self, spec: WorkerSpec) -> Result<bool, WorkerError> {
        spec.validate().map_err(WorkerError::Invalid)?;
        let id = spec.id();
        if let Some(existing) = self.by_id.get(&id) {
            return Err(WorkerError::AlreadyRegistered(id, existing.model.clone()));
        }
        let members = self.partitions.entry(spec.partition()).or_default();
        let new_partition = members.is_empty();
        members.push(id);
        self.changed.push((spec.partition(), true));
        self.labels.insert(id, Labels::new(&spec.labels));
        if let Some(endpoint) = spec.endpoint() {
            self.endpoints.insert(id, endpoint);
        }
        // Every worker has a cell of its own: the scraper fills those with a `url`, and a
        // simulation (replay) any.
        self.engine.insert(id, EngineReport::new());
        self.by_id.insert(id, spec);
        Ok(new_partition)
    }

    pub fn remove(&mut self, id: WorkerId) -> Result<WorkerSpec, WorkerError> {
        let spec = self.by_id.remove(&id).ok_or(WorkerError::Unknown(id))?;
        self.labels.remove(&id);
        self.endpoints.remove(&id);
        self.engine.remove(&id);
        if let Some(members) = self.partitions.get_mut(&spec.partition()) {
            members.retain(|w| *w != id);
        }
        self.changed.push((spec.partition(), false));
        self.unhealthy.remove(&id);
        Ok(spec)
    }

    /// Takes a worker out of (or back into) its partition's candidates. Returns whether
    /// its health changed.
    pub fn set_healthy(&mut self, id: WorkerId, healthy: bool) -> bool {
        let Some(spec) = self.by_id.get(&id) else {
            return false;
        };
        let members = self.partitions.entry(spec.partition()).or_default();
        let change = if healthy && self.unhealthy.remove(&id) {
            members.push(id);
            Some(true)
        } else if !healthy && self.unhealthy.insert(id) {
            members.retain(|w| *w != id);
            Some(false)
        } else {
            None
        };
        if let Some(appended) = change {
            self.changed.push((spec.partition(), appended));
        }
        change.is_some()
    }

    /// The partitions whose members (or their specs) changed since the last call, each
    /// once, with whether members were only appended to it (the others kept their place
    /// and spec).
    pub fn take_changed(&mut self) -> Vec<(PartitionKey, bool)> {
        let mut changed = std::mem::take(&mut self.changed);
        changed.sort();
        // Sorted, a partition's `false` comes first: `dedup` keeps it.
        changed.dedup_by(|later, first| later.0 == first.0);
        changed
    }

    pub fn is_healthy(&self, id: WorkerId) -> bool {
        self.by_id.contains_key(&id) && !self.unhealthy.contains(&id)
    }

    /// Unhealthy workers of a partition.
    pub fn unhealthy_in(&self, partition: &PartitionKey) -> usize {
        self.unhealthy
            .iter()
            .filter(|id| {
                self.by_id
                    .get(id)
                    .is_some_and(|w| &w.partition() == partition)
            })
            .count()
    }

    pub fn get(&self, id: WorkerId) -> Option<&WorkerSpec> {
        self.by_id.get(&id)
    }

    /// The worker's labels (shared; empty when it has none or is unknown).
    pub fn labels(&self, id: WorkerId) -> Arc<Labels> {
        self.labels.get(&id).cloned().unwrap_or_else(Labels::none)
    }

    /// The worker's engine report (shared; the empty one for an unknown worker).
    pub fn engine(&self, id: WorkerId) -> Arc<EngineReport> {
        self.engine
            .get(&id)
            .cloned()
            .unwrap_or_else(EngineReport::none)
    }

    /// Every worker's engine URL and report, for the metrics scraper.
    pub fn engines(&self) -> Vec<(WorkerId, String, Arc<EngineReport>)> {
        self.by_id
            .iter()
            .filter_map(|(id, spec)| {
                let url = spec.url.clone()?;
                Some((*id, url, self.engine(*id)))
            })
            .collect()
    }

    /// The healthy workers of a partition (empty when unknown).
    pub fn members(&self, partition: &PartitionKey) -> &[WorkerId] {
        self.partitions.get(partition).map_or(&[], Vec::as_slice)
    }

    /// Whether any worker, healthy or not, belongs to `partition`.
    pub fn uses_partition(&self, partition: &PartitionKey) -> bool {
        self.by_id.values().any(|w| &w.partition() == partition)
    }

    pub fn has_model(&self, model: &str) -> bool {
        self.by_id.values().any(|w| w.model == model)
    }

    pub fn all(&self) -> impl Iterator<Item = &WorkerSpec> {
        self.by_id.values()
    }

    /// The workers with an `ip:port` endpoint, and it (in no particular order).
    pub fn endpoints(
        &self,
    ) -> impl ExactSizeIterator<Item = (WorkerId, std::net::SocketAddr)> + '_ {
        self.endpoints.iter().map(|(id, endpoint)| (*id, *endpoint))
    }

    /// `id`'s endpoint, when it has one.
    pub fn endpoint(&self, id: WorkerId) -> Option<std::net::SocketAddr> {
        self.endpoints.get(&id).copied()
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}
