//! What is wrong in a section that checks itself (`replicas:`, `request_attributes:`,
//! `engine_metrics:`, `admission:`, `discovery:`); the config places it at the section's line.

use crate::attributes::MAX_LISTED_HEADERS;

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SectionInvalid {
    #[error("`replicas.nats` `{0}`: expected nats://HOST:PORT")]
    NatsUrl(String),
    #[error("`replicas.nats` carries credentials; put the token in a file named by `replicas.token_file`")]
    NatsCredentials,
    #[error("`replicas.subject` `{0}`: a NATS subject token without spaces, `*` or `>`")]
    Subject(String),
    #[error("`replicas.peer_ttl_ms` ({peer_ttl_ms}) must be larger than `replicas.heartbeat_ms` ({heartbeat_ms}), and both at least 1")]
    PeerTtl { peer_ttl_ms: u64, heartbeat_ms: u64 },
    #[error("`request_attributes.headers` lists {0} headers; at most {MAX_LISTED_HEADERS}")]
    TooManyHeaders(usize),
    #[error("`request_attributes`: `{0}` is not an HTTP header name")]
    HeaderName(String),
    #[error("`request_attributes`: `{0}` carries credentials and is never handed to policies; name another header")]
    CredentialHeader(String),
    #[error("`request_attributes.tenant`: `{0}` is not a tenant source; expected `key`, `user` or `header:NAME`")]
    TenantSource(String),
    #[error("`request_attributes.max_value_bytes` must be at least 1")]
    MaxValueBytes,
    #[error("`request_attributes.lora_adapters`: `{adapter}: {base}` must map an adapter name to another, base model")]
    AdapterMapping { adapter: String, base: String },
    #[error("`engine_metrics.timeout_ms`, `max_bytes` and `concurrency` must be at least 1")]
    EngineMetrics,
    #[error("`{0}`: every rate and burst is a number above 0")]
    Rate(String),
    #[error("`admission.rate_limits`: {0}")]
    RateLimits(Box<SectionInvalid>),
    #[error("`admission.busy.max_engine_waiting` must be a number >= 0")]
    MaxEngineWaiting,
    #[error("`admission.busy.max_kv_cache_usage` is a fraction from 0 to 1")]
    MaxKvCacheUsage,
    #[error("`admission.queue.max_wait_ms` must be at least 1")]
    MaxWait,
    #[error("`admission.queue.tenant_weights`: `{0}` has weight 0; a weight is at least 1")]
    ZeroWeight(String),
    #[error("`discovery.kubernetes.{0}` `{1}` is not a Kubernetes name: lowercase letters, digits and `-` (and `.` in a pool's name), starting and ending with a letter or digit")]
    KubernetesName(&'static str, String),
    #[error("`discovery.kubernetes.{0}` `{1}` is not a label key: an optional DNS prefix and `/`, then up to 63 letters, digits, `-`, `_` or `.`")]
    LabelKey(&'static str, String),
    #[error("`discovery.kubernetes.model` must not be empty; leave it out to skip pods without the model label")]
    EmptyDiscoveryModel,
    #[error("`discovery.kubernetes.kv_events`: `port` and `replay_port` are port numbers from 1 to 65535")]
    KvEventPort,
}
