//! Startup: from a parsed config to a registry with every plugin loaded and every policy
//! instance validated and built once per worker type. Collects every error, not just the
//! first, so `switchyard check` can show them all.

pub mod probe;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use switchyard_plugin_sdk::WorkerType;

use crate::{
    AdmitterUse, Admitters, BuildError, CallBudget, ComponentUse, InstanceFactory, InstanceKind,
    Registry,
};
pub use switchyard_config::BUILTIN_DEFAULT;
use switchyard_config::{
    ComponentEntry, Config, ConfigError, ConfigSource, InstanceEntry, Keyring, OnError,
};
use switchyard_plugin_host::plugin::{
    ComponentKind, LoadError, OwnedParams, PartitionKey, PluginImage, PluginSpec,
};

/// Environment variable that overrides `worker_selection.default` (and the per-role
/// keys) by instance name (`roles.rs`: Dynamo's variables too).
pub const POLICY_ENV: &str = "SWITCHYARD_WORKER_SELECTION_POLICY";

mod roles;
pub use roles::{unread_dynamo_env, RoleDefaults, DYNAMO_POLICY_ENV};

/// A place in the config: file, and line when known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    pub config: String,
    pub line: Option<usize>,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}", self.config),
            None => f.write_str(&self.config),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{at}: {error}")]
    Plugin { at: Location, error: LoadError },
    /// An instance names a type nothing registered.
    #[error(transparent)]
    UnknownType(ConfigError),
    /// Instances not checked because they may use types of plugins that failed to load.
    #[error("{config}: instance(s) {} not checked: they name types no loaded plugin registers, and a plugin above failed to load; fix that plugin first", instances.join(", "))]
    NotChecked {
        config: String,
        instances: Vec<String>,
    },
    /// A policy type refused an instance's parameters.
    #[error("{at}: instance `{instance}`: invalid parameters for policy type `{policy_type}` from {origin} ({params}): {error}")]
    InvalidParameters {
        at: Location,
        instance: String,
        policy_type: String,
        params: String,
        error: BuildError,
        /// Where the refusing type comes from: a plugin's name and library, or built-in.
        origin: String,
    },
    /// An `admission.admitters` entry names no admitter, or its type refused it.
    #[error("{at}: admission.admitters: {message}")]
    Admitter {
        at: Location,
        message: crate::admitters::AdmitterInvalid,
    },
    /// A plugin crashed, exited or hung in its probe process (`probe: true`).
    #[error(transparent)]
    Probe(#[from] probe::ProbeFailure),
    /// An instance validated but could not be built for a worker type.
    #[error("{at}: instance `{instance}` cannot be built for worker type {}: {error}{}{}", crate::instances::role_word(*worker_type), origin.as_ref().map(|o| format!(" (the type is from {o})")).unwrap_or_default(), if *roles_listed { "" } else { ". If the policy does not serve that role, list the roles it serves: `worker_types: [prefill, decode]` (docs/configuration.md)" })]
    Unbuildable {
        at: Location,
        instance: String,
        worker_type: WorkerType,
        error: BuildError,
        /// Where the type at fault comes from, when a type is.
        origin: Option<String>,
        /// Whether the entry lists its `worker_types` (else the hint to list them).
        roles_listed: bool,
    },
}

impl StartupError {
    /// The build error behind an instance failure, if this is one.
    pub fn build_error(&self) -> Option<&BuildError> {
        match self {
            StartupError::InvalidParameters { error, .. }
            | StartupError::Unbuildable { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// Where the type a build error names comes from.
fn origin_of(registry: &Registry, error: &BuildError) -> Option<String> {
    match error {
        BuildError::Validate { policy_type, .. } | BuildError::Build { policy_type, .. } => {
            registry.policy(policy_type).map(|p| p.origin.to_string())
        }
        BuildError::Create { component, .. } => {
            registry.component(component).map(|c| c.origin.to_string())
        }
        _ => None,
    }
}

impl From<ConfigError> for Box<StartupError> {
    fn from(error: ConfigError) -> Self {
        Box::new(StartupError::Config(error))
    }
}

/// Everything startup produced.
pub struct Startup {
    pub source: ConfigSource,
    pub registry: Registry,
    /// The built-in `default` instance first, then the config's, in order.
    pub instances: Vec<Arc<InstanceFactory>>,
    /// The instance of each role's requests that name none (`roles.rs`): what routing
    /// reads, so a host that changes the defaults sets these.
    pub role_defaults: RoleDefaults,
    /// The config's API keys (`auth:`), read with it: a reload rotates them.
    pub keyring: Arc<Keyring>,
    /// `admission.admitters`, resolved and checked; built per partition with its policies.
    pub admitters: Vec<AdmitterUse>,
}

impl Startup {
    /// The settings this startup was built from: what every layer above reads, rather
    /// than reaching through the config source (which also keeps the file's path).
    pub fn config(&self) -> &Config {
        &self.source.config
    }

    /// The settings, to adjust before the router is built from them (replay runs a
    /// config's policies over simulated workers of its own).
    pub fn config_mut(&mut self) -> &mut Config {
        &mut self.source.config
    }

    pub fn instance(&self, name: &str) -> Option<&Arc<InstanceFactory>> {
        self.instances.iter().find(|i| i.name == name)
    }

    /// The instance a request to `role`'s workers gets when it names none.
    pub fn default_for(&self, role: WorkerType) -> &str {
        self.role_defaults.get(role)
    }

    /// The instance of aggregated requests that name none.
    pub fn default_instance(&self) -> &str {
        self.default_for(WorkerType::Select)
    }
}

/// The whole startup path from a config file (the embedded default when None): read,
/// probe each plugin in a child process (`probe`), load, check, build. Every error, as the
/// lines `check` prints.
pub fn load(config: Option<&Path>, probe: bool) -> Result<Startup, Vec<StartupError>> {
    let source = match config {
        Some(path) => ConfigSource::from_file(path),
        None => ConfigSource::embedded(),
    }
    .map_err(|e| vec![StartupError::Config(e)])?;
    let images = read_images(&source);
    if probe {
        let failures = probe::probe_all(&source, &images);
        if !failures.is_empty() {
            return Err(failures.into_iter().map(StartupError::Probe).collect());
        }
    }
    start_from(source, &images)
}

pub fn start(source: ConfigSource) -> Result<Startup, Vec<StartupError>> {
    let images = read_images(&source);
    start_from(source, &images)
}

fn start_from(source: ConfigSource, images: &Images) -> Result<Startup, Vec<StartupError>> {
    // Before any plugin loads: its loggers, and isolated processes, take the bound.
    switchyard_plugin_host::plugin::logger::set_lines_per_second(
        source.config.router.plugin_log_lines_per_second,
    );
    let mut errors: Vec<StartupError> = Vec::new();
    let registry = load_plugins(&source, images, &mut errors);
    assemble(source, registry, errors)
}

/// The bytes of each plugin file of a config, by entry, read once: the probe, the
/// isolated children and the in-process load all check and map these, whatever happens
/// to the files meanwhile. None: a file that cannot be read as a library (loading it
/// reports why).
pub type Images = Vec<Option<Arc<PluginImage>>>;

/// Reads each plugin file of `source` once; entries that name the same file share it.
pub fn read_images(source: &ConfigSource) -> Images {
    let mut by_file: HashMap<PathBuf, Arc<PluginImage>> = HashMap::new();
    let mut read = |entry: &switchyard_config::PluginEntry| {
        let path = source.resolve(&entry.path);
        let canonical = std::fs::canonicalize(&path).ok()?;
        if let Some(image) = by_file.get(&canonical) {
            return Some(image.clone());
        }
        let image = PluginImage::read(&path).ok()?;
        by_file.insert(canonical, image.clone());
        Some(image)
    };
    source.config.plugins.iter().map(&mut read).collect()
}

/// The rest of startup, over a registry with the config's plugins loaded (and the errors
/// loading them gave): config checks, instances validated and built.
fn assemble(
    source: ConfigSource,
    registry: Registry,
    mut errors: Vec<StartupError>,
) -> Result<Startup, Vec<StartupError>> {
    let (config_errors, sound_entries) = source.validate();
    errors.extend(config_errors.into_iter().map(StartupError::from));

    let mut instances = Vec::new();
    match builtin_default(&source, &registry) {
        Ok(instance) => instances.push(Arc::new(instance)),
        Err(e) => errors.push(e.into()),
    }
    // A plugin that failed to load is the one root error: instances that name its types
    // are summed up in one line, not reported each as an unknown type.
    let plugins_failed = errors
        .iter()
        .any(|e| matches!(e, StartupError::Plugin { .. }));
    let mut not_checked = Vec::new();
    for entry in sound_entries {
        match configured_instance(&source, &registry, entry) {
            Ok(instance) => instances.push(Arc::new(instance)),
            Err(e) if plugins_failed && matches!(*e, StartupError::UnknownType(_)) => {
                not_checked.push(format!("`{}`", entry.name));
            }
            Err(e) => errors.push(*e),
        }
    }
    if !not_checked.is_empty() {
        errors.push(StartupError::NotChecked {
            config: source.name.clone(),
            instances: not_checked,
        });
    }
    let serves = |name: &str, role| {
        instances
            .iter()
            .find(|i| i.name == name)
            .map(|i| i.serves(role))
            .or_else(|| source.instance_names().contains(&name).then_some(true))
    };
    let role_defaults = roles::resolve(&source, serves).unwrap_or_else(|e| {
        errors.extend(e.into_iter().map(StartupError::from));
        RoleDefaults::default()
    });
    let admitters = configured_admitters(&source, &registry, &mut errors);
    let keyring = Keyring::load(&source).unwrap_or_else(|e| {
        errors.extend(e.into_iter().map(StartupError::from));
        Keyring::default()
    });

    if errors.is_empty() {
        Ok(Startup {
            source,
            registry,
            instances,
            role_defaults,
            keyring: Arc::new(keyring),
            admitters,
        })
    } else {
        Err(errors)
    }
}

/// A registry with the built-ins and every plugin the config lists that loads.
fn load_plugins(
    source: &ConfigSource,
    images: &Images,
    errors: &mut Vec<StartupError>,
) -> Registry {
    let mut registry = Registry::with_builtins();
    for (entry, image) in source.config.plugins.iter().zip(images) {
        let spec = PluginSpec {
            path: source.resolve(&entry.path),
            sha256: entry.sha256.clone(),
            revision: entry.revision,
        };
        let image = image.as_ref();
        let loaded = match entry.isolation.process_group(&spec.path) {
            Some(process) => {
                registry.load_plugin_isolated(&spec, image, &process, &source.config.isolation)
            }
            None => registry.load_plugin_from(&spec, image),
        };
        if let Err(error) = loaded {
            let path_line = source.line_of("path", &entry.path.to_string_lossy(), 0);
            // A pin that does not match, or does not parse, is the `sha256:` line's fault.
            let pin_line = match (&error, &entry.sha256) {
                (LoadError::ChecksumMismatch { .. } | LoadError::InvalidPin { .. }, Some(pin)) => {
                    path_line.and_then(|from| source.line_from("sha256", pin, from))
                }
                _ => None,
            };
            let at = Location {
                config: source.name.clone(),
                line: pin_line.or(path_line),
            };
            errors.push(StartupError::Plugin { at, error });
        }
    }
    registry
}

/// The built-in `default` instance, tuned by `worker_selection.builtin_default`.
fn builtin_default(
    source: &ConfigSource,
    registry: &Registry,
) -> Result<InstanceFactory, ConfigError> {
    let params = OwnedParams::new(source.config.worker_selection.builtin_default.clone());
    let policy = registry.policy(BUILTIN_DEFAULT).expect("built in");
    match policy.validate(&params, registry) {
        Ok(factory) => Ok(InstanceFactory {
            name: BUILTIN_DEFAULT.to_owned(),
            on_error: OnError::Fail,
            kind: InstanceKind::Policy {
                policy_type: BUILTIN_DEFAULT.to_owned(),
                origin: policy.origin.to_string(),
                factory,
            },
            budget: None,
            serves: WorkerType::ALL.to_vec(),
        }),
        Err(e) => Err(ConfigError {
            file: source.name.clone(),
            line: source
                .text
                .lines()
                .position(|l| l.trim_start().starts_with("builtin_default:"))
                .map(|i| i + 1),
            message: format!(
                "invalid `builtin_default` parameters: {e}. See docs/default-policy.md for the knobs"
            ),
        }),
    }
}

/// One configured instance, validated and built once for every worker type it serves.
fn configured_instance(
    source: &ConfigSource,
    registry: &Registry,
    entry: &InstanceEntry,
) -> Result<InstanceFactory, Box<StartupError>> {
    let instance = instance(source, registry, entry)?;
    for worker_type in instance.serves.clone() {
        if let Err(error) = instance.build(&PartitionKey::new("<startup check>", worker_type)) {
            return Err(Box::new(StartupError::Unbuildable {
                at: Location {
                    config: source.name.clone(),
                    line: source.instance_line(entry),
                },
                instance: entry.name.clone(),
                worker_type,
                origin: origin_of(registry, &error),
                error,
                roles_listed: entry.worker_types.is_some(),
            }));
        }
    }
    Ok(instance)
}

/// `admission.admitters`, each resolved and created once for every worker type; an entry
/// that fails is reported at its `type:` line.
fn configured_admitters(
    source: &ConfigSource,
    registry: &Registry,
    errors: &mut Vec<StartupError>,
) -> Vec<AdmitterUse> {
    let Some(admission) = &source.config.admission else {
        return Vec::new();
    };
    let section = source
        .text
        .lines()
        .position(|l| l.starts_with("admission:"))
        .map_or(1, |i| i + 1);
    let mut uses = Vec::new();
    for entry in &admission.admitters {
        let type_name = &entry.admitter_type;
        let at = Location {
            config: source.name.clone(),
            line: source.line_from("type", type_name, section),
        };
        let params = configured_params(source, &entry.parameters);
        let checked = crate::admitters::resolve(registry, type_name, params, entry.on_error)
            .and_then(|admitter| {
                for worker_type in WorkerType::ALL {
                    let partition = PartitionKey::new("<startup check>", worker_type);
                    if let Err(error) =
                        Admitters::build(std::slice::from_ref(&admitter), &partition)
                    {
                        return Err(crate::admitters::AdmitterInvalid::Parameters {
                            type_name: type_name.clone(),
                            origin: admitter.component.origin.to_string(),
                            params: admitter.params.json().to_owned(),
                            error: Box::new(error),
                        });
                    }
                }
                Ok(admitter)
            });
        match checked {
            Ok(admitter) => uses.push(admitter),
            Err(message) => errors.push(StartupError::Admitter { at, message }),
        }
    }
    uses
}

fn instance(
    source: &ConfigSource,
    registry: &Registry,
    entry: &InstanceEntry,
) -> Result<InstanceFactory, Box<StartupError>> {
    let composed = !entry.filters.is_empty() || !entry.scorers.is_empty() || entry.picker.is_some();
    let name = &entry.name;
    let name_line = source.instance_line(entry).unwrap_or(1);
    let at = |message: String| ConfigError {
        file: source.name.clone(),
        line: Some(name_line),
        message,
    };
    let kind = match (&entry.policy_type, composed) {
        (Some(_), true) => {
            return Err(at(format!("instance `{name}` has both `type` and `filters`/`scorers`/`picker`; use `type` for a policy type, or compose components, not both")).into())
        }
        (None, false) => {
            return Err(at(format!("instance `{name}` needs `type: <policy type>`, or `scorers` and a `picker`")).into())
        }
        (Some(policy_type), false) => policy_instance(source, registry, entry, policy_type, name_line)?,
        (None, true) => {
            let mut components = Vec::new();
            for (entries, kind) in [(&entry.filters, ComponentKind::Filter), (&entry.scorers, ComponentKind::Scorer)] {
                for c in entries {
                    components.push(component(source, registry, (name, name_line), c, kind)?);
                }
            }
            match &entry.picker {
                Some(picker) => components.push(component(source, registry, (name, name_line), picker, ComponentKind::Picker)?),
                None => return Err(at(format!("instance `{name}` composes components but has no `picker`; add e.g. `picker: {{type: builtin.lowest-cost}}`")).into()),
            }
            InstanceKind::Composition { components }
        }
    };
    let budget = match entry.call_budget_ms {
        None => None,
        Some(ms) if ms.is_finite() && ms > 0.0 && entry.trip_after > 0 => Some(CallBudget {
            limit: Duration::from_secs_f64(ms / 1e3),
            trip_after: entry.trip_after,
            cooldown: Duration::from_secs(entry.trip_cooldown_secs),
        }),
        Some(ms) => {
            return Err(at(format!(
                "instance `{name}`: `call_budget_ms` must be a number > 0 and `trip_after` at least 1, got {ms} and {}",
                entry.trip_after
            ))
            .into())
        }
    };
    let serves = match &entry.worker_types {
        None => WorkerType::ALL.to_vec(),
        Some(listed) if listed.is_empty() => {
            return Err(at(format!("instance `{name}`: `worker_types` lists no worker type; list the roles it serves (prefill, decode, aggregated), or leave the key out for all three")).into())
        }
        Some(listed) => WorkerType::ALL.into_iter().filter(|r| listed.contains(r)).collect(),
    };
    Ok(InstanceFactory {
        name: name.clone(),
        on_error: entry.on_error,
        kind,
        budget,
        serves,
    })
}

/// An instance of a policy type (`type:`), its parameters validated by the type.
fn policy_instance(
    source: &ConfigSource,
    registry: &Registry,
    entry: &InstanceEntry,
    policy_type: &str,
    name_line: usize,
) -> Result<InstanceKind, Box<StartupError>> {
    let name = &entry.name;
    let type_line = source.line_from("type", policy_type, name_line);
    let at_type = |message: String| ConfigError {
        file: source.name.clone(),
        line: type_line,
        message,
    };
    let Some(policy) = registry.policy(policy_type) else {
        let hint = match registry.component(policy_type) {
            Some(c) => format!(
                " (`{policy_type}` is a {}: list it under `{}s:` of a composed instance)",
                c.kind.as_str(),
                c.kind.as_str()
            ),
            None => String::new(),
        };
        return Err(Box::new(StartupError::UnknownType(at_type(format!(
            "instance `{name}`: unknown policy type `{policy_type}`{hint}. Registered policy types: {}. Load the plugin that provides it under `plugins:`",
            registry.names_of(None).join(", ")
        )))));
    };
    let params = configured_params(source, &entry.parameters);
    let factory = policy.validate(&params, registry).map_err(|error| {
        Box::new(StartupError::InvalidParameters {
            at: Location {
                config: source.name.clone(),
                line: type_line,
            },
            instance: name.clone(),
            policy_type: policy_type.to_owned(),
            params: params.json().to_owned(),
            error,
            origin: policy.origin.to_string(),
        })
    })?;
    Ok(InstanceKind::Policy {
        policy_type: policy_type.to_owned(),
        origin: policy.origin.to_string(),
        factory,
    })
}

/// One component of a composed instance whose `name:` is on line `from`.
fn component(
    source: &ConfigSource,
    registry: &Registry,
    (instance, from): (&str, usize),
    entry: &ComponentEntry,
    expected: ComponentKind,
) -> Result<ComponentUse, Box<StartupError>> {
    let type_name = &entry.component_type;
    let at = |message: String| ConfigError {
        file: source.name.clone(),
        line: source.line_from("type", type_name, from),
        message,
    };
    let Some(component) = registry.component(type_name) else {
        return Err(Box::new(StartupError::UnknownType(at(format!(
            "instance `{instance}`: unknown {} type `{type_name}`. Registered {}s: {}. Load the plugin that provides it under `plugins:`",
            expected.as_str(),
            expected.as_str(),
            registry.names_of(Some(expected)).join(", ")
        )))));
    };
    if component.kind != expected {
        return Err(at(format!(
            "instance `{instance}`: `{type_name}` is {}, but it is listed as {}; list it in {}",
            component.kind.with_article(),
            expected.with_article(),
            component.kind.config_place()
        ))
        .into());
    }
    let weight = match (entry.weight, expected) {
        (Some(w), ComponentKind::Scorer) if w.is_finite() => w,
        (Some(w), ComponentKind::Scorer) => return Err(at(format!("instance `{instance}`: scorer `{type_name}` has weight {w}; weights must be finite numbers")).into()),
        (Some(_), _) => return Err(at(format!("instance `{instance}`: `weight` applies to scorers only, not to {} `{type_name}`", expected.as_str())).into()),
        (None, _) => 1.0,
    };
    Ok(ComponentUse {
        component: component.clone(),
        params: configured_params(source, &entry.parameters),
        weight,
    })
}

/// An entry's parameters as its factory is handed them: with the router's cost-model
/// knobs (ABI 1.5).
fn configured_params(
    source: &ConfigSource,
    parameters: &serde_json::Map<String, serde_json::Value>,
) -> OwnedParams {
    OwnedParams::new(parameters.clone()).with_router(Some(crate::builtin::router_settings(
        &source.config.router,
        &source.config.worker_selection.builtin_default,
    )))
}
