//! Policies: the registry of component and policy types, the built-in ones, configured
//! instances, and the filter -> score -> pick pipeline they run. Plugin code is reached
//! only through the [`switchyard_plugin_host::plugin`] boundary.

pub mod admitters;
pub mod builtin;
pub mod busy;
pub mod candidates;
pub mod columns;
pub mod engine_signals;
pub mod error;
pub mod histogram;
pub mod instances;
pub mod pipeline;
pub mod rate_limits;
pub mod registry;
pub mod startup;

pub use admitters::{AdmitterUse, Admitters, Rejection};
pub use candidates::{CandidateRow, Candidates, KeptColumns};
pub use error::{BuildError, Refusal, SelectError};
pub use instances::{CallBudget, ComponentUse, InstanceFactory, InstanceKind};
pub use pipeline::{
    CandidatesFrom, Policy, RawOutput, RowExtras, SelectTrace, Selector, Stage, StageStats,
};
pub use registry::{ComponentType, Origin, PolicyFactory, PolicyType, Registry};
