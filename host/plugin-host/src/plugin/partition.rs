//! A routing partition as the host keeps it (model x worker type), and its ABI form.

use std::fmt;

use switchyard_plugin_sdk::abi::switchyard_partition;
use switchyard_plugin_sdk::{str_to_abi, Partition, WorkerType};

/// A routing partition: one model and one worker type.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionKey {
    pub model: String,
    pub worker_type: WorkerType,
}

impl PartitionKey {
    pub fn new(model: impl Into<String>, worker_type: WorkerType) -> Self {
        PartitionKey {
            model: model.into(),
            worker_type,
        }
    }

    /// The SDK's view, as built-in components read it.
    pub fn view(&self) -> Partition<'_> {
        Partition {
            worker_type: self.worker_type,
            model: &self.model,
        }
    }

    /// The ABI form, borrowing this key for the duration of `f`.
    pub(super) fn with_abi<R>(&self, f: impl FnOnce(&switchyard_partition) -> R) -> R {
        let raw = switchyard_partition {
            struct_size: std::mem::size_of::<switchyard_partition>() as u32,
            worker_type: self.worker_type.to_abi(),
            model: str_to_abi(&self.model),
        };
        f(&raw)
    }
}

impl fmt::Display for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.model, self.worker_type.as_str())
    }
}
