//! `router.session_affinity`: the router binds a session to the worker its last request
//! was dispatched to, and sends the session's next requests there (docs/configuration.md,
//! "Sessions").

use serde::{Deserialize, Serialize};

/// How strongly a session keeps to its worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AffinityMode {
    /// No binding: every request is routed on its own.
    #[default]
    Off,
    /// To its worker while the worker is under `soft_max_active_requests` (and not at an
    /// admission.busy threshold); else routed on its own, and bound to where it went.
    Soft,
    /// Always to its worker while the worker is a candidate; only a worker that left (or
    /// is unhealthy) lets the session move.
    Hard,
}

/// `router.session_affinity`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionAffinity {
    pub mode: AffinityMode,
    /// Soft: the bound worker is kept while its active requests are below this.
    pub soft_max_active_requests: u32,
    /// A binding unused this long is forgotten.
    pub ttl_secs: u64,
    /// The most sessions bound at once; past it the least recently used is forgotten.
    pub max_sessions: usize,
}

impl Default for SessionAffinity {
    fn default() -> Self {
        SessionAffinity {
            mode: AffinityMode::Off,
            soft_max_active_requests: 8,
            ttl_secs: 600,
            max_sessions: 1 << 20,
        }
    }
}

impl SessionAffinity {
    /// The knobs that must be at least 1, for the config's check.
    pub fn positive(&self) -> [(&'static str, u64); 3] {
        [
            (
                "soft_max_active_requests",
                u64::from(self.soft_max_active_requests),
            ),
            ("ttl_secs", self.ttl_secs),
            ("max_sessions", self.max_sessions as u64),
        ]
    }
}
