//! Dynamo's `protocols` identity types.

use serde::{Deserialize, Serialize};

/// A worker identifier.
pub type WorkerId = u64;

/// A data-parallel rank identifier.
pub type DpRank = u32;

/// A worker and its data-parallel rank (`dp_rank` 0: no data parallelism, or the first
/// rank). Ordered by worker id, then rank, as Dynamo's examples sort by it.
#[derive(
    Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
// A fixed layout (id, then rank): the picker adapter writes rows of it two at a time.
#[repr(C)]
pub struct WorkerWithDpRank {
    pub worker_id: WorkerId,
    pub dp_rank: DpRank,
}

impl WorkerWithDpRank {
    #[inline]
    pub fn new(worker_id: WorkerId, dp_rank: DpRank) -> Self {
        Self { worker_id, dp_rank }
    }

    #[inline]
    pub fn from_worker_id(worker_id: WorkerId) -> Self {
        Self {
            worker_id,
            dp_rank: 0,
        }
    }
}

/// A worker affinity target that may apply to every data-parallel rank of a worker
/// (switchyard's bindings always name the rank).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerAffinityTarget {
    pub worker_id: WorkerId,
    pub dp_rank: Option<DpRank>,
}

impl WorkerAffinityTarget {
    pub fn new(worker_id: WorkerId, dp_rank: Option<DpRank>) -> Self {
        Self { worker_id, dp_rank }
    }
}

impl From<WorkerWithDpRank> for WorkerAffinityTarget {
    fn from(worker: WorkerWithDpRank) -> Self {
        Self::new(worker.worker_id, Some(worker.dp_rank))
    }
}

impl From<switchyard_plugin_sdk::WorkerId> for WorkerWithDpRank {
    #[inline]
    fn from(worker: switchyard_plugin_sdk::WorkerId) -> Self {
        Self::new(worker.worker_id, worker.dp_rank)
    }
}

impl From<WorkerWithDpRank> for switchyard_plugin_sdk::WorkerId {
    #[inline]
    fn from(worker: WorkerWithDpRank) -> Self {
        switchyard_plugin_sdk::WorkerId {
            worker_id: worker.worker_id,
            dp_rank: worker.dp_rank,
        }
    }
}
