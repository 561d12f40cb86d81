//! switchyard's operator tools, built on the layer crates: what `check` and
//! `plugin inspect` print, trace replay against simulated workers, `send-trace`, the
//! engine simulator, plugin project scaffolds and the plugin conformance run. The
//! `switchyard` binary wires them to its subcommands; none of them is on the request path.

// The layers under the names the router's own crate gives them.
use switchyard_config as config;
use switchyard_fleet as fleet;
use switchyard_plugin_host::{isolation, plugin};
use switchyard_policy as policy;
use switchyard_policy::startup;
use switchyard_serve as serve;

pub mod conformance;
pub mod dry_run;
pub mod engine_sim;
pub mod replay;
pub mod scaffold;
pub mod send_trace;
pub mod summary;
