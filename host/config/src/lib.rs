//! The YAML config: plugins to load, policy instances, router knobs, static workers.
//! Unknown keys are rejected; every error names the file and, where it can, the line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use switchyard_plugin_sdk::{WorkerId, WorkerType};

pub mod admission;
pub mod attributes;
pub mod auth;
pub mod discovery;
pub mod envoy_module;
pub mod hardening;
mod kv_event_limits;
mod limits;
pub mod listener;
pub mod replicas;
mod section_invalid;
pub mod session_affinity;
mod source;
pub mod worker_address;
mod workers;

pub use admission::{
    AdmissionSettings, AdmitterEntry, AdmitterOnError, BusyThresholds, QueueOrder, QueueSettings,
    RateLimit,
};
pub use attributes::{EngineMetricsSettings, RequestAttributeSettings, TenantSource};
pub use auth::{AuthSettings, Keyring};
pub use discovery::{DiscoverySettings, KubernetesDiscovery, PodKvEvents};
pub use kv_event_limits::KvEventLimits;
pub use limits::{MAX_CONFIG_BYTES, MAX_FLOW_DEPTH};
pub use listener::{HttpSettings, TlsSettings};
pub use replicas::ReplicaSettings;
pub use section_invalid::SectionInvalid;
pub use session_affinity::{AffinityMode, SessionAffinity};
pub use source::{ConfigError, ConfigSource};
pub use switchyard_plugin_host::isolation::IsolationSettings;
use switchyard_plugin_host::plugin::{PartitionKey, RevisionRule};
pub use worker_address::{EngineUrl, WorkerNetworks};
pub use workers::{KvEventSource, WorkerInvalid, WorkerSpec};

/// The config shipped inside the binary: the example plugins of all three languages,
/// with paths relative to the folder of the `switchyard` executable.
pub const EMBEDDED_DEFAULT: &str = include_str!("../default-config.yaml");
/// How the embedded config is named in messages.
pub const EMBEDDED_NAME: &str = "<embedded default config>";
/// The built-in policy's instance name (and type name); reserved in `instances`.
pub const BUILTIN_DEFAULT: &str = "default";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub plugins: Vec<PluginEntry>,
    #[serde(default)]
    pub worker_selection: WorkerSelection,
    #[serde(default)]
    pub router: RouterSettings,
    #[serde(default)]
    /// Workers known at startup (more can be added over HTTP).
    pub workers: Vec<WorkerSpec>,
    /// Per model: how the KV index learns what each worker caches.
    #[serde(default)]
    pub models: BTreeMap<String, ModelSettings>,
    /// The OpenAI-compatible frontend: upstream timeouts, retries, health probes.
    #[serde(default)]
    pub frontend: FrontendSettings,
    /// The Envoy external-processing endpoint picker (`ext_proc:`), off unless set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ext_proc: Option<ExtProcSettings>,
    /// Supervision of plugins run with `isolation: process` (docs/isolation.md).
    #[serde(default)]
    pub isolation: IsolationSettings,
    /// API keys of inference clients and operators (docs/security.md).
    #[serde(default)]
    pub auth: AuthSettings,
    /// The HTTP listener: TLS, timeouts, connection and body limits.
    #[serde(default)]
    pub http: HttpSettings,
    /// Router replicas sharing their bookings over NATS (docs/replicas.md); alone when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<ReplicaSettings>,
    /// What of each request policies may read (the ATTRIBUTES input group).
    #[serde(default)]
    pub request_attributes: RequestAttributeSettings,
    /// Scraping engines' own load for policies (the ENGINE input group); off by default.
    #[serde(default)]
    pub engine_metrics: EngineMetricsSettings,
    /// Busy thresholds and the queue requests wait in while every worker is busy; absent:
    /// no worker is busy, nothing waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionSettings>,
    /// Workers found on Kubernetes: an InferencePool's ready pods (docs/kubernetes.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery: Option<DiscoverySettings>,
}

/// Where a plugin library runs (`plugins[].isolation`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Isolation {
    /// `none` (the default): in the router's process, as fast as built-in code.
    /// `process`: in a supervised child process of its own.
    Mode(IsolationMode),
    /// `{process: NAME}`: in the child process `NAME`, shared by every library naming it
    /// (one per vendor, say).
    Group { process: String },
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IsolationMode {
    #[default]
    None,
    Process,
}

impl<'de> Deserialize<'de> for Isolation {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Group {
            process: String,
        }
        let expected = "expected `none`, `process` (a child process of its own) or `{process: NAME}` (a child shared by every plugin naming NAME)";
        let value = serde_yaml::Value::deserialize(deserializer)?;
        match &value {
            serde_yaml::Value::String(s) if s == "none" => Ok(Isolation::Mode(IsolationMode::None)),
            serde_yaml::Value::String(s) if s == "process" => {
                Ok(Isolation::Mode(IsolationMode::Process))
            }
            serde_yaml::Value::Mapping(_) => match serde_yaml::from_value::<Group>(value) {
                Ok(group) if !group.process.trim().is_empty() => Ok(Isolation::Group {
                    process: group.process,
                }),
                Ok(_) => Err(D::Error::custom(format!(
                    "isolation: the process name is empty; {expected}"
                ))),
                Err(e) => Err(D::Error::custom(format!("isolation: {e}; {expected}"))),
            },
            other => Err(D::Error::custom(format!(
                "isolation: {expected}, found {}",
                serde_yaml::to_string(other).unwrap_or_default().trim()
            ))),
        }
    }
}

impl Default for Isolation {
    fn default() -> Self {
        Isolation::Mode(IsolationMode::None)
    }
}

impl Isolation {
    /// The child process a library runs in (None: in process). A library with
    /// `isolation: process` gets a child of its own, named after its file.
    pub fn process_group(&self, path: &Path) -> Option<String> {
        match self {
            Isolation::Mode(IsolationMode::None) => None,
            Isolation::Mode(IsolationMode::Process) => Some(format!("{}", path.display())),
            Isolation::Group { process } => Some(process.clone()),
        }
    }
}

/// The endpoint picker for Envoy gateways (`ext_proc:`; `serve --ext-proc` overrides
/// `listen`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExtProcSettings {
    /// Where the gRPC service listens, e.g. `0.0.0.0:9002`.
    pub listen: std::net::SocketAddr,
    /// A request body larger than this is refused (413) rather than buffered.
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
    /// Load shedding: a worker with this many active requests takes no more; when every
    /// eligible worker has, the request is refused with 429. No limit when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requests_per_worker: Option<u64>,
    /// Serve the picker over TLS (with `client_ca`: mutual TLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSettings>,
    /// Endpoints named after the pick, in the policy's order of preference, for the
    /// gateway to retry on (the Inference Extension's `ip:port,ip:port,...`). 0: the pick
    /// alone, which is all an ORIGINAL_DST cluster can route. At most
    /// `MAX_FALLBACK_ENDPOINTS`.
    #[serde(default, deserialize_with = "fallback_count")]
    pub fallback_endpoints: u8,
    /// Threads of the picker's own runtime, apart from the HTTP service's. One by default:
    /// a stream's connection and its handler then share a thread, and no message costs a
    /// wake-up of another; more serve more streams at once on a larger machine.
    #[serde(
        default = "default_picker_threads",
        deserialize_with = "picker_threads"
    )]
    pub threads: u16,
    /// Streams one connection may have open at once (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`):
    /// each costs memory while it lasts. Envoy opens another connection when a connection
    /// is full, so the bound never refuses a gateway's request.
    #[serde(
        default = "default_streams_per_connection",
        deserialize_with = "streams_per_connection"
    )]
    pub max_streams_per_connection: u32,
    /// A stream whose request headers message has not arrived this long after it opened
    /// is ended with `DEADLINE_EXCEEDED` (Envoy sends them at once). Also the HTTP/2
    /// keepalive: a connection silent this long is pinged, and closed unanswered.
    #[serde(
        default = "default_request_headers_timeout",
        deserialize_with = "request_headers_timeout"
    )]
    pub request_headers_timeout_ms: u64,
    /// The largest gRPC message taken (a body chunk, a headers message); a larger one
    /// ends its stream with `RESOURCE_EXHAUSTED` before it is read.
    #[serde(
        default = "default_max_message_bytes",
        deserialize_with = "message_bytes"
    )]
    pub max_message_bytes: usize,
    /// Request headers whose names and values together are larger than this are answered
    /// with 431 at once (Envoy's own default limit is 60 KiB).
    #[serde(
        default = "default_max_header_bytes",
        deserialize_with = "header_bytes"
    )]
    pub max_header_bytes: usize,
    /// Request bodies all streams together may hold while they are read (each up to
    /// `max_body_bytes`); a chunk that would pass it is answered 503 with `retry-after`.
    #[serde(
        default = "default_max_buffered_bytes",
        deserialize_with = "buffered_bytes"
    )]
    pub max_buffered_bytes: usize,
    /// The Gateway API Inference Extension's conformance tests steer each request with a
    /// `test-epp-endpoint-selection` header (`IP` or `IP:port`, comma-separated); when on,
    /// the picker keeps to the endpoints it names and reports the served endpoint back in
    /// `x-conformance-test-served-endpoint`. Off by default: a production picker must not
    /// let its clients choose endpoints (GIE's own picker gates it behind a test-only
    /// plugin, too).
    #[serde(default, deserialize_with = "test_switch")]
    pub test_endpoint_selection: bool,
}

fn test_switch<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    deserializer.deserialize_any(TestSwitch)
}

/// `true` or `false`; anything else is refused inside the visitor, so the error carries
/// the value's line.
struct TestSwitch;

impl TestSwitch {
    fn refuse<E: serde::de::Error>(got: impl std::fmt::Display) -> E {
        E::custom(format!("test_endpoint_selection is true or false (got {got}): true lets each request's `test-epp-endpoint-selection` header choose its endpoints, for the Inference Extension's conformance tests only"))
    }
}

impl serde::de::Visitor<'_> for TestSwitch {
    type Value = bool;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("test_endpoint_selection: true or false")
    }

    fn visit_bool<E: serde::de::Error>(self, on: bool) -> Result<bool, E> {
        Ok(on)
    }

    fn visit_str<E: serde::de::Error>(self, got: &str) -> Result<bool, E> {
        Err(Self::refuse(format!("\"{got}\"")))
    }

    fn visit_u64<E: serde::de::Error>(self, got: u64) -> Result<bool, E> {
        Err(Self::refuse(got))
    }

    fn visit_i64<E: serde::de::Error>(self, got: i64) -> Result<bool, E> {
        Err(Self::refuse(got))
    }

    fn visit_f64<E: serde::de::Error>(self, got: f64) -> Result<bool, E> {
        Err(Self::refuse(got))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<bool, E> {
        Err(Self::refuse("nothing"))
    }
}

fn default_max_buffered_bytes() -> usize {
    ExtProcSettings::DEFAULT_MAX_BUFFERED_BYTES
}

fn buffered_bytes<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<usize, D::Error> {
    deserializer
        .deserialize_u64(Bounded(65_536, 1 << 40, "max_buffered_bytes is from {min} to {max} (got {got}): the request bodies of every stream together"))
        .map(|bytes| bytes as usize)
}

fn default_streams_per_connection() -> u32 {
    ExtProcSettings::DEFAULT_STREAMS_PER_CONNECTION
}

fn streams_per_connection<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<u32, D::Error> {
    deserializer
        .deserialize_u64(Bounded(
            1,
            65_536,
            "max_streams_per_connection is from 1 to {max} (got {got})",
        ))
        .map(|streams| streams as u32)
}

fn default_request_headers_timeout() -> u64 {
    ExtProcSettings::DEFAULT_REQUEST_HEADERS_TIMEOUT_MS
}

fn request_headers_timeout<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<u64, D::Error> {
    deserializer.deserialize_u64(Bounded(1, 600_000, "request_headers_timeout_ms is from 1 to {max} (got {got}): a stream that has not sent its request headers by then is not a gateway's"))
}

fn default_max_message_bytes() -> usize {
    ExtProcSettings::DEFAULT_MAX_MESSAGE_BYTES
}

fn message_bytes<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<usize, D::Error> {
    deserializer
        .deserialize_u64(Bounded(4096, 64 << 20, "max_message_bytes is from {min} to {max} (got {got}): one message is held whole while it is read"))
        .map(|bytes| bytes as usize)
}

fn default_max_header_bytes() -> usize {
    ExtProcSettings::DEFAULT_MAX_HEADER_BYTES
}

fn header_bytes<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<usize, D::Error> {
    deserializer
        .deserialize_u64(Bounded(
            1024,
            8 << 20,
            "max_header_bytes is from {min} to {max} (got {got}), Envoy's own range",
        ))
        .map(|bytes| bytes as usize)
}

fn fallback_count<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u8, D::Error> {
    let most = u64::from(ExtProcSettings::MAX_FALLBACK_ENDPOINTS);
    deserializer
        .deserialize_u64(Bounded(0, most, "fallback_endpoints is at most {max} (got {got}): each one is another selection per request"))
        .map(|count| count as u8)
}

fn default_picker_threads() -> u16 {
    1
}

fn picker_threads<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u16, D::Error> {
    let most = u64::from(ExtProcSettings::MAX_THREADS);
    deserializer
        .deserialize_u64(Bounded(1, most, "threads is from 1 to {max} (got {got}): the picker's runtime needs a thread, and more than {max} is a mistake"))
        .map(|threads| threads as u16)
}

/// A whole number from `.0` to `.1`; out of range, the message `.2` with `{max}` and
/// `{got}` filled in. Refused inside the visitor, so the error carries the value's line.
struct Bounded(u64, u64, &'static str);

impl serde::de::Visitor<'_> for Bounded {
    type Value = u64;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "a whole number from {} to {}", self.0, self.1)
    }

    fn visit_u64<E: serde::de::Error>(self, got: u64) -> Result<u64, E> {
        if (self.0..=self.1).contains(&got) {
            return Ok(got);
        }
        Err(E::custom(
            self.2
                .replace("{min}", &self.0.to_string())
                .replace("{max}", &self.1.to_string())
                .replace("{got}", &got.to_string()),
        ))
    }

    fn visit_i64<E: serde::de::Error>(self, got: i64) -> Result<u64, E> {
        match u64::try_from(got) {
            Ok(got) => self.visit_u64(got),
            Err(_) => Err(E::invalid_value(serde::de::Unexpected::Signed(got), &self)),
        }
    }
}

impl ExtProcSettings {
    pub const DEFAULT_MAX_BODY_BYTES: usize = 16 << 20;
    pub const MAX_FALLBACK_ENDPOINTS: u8 = 8;
    pub const MAX_THREADS: u16 = 256;
    pub const DEFAULT_STREAMS_PER_CONNECTION: u32 = 512;
    pub const DEFAULT_REQUEST_HEADERS_TIMEOUT_MS: u64 = 10_000;
    /// tonic's own default, made explicit.
    pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 << 20;
    pub const DEFAULT_MAX_HEADER_BYTES: usize = 96 << 10;
    pub const DEFAULT_MAX_BUFFERED_BYTES: usize = 256 << 20;

    /// Listening on `listen`, every other setting at its default.
    pub fn listening(listen: std::net::SocketAddr) -> Self {
        ExtProcSettings {
            listen,
            max_body_bytes: Self::DEFAULT_MAX_BODY_BYTES,
            max_requests_per_worker: None,
            tls: None,
            fallback_endpoints: 0,
            threads: default_picker_threads(),
            max_streams_per_connection: Self::DEFAULT_STREAMS_PER_CONNECTION,
            request_headers_timeout_ms: Self::DEFAULT_REQUEST_HEADERS_TIMEOUT_MS,
            max_message_bytes: Self::DEFAULT_MAX_MESSAGE_BYTES,
            max_header_bytes: Self::DEFAULT_MAX_HEADER_BYTES,
            max_buffered_bytes: Self::DEFAULT_MAX_BUFFERED_BYTES,
            test_endpoint_selection: false,
        }
    }
}

fn default_max_body_bytes() -> usize {
    ExtProcSettings::DEFAULT_MAX_BODY_BYTES
}

/// How the KV index learns what a model's workers cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KvTracking {
    /// Only from KV events (`POST /v1/kv_events`): what engines report.
    #[default]
    Events,
    /// The frontend assumes each routed prompt's blocks are cached on the worker that
    /// served it (bounded per worker, LRU, with a TTL): prefix-aware routing against
    /// engines that publish no events.
    Predicted,
    /// Not at all: cache-aware policies see no overlap.
    Off,
}

/// How the frontend serves a model whose workers are split into prefill and decode
/// (docs/disaggregation.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Disaggregation {
    /// One worker serves each request (aggregated workers).
    #[default]
    Off,
    /// vLLM's KV-connector flow: the prefill worker is asked for one token with
    /// `kv_transfer_params` asking for remote decode; what it answers in
    /// `kv_transfer_params` goes with the request to the decode worker, which streams.
    Vllm,
    /// SGLang's bootstrap flow: both workers get the request at once with the prefill
    /// worker's `bootstrap_host` / `bootstrap_port` and a fresh `bootstrap_room`; the
    /// decode worker's answer streams.
    Sglang,
}

/// Settings of one model (`models.NAME`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSettings {
    pub kv_tracking: KvTracking,
    /// Whether the frontend pairs a prefill and a decode worker per request.
    pub disaggregation: Disaggregation,
    /// Disaggregated: when the prefill side fails (no prefill worker, or its engine
    /// fails), a decode worker serves the request whole instead of the client getting
    /// the error (its engine must serve whole requests, as vLLM's `kv_both` does).
    pub aggregated_fallback: bool,
    /// `predicted`: blocks remembered per worker (least recently routed go first).
    pub predicted_blocks_per_worker: usize,
    /// `predicted`: seconds a routed block is assumed cached.
    pub predicted_ttl_secs: u64,
    /// The model's Hugging Face `tokenizer.json` (relative to the config's folder); its
    /// chat template comes from the `tokenizer_config.json` beside it. Without one, the
    /// frontend hashes prompt text (approximate; docs/frontend.md).
    pub tokenizer: Option<PathBuf>,
}

impl Default for ModelSettings {
    fn default() -> Self {
        ModelSettings {
            kv_tracking: KvTracking::default(),
            disaggregation: Disaggregation::default(),
            aggregated_fallback: false,
            predicted_blocks_per_worker: 65_536,
            predicted_ttl_secs: 600,
            tokenizer: None,
        }
    }
}

/// The OpenAI-compatible frontend's settings (`frontend:`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FrontendSettings {
    /// Connecting to an engine gives up after this long (then: unhealthy, select again).
    pub connect_timeout_ms: u64,
    /// A whole upstream answer gives up after this long.
    pub request_timeout_secs: u64,
    /// A kept-alive connection to an engine idle this long is closed, not reused. Below
    /// what engines keep (llama.cpp, and vLLM's and SGLang's uvicorn: 5 s), so the router
    /// does not send on a connection the engine is closing. 0: no connection is reused.
    pub pool_idle_timeout_ms: u64,
    /// Selections retried after an engine refused the connection, per request.
    pub connect_retries: u32,
    /// A worker whose engine refused a connection stays out of the candidates this long.
    pub unhealthy_cooldown_ms: u64,
    /// `GET /health` of every worker with a `url`, this often.
    pub health_interval_ms: u64,
    pub health_timeout_ms: u64,
    /// Requests proxied at once; more are answered 429 at once. Each holds two sockets
    /// (client and engine): the bound keeps an overload from exhausting the process's
    /// file descriptors, which would also stop reloads and health probes.
    pub max_in_flight: u64,
    /// CA certificates (PEM) that `https://` engine URLs are verified against, instead of
    /// the system's roots.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_ca: Option<PathBuf>,
}

impl Default for FrontendSettings {
    fn default() -> Self {
        FrontendSettings {
            connect_timeout_ms: 1_000,
            request_timeout_secs: 600,
            pool_idle_timeout_ms: 3_000,
            connect_retries: 2,
            unhealthy_cooldown_ms: 5_000,
            health_interval_ms: 2_000,
            health_timeout_ms: 1_000,
            max_in_flight: 8_192,
            engine_ca: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginEntry {
    pub path: PathBuf,
    pub sha256: Option<String>,
    #[serde(default)]
    pub revision: RevisionRule,
    /// `check` and `serve` first load and exercise the plugin in a child process, so a
    /// library that crashes is refused instead of taking the router down.
    #[serde(default = "yes")]
    pub probe: bool,
    /// `none` (default), `process`, or `{process: NAME}` (docs/isolation.md).
    #[serde(default)]
    pub isolation: Isolation,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSelection {
    /// Instance used when a request names none; `default` is the built-in policy.
    #[serde(default = "default_name")]
    pub default: String,
    /// The instance for requests to aggregated workers that name none (Dynamo's
    /// `worker_selection.aggregated`; `select` is the same pool), instead of `default`.
    #[serde(default, alias = "select")]
    pub aggregated: Option<String>,
    /// The instance for prefill workers' requests that name none, instead of `default`.
    #[serde(default)]
    pub prefill: Option<String>,
    /// The instance for decode workers' requests that name none, instead of `default`.
    #[serde(default)]
    pub decode: Option<String>,
    /// Knobs of the built-in `default` policy (docs/default-policy.md).
    #[serde(default)]
    pub builtin_default: Map<String, Value>,
    #[serde(default)]
    pub instances: Vec<InstanceEntry>,
}

impl Default for WorkerSelection {
    fn default() -> Self {
        WorkerSelection {
            default: default_name(),
            aggregated: None,
            prefill: None,
            decode: None,
            builtin_default: Map::new(),
            instances: Vec::new(),
        }
    }
}

fn default_name() -> String {
    "default".to_owned()
}

/// What a request gets when its policy fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    /// The request fails with a 500 naming the component.
    #[default]
    Fail,
    /// The request is routed by the built-in default policy, and the fallback counted.
    Fallback,
}

impl OnError {
    pub fn as_str(self) -> &'static str {
        match self {
            OnError::Fail => "fail",
            OnError::Fallback => "fallback",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceEntry {
    pub name: String,
    /// A policy type (the reference's form); exclusive with filters/scorers/picker.
    #[serde(rename = "type")]
    pub policy_type: Option<String>,
    #[serde(default)]
    pub parameters: Map<String, Value>,
    #[serde(default)]
    pub filters: Vec<ComponentEntry>,
    #[serde(default)]
    pub scorers: Vec<ComponentEntry>,
    pub picker: Option<ComponentEntry>,
    #[serde(default)]
    pub on_error: OnError,
    /// A selection slower than this (milliseconds) is over budget. A component cannot be
    /// interrupted in-process; after `trip_after` consecutive over-budget selections an
    /// instance with `on_error: fallback` is tripped: the built-in policy routes its
    /// requests for `trip_cooldown_secs`.
    #[serde(default)]
    pub call_budget_ms: Option<f64>,
    #[serde(default = "default_trip_after")]
    pub trip_after: u32,
    #[serde(default = "default_trip_cooldown")]
    pub trip_cooldown_secs: u64,
    /// The worker types (roles) the instance serves: `prefill`, `decode`, `aggregated`
    /// (or `select`). It is built only for those; a request for another role that it is
    /// asked to route is refused with 503. All three when absent.
    #[serde(default)]
    pub worker_types: Option<Vec<WorkerType>>,
}

impl WorkerSelection {
    /// The `worker_selection` key that names the instance of `role`'s requests.
    pub fn role_key(role: WorkerType) -> &'static str {
        match role {
            WorkerType::Prefill => "prefill",
            WorkerType::Decode => "decode",
            WorkerType::Select => "aggregated",
        }
    }

    /// The instance `role`'s requests get from the YAML: its own key, else `default`.
    pub fn for_role(&self, role: WorkerType) -> (&str, &'static str) {
        let own = match role {
            WorkerType::Prefill => &self.prefill,
            WorkerType::Decode => &self.decode,
            WorkerType::Select => &self.aggregated,
        };
        match own {
            Some(name) => (name, Self::role_key(role)),
            None => (&self.default, "default"),
        }
    }
}

fn default_trip_after() -> u32 {
    3
}

fn default_trip_cooldown() -> u64 {
    30
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComponentEntry {
    #[serde(rename = "type")]
    pub component_type: String,
    #[serde(default)]
    pub parameters: Map<String, Value>,
    /// Scorers only: the weight of this scorer's cost in the sum.
    pub weight: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RouterSettings {
    /// Tokens per KV block, for requests that carry token ids.
    pub block_size: u32,
    /// Seconds after which a reserved request that was never freed is released.
    pub request_expiry_secs: u64,
    /// Whether `POST /v1/admin/reload` is answered for clients other than loopback.
    pub remote_admin: bool,
    /// Whether a reload may remove every worker (a config emptied by mistake otherwise
    /// leaves the router answering 404 to everything: such a reload is refused).
    pub reload_may_empty_fleet: bool,
    /// The most blocks the KV index keeps per worker in each offload tier (host, disk).
    /// Past it, the worker's blocks in that tier are forgotten (counted in `/metrics`)
    /// and its events rebuild them.
    pub max_offloaded_blocks_per_worker: u64,
    /// The least the KV index's device-tier bound of a worker is: a safety net against
    /// lost removals, not a cache size. A worker whose `total_kv_blocks` or engine-reported
    /// capacity is known gets twice that when it is larger.
    pub kv_bound_blocks_per_worker: u64,
    /// The most (block, worker) pairs the KV index holds across the fleet, per tier: it
    /// bounds the index's memory (about 14-28 bytes a pair). Past it, the worker holding
    /// the most blocks in that tier is forgotten there, counted and logged once.
    pub max_kv_index_pairs: u64,
    /// After SIGTERM, how long requests and ext_proc streams in flight may take to
    /// finish before the process ends anyway.
    pub drain_timeout_secs: u64,
    /// The hosts workers may point at (engine URLs, addresses, KV-event endpoints):
    /// networks, addresses, host names, `*.domain`. Any host when empty.
    pub worker_networks: Vec<String>,
    /// Bounds on engines' KV-event messages and replays.
    pub kv_events: KvEventLimits,
    /// Sessions bound to the worker their last request went to (off by default).
    pub session_affinity: SessionAffinity,
    /// Log lines a second each plugin factory or instance may log (ABI 1.5); more are
    /// dropped, counted and reported in one line. 0: plugins' lines are dropped.
    pub plugin_log_lines_per_second: u32,
}

impl Default for RouterSettings {
    fn default() -> Self {
        RouterSettings {
            block_size: 16,
            request_expiry_secs: 600,
            remote_admin: false,
            reload_may_empty_fleet: false,
            max_offloaded_blocks_per_worker: 1 << 22,
            kv_bound_blocks_per_worker: 1 << 22,
            max_kv_index_pairs: 1 << 25,
            drain_timeout_secs: 30,
            worker_networks: Vec::new(),
            kv_events: KvEventLimits::default(),
            session_affinity: SessionAffinity::default(),
            plugin_log_lines_per_second: 20,
        }
    }
}
