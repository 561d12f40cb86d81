//! The plugin boundary: the only part of the host that holds raw ABI values, calls into
//! plugin code, or implements an `extern "C"` function. Everything above it sees safe
//! Rust types.
//!
//! - [`library`]: the loader (checksum, `dlopen`, entry symbol, registration).
//! - [`abi_checks`]: the descriptor checks that run before any plugin code but the entry
//!   symbol; [`load_error`] has one variant per check.
//! - [`manifest`]: the static manifest, read from the file without loading it.
//! - [`registrar`]: the host side of `on_register`.
//! - [`component_call`]: the one way any component instance is called (built in, plugin
//!   in this process, isolated plugin).
//! - [`component`]: component defs and the live instance handle the pipeline calls.
//! - [`policy_def`]: policy defs, their validated factories and the builder.
//! - [`params`], [`partition`], [`inputs`] (the request and the candidate columns),
//!   [`labels`], [`engine`]: what crosses on each call, in host form, and the ABI views
//!   made from it.
//! - [`shared_call`]: one call of an isolated plugin, laid out in shared memory.
//! - [`logger`]: plugin logging (ABI 1.5), rate-limited per factory or instance.
//! - [`error_buffer`]: the buffer plugins write messages into, `CallError`, and the panic
//!   guard of every host callback.
//!
//! Every call into plugin code is one `unsafe` block with a `SAFETY:` note; every host
//! `extern "C"` function runs inside `host_guard`, so nothing unwinds into C.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod abi_checks;
mod call_window;
pub mod component;
pub mod component_call;
pub mod elf_check;
pub mod engine;
pub mod error_buffer;
pub mod image;
pub mod inputs;
pub mod labels;
pub mod library;
pub mod load_error;
pub mod logger;
pub mod manifest;
pub mod params;
pub mod partition;
pub mod policy_def;
pub mod registrar;
pub mod shared_call;

pub use abi_checks::{PluginInfo, RevisionRule, HOST_ABI_MINOR};
pub use component::{
    AdmissionFields, ComponentDef, ComponentInstance, ComponentKind, Lifecycle, Outcome,
};
pub use component_call::{Builtin, BuiltinInstance, Component};
pub use engine::{EngineReading, EngineReport, EngineSample};
pub use error_buffer::{CallError, ErrorBuffer};
pub use image::PluginImage;
pub use inputs::Columns;
pub use inputs::{
    AbiRequest, InputTriggerName, PromptBlocks, RequestAttributes, RouteRequest, SessionInfo,
};
pub use labels::Labels;
pub use library::{load, LoadedLibrary, LoadedPlugin, PluginSpec};
pub use load_error::LoadError;
pub use logger::{LogLine, PluginLogger};
pub use manifest::Manifest;
pub use params::OwnedParams;
pub use partition::PartitionKey;
pub use policy_def::{Built, BuiltComponent, PluginPolicyFactory, PolicyDef};
pub use registrar::Registered;
pub use switchyard_plugin_sdk::Status;
