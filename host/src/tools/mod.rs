//! Operator tools built on the library: what `check` and `plugin inspect` print, trace
//! replay against simulated workers, the engine simulator, plugin project scaffolds and the plugin conformance run.

pub mod conformance;
pub mod dry_run;
pub mod engine_sim;
pub mod replay;
pub mod scaffold;
pub mod send_trace;
pub mod summary;
