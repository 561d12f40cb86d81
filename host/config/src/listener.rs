//! How the router's listeners meet the network (`http:`, `ext_proc.tls`): TLS, and the
//! limits that keep idle, slow or too many connections from locking other clients out.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// TLS on a listener: PEM files, relative to the config's folder, read again on reload.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSettings {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Clients must present a certificate signed by one of these CAs (mutual TLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<PathBuf>,
}

/// The HTTP listener's settings (`http:`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSettings {
    /// Serve HTTPS with this certificate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSettings>,
    /// A client has this long to send a request's headers (and the TLS handshake),
    /// counted from the connection's start or the previous answer's end: it is also how
    /// long an HTTP/1.1 connection may sit idle between requests.
    pub header_read_timeout_secs: u64,
    /// A connection with no request in flight for this long is closed (HTTP/2 as well).
    pub idle_timeout_secs: u64,
    /// A request's body must arrive within this long of its headers.
    pub body_read_timeout_secs: u64,
    /// A larger request body is refused with 413.
    pub max_body_bytes: usize,
    /// Connections open at once. 0: half the open-file limit (each proxied request
    /// also holds a socket to its engine). When full, the oldest idle connection is
    /// closed for a new one; with none idle, the new one is refused.
    pub max_connections: usize,
    /// Connections open at once from one IP address. Raise it when a load balancer's few
    /// addresses carry every client.
    pub max_connections_per_peer: usize,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            tls: None,
            header_read_timeout_secs: 10,
            idle_timeout_secs: 60,
            body_read_timeout_secs: 30,
            max_body_bytes: 2 << 20,
            max_connections: 0,
            max_connections_per_peer: 1024,
        }
    }
}

impl HttpSettings {
    /// The settings read only at startup (all but `tls`, which reloads), to compare.
    pub fn without_tls(&self) -> HttpSettings {
        HttpSettings {
            tls: None,
            ..self.clone()
        }
    }

    /// The connection cap in force: `max_connections`, or half of `open_files`.
    pub fn connection_cap(&self, open_files: u64) -> usize {
        if self.max_connections > 0 {
            self.max_connections
        } else {
            usize::try_from(open_files.saturating_sub(64) / 2)
                .unwrap_or(usize::MAX)
                .max(16)
        }
    }

    /// The settings that must be at least 1, by name.
    pub fn positive(&self) -> [(&'static str, u64); 5] {
        [
            ("header_read_timeout_secs", self.header_read_timeout_secs),
            ("idle_timeout_secs", self.idle_timeout_secs),
            ("body_read_timeout_secs", self.body_read_timeout_secs),
            ("max_body_bytes", self.max_body_bytes as u64),
            (
                "max_connections_per_peer",
                self.max_connections_per_peer as u64,
            ),
        ]
    }
}
