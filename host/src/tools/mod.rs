//! Operator tools built on the library: what `check` and `plugin inspect` print, and
//! trace replay against simulated workers.

pub mod engine_sim;
pub mod replay;
pub mod summary;
