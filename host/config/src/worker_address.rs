//! Where a worker may point the router: engine URLs of the form `http(s)://host:port`
//! and nothing else, KV-event endpoints `tcp://host:port`, and the operator's allow-list
//! (`router.worker_networks`). A worker is an instruction to send users' prompts
//! somewhere; these checks are what keeps it from naming an attacker's host, the
//! router's own admin routes, or a URL carrying credentials.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

/// An engine's base URL, checked: scheme, host and port only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineUrl {
    pub https: bool,
    pub host: String,
    pub port: u16,
}

impl EngineUrl {
    /// Parses `http://host:port` or `https://host:port` (a trailing `/` is allowed).
    pub fn parse(text: &str) -> Result<EngineUrl, String> {
        let expected = "expected http://HOST:PORT or https://HOST:PORT and nothing else";
        let url = url::Url::parse(text)
            .map_err(|e| format!("`{text}` is not a URL ({e}); {expected}"))?;
        let https = match url.scheme() {
            "http" => false,
            "https" => true,
            other => return Err(format!("scheme `{other}` in `{text}`; {expected}")),
        };
        if !url.username().is_empty() || url.password().is_some() {
            // The URL itself is not repeated: it holds a credential.
            return Err(format!("the URL carries a user name or password; {expected}. Credentials in URLs would be sent to the engine and shown by GET /v1/workers"));
        }
        if url.path() != "/" && !url.path().is_empty() {
            return Err(format!(
                "`{text}` has a path (`{}`); {expected}: the router adds the OpenAI paths itself",
                url.path()
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!("`{text}` has a query or fragment; {expected}"));
        }
        let host = match url.host() {
            Some(url::Host::Domain(d)) => d.to_owned(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            None => return Err(format!("`{text}` has no host; {expected}")),
        };
        let port = url
            .port_or_known_default()
            .ok_or_else(|| format!("`{text}` has no port; {expected}"))?;
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

/// Splits `tcp://host:port` (ZeroMQ's form for a peer's address).
pub fn parse_tcp_endpoint(text: &str) -> Result<(String, u16), String> {
    let expected = "expected tcp://HOST:PORT (the engine's address, not the `*` it binds)";
    let rest = text
        .strip_prefix("tcp://")
        .ok_or_else(|| format!("`{text}`: {expected}"))?;
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| format!("`{text}` has no port: {expected}"))?;
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
        _ => Err(format!("`{text}`: {expected}")),
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
    pub fn parse(entries: &[String]) -> Result<WorkerNetworks, String> {
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
                    Err(format!("`router.worker_networks` entry `{entry}`: expected a network (10.0.0.0/8), an address, a host name or `*.domain`"))
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

/// Whether `host:port` is one of the router's own listeners (`own`: every address they
/// answer on, wildcard binds expanded to the machine's addresses).
pub fn is_own_address(host: &str, port: u16, own: &[SocketAddr]) -> bool {
    let ip = match host.parse::<IpAddr>() {
        Ok(ip) => ip.to_canonical(),
        Err(_) if host.eq_ignore_ascii_case("localhost") => {
            return own.iter().any(|a| a.port() == port && a.ip().is_loopback())
        }
        Err(_) => return false,
    };
    own.iter()
        .any(|a| a.port() == port && (a.ip().to_canonical() == ip || ip.is_unspecified()))
}
