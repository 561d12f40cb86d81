//! Isolation for untrusted plugins (`isolation: process`, docs/isolation.md): a library
//! runs in a supervised child process (this same binary, `__isolated-plugins`), so a
//! plugin that aborts, exits, crashes, corrupts its heap or hangs takes down only that
//! child. Its instances answer through their `on_error` while it is restarted.
//!
//! - [`supervisor`]: the router's side of one child: start (with limits), control
//!   requests, death and deadline supervision, restart with backoff, counters.
//! - [`remote`]: isolated instances as pipeline stages, and the shared-memory channels
//!   their calls cross (one per policy and process).
//! - [`region`]: memfd regions and the futex waits on their sequence words.
//! - [`control`]: the control connection's messages.
//! - [`child`]: the child process itself; [`seccomp`]: its optional system-call filter.
//!
//! The call's layout in shared memory is the plugin boundary's (`plugin::shared_call`).

pub mod channel;
pub mod child;
pub mod control;
pub mod region;
pub mod remote;
pub mod seccomp;
pub mod settings;
pub mod supervisor;

pub use remote::{
    build_policy, create_component, share_channels, validate_policy, BuiltPart, RemoteInstance,
};
pub use settings::IsolationSettings;
pub use supervisor::{IsolatedProcess, ProcessSnapshot};

/// How a child process ended, in words (the signal's name when one killed it).
pub fn describe_exit(status: std::process::ExitStatus, finished: bool) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(signal) = status.signal() {
        let name = nix::sys::signal::Signal::try_from(signal)
            .map_or_else(|_| String::new(), |s| format!(" ({})", s.as_str()));
        return format!("was killed by signal {signal}{name}");
    }
    match status.code() {
        Some(code) if !finished => format!("made the process exit with status {code}"),
        Some(code) => format!("ended the process with status {code}"),
        None => "ended the process abnormally".to_owned(),
    }
}
