//! switchyard: an LLM inference request router whose worker-selection policies are
//! plugins loaded from shared libraries at startup.
//!
//! Layers, bottom to top; each may use only the ones below it:
//! - [`plugin`]: the plugin boundary. The only module that holds raw ABI values, calls
//!   plugin code or implements `extern "C"` functions: the loader, the ABI checks, the
//!   registrar, builder and params callbacks, component and policy handles.
//! - [`config`]: the YAML config.
//! - [`isolation`]: plugins run in supervised child processes (`isolation: process`).
//! - [`policy`]: the registry of types, the built-ins, configured instances and the
//!   filter -> score -> pick pipeline.
//! - [`startup`]: from config to loaded plugins and validated instances.
//! - [`fleet`]: workers, KV index, load accounting, metrics, and the router.
//! - [`serve`]: the HTTP API.
//! - [`tools`]: `check` / `plugin inspect` summaries and trace replay.

pub mod config;
pub mod fleet;
pub mod isolation;
pub mod plugin;
pub mod policy;
pub mod serve;
pub mod startup;
pub mod tools;
