//! switchyard: an LLM inference request router whose worker-selection policies are
//! plugins loaded from shared libraries at startup.
//!
//! The router is a workspace of layer crates, bottom to top; each depends only on the
//! ones below it, so an upward import does not compile (docs/ARCHITECTURE.md):
//! - `switchyard-plugin-host` ([`plugin`], [`isolation`]): the plugin boundary (the only
//!   code that holds raw ABI values, calls plugin code or implements `extern "C"`
//!   functions) and supervised child processes for `isolation: process`.
//! - `switchyard-config` ([`config`]): the YAML config.
//! - `switchyard-policy` ([`policy`], [`startup`]): the registry of types, the built-ins,
//!   configured instances, the filter -> score -> pick pipeline, and startup (from config
//!   to loaded plugins and validated instances).
//! - `switchyard-fleet` ([`fleet`]): workers, KV index, load accounting, metrics, and the
//!   router.
//! - `switchyard-engines` ([`engines`]): the engine client and its TLS, upstream
//!   failures, health checks, engine-metrics scraping: what any host embedding the
//!   router needs of the engines.
//! - `switchyard-serve` ([`serve`]): the HTTP API, the OpenAI frontend, the Envoy picker.
//! - `switchyard-tools` ([`tools`]): `check`, `plugin inspect/new/test`, replay,
//!   `send-trace`, `engine-sim`.
//! - this crate: the `switchyard` binary (its CLI and wiring). The layers are re-exported
//!   under their short names.

pub use switchyard_config as config;
pub use switchyard_engines as engines;
pub use switchyard_fleet as fleet;
pub use switchyard_plugin_host::{isolation, plugin};
pub use switchyard_policy as policy;
pub use switchyard_policy::startup;
pub use switchyard_serve as serve;

pub use switchyard_tools as tools;
