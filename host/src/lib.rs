//! switchyard: an LLM inference request router whose worker-selection policies are
//! plugins loaded from shared libraries at startup.
//!
//! Layers, each in a module named after it:
//! - [`config`]: the YAML config.
//! - [`loader`] and [`abi_checks`]: opening plugins and checking them before they run.
//! - [`registry`]: component and policy types, built-in and from plugins.
//! - [`startup`] and [`instances`]: from config to validated policy instances.
//! - [`pipeline`]: filter -> score -> pick for one policy instance.
//! - [`builtin`]: built-in components and the `default` policy.
//! - [`workers`], [`kv_index`], [`load_accounting`]: the routing state plugins read.
//! - [`router`]: select, select-and-reserve, prefill-complete, free.
//! - [`http_service`] and [`metrics`]: the HTTP API and Prometheus metrics.
//! - [`replay`]: request traces against simulated workers.
//! - [`summary`]: what `check` and `plugin inspect` print.

pub mod abi_checks;
pub mod builtin;
pub mod config;
pub mod http_service;
pub mod instances;
pub mod kv_index;
pub mod load_accounting;
pub mod loader;
pub mod metrics;
pub mod params;
pub mod pipeline;
pub mod registry;
pub mod replay;
pub mod request;
pub mod router;
pub mod startup;
pub mod summary;
pub mod workers;
