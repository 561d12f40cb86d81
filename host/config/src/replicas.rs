//! Several routers as one (`replicas:`): each publishes its bookings on a NATS bus and
//! counts the others' (docs/replicas.md).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::SectionInvalid;

/// The `replicas:` section; absent: this router works alone.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaSettings {
    /// The NATS server, `nats://HOST:PORT` (no credentials in it: `token_file`).
    pub nats: String,
    /// This replica's name on the bus; default: host name, process id and a random suffix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The subjects' prefix: replicas of one fleet share it.
    #[serde(default = "default_subject")]
    pub subject: String,
    /// A file holding the NATS server's auth token, relative to the config's folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// How often a replica says it is alive.
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// A replica not heard from for this long is gone: its bookings are dropped.
    #[serde(default = "default_peer_ttl_ms")]
    pub peer_ttl_ms: u64,
    /// At start (and when the bus comes back), how long to collect the others' bookings
    /// before serving.
    #[serde(default = "default_snapshot_wait_ms")]
    pub snapshot_wait_ms: u64,
}

fn default_subject() -> String {
    "switchyard".to_owned()
}
fn default_heartbeat_ms() -> u64 {
    500
}
fn default_peer_ttl_ms() -> u64 {
    3_000
}
fn default_snapshot_wait_ms() -> u64 {
    300
}

impl ReplicaSettings {
    /// Checks what serde cannot; the message names the setting.
    pub fn validate(&self) -> Result<(), SectionInvalid> {
        let rest = self
            .nats
            .strip_prefix("nats://")
            .ok_or_else(|| SectionInvalid::NatsUrl(self.nats.clone()))?;
        if rest.contains('@') {
            return Err(SectionInvalid::NatsCredentials);
        }
        if rest
            .rsplit_once(':')
            .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
        {
            return Err(SectionInvalid::NatsUrl(self.nats.clone()));
        }
        if self.subject.is_empty()
            || self
                .subject
                .contains(|c: char| c.is_whitespace() || matches!(c, '*' | '>'))
        {
            return Err(SectionInvalid::Subject(self.subject.clone()));
        }
        if self.heartbeat_ms == 0 || self.peer_ttl_ms <= self.heartbeat_ms {
            return Err(SectionInvalid::PeerTtl {
                peer_ttl_ms: self.peer_ttl_ms,
                heartbeat_ms: self.heartbeat_ms,
            });
        }
        Ok(())
    }
}
