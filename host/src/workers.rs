//! The worker registry: workers added and removed at run time, grouped into partitions
//! (model x worker type). Aggregated workers form the `select` partition of their model.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use switchyard_plugin_sdk::{WorkerId, WorkerType};

use crate::registry::PartitionKey;

/// What a worker does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerRole {
    Prefill,
    Decode,
    Aggregated,
}

impl WorkerRole {
    pub fn worker_type(self) -> WorkerType {
        match self {
            WorkerRole::Prefill => WorkerType::Prefill,
            WorkerRole::Decode => WorkerType::Decode,
            WorkerRole::Aggregated => WorkerType::Select,
        }
    }
}

fn aggregated() -> WorkerRole {
    WorkerRole::Aggregated
}
fn default_kv_blocks() -> u64 {
    16_384
}
fn default_batched_tokens() -> u64 {
    8_192
}

/// A worker (one data-parallel rank of an engine), as configured or added over HTTP.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSpec {
    pub model: String,
    pub worker_id: u64,
    #[serde(default)]
    pub dp_rank: u32,
    #[serde(default = "aggregated")]
    pub worker_type: WorkerRole,
    /// KV capacity in blocks.
    #[serde(default = "default_kv_blocks")]
    pub total_kv_blocks: u64,
    #[serde(default = "default_batched_tokens")]
    pub max_batched_tokens: u64,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Cost multiplier from preferred routing constraints (taints), if any.
    #[serde(default)]
    pub preferred_taint_multiplier: Option<f64>,
}

impl WorkerSpec {
    pub fn id(&self) -> WorkerId {
        WorkerId {
            worker_id: self.worker_id,
            dp_rank: self.dp_rank,
        }
    }
    pub fn partition(&self) -> PartitionKey {
        PartitionKey::new(self.model.clone(), self.worker_type.worker_type())
    }
    /// Checks the values serde cannot.
    pub fn validate(&self) -> Result<(), String> {
        if self.model.trim().is_empty() {
            return Err("`model` must not be empty".into());
        }
        if self.total_kv_blocks == 0 {
            return Err("`total_kv_blocks` must be at least 1".into());
        }
        if let Some(m) = self.preferred_taint_multiplier {
            if !m.is_finite() || m < 0.0 {
                return Err(format!(
                    "`preferred_taint_multiplier` must be a finite number >= 0, got {m}"
                ));
            }
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WorkerError {
    #[error("worker {} (dp_rank {}) is already registered for model `{}`; remove it first", .0.worker_id, .0.dp_rank, .1)]
    AlreadyRegistered(WorkerId, String),
    #[error("no worker {} (dp_rank {})", .0.worker_id, .0.dp_rank)]
    Unknown(WorkerId),
    #[error("invalid worker: {0}")]
    Invalid(String),
}

#[derive(Default)]
pub struct Workers {
    by_id: HashMap<WorkerId, WorkerSpec>,
    partitions: BTreeMap<PartitionKey, Vec<WorkerId>>,
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
        self.by_id.insert(id, spec);
        Ok(new_partition)
    }

    pub fn remove(&mut self, id: WorkerId) -> Result<WorkerSpec, WorkerError> {
        let spec = self.by_id.remove(&id).ok_or(WorkerError::Unknown(id))?;
        if let Some(members) = self.partitions.get_mut(&spec.partition()) {
            members.retain(|w| *w != id);
        }
        Ok(spec)
    }

    pub fn get(&self, id: WorkerId) -> Option<&WorkerSpec> {
        self.by_id.get(&id)
    }

    /// The workers of a partition (empty when unknown).
    pub fn members(&self, partition: &PartitionKey) -> &[WorkerId] {
        self.partitions.get(partition).map_or(&[], Vec::as_slice)
    }

    pub fn has_model(&self, model: &str) -> bool {
        self.by_id.values().any(|w| w.model == model)
    }

    pub fn all(&self) -> impl Iterator<Item = &WorkerSpec> {
        self.by_id.values()
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}
