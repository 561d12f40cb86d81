//! The plugin host: everything that touches a plugin library.
//!
//! - [`plugin`]: the plugin boundary. The only code that holds raw ABI values, calls
//!   plugin code or implements `extern "C"` functions: the loader, the ABI checks, the
//!   registrar, builder and params callbacks, component and policy handles, the one
//!   call path of every component instance (`plugin::component_call`: built in, plugin in
//!   this process, isolated plugin), and the layout of an isolated call in shared memory.
//! - [`isolation`]: plugins run in supervised child processes (`isolation: process`).
//! - [`file_gate`]: the one way any file the config names is opened and read (regular,
//!   bounded in size, read in bounded steps); the lowest crate, so every layer reaches it.
//!
//! Nothing here knows the config file, the fleet or the network: the layers above
//! (`switchyard-config`, `switchyard-policy`, `switchyard-fleet`, `switchyard-serve`,
//! the `switchyard` binary) depend on this crate, never the other way round.

pub mod file_gate;
pub mod isolation;
pub mod plugin;
