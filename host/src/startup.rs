//! Startup: from a parsed config to a registry with every plugin loaded and every policy
//! instance validated and built once per worker type. Collects every error, not just the
//! first, so `switchyard check` can show them all.

use std::collections::HashSet;
use std::sync::Arc;

use switchyard_plugin_sdk::WorkerType;

use crate::config::{ComponentEntry, ConfigError, ConfigSource, InstanceEntry, OnError};
use crate::instances::{ComponentUse, InstanceFactory, InstanceKind};
use crate::loader::{load_into, LoadError, PluginSpec};
use crate::params::OwnedParams;
use crate::registry::{ComponentKind, PartitionKey, Registry};

/// Environment variable that overrides `worker_selection.default` by instance name.
pub const POLICY_ENV: &str = "SWITCHYARD_WORKER_SELECTION_POLICY";
/// The built-in policy's instance name (and type name).
pub const BUILTIN_DEFAULT: &str = "default";

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{}: {error}", match line { Some(l) => format!("{config}:{l}"), None => config.clone() })]
    Plugin {
        config: String,
        line: Option<usize>,
        error: LoadError,
    },
}

/// Everything startup produced.
pub struct Startup {
    pub source: ConfigSource,
    pub registry: Registry,
    /// The built-in `default` instance first, then the config's, in order.
    pub instances: Vec<Arc<InstanceFactory>>,
    pub default_instance: String,
}

impl Startup {
    pub fn instance(&self, name: &str) -> Option<&Arc<InstanceFactory>> {
        self.instances.iter().find(|i| i.name == name)
    }
}

pub fn start(source: ConfigSource) -> Result<Startup, Vec<StartupError>> {
    let mut errors: Vec<StartupError> = Vec::new();
    let mut registry = Registry::with_builtins();

    for entry in &source.config.plugins {
        let spec = PluginSpec {
            path: source.resolve(&entry.path),
            sha256: entry.sha256.clone(),
            revision: entry.revision,
        };
        if let Err(error) = load_into(&mut registry, &spec) {
            let line = source.line_of("path", &entry.path.to_string_lossy(), 0);
            errors.push(StartupError::Plugin {
                config: source.name.clone(),
                line,
                error,
            });
        }
    }

    let router = &source.config.router;
    for (key, value) in [
        ("block_size", u64::from(router.block_size)),
        ("request_expiry_secs", router.request_expiry_secs),
    ] {
        if value == 0 {
            let line = source
                .text
                .lines()
                .position(|l| l.trim_start().starts_with(&format!("{key}:")))
                .map(|i| i + 1);
            errors.push(
                ConfigError {
                    file: source.name.clone(),
                    line,
                    message: format!("`router.{key}` must be at least 1"),
                }
                .into(),
            );
        }
    }

    let mut instances = Vec::new();
    let builtin_params = OwnedParams::new(source.config.worker_selection.builtin_default.clone());
    match registry.policy(BUILTIN_DEFAULT).expect("built in").validate(&builtin_params) {
        Ok(factory) => instances.push(Arc::new(InstanceFactory {
            name: BUILTIN_DEFAULT.to_owned(),
            on_error: OnError::Fail,
            kind: InstanceKind::Policy { policy_type: BUILTIN_DEFAULT.to_owned(), factory },
        })),
        Err(e) => errors.push(
            ConfigError {
                file: source.name.clone(),
                line: source.text.lines().position(|l| l.trim_start().starts_with("builtin_default:")).map(|i| i + 1),
                message: format!("invalid `builtin_default` parameters: {e}. See docs/default-policy.md for the knobs"),
            }
            .into(),
        ),
    }

    let mut seen = HashSet::new();
    for entry in &source.config.worker_selection.instances {
        let nth = source
            .config
            .worker_selection
            .instances
            .iter()
            .take_while(|e| !std::ptr::eq(*e, entry))
            .filter(|e| e.name == entry.name)
            .count();
        let at = |message: String| source.error_at("name", &entry.name, nth, message);
        if entry.name.trim().is_empty() {
            errors.push(
                at("an instance has an empty `name`; give each instance a unique name".into())
                    .into(),
            );
            continue;
        }
        if entry.name == BUILTIN_DEFAULT {
            errors.push(at(format!("instance name `{BUILTIN_DEFAULT}` is reserved for the built-in policy; tune it under `worker_selection.builtin_default`, or pick another name")).into());
            continue;
        }
        if !seen.insert(entry.name.clone()) {
            errors.push(
                at(format!(
                    "duplicate instance name `{}`; instance names must be unique",
                    entry.name
                ))
                .into(),
            );
            continue;
        }
        match instance(&source, &registry, entry) {
            Ok(factory) => {
                let mut ok = true;
                for worker_type in WorkerType::ALL {
                    if let Err(e) =
                        factory.build(&PartitionKey::new("<startup check>", worker_type))
                    {
                        errors.push(
                            at(format!(
                                "instance `{}` cannot be built for worker type {}: {e}",
                                entry.name,
                                worker_type.as_str()
                            ))
                            .into(),
                        );
                        ok = false;
                        break;
                    }
                }
                if ok {
                    instances.push(Arc::new(factory));
                }
            }
            Err(e) => errors.push(e.into()),
        }
    }

    let (default_instance, from_env) = match std::env::var(POLICY_ENV) {
        Ok(name) if !name.is_empty() => (name, true),
        _ => (source.config.worker_selection.default.clone(), false),
    };
    let known = default_instance == BUILTIN_DEFAULT
        || source
            .config
            .worker_selection
            .instances
            .iter()
            .any(|i| i.name == default_instance);
    if !known {
        let names: Vec<_> = std::iter::once(BUILTIN_DEFAULT)
            .chain(
                source
                    .config
                    .worker_selection
                    .instances
                    .iter()
                    .map(|i| i.name.as_str()),
            )
            .collect();
        let message = if from_env {
            format!(
                "{POLICY_ENV}={default_instance} names no instance; set it to one of: {}",
                names.join(", ")
            )
        } else {
            format!(
                "`worker_selection.default: {default_instance}` names no instance; use one of: {}",
                names.join(", ")
            )
        };
        errors.push(
            source
                .error_at("default", &default_instance, 0, message)
                .into(),
        );
    }

    if errors.is_empty() {
        Ok(Startup {
            source,
            registry,
            instances,
            default_instance,
        })
    } else {
        Err(errors)
    }
}

fn instance(
    source: &ConfigSource,
    registry: &Registry,
    entry: &InstanceEntry,
) -> Result<InstanceFactory, ConfigError> {
    let composed = !entry.filters.is_empty() || !entry.scorers.is_empty() || entry.picker.is_some();
    let name = &entry.name;
    let at = |message: String| source.error_at("name", name, 0, message);
    let kind = match (&entry.policy_type, composed) {
        (Some(_), true) => {
            return Err(at(format!("instance `{name}` has both `type` and `filters`/`scorers`/`picker`; use `type` for a policy type, or compose components, not both")))
        }
        (None, false) => {
            return Err(at(format!("instance `{name}` needs `type: <policy type>`, or `scorers` and a `picker`")))
        }
        (Some(policy_type), false) => {
            let at_type = |message: String| source.error_at("type", policy_type, 0, message);
            let Some(policy) = registry.policy(policy_type) else {
                let hint = match registry.component(policy_type) {
                    Some(c) => format!(" (`{policy_type}` is a {}: list it under `{}s:` of a composed instance)", c.kind.as_str(), c.kind.as_str()),
                    None => String::new(),
                };
                return Err(at_type(format!(
                    "instance `{name}`: unknown policy type `{policy_type}`{hint}. Registered policy types: {}. Load the plugin that provides it under `plugins:`",
                    registry.names_of(None).join(", ")
                )));
            };
            let params = OwnedParams::new(entry.parameters.clone());
            let factory = policy.validate(&params).map_err(|e| {
                at_type(format!("instance `{name}`: invalid parameters for policy type `{policy_type}` ({}): {e}", params.json()))
            })?;
            InstanceKind::Policy { policy_type: policy_type.clone(), factory }
        }
        (None, true) => {
            let mut components = Vec::new();
            for (entries, kind) in [(&entry.filters, ComponentKind::Filter), (&entry.scorers, ComponentKind::Scorer)] {
                for c in entries {
                    components.push(component(source, registry, name, c, kind)?);
                }
            }
            match &entry.picker {
                Some(picker) => components.push(component(source, registry, name, picker, ComponentKind::Picker)?),
                None => return Err(at(format!("instance `{name}` composes components but has no `picker`; add e.g. `picker: {{type: builtin.lowest-cost}}`"))),
            }
            InstanceKind::Composition { components }
        }
    };
    Ok(InstanceFactory {
        name: name.clone(),
        on_error: entry.on_error,
        kind,
    })
}

fn component(
    source: &ConfigSource,
    registry: &Registry,
    instance: &str,
    entry: &ComponentEntry,
    expected: ComponentKind,
) -> Result<ComponentUse, ConfigError> {
    let type_name = &entry.component_type;
    let at = |message: String| source.error_at("type", type_name, 0, message);
    let Some(component) = registry.component(type_name) else {
        return Err(at(format!(
            "instance `{instance}`: unknown {} type `{type_name}`. Registered {}s: {}. Load the plugin that provides it under `plugins:`",
            expected.as_str(),
            expected.as_str(),
            registry.names_of(Some(expected)).join(", ")
        )));
    };
    if component.kind != expected {
        return Err(at(format!(
            "instance `{instance}`: `{type_name}` is a {}, but it is listed as a {}; move it under `{}s:`",
            component.kind.as_str(),
            expected.as_str(),
            component.kind.as_str()
        )));
    }
    let weight = match (entry.weight, expected) {
        (Some(w), ComponentKind::Scorer) if w.is_finite() => w,
        (Some(w), ComponentKind::Scorer) => return Err(at(format!("instance `{instance}`: scorer `{type_name}` has weight {w}; weights must be finite numbers"))),
        (Some(_), _) => return Err(at(format!("instance `{instance}`: `weight` applies to scorers only, not to {} `{type_name}`", expected.as_str()))),
        (None, _) => 1.0,
    };
    Ok(ComponentUse {
        component: component.clone(),
        params: OwnedParams::new(entry.parameters.clone()),
        weight,
    })
}
