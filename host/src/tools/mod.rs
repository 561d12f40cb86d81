//! Operator tools built on the library: what `check` and `plugin inspect` print, trace
//! replay against simulated workers, the engine simulator, and plugin project scaffolds.

pub mod engine_sim;
pub mod replay;
pub mod scaffold;
pub mod summary;
