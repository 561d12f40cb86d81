//! Dynamo's `services` module: the standalone selection service's policy registration.

pub mod selection;
