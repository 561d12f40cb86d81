//! The YAML config: plugins to load, policy instances, router knobs, static workers.
//! Unknown keys are rejected; every error names the file and, where it can, the line.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use switchyard_plugin_sdk::{WorkerId, WorkerType};

pub mod admission;
pub mod attributes;
pub mod auth;
pub mod hardening;
mod limits;
pub mod listener;
pub mod replicas;
mod section_invalid;
pub mod worker_address;
mod workers;

pub use admission::{
    AdmissionSettings, AdmitterEntry, AdmitterOnError, BusyThresholds, QueueOrder, QueueSettings,
    RateLimit,
};
pub use attributes::{EngineMetricsSettings, RequestAttributeSettings, TenantSource};
pub use auth::{AuthSettings, Keyring};
pub use limits::{MAX_CONFIG_BYTES, MAX_FLOW_DEPTH};
pub use listener::{HttpSettings, TlsSettings};
pub use replicas::ReplicaSettings;
pub use section_invalid::SectionInvalid;
pub use switchyard_plugin_host::isolation::IsolationSettings;
use switchyard_plugin_host::plugin::{PartitionKey, RevisionRule};
pub use worker_address::{EngineUrl, WorkerNetworks};
pub use workers::{KvEventSource, WorkerInvalid, WorkerRole, WorkerSpec};

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
}

fn fallback_count<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u8, D::Error> {
    let count = u64::deserialize(deserializer)?;
    if count > u64::from(ExtProcSettings::MAX_FALLBACK_ENDPOINTS) {
        return Err(serde::de::Error::custom(format!(
            "fallback_endpoints is at most {} (got {count}): each one is another selection per request",
            ExtProcSettings::MAX_FALLBACK_ENDPOINTS
        )));
    }
    Ok(count as u8)
}

impl ExtProcSettings {
    pub const DEFAULT_MAX_BODY_BYTES: usize = 16 << 20;
    pub const MAX_FALLBACK_ENDPOINTS: u8 = 8;

    /// Listening on `listen`, every other setting at its default.
    pub fn listening(listen: std::net::SocketAddr) -> Self {
        ExtProcSettings {
            listen,
            max_body_bytes: Self::DEFAULT_MAX_BODY_BYTES,
            max_requests_per_worker: None,
            tls: None,
            fallback_endpoints: 0,
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
    /// The most blocks the KV index keeps per worker in each offload tier (host, disk);
    /// the device tier keeps at most the worker's `total_kv_blocks`. Past it, the
    /// worker's oldest blocks are evicted (counted in `/metrics`).
    pub max_offloaded_blocks_per_worker: u64,
    /// After SIGTERM, how long requests and ext_proc streams in flight may take to
    /// finish before the process ends anyway.
    pub drain_timeout_secs: u64,
    /// The hosts workers may point at (engine URLs, addresses, KV-event endpoints):
    /// networks, addresses, host names, `*.domain`. Any host when empty.
    pub worker_networks: Vec<String>,
}

impl Default for RouterSettings {
    fn default() -> Self {
        RouterSettings {
            block_size: 16,
            request_expiry_secs: 600,
            remote_admin: false,
            reload_may_empty_fleet: false,
            max_offloaded_blocks_per_worker: 1 << 22,
            drain_timeout_secs: 30,
            worker_networks: Vec::new(),
        }
    }
}

/// A config error: file, line (1-based) when known, and what to do.
#[derive(Debug, thiserror::Error)]
pub struct ConfigError {
    pub file: String,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.file, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

/// A parsed config and where it came from.
pub struct ConfigSource {
    pub config: Config,
    /// How to name the config in messages.
    pub name: String,
    /// The text, for locating lines in later (semantic) errors.
    pub text: String,
    /// Relative plugin paths are resolved against this folder.
    pub base_dir: PathBuf,
    /// The file it was read from (None: the embedded default, or text from elsewhere):
    /// what a reload reads again.
    pub path: Option<PathBuf>,
}

impl ConfigSource {
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: name.clone(),
            line: None,
            message: format!("cannot read the config: {e}. Check the --config path"),
        })?;
        let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut source = Self::parse(text, name, base_dir)?;
        source.path = Some(path.to_owned());
        Ok(source)
    }

    /// The embedded default config; its plugin paths resolve against the executable's folder.
    pub fn embedded() -> Result<Self, ConfigError> {
        let base_dir = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(Path::to_path_buf))
            .unwrap_or_default();
        Self::parse(
            EMBEDDED_DEFAULT.to_owned(),
            EMBEDDED_NAME.to_owned(),
            base_dir,
        )
    }

    pub fn parse(text: String, name: String, base_dir: PathBuf) -> Result<Self, ConfigError> {
        limits::check_shape(&text).map_err(|(line, message)| ConfigError {
            file: name.clone(),
            line,
            message,
        })?;
        let config: Config = serde_yaml::from_str(&text).map_err(|e| ConfigError {
            file: name.clone(),
            line: e.location().map(|l| l.line()),
            message: format!(
                "{}. See docs/configuration.md for the schema",
                // serde_yaml appends "at line L column C"; the prefix already says where.
                e.to_string().split(" at line ").next().unwrap_or_default()
            ),
        })?;
        Ok(ConfigSource {
            config,
            name,
            text,
            base_dir,
            path: None,
        })
    }

    /// Resolves a plugin path: absolute as is, otherwise against the config's folder.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            path.to_owned()
        } else {
            self.base_dir.join(path)
        }
    }

    /// The 1-based lines holding `key: value`, block or flow style (`{key: value, ...}`).
    fn lines_of<'s>(&'s self, key: &str, value: &'s str) -> impl Iterator<Item = usize> + 's {
        let pattern = format!("{key}:");
        let holds = move |line: &str| {
            let line = line.split(" #").next().unwrap_or(line);
            line.match_indices(&pattern).any(|(at, _)| {
                let before = line[..at].chars().next_back();
                let starts_key =
                    before.is_none_or(|c| c.is_whitespace() || matches!(c, '{' | ',' | '-'));
                let rest = &line[at + pattern.len()..];
                let token = rest
                    .split([',', '}'])
                    .next()
                    .unwrap_or("")
                    .trim()
                    .trim_matches(['"', '\'']);
                starts_key && token == value
            })
        };
        self.text
            .lines()
            .enumerate()
            .filter(move |(_, line)| holds(line))
            .map(|(i, _)| i + 1)
    }

    /// The 1-based line of the `nth` (0-based) `key: value` in the text, if any.
    pub fn line_of(&self, key: &str, value: &str, nth: usize) -> Option<usize> {
        self.lines_of(key, value).nth(nth)
    }

    /// The first line at or after `from` holding `key: value`: where a key of the
    /// instance whose `name:` is on line `from` stands, so several instances with the
    /// same mistake are each reported at their own line.
    pub fn line_from(&self, key: &str, value: &str, from: usize) -> Option<usize> {
        self.lines_of(key, value).find(|line| *line >= from)
    }

    /// Checks the values serde cannot: router knobs and instance names. Returns every
    /// error, and which `worker_selection.instances` entries are sound enough to build.
    pub fn validate(&self) -> (Vec<ConfigError>, Vec<&InstanceEntry>) {
        let mut errors = self.check_positive();
        errors.extend(self.check_worker_destinations());
        errors.extend(self.check_sections());
        let (instance_errors, sound) = self.check_instances();
        errors.extend(instance_errors);
        (errors, sound)
    }

    /// The first line (1-based) that starts, after indentation, with `prefix`.
    fn line_starting(&self, prefix: &str) -> Option<usize> {
        self.text
            .lines()
            .position(|l| l.trim_start().starts_with(prefix))
            .map(|i| i + 1)
    }

    /// Knobs that must be at least 1.
    fn check_positive(&self) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        let router = &self.config.router;
        let frontend = &self.config.frontend;
        let positive = [
            ("router", "block_size", u64::from(router.block_size)),
            ("router", "request_expiry_secs", router.request_expiry_secs),
            (
                "frontend",
                "connect_timeout_ms",
                frontend.connect_timeout_ms,
            ),
            (
                "frontend",
                "request_timeout_secs",
                frontend.request_timeout_secs,
            ),
            (
                "frontend",
                "health_interval_ms",
                frontend.health_interval_ms,
            ),
            ("frontend", "health_timeout_ms", frontend.health_timeout_ms),
            ("frontend", "max_in_flight", frontend.max_in_flight),
        ]
        .into_iter()
        .chain(
            self.config
                .http
                .positive()
                .map(|(key, value)| ("http", key, value)),
        );
        for (section, key, value) in positive {
            if value == 0 {
                let line = self.line_starting(&format!("{key}:"));
                errors.push(ConfigError {
                    file: self.name.clone(),
                    line,
                    message: format!("`{section}.{key}` must be at least 1"),
                });
            }
        }
        errors
    }

    /// Sections that check themselves: replicas, request attributes, engine metrics,
    /// admission.
    fn check_sections(&self) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        let replicas = self.config.replicas.as_ref();
        let sections = [
            (
                "replicas:",
                replicas.map_or(Ok(()), ReplicaSettings::validate),
            ),
            (
                "request_attributes:",
                self.config.request_attributes.validate(),
            ),
            ("engine_metrics:", self.config.engine_metrics.validate()),
            (
                "admission:",
                self.config
                    .admission
                    .as_ref()
                    .map_or(Ok(()), AdmissionSettings::validate),
            ),
        ];
        for (section, result) in sections {
            if let Err(invalid) = result {
                errors.push(ConfigError {
                    file: self.name.clone(),
                    line: self.line_starting(section),
                    message: invalid.to_string(),
                });
            }
        }
        errors
    }

    /// Instance names: not empty, not the built-in's, unique. The errors, and the entries
    /// sound enough to build.
    fn check_instances(&self) -> (Vec<ConfigError>, Vec<&InstanceEntry>) {
        let mut errors = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut sound = Vec::new();
        let entries = &self.config.worker_selection.instances;
        for (index, entry) in entries.iter().enumerate() {
            let nth = entries[..index]
                .iter()
                .filter(|e| e.name == entry.name)
                .count();
            let at = |message: String| self.error_at("name", &entry.name, nth, message);
            if entry.name.trim().is_empty() {
                errors.push(at(
                    "an instance has an empty `name`; give each instance a unique name".into(),
                ));
            } else if entry.name == BUILTIN_DEFAULT {
                errors.push(at(format!("instance name `{BUILTIN_DEFAULT}` is reserved for the built-in policy; tune it under `worker_selection.builtin_default`, or pick another name")));
            } else if !seen.insert(entry.name.as_str()) {
                errors.push(at(format!(
                    "duplicate instance name `{}`; instance names must be unique",
                    entry.name
                )));
            } else {
                sound.push(entry);
            }
        }
        (errors, sound)
    }

    /// `router.worker_networks` parses, and every configured worker is inside it.
    fn check_worker_destinations(&self) -> Vec<ConfigError> {
        let networks = match WorkerNetworks::parse(&self.config.router.worker_networks) {
            Ok(networks) => networks,
            Err(error) => {
                return vec![ConfigError {
                    file: self.name.clone(),
                    line: self
                        .text
                        .lines()
                        .position(|l| l.contains("worker_networks"))
                        .map(|i| i + 1),
                    message: error.to_string(),
                }]
            }
        };
        self.config
            .workers
            .iter()
            .filter_map(|worker| {
                let message = worker.check_destinations(&networks, &[]).err()?;
                let nth = self
                    .config
                    .workers
                    .iter()
                    .take_while(|w| !std::ptr::eq(*w, worker))
                    .filter(|w| w.worker_id == worker.worker_id)
                    .count();
                Some(self.error_at(
                    "worker_id",
                    &worker.worker_id.to_string(),
                    nth,
                    format!("worker {}: {message}", worker.worker_id),
                ))
            })
            .collect()
    }

    /// The worker allow-list (`router.worker_networks`), parsed (`validate` reported
    /// its errors; an unparsable list here admits nothing).
    pub fn worker_networks(&self) -> WorkerNetworks {
        WorkerNetworks::parse(&self.config.router.worker_networks)
            .unwrap_or_else(|_| WorkerNetworks::closed())
    }

    /// The instance names a request or `worker_selection.default` may use.
    pub fn instance_names(&self) -> Vec<&str> {
        std::iter::once(BUILTIN_DEFAULT)
            .chain(
                self.config
                    .worker_selection
                    .instances
                    .iter()
                    .map(|i| i.name.as_str()),
            )
            .collect()
    }

    /// The 1-based line of `worker_selection.instances[index]`'s `name:`.
    pub fn instance_line(&self, entry: &InstanceEntry) -> Option<usize> {
        let entries = &self.config.worker_selection.instances;
        let index = entries.iter().position(|e| std::ptr::eq(e, entry))?;
        let nth = entries[..index]
            .iter()
            .filter(|e| e.name == entry.name)
            .count();
        self.line_of("name", &entry.name, nth)
    }

    /// A config error at the line of `key: value`.
    pub fn error_at(&self, key: &str, value: &str, nth: usize, message: String) -> ConfigError {
        ConfigError {
            file: self.name.clone(),
            line: self.line_of(key, value, nth),
            message,
        }
    }
}
