//! The workers discovery added to the router, brought to what the pods say: through the
//! router's own `add_worker` / `remove_worker`, the paths of `POST` and `DELETE
//! /v1/workers` (a leaving worker's bookings and KV state go with it).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use switchyard_fleet::router::Router;
use switchyard_fleet::workers::WorkerSpec;
use switchyard_plugin_sdk::WorkerId;

/// What one reconciliation changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub added: usize,
    pub removed: usize,
}

/// The workers this discovery registered, and those the router refused (said once).
#[derive(Debug, Default)]
pub struct Members {
    owned: BTreeMap<WorkerId, WorkerSpec>,
    refused: BTreeSet<WorkerId>,
}

impl Members {
    /// Makes the router's discovered workers `desired`. Leaving workers go first, so a
    /// pod whose address changed leaves before it joins again. It may run plugin code (a
    /// new partition builds its policies) and waits for the fleet's locks: call it off
    /// the executor.
    pub fn reconcile(
        &mut self,
        router: &Arc<Router>,
        desired: &BTreeMap<WorkerId, WorkerSpec>,
    ) -> Changes {
        let mut changes = Changes::default();
        let leaving: Vec<WorkerId> = self
            .owned
            .iter()
            .filter(|(id, spec)| desired.get(id) != Some(*spec))
            .map(|(id, _)| *id)
            .collect();
        for id in leaving {
            self.owned.remove(&id);
            // Already gone (an operator's `DELETE /v1/workers`) is as good as removed.
            if router.remove_worker(id).is_ok() {
                tracing::info!(
                    worker = id.worker_id,
                    rank = id.dp_rank,
                    "discovery: worker left the fleet"
                );
                changes.removed += 1;
            }
        }
        for (id, spec) in desired {
            if self.owned.contains_key(id) {
                continue;
            }
            match router.add_worker(spec.clone()) {
                Ok(()) => {
                    // As `POST /v1/workers` does: its engine's KV events, if it publishes.
                    if let Err(error) = router.subscribe_kv_events(std::slice::from_ref(spec)) {
                        tracing::warn!(worker = id.worker_id, rank = id.dp_rank, %error, "discovery: cannot subscribe to the pod's KV events");
                    }
                    tracing::info!(worker = id.worker_id, rank = id.dp_rank, url = spec.url.as_deref().unwrap_or(""), model = %spec.model, "discovery: worker joined the fleet");
                    self.owned.insert(*id, spec.clone());
                    self.refused.remove(id);
                    changes.added += 1;
                }
                Err(error) => {
                    if self.refused.insert(*id) {
                        tracing::warn!(worker = id.worker_id, rank = id.dp_rank, %error, "discovery: the router refused a pod's worker; it is tried again at the next change");
                    }
                }
            }
        }
        self.refused.retain(|id| desired.contains_key(id));
        changes
    }

    /// How many workers discovery has registered.
    pub fn len(&self) -> usize {
        self.owned.len()
    }

    pub fn is_empty(&self) -> bool {
        self.owned.is_empty()
    }
}
