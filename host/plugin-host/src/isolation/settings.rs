//! How isolated plugin processes are supervised: the `isolation:` section of the config,
//! defined here because the supervisor is what reads it.

use serde::{Deserialize, Serialize};

/// How isolated plugin processes are supervised (`isolation:`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IsolationSettings {
    /// A component call that takes longer fails (its instance's `on_error` answers).
    pub call_deadline_ms: f64,
    /// A call still running this long after its deadline: the child is killed and restarted.
    pub kill_after_ms: u64,
    /// Creating instances and other control requests to a child give up after this long.
    pub control_timeout_ms: u64,
    /// First wait before restarting a child that died; doubled per death in a row up to
    /// `restart_backoff_max_ms`, back to the first after a minute up.
    pub restart_backoff_ms: u64,
    pub restart_backoff_max_ms: u64,
    /// A child's data limit (RLIMIT_DATA: heap, private mappings, thread stacks), if any.
    pub memory_limit_mb: Option<u64>,
    /// A child's CPU-time limit in seconds (RLIMIT_CPU: the kernel kills it past that).
    pub cpu_time_limit_secs: Option<u64>,
    /// A seccomp filter in each child: plugin code that starts a program or process, or
    /// traces another, kills the child (SIGSYS).
    pub seccomp: bool,
    /// The most candidates one isolated call may carry (sizes each shared-memory channel;
    /// only the pages a fleet touches are resident).
    pub max_candidates: usize,
    /// How long a caller spins before it sleeps on the futex, waiting for an answer (and
    /// a child's call thread waiting for the next call), in microseconds.
    pub spin_us: u64,
}

impl Default for IsolationSettings {
    fn default() -> Self {
        IsolationSettings {
            call_deadline_ms: 50.0,
            kill_after_ms: 1_000,
            control_timeout_ms: 10_000,
            restart_backoff_ms: 100,
            restart_backoff_max_ms: 10_000,
            memory_limit_mb: None,
            cpu_time_limit_secs: None,
            seccomp: false,
            max_candidates: 65_536,
            spin_us: 50,
        }
    }
}
