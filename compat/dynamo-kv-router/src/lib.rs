//! Dynamo's worker-selection policy API, on the switchyard plugin SDK.
//!
//! A policy crate written against Dynamo's `dynamo-kv-router` (feature
//! `standalone-selection`) builds unchanged as a switchyard plugin when its dependency
//! points here:
//!
//! ```toml
//! dynamo-kv-router = { package = "switchyard-dynamo-kv-router", path = "...", features = ["standalone-selection"] }
//! ```
//!
//! and its catalog crate (a `cdylib`) adds one line after its `register` function:
//!
//! ```ignore
//! dynamo_kv_router::export_catalog!(register);
//! ```
//!
//! # Which Dynamo API this is
//!
//! The API of Dynamo's guide "Write Custom Routing Strategies" (the revision of
//! `lib/kv-router` where the components live in `scheduling::selector::policy` and the
//! registry in `services::selection::policy_registry`, ai-dynamo/dynamo `main` as of
//! commit 0a3d0d5 / 0f7318a, 2026): the names, module paths, traits, signatures, accessor
//! methods and numeric types of that revision, at the crate root and in
//! [`services::selection`].
//!
//! Dynamo's current shape of the same API is followed too, under its own path:
//! [`plugins::worker_selection`] (a batch `WorkerScorer::score` over `WorkerCandidates`, a
//! filter handed `WorkerCandidate<'_>` by value, the [`WorkerType`] enum handed to
//! factories) with [`plugins::RouterPluginRegistry`] (ai-dynamo/dynamo commits 19cd890 and
//! 1dca837, 2026). [`export_catalog!`] takes either registry's `register`. What of it is
//! not followed is listed in docs/dynamo.md.
//!
//! # How it maps onto switchyard
//!
//! Each Dynamo filter, scorer and picker becomes one SDK component (the adapters in
//! `policy`), each policy type one SDK policy type. The adapters read the SDK's columns and
//! hand Dynamo's row values (`f64` overlap blocks, `usize` loads) to the policy; a filter or
//! scorer costs one dynamic call per selection (the per-row loop is compiled into the
//! policy's own type), and a picker's `WorkerInputView` is built in buffers the adapter
//! keeps, so a selection allocates nothing once the buffers have grown.
//!
//! Switchyard additions, not in Dynamo: [`export_catalog!`], [`testing`] (drive a policy
//! over rows in unit tests and benchmarks), [`WorkerSelectionPolicy::into_parts`] and
//! [`WorkerSelectionContext::switchyard`].

mod context;
pub mod export;
mod inputs;
pub mod plugins;
mod policy;
pub mod protocols;
pub mod services;
pub mod testing;
mod worker_type;

#[doc(hidden)]
pub use switchyard_plugin_sdk as __sdk;

pub use context::{KvHints, SessionContext, WorkerSelectionContext, WorkerSelectionInputTrigger};
pub use inputs::{
    CandidateRows, ScoredWorkerCandidate, WorkerCacheInput, WorkerCandidate, WorkerInputView,
    WorkerInputs, WorkerLoadInput, WorkerRoutingInput,
};
pub use policy::{
    WorkerFilter, WorkerPicker, WorkerScorer, WorkerSelectionPolicy, WorkerSelectionPolicyError,
};
pub use protocols::{DpRank, WorkerAffinityTarget, WorkerId, WorkerWithDpRank};
pub use services::selection::{KvRouterConfig, RoutingPartitionRef, WorkerSelectionPolicyFactory};
pub use worker_type::WorkerType;

/// The Dynamo API revisions this crate follows (see the crate docs).
pub const DYNAMO_API_REVISION: &str = "lib/kv-router: the guide's (scheduling::selector::policy, \
services::selection; 0a3d0d5 / 0f7318a) at the root, the current plugins::worker_selection \
(19cd890 / 1dca837) under plugins";

/// Exports a Dynamo policy catalog as a switchyard plugin: `register` is the catalog's
/// `fn register(&mut WorkerSelectionPolicyRegistry) -> Result<(), WorkerSelectionPolicyRegistryError>`
/// (or the current shape's `&mut plugins::RouterPluginRegistry`); each policy type it
/// registers becomes a switchyard policy type of the same name.
///
/// ```ignore
/// dynamo_kv_router::export_catalog!(register);
/// // or, naming the plugin:
/// dynamo_kv_router::export_catalog!(register, name: "acme-routing", version: "1.0.0", vendor: "Acme");
/// ```
///
/// The plugin is named after the crate (`CARGO_PKG_NAME`, `CARGO_PKG_VERSION`) unless given.
#[macro_export]
macro_rules! export_catalog {
    ($register:path $(,)?) => {
        $crate::export_catalog!(
            $register,
            name: env!("CARGO_PKG_NAME"),
            version: env!("CARGO_PKG_VERSION"),
            vendor: "Dynamo policy catalog (switchyard-dynamo-kv-router)",
        );
    };
    ($register:path, name: $name:expr, version: $version:expr, vendor: $vendor:expr $(,)?) => {
        fn __switchyard_dynamo_register(
            registrar: &mut $crate::__sdk::Registrar<'_>,
        ) -> ::core::result::Result<(), $crate::__sdk::PolicyError> {
            $crate::export::register_catalog(registrar, $register)
        }
        $crate::__sdk::export_plugin! {
            name: $name,
            version: $version,
            vendor: $vendor,
            register: __switchyard_dynamo_register,
        }
    };
}
