//! A config file as read: its text, where it came from, the parsed [`Config`], the lines
//! errors point at, and the checks serde cannot make.

use std::fmt;
use std::path::{Path, PathBuf};

use switchyard_plugin_host::file_gate::{self, FileKind};

use crate::{
    limits, AdmissionSettings, Config, InstanceEntry, ReplicaSettings, WorkerNetworks,
    BUILTIN_DEFAULT, EMBEDDED_DEFAULT, EMBEDDED_NAME,
};

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
        let text = file_gate::read_text(path, FileKind::Config).map_err(|e| ConfigError {
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
                "router",
                "kv_bound_blocks_per_worker",
                router.kv_bound_blocks_per_worker,
            ),
            ("router", "max_kv_index_pairs", router.max_kv_index_pairs),
            (
                "router",
                "max_offloaded_blocks_per_worker",
                router.max_offloaded_blocks_per_worker,
            ),
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
        )
        .chain(
            router
                .session_affinity
                .positive()
                .map(|(key, value)| ("router.session_affinity", key, value)),
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
    /// admission, discovery.
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
            (
                "discovery:",
                self.config
                    .discovery
                    .as_ref()
                    .map_or(Ok(()), crate::DiscoverySettings::validate),
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

    /// Every configured worker is valid (as `POST /v1/workers` checks one), and
    /// `router.worker_networks` parses and holds it.
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
                let message = match worker.validate() {
                    Err(invalid) => invalid.to_string(),
                    Ok(()) => worker.check_destinations(&networks, &[]).err()?.to_string(),
                };
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
