//! The switchyard plugin SDK for Rust.
//!
//! - [`abi`]: the C ABI v1 (the only contract; `include/switchyard/plugin.h` is generated
//!   from it).
//! - [`WorkerFilter`], [`WorkerScorer`], [`WorkerPicker`]: the safe component traits, and
//!   [`RequestAdmitter`] (ABI 1.3), which decides before selection whether a request is served.
//! - [`Registrar`]: registers component and policy types.
//! - [`export_plugin!`]: exports the entry symbol and writes the static [`manifest`].
//! - Batch helpers for the components most policies use, written once for the host's
//!   built-in ones and Rust plugins alike: [`keep_at_least`] (a count threshold, compared
//!   in the column's own type) and [`WorkerCandidates::lowest_cost_row`] (the picker:
//!   lowest cost, ties to the lowest worker id).
//! - [`builtins`]: the router's own least-busy components (a device-overlap filter, an
//!   active-requests scorer, a deterministic lowest-cost picker), for plugins to reuse.
//!
//! - [`log`] (ABI 1.5): the router's log; `tracing` events inside the router's calls reach
//!   it, named by plugin and type.
//!
//! A Rust plugin goes through exactly the same C ABI as a C or C++ plugin.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod abi;
mod admission;
pub mod builtins;
mod component;
pub mod export;
#[cfg(feature = "layout")]
pub mod layout;
pub mod log;
mod lowest_cost;
pub mod manifest;
mod params;
mod status;
mod threshold;
mod view;

pub use admission::{Admission, Placement, RequestAdmitter, Saturation};
pub use component::{
    Lifecycle, Notifications, PolicyError, PolicyParts, WorkerFilter, WorkerInputs, WorkerPicker,
    WorkerScorer,
};
pub use export::{write_error, Registrar};
pub use log::{LogLevel, Logger};
pub use params::{Params, RouterSettings};
pub use status::Status;
pub use threshold::keep_at_least;
pub use view::{
    str_from_abi, str_to_abi, AdapterState, AffinityMode, AffinityTarget, CacheInputs,
    CandidateCache, CandidateLoad, EngineLoad, EngineState, InputTrigger, LoadInputs, Outcome,
    Partition, RequestAttributes, RoutingInputs, SessionContext, WorkerCandidate, WorkerCandidates,
    WorkerId, WorkerSelectionContext, WorkerType,
};
