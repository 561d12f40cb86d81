//! Who may call what (`auth:`): API keys for two audiences, inference clients and
//! operators, read from files or the environment (never from the YAML itself), several
//! per grant so keys rotate by reload, compared in constant time.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::{ConfigError, ConfigSource};
use switchyard_plugin_host::file_gate::{self, FileKind};

/// A key file larger than this is refused (it holds a few keys, one per line).
pub const MAX_KEY_FILE_BYTES: u64 = FileKind::ApiKeys.limit();
/// Shorter keys are refused: a guessable key is no credential.
pub const MIN_KEY_CHARS: usize = 16;

/// The `auth:` section.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSettings {
    /// Inference clients: the OpenAI routes, `/v1/select` and the Envoy endpoint picker.
    pub clients: Vec<KeyGrant>,
    /// Operators: workers, KV events, reservations, reload, policies, metrics.
    pub operators: Vec<KeyGrant>,
    /// `GET /metrics` without a key (for a scraper that cannot send one). Off: operators only.
    pub metrics_open: bool,
    /// Which clients may choose an instance (`x-switchyard-instance`, `/v1/select`'s
    /// `instance`) beyond what their key's `instances` lists.
    pub choose_instance: InstanceChoice,
    /// Serve on a non-loopback address without any key (labs only; `serve --insecure`).
    pub insecure: bool,
}

/// Who may pick the instance a request is routed with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum InstanceChoice {
    /// Loopback clients (and keys whose scope names the instance).
    #[default]
    Loopback,
    /// Every client.
    Anyone,
    /// Only keys whose scope names the instance.
    Scoped,
}

/// One grant: a name (what logs show, never the key), where its keys are, and what
/// they may reach.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KeyGrant {
    pub name: String,
    /// A file of keys, one per line (`#` starts a comment); relative to the config's folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// An environment variable holding one key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_env: Option<String>,
    /// Refused with a message: keys never stand in the YAML.
    #[serde(default, skip_serializing)]
    pub key: Option<serde_yaml::Value>,
    /// Clients only: the models these keys may use (all when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<BTreeSet<String>>,
    /// Clients only: instances these keys may choose.
    #[serde(default)]
    pub instances: BTreeSet<String>,
}

/// Which audience a key belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Audience {
    Client,
    Operator,
}

impl Audience {
    pub fn as_str(self) -> &'static str {
        match self {
            Audience::Client => "client",
            Audience::Operator => "operator",
        }
    }
}

/// What a verified key may do.
#[derive(Clone, Debug)]
pub struct Grant {
    pub audience: Audience,
    pub name: String,
    pub models: Option<BTreeSet<String>>,
    pub instances: BTreeSet<String>,
}

impl Grant {
    pub fn allows_model(&self, model: &str) -> bool {
        self.models.as_ref().is_none_or(|m| m.contains(model))
    }
}

/// The loaded keys: SHA-256 digests only, each with its grant.
#[derive(Debug, Default)]
pub struct Keyring {
    keys: Vec<([u8; 32], usize)>,
    /// Shared: each verified request holds its grant without copying it.
    grants: Vec<std::sync::Arc<Grant>>,
    pub metrics_open: bool,
    pub choose_instance: InstanceChoice,
}

impl Keyring {
    /// Reads every grant's keys; every error names the config line, the file or variable,
    /// and what to do. No error ever shows a key.
    pub fn load(source: &ConfigSource) -> Result<Keyring, Vec<ConfigError>> {
        let settings = &source.config.auth;
        let mut ring = Keyring {
            metrics_open: settings.metrics_open,
            choose_instance: settings.choose_instance,
            ..Keyring::default()
        };
        let mut errors = Vec::new();
        let grants = settings
            .clients
            .iter()
            .map(|g| (Audience::Client, g))
            .chain(settings.operators.iter().map(|g| (Audience::Operator, g)));
        for (nth, (audience, grant)) in grants.enumerate() {
            let at = |message: String| {
                source.error_at(
                    "name",
                    &grant.name,
                    0,
                    format!("auth.{}s `{}`: {message}", audience.as_str(), grant.name),
                )
            };
            let scoped = audience == Audience::Operator
                && (grant.models.is_some() || !grant.instances.is_empty());
            let keys = if scoped {
                Err("`models` and `instances` scope client keys; an operator key reaches every operator route".into())
            } else {
                keys_of(source, grant)
            };
            match keys {
                Ok(keys) => ring.keys.extend(keys.into_iter().map(|k| (k, nth))),
                Err(message) => errors.push(at(message)),
            }
            ring.grants.push(std::sync::Arc::new(Grant {
                audience,
                name: grant.name.clone(),
                models: grant.models.clone(),
                instances: grant.instances.clone(),
            }));
        }
        let mut digests: Vec<&[u8; 32]> = ring.keys.iter().map(|(k, _)| k).collect();
        digests.sort();
        if digests.windows(2).any(|w| w[0] == w[1]) {
            errors.push(ConfigError {
                file: source.name.clone(),
                line: None,
                message: "auth: one key is listed twice (in two grants, or twice in one); each key must be unique so it names one grant".into(),
            });
        }
        if errors.is_empty() {
            Ok(ring)
        } else {
            Err(errors)
        }
    }

    /// Whether any key is configured: without one, every route is open.
    pub fn is_enabled(&self) -> bool {
        !self.grants.is_empty()
    }

    pub fn has(&self, audience: Audience) -> bool {
        self.grants.iter().any(|g| g.audience == audience)
    }

    /// The grant of `token`, if it is a configured key. Every key is compared, in
    /// constant time, so the answer's timing says nothing about which key came close.
    pub fn verify(&self, token: &str) -> Option<&std::sync::Arc<Grant>> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for (key, grant) in &self.keys {
            if bool::from(key.ct_eq(&digest)) {
                found = Some(*grant);
            }
        }
        found.map(|g| &self.grants[g])
    }
}

/// The digests of one grant's keys.
fn keys_of(source: &ConfigSource, grant: &KeyGrant) -> Result<Vec<[u8; 32]>, String> {
    if grant.name.trim().is_empty() {
        return Err("every grant needs a `name` (shown in logs instead of the key)".into());
    }
    if grant.key.is_some() {
        return Err("keys never stand in the config itself (it gets committed and printed); put them in a file named by `key_file`, or an environment variable named by `key_env`".into());
    }
    let texts: Vec<(String, String)> = match (&grant.key_file, &grant.key_env) {
        (Some(_), Some(_)) | (None, None) => {
            return Err("set exactly one of `key_file` and `key_env`".into())
        }
        (Some(file), None) => {
            let path = source.resolve(file);
            let shown = path.display().to_string();
            let text = read_key_file(&path).map_err(|e| format!("key file {shown}: {e}"))?;
            text.lines()
                .enumerate()
                .map(|(i, line)| (line.split('#').next().unwrap_or("").trim().to_owned(), i))
                .filter(|(line, _)| !line.is_empty())
                .map(|(key, i)| (key, format!("key file {shown}, line {}", i + 1)))
                .collect()
        }
        (None, Some(var)) => {
            let value = std::env::var(var).map_err(|_| {
                format!(
                    "environment variable `{var}` is not set (or not UTF-8); export the key in it"
                )
            })?;
            vec![(
                value.trim().to_owned(),
                format!("environment variable `{var}`"),
            )]
        }
    };
    if texts.is_empty() {
        return Err("no key found: the file holds only blank lines and comments".into());
    }
    texts
        .into_iter()
        .map(|(key, place)| {
            let chars = key.chars().count();
            if chars < MIN_KEY_CHARS || key.chars().any(|c| c.is_whitespace() || c.is_control()) {
                Err(format!("{place}: a key must be at least {MIN_KEY_CHARS} characters without spaces (found {chars} characters); generate one with `openssl rand -hex 32`"))
            } else {
                Ok(Sha256::digest(key.as_bytes()).into())
            }
        })
        .collect()
}

fn read_key_file(path: &std::path::Path) -> Result<String, String> {
    file_gate::read_text(path, FileKind::ApiKeys).map_err(|e| e.to_string())
}

/// Whether a key file can be read by users other than its owner (`check` warns).
#[cfg(unix)]
pub fn readable_by_others(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o044 != 0)
}

#[cfg(not(unix))]
pub fn readable_by_others(_path: &std::path::Path) -> bool {
    false
}
