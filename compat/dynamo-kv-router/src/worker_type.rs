//! Dynamo's typed worker role (its current `plugins::worker_selection` factories are
//! handed one).

use core::fmt;

use switchyard_plugin_sdk as sdk;

/// The processing stage of a worker pool.
#[derive(Copy, Clone, Debug, Eq, PartialEq, Hash)]
pub enum WorkerType {
    Prefill,
    Decode,
    Encode,
    Aggregated,
}

impl WorkerType {
    /// The lowercase name: `prefill`, `decode`, `encode`, `aggregated`.
    #[inline]
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Prefill => "prefill",
            Self::Decode => "decode",
            Self::Encode => "encode",
            Self::Aggregated => "aggregated",
        }
    }

    /// Switchyard's partition type: its `select` pool is Dynamo's aggregated one
    /// (switchyard has no encode pool).
    #[inline]
    pub fn from_switchyard(worker_type: sdk::WorkerType) -> Self {
        match worker_type {
            sdk::WorkerType::Prefill => Self::Prefill,
            sdk::WorkerType::Decode => Self::Decode,
            sdk::WorkerType::Select => Self::Aggregated,
        }
    }
}

impl fmt::Display for WorkerType {
    #[inline]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
