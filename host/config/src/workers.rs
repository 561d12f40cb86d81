//! A worker as the config lists it: its model, identity, role, addresses, KV event
//! source and capacity, and the checks on them.

use super::*;
use crate::worker_address::AddressError;

/// A worker's `worker_type` as the config spells it: `prefill`, `decode` or `aggregated`
/// (`select`, the SDK's `WorkerType::Select`, is accepted too: one pool, two words).
mod role {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use switchyard_plugin_sdk::WorkerType;

    #[derive(Deserialize, Serialize)]
    #[serde(rename_all = "lowercase")]
    enum Spelled {
        Prefill,
        Decode,
        #[serde(alias = "select")]
        Aggregated,
    }

    pub fn serialize<S: Serializer>(role: &WorkerType, to: S) -> Result<S::Ok, S::Error> {
        match role {
            WorkerType::Prefill => Spelled::Prefill,
            WorkerType::Decode => Spelled::Decode,
            WorkerType::Select => Spelled::Aggregated,
        }
        .serialize(to)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(from: D) -> Result<WorkerType, D::Error> {
        Ok(match Spelled::deserialize(from)? {
            Spelled::Prefill => WorkerType::Prefill,
            Spelled::Decode => WorkerType::Decode,
            Spelled::Aggregated => WorkerType::Select,
        })
    }
}
/// The largest `total_kv_blocks` taken: 2^32 blocks is more KV cache than any engine
/// has; a larger number is a typo (or `u64::MAX`) that would lift the index's bound.
pub const MAX_TOTAL_KV_BLOCKS: u64 = 1 << 32;
fn default_batched_tokens() -> u64 {
    8_192
}

/// A worker (one data-parallel rank of an engine), as configured or added over HTTP.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSpec {
    pub model: String,
    pub worker_id: u64,
    #[serde(default)]
    pub dp_rank: u32,
    #[serde(default, with = "role")]
    pub worker_type: WorkerType,
    /// The engine's KV cache in blocks, when the operator knows it better than the
    /// engine reports it. Optional: the KV index's bound for the worker is a safety net
    /// sized from this, the engine's reported capacity or `router.kv_bound_blocks_per_worker`,
    /// whichever is largest (docs/kv-events.md), never a limit on what the engine holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_kv_blocks: Option<u64>,
    #[serde(default = "default_batched_tokens")]
    pub max_batched_tokens: u64,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Cost multiplier from preferred routing constraints (taints), if any.
    #[serde(default)]
    pub preferred_taint_multiplier: Option<f64>,
    /// The worker's OpenAI-compatible engine, `http://host:port`, for the frontend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The engine's `ip:port` as a gateway reaches it: what the Envoy endpoint picker
    /// answers. Without it, `url`'s host and port when the host is an IP address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Where its engine publishes KV events (vLLM/SGLang ZeroMQ format), if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_events: Option<KvEventSource>,
    /// SGLang prefill workers: the port of the engine's bootstrap server
    /// (`--disaggregation-bootstrap-port`, 8998 by default); without it, `url`'s port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_port: Option<u16>,
}

/// Where a worker's engine publishes its KV events (`workers[].kv_events`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KvEventSource {
    /// The engine's PUB socket, e.g. `tcp://10.0.0.5:5557` (vLLM's
    /// `--kv-events-config '{"endpoint": "tcp://*:5557", ...}'`; with data parallelism
    /// each rank publishes on its own port: base + rank).
    pub endpoint: String,
    /// The engine's replay ROUTER socket (`replay_endpoint`, e.g. `tcp://10.0.0.5:5558`):
    /// lost batches are asked for there. Without it a gap clears the worker's blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_endpoint: Option<String>,
    /// The topic the engine publishes on (vLLM's default: empty).
    #[serde(default)]
    pub topic: String,
}

/// What is wrong with a worker's entry (`workers:` or `POST /v1/workers`).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum WorkerInvalid {
    #[error("`address` must be an IP address and port like 10.0.0.7:8000, got `{0}`")]
    Address(String),
    #[error("`model` must not be empty")]
    EmptyModel,
    #[error("`total_kv_blocks` must be between 1 and {max} (2^32), got {0}; leave it out to size the worker's KV index from its engine", max = MAX_TOTAL_KV_BLOCKS)]
    KvBlocks(u64),
    #[error("`url`: {0}")]
    Url(AddressError),
    #[error("kv_events.{field}: {error}")]
    KvEvents {
        field: &'static str,
        error: AddressError,
    },
    #[error("`preferred_taint_multiplier` must be a finite number >= 0, got {0}")]
    TaintMultiplier(f64),
    /// A destination is the router's own listener.
    #[error("`{field}` points at the router itself ({host}:{port}); a worker must be an engine")]
    OwnAddress {
        field: &'static str,
        host: String,
        port: u16,
    },
    /// A destination's host name resolves to one of the router's own addresses.
    #[error("`{field}` points at the router itself: `{host}` resolves to {address}, and the router listens there on port {port}; a worker must be an engine: give the engine's own host and port")]
    ResolvesToOwn {
        field: &'static str,
        host: String,
        port: u16,
        address: std::net::IpAddr,
    },
    /// A destination's host name could not be checked against the router's addresses.
    #[error("`{field}` host `{host}` did not resolve within {seconds} s, so it cannot be checked that it is not the router itself; retry when the name resolves, or give the engine's IP address")]
    Unresolved {
        field: &'static str,
        host: String,
        seconds: u64,
    },
    #[error("`address` `{0}` has port 0, which no engine listens on; give the engine's port, like 10.0.0.7:8000")]
    AddressPortZero(String),
    #[error("`bootstrap_port` is 0, which no engine listens on; give the port of the engine's bootstrap server (SGLang's --disaggregation-bootstrap-port, 8998 by default), or leave it out to use `url`'s port")]
    BootstrapPortZero,
    #[error("`{field}` host `{host}` is not in `router.worker_networks`; add its network or name there if it is one of your engines")]
    NotAllowed { field: &'static str, host: String },
}

impl KvEventSource {
    /// Checks the endpoints' form (`tcp://host:port`).
    pub fn validate(&self) -> Result<(), WorkerInvalid> {
        for (field, endpoint) in self.endpoints() {
            worker_address::parse_tcp_endpoint(endpoint)
                .map_err(|error| WorkerInvalid::KvEvents { field, error })?;
        }
        Ok(())
    }

    /// `endpoint` and `replay_endpoint` when set, by field name.
    fn endpoints(&self) -> impl Iterator<Item = (&'static str, &String)> {
        std::iter::once(("endpoint", &self.endpoint))
            .chain(self.replay_endpoint.iter().map(|e| ("replay_endpoint", e)))
    }
}

impl WorkerSpec {
    pub fn id(&self) -> WorkerId {
        WorkerId {
            worker_id: self.worker_id,
            dp_rank: self.dp_rank,
        }
    }
    pub fn partition(&self) -> PartitionKey {
        PartitionKey::new(self.model.clone(), self.worker_type)
    }
    /// The `ip:port` a gateway sends this worker's requests to, if it has one.
    pub fn endpoint(&self) -> Option<std::net::SocketAddr> {
        match &self.address {
            Some(address) => address.parse().ok(),
            None => EngineUrl::parse(self.url.as_deref()?).ok()?.socket_addr(),
        }
    }

    /// Every host and port this worker makes the router (or a gateway) talk to, each
    /// with the field that names it.
    fn destinations(&self) -> Vec<(&'static str, String, u16)> {
        let mut out = Vec::new();
        if let Some(url) = self.url.as_deref().and_then(|u| EngineUrl::parse(u).ok()) {
            out.push(("url", url.host, url.port));
        }
        if let Some(address) = self.endpoint().filter(|_| self.address.is_some()) {
            out.push(("address", address.ip().to_string(), address.port()));
        }
        for (field, endpoint) in self.kv_events.iter().flat_map(KvEventSource::endpoints) {
            if let Ok((host, port)) = worker_address::parse_tcp_endpoint(endpoint) {
                out.push((
                    if field == "endpoint" {
                        "kv_events.endpoint"
                    } else {
                        "kv_events.replay_endpoint"
                    },
                    host,
                    port,
                ));
            }
        }
        out
    }

    /// Checks where the worker points against the allow-list and the router's own
    /// listeners (`own`): a worker must not turn the router against itself.
    pub fn check_destinations(
        &self,
        networks: &WorkerNetworks,
        own: &[std::net::SocketAddr],
    ) -> Result<(), WorkerInvalid> {
        use worker_address::SelfCheck;
        for (field, host, port) in self.destinations() {
            let timeout = worker_address::RESOLVE_TIMEOUT;
            match worker_address::check_own_address(&host, port, own, timeout) {
                SelfCheck::Elsewhere => {}
                SelfCheck::Own => return Err(WorkerInvalid::OwnAddress { field, host, port }),
                SelfCheck::ResolvesToOwn(address) => {
                    return Err(WorkerInvalid::ResolvesToOwn {
                        field,
                        host,
                        port,
                        address,
                    })
                }
                SelfCheck::Unresolved => {
                    return Err(WorkerInvalid::Unresolved {
                        field,
                        host,
                        seconds: timeout.as_secs(),
                    })
                }
            }
            if !networks.permits(&host) {
                return Err(WorkerInvalid::NotAllowed { field, host });
            }
        }
        Ok(())
    }

    /// Checks the values serde cannot.
    pub fn validate(&self) -> Result<(), WorkerInvalid> {
        if let Some(address) = &self.address {
            match address.parse::<std::net::SocketAddr>() {
                Err(_) => return Err(WorkerInvalid::Address(address.clone())),
                Ok(a) if a.port() == 0 => {
                    return Err(WorkerInvalid::AddressPortZero(address.clone()))
                }
                Ok(_) => {}
            }
        }
        if self.model.trim().is_empty() {
            return Err(WorkerInvalid::EmptyModel);
        }
        if let Some(blocks) = self.total_kv_blocks {
            if blocks == 0 || blocks > MAX_TOTAL_KV_BLOCKS {
                return Err(WorkerInvalid::KvBlocks(blocks));
            }
        }
        if let Some(url) = &self.url {
            EngineUrl::parse(url).map_err(WorkerInvalid::Url)?;
        }
        if let Some(source) = &self.kv_events {
            source.validate()?;
        }
        if let Some(m) = self.preferred_taint_multiplier {
            if !m.is_finite() || m < 0.0 {
                return Err(WorkerInvalid::TaintMultiplier(m));
            }
        }
        if self.bootstrap_port == Some(0) {
            return Err(WorkerInvalid::BootstrapPortZero);
        }
        Ok(())
    }
}
