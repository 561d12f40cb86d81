//! The fleet: workers, the KV index and load accounting (the routing state policies
//! read), metrics, and the router that ties them to the configured policy instances.

pub mod admission;
pub mod executor;
pub mod generation;
pub mod kept_columns;
pub mod kv_bound;
pub mod kv_events;
pub mod kv_index;
pub mod lifecycle;
pub mod load_accounting;
pub mod metrics;
pub mod predicted_kv;
pub mod replicas;
pub mod retire;
pub mod sessions;
pub use switchyard_policy::rate_limits;
pub mod router;
pub mod workers;
