//! Where a worker may point the router: engine URLs of the form `http(s)://host:port`
//! and nothing else, KV-event endpoints `tcp://host:port`, and the operator's allow-list
//! (`router.worker_networks`). A worker is an instruction to send users' prompts
//! somewhere; these checks are what keeps it from naming an attacker's host, the
//! router's own admin routes, or a URL carrying credentials.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ipnet::IpNet;

const EXPECTED_URL: &str = "expected http://HOST:PORT or https://HOST:PORT and nothing else";
const EXPECTED_TCP: &str = "expected tcp://HOST:PORT (the engine's address, not the `*` it binds)";

/// What is wrong with a worker's address: each names the text (except a URL with a
/// credential, which is never repeated) and the form expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("`{text}` is not a URL ({reason}); {EXPECTED_URL}")]
    NotUrl { text: String, reason: String },
    #[error("scheme `{scheme}` in `{text}`; {EXPECTED_URL}")]
    Scheme { text: String, scheme: String },
    #[error("the URL carries a user name or password; {EXPECTED_URL}. Credentials in URLs would be sent to the engine and shown by GET /v1/workers")]
    Credentials,
    #[error(
        "`{text}` has a path (`{path}`); {EXPECTED_URL}: the router adds the OpenAI paths itself"
    )]
    Path { text: String, path: String },
    #[error("`{0}` has a query or fragment; {EXPECTED_URL}")]
    Query(String),
    #[error("`{0}` has no host; {EXPECTED_URL}")]
    NoHost(String),
    #[error("`{0}` has no port; {EXPECTED_URL} (the port is required, even 80 or 443)")]
    NoPort(String),
    #[error("`{0}` has port 0, which no engine listens on; {EXPECTED_URL} with the engine's port")]
    PortZero(String),
    #[error("`{0}`: {EXPECTED_TCP}")]
    NotTcp(String),
    #[error("`{0}` has no port: {EXPECTED_TCP}")]
    NoTcpPort(String),
    #[error("`router.worker_networks` entry `{0}`: expected a network (10.0.0.0/8), an address, a host name or `*.domain`")]
    NetworkEntry(String),
}

/// An engine's base URL, checked: scheme, host and port only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineUrl {
    pub https: bool,
    pub host: String,
    pub port: u16,
}

impl EngineUrl {
    /// Parses `http://host:port` or `https://host:port` (a trailing `/` is allowed).
    pub fn parse(text: &str) -> Result<EngineUrl, AddressError> {
        let url = url::Url::parse(text).map_err(|e| AddressError::NotUrl {
            text: text.to_owned(),
            reason: e.to_string(),
        })?;
        let https = match url.scheme() {
            "http" => false,
            "https" => true,
            other => {
                return Err(AddressError::Scheme {
                    text: text.to_owned(),
                    scheme: other.to_owned(),
                })
            }
        };
        if !url.username().is_empty() || url.password().is_some() {
            // The URL itself is not repeated: it holds a credential.
            return Err(AddressError::Credentials);
        }
        if url.path() != "/" && !url.path().is_empty() {
            return Err(AddressError::Path {
                text: text.to_owned(),
                path: url.path().to_owned(),
            });
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(AddressError::Query(text.to_owned()));
        }
        let host = match url.host() {
            Some(url::Host::Domain(d)) => d.to_owned(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            None => return Err(AddressError::NoHost(text.to_owned())),
        };
        // The url crate drops a port equal to the scheme's default: read the text.
        let port = match url.port() {
            Some(0) => return Err(AddressError::PortZero(text.to_owned())),
            Some(port) => port,
            None if has_port(text) => url.port_or_known_default().unwrap_or(0),
            None => return Err(AddressError::NoPort(text.to_owned())),
        };
        Ok(EngineUrl { https, host, port })
    }

    /// The host as an IP address, when it is one.
    pub fn ip(&self) -> Option<IpAddr> {
        self.host.parse().ok()
    }

    /// `ip:port` when the host is an IP address.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        Some(SocketAddr::new(self.ip()?, self.port))
    }
}

/// Whether a URL's authority names a port (`host:port`, `[v6]:port`), read from its text.
fn has_port(text: &str) -> bool {
    let rest = text.split_once("://").map_or(text, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_end = authority.rfind(']').map_or(0, |i| i + 1);
    authority[host_end..]
        .rsplit_once(':')
        .is_some_and(|(_, port)| !port.is_empty())
}

/// Splits `tcp://host:port` (ZeroMQ's form for a peer's address).
pub fn parse_tcp_endpoint(text: &str) -> Result<(String, u16), AddressError> {
    let rest = text
        .strip_prefix("tcp://")
        .ok_or_else(|| AddressError::NotTcp(text.to_owned()))?;
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| AddressError::NoTcpPort(text.to_owned()))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = port.parse::<u16>().ok().filter(|p| *p > 0);
    let valid_host = !host.is_empty()
        && host != "*"
        && (host.parse::<IpAddr>().is_ok()
            || host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.')));
    match port {
        Some(port) if valid_host => Ok((host.to_owned(), port)),
        _ => Err(AddressError::NotTcp(text.to_owned())),
    }
}

/// One entry of `router.worker_networks`.
#[derive(Clone, Debug)]
enum Allowed {
    Network(IpNet),
    /// A host name, exactly.
    Name(String),
    /// `*.suffix`: any name ending in `.suffix`.
    Suffix(String),
}

/// The operator's allow-list of worker hosts. Empty: any host.
#[derive(Clone, Debug, Default)]
pub struct WorkerNetworks {
    allowed: Vec<Allowed>,
    /// Admits no host (a list that did not parse).
    closed: bool,
}

impl WorkerNetworks {
    /// Parses the entries: networks (`10.0.0.0/8`), addresses (`10.0.0.5`), host names
    /// (`engine-1.internal`) and name suffixes (`*.engines.internal`).
    pub fn parse(entries: &[String]) -> Result<WorkerNetworks, AddressError> {
        let allowed = entries
            .iter()
            .map(|entry| {
                let entry = entry.trim();
                if let Ok(net) = entry.parse::<IpNet>() {
                    Ok(Allowed::Network(net))
                } else if let Ok(ip) = entry.parse::<IpAddr>() {
                    Ok(Allowed::Network(IpNet::from(ip)))
                } else if let Some(suffix) = entry.strip_prefix("*.") {
                    Ok(Allowed::Suffix(format!(".{}", suffix.to_ascii_lowercase())))
                } else if !entry.is_empty()
                    && entry
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.'))
                {
                    Ok(Allowed::Name(entry.to_ascii_lowercase()))
                } else {
                    Err(AddressError::NetworkEntry(entry.to_owned()))
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(WorkerNetworks {
            allowed,
            closed: false,
        })
    }

    pub fn is_open(&self) -> bool {
        self.allowed.is_empty() && !self.closed
    }

    /// A list that admits no host.
    pub fn closed() -> Self {
        WorkerNetworks {
            allowed: Vec::new(),
            closed: true,
        }
    }

    /// Whether `host` (an IP address or a name) is on the list. Names are matched as
    /// names: a name that resolves into an allowed network is not allowed by it, since
    /// what it resolves to can change after the check.
    pub fn permits(&self, host: &str) -> bool {
        if self.is_open() {
            return true;
        }
        match host.parse::<IpAddr>() {
            Ok(ip) => {
                let ip = ip.to_canonical();
                self.allowed
                    .iter()
                    .any(|a| matches!(a, Allowed::Network(net) if net.contains(&ip)))
            }
            Err(_) => {
                let host = host.to_ascii_lowercase();
                self.allowed.iter().any(|a| match a {
                    Allowed::Name(name) => *name == host,
                    Allowed::Suffix(suffix) => host.ends_with(suffix.as_str()),
                    Allowed::Network(_) => false,
                })
            }
        }
    }
}

/// How long a worker's host name may take to resolve when it is checked against the
/// router's own addresses.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Host-name lookups under way at once (each on a thread of its own, which outlives a
/// lookup that timed out); past this, a check is refused rather than another started.
const MAX_LOOKUPS: usize = 16;

static LOOKUPS: AtomicUsize = AtomicUsize::new(0);

/// Whether a destination is the router itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SelfCheck {
    /// Not one of the router's addresses (or the name does not resolve: then nothing
    /// answers there now).
    Elsewhere,
    /// `host:port` is the router's, as written (an address, or `localhost`).
    Own,
    /// The host name resolves to this address of the router's.
    ResolvesToOwn(IpAddr),
    /// The name could not be resolved in time (or too many lookups are under way): the
    /// check cannot say, so the destination is refused.
    Unresolved,
}

/// Whether `host:port` reaches one of the router's own listeners (`own`: every address
/// they answer on, wildcard binds expanded to the machine's interface addresses). A host
/// name is resolved (within `timeout`) and every address it resolves to compared;
/// without `own`, nothing is looked up.
pub fn check_own_address(
    host: &str,
    port: u16,
    own: &[SocketAddr],
    timeout: Duration,
) -> SelfCheck {
    if !own.iter().any(|a| a.port() == port) {
        return SelfCheck::Elsewhere;
    }
    let name = host.trim_end_matches('.').to_ascii_lowercase();
    if let Ok(ip) = name.parse::<IpAddr>() {
        return if is_own_ip(ip, port, own) {
            SelfCheck::Own
        } else {
            SelfCheck::Elsewhere
        };
    }
    if name == "localhost" || name.ends_with(".localhost") {
        return SelfCheck::Own;
    }
    match resolve(host, port, timeout) {
        Some(addresses) => addresses
            .into_iter()
            .find(|ip| is_own_ip(*ip, port, own))
            .map_or(SelfCheck::Elsewhere, SelfCheck::ResolvesToOwn),
        None => SelfCheck::Unresolved,
    }
}

/// Whether `ip:port` reaches a listener in `own`. Loopback addresses are one: a worker
/// at `[::1]` or `127.0.0.2` on a loopback listener's port is the router's machine, and
/// `0.0.0.0` / `::` as a destination is this machine.
fn is_own_ip(ip: IpAddr, port: u16, own: &[SocketAddr]) -> bool {
    let ip = ip.to_canonical();
    own.iter().any(|a| {
        let mine = a.ip().to_canonical();
        a.port() == port
            && (mine == ip || ip.is_unspecified() || (ip.is_loopback() && mine.is_loopback()))
    })
}

/// The addresses `host` resolves to; empty when it does not resolve, `None` when the
/// lookup took longer than `timeout` or too many are under way. The lookup runs on a
/// thread of its own, so the caller waits at most `timeout`.
fn resolve(host: &str, port: u16, timeout: Duration) -> Option<Vec<IpAddr>> {
    if LOOKUPS.fetch_add(1, Ordering::AcqRel) >= MAX_LOOKUPS {
        LOOKUPS.fetch_sub(1, Ordering::AcqRel);
        return None;
    }
    let (send, receive) = std::sync::mpsc::channel();
    let target = (host.to_owned(), port);
    let spawned = std::thread::Builder::new()
        .name("resolve-worker".into())
        .spawn(move || {
            let addresses: Vec<IpAddr> = target
                .to_socket_addrs()
                .map(|found| found.map(|a| a.ip()).collect())
                .unwrap_or_default();
            LOOKUPS.fetch_sub(1, Ordering::AcqRel);
            let _ = send.send(addresses);
        });
    if spawned.is_err() {
        LOOKUPS.fetch_sub(1, Ordering::AcqRel);
        return None;
    }
    receive.recv_timeout(timeout).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_secs(2);

    #[test]
    fn the_router_is_found_however_its_address_is_spelled() {
        let loopback: Vec<SocketAddr> = vec!["127.0.0.1:8080".parse().unwrap()];
        for host in [
            "127.0.0.1",
            "127.0.0.2",
            "::1",
            "::ffff:127.0.0.1",
            "0.0.0.0",
            "::",
        ] {
            assert_eq!(
                check_own_address(host, 8080, &loopback, WAIT),
                SelfCheck::Own,
                "{host}"
            );
        }
        for host in ["localhost", "LOCALHOST.", "engine.localhost"] {
            assert_eq!(
                check_own_address(host, 8080, &loopback, WAIT),
                SelfCheck::Own,
                "{host}"
            );
        }
        assert_eq!(
            check_own_address("127.0.0.1", 8081, &loopback, WAIT),
            SelfCheck::Elsewhere,
            "another port"
        );
        let lan: Vec<SocketAddr> = vec!["10.1.2.3:8080".parse().unwrap()];
        assert_eq!(
            check_own_address("10.1.2.4", 8080, &lan, WAIT),
            SelfCheck::Elsewhere
        );
        assert_eq!(
            check_own_address("10.1.2.3", 8080, &lan, WAIT),
            SelfCheck::Own
        );
        assert_eq!(
            check_own_address("127.0.0.1", 8080, &lan, WAIT),
            SelfCheck::Elsewhere,
            "a listener on one address only is not on loopback"
        );
    }

    #[test]
    fn only_a_name_on_a_router_port_is_looked_up() {
        // Nothing listens on port 9 of the router: no lookup is made (none leaves the host).
        let own: Vec<SocketAddr> = vec!["127.0.0.1:8080".parse().unwrap()];
        for own in [&own[..], &[]] {
            assert_eq!(
                check_own_address("no-such-host.invalid", 9, own, WAIT),
                SelfCheck::Elsewhere
            );
        }
    }

    #[test]
    fn an_engine_url_names_a_port_other_than_zero() {
        assert_eq!(EngineUrl::parse("http://10.0.0.1:80").unwrap().port, 80);
        assert_eq!(EngineUrl::parse("https://[::1]:443/").unwrap().port, 443);
        assert!(matches!(
            EngineUrl::parse("http://10.0.0.1"),
            Err(AddressError::NoPort(_))
        ));
        assert!(matches!(
            EngineUrl::parse("https://[::1]/"),
            Err(AddressError::NoPort(_))
        ));
        assert!(matches!(
            EngineUrl::parse("http://h:0"),
            Err(AddressError::PortZero(_))
        ));
    }
}
