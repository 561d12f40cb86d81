//! Which instance a request that names none gets, per worker type (role), and the
//! environment that overrides it, as Dynamo resolves its per-stage selections.
//!
//! For a role, the first of: its stage variable (`DYN_ROUTER_PREFILL_POLICY`,
//! `DYN_ROUTER_DECODE_POLICY`), the global variable (`SWITCHYARD_WORKER_SELECTION_POLICY`,
//! or Dynamo's `DYN_ROUTER_WORKER_SELECTION_POLICY`), the role's YAML key
//! (`worker_selection.prefill` / `decode` / `aggregated`), then `worker_selection.default`.
//! The value `default` is the built-in policy, as in Dynamo. Any other `DYN_ROUTER_*`
//! variable is Dynamo's and not read here: it is named in a warning, never silently
//! ignored.

use switchyard_config::{ConfigError, ConfigSource, WorkerSelection};
use switchyard_plugin_sdk::WorkerType;

use super::POLICY_ENV;
use crate::instances::role_word;

/// Dynamo's global override, read as `POLICY_ENV` is.
pub const DYNAMO_POLICY_ENV: &str = "DYN_ROUTER_WORKER_SELECTION_POLICY";

/// The `DYN_ROUTER_*` variables switchyard reads.
const READ: [&str; 3] = [
    DYNAMO_POLICY_ENV,
    "DYN_ROUTER_PREFILL_POLICY",
    "DYN_ROUTER_DECODE_POLICY",
];

/// The instance of each role's requests that name none, in `WorkerType::ALL` order.
#[derive(Clone, Debug, Default)]
pub struct RoleDefaults([String; 3]);

impl RoleDefaults {
    pub fn get(&self, role: WorkerType) -> &str {
        &self.0[index(role)]
    }

    /// Every role to `name` (tools and benches that route with one instance).
    pub fn all(name: &str) -> RoleDefaults {
        RoleDefaults([name.to_owned(), name.to_owned(), name.to_owned()])
    }
}

fn index(role: WorkerType) -> usize {
    WorkerType::ALL
        .iter()
        .position(|&r| r == role)
        .unwrap_or_default()
}

fn stage_env(role: WorkerType) -> Option<&'static str> {
    match role {
        WorkerType::Prefill => Some("DYN_ROUTER_PREFILL_POLICY"),
        WorkerType::Decode => Some("DYN_ROUTER_DECODE_POLICY"),
        WorkerType::Select => None,
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Where a role's instance name came from.
enum From {
    Env(&'static str),
    Yaml(&'static str),
}

/// Each role's instance; every name that names no instance is an error naming the
/// variable or the YAML key (and its line) it came from. `serves(name, role)` says
/// whether instance `name` serves `role` (unknown names: `None`).
pub fn resolve(
    source: &ConfigSource,
    serves: impl Fn(&str, WorkerType) -> Option<bool>,
) -> Result<RoleDefaults, Vec<ConfigError>> {
    let mut errors = Vec::new();
    let global = match (env(POLICY_ENV), env(DYNAMO_POLICY_ENV)) {
        (Some(ours), Some(theirs)) if ours != theirs => {
            errors.push(ConfigError {
                file: source.name.clone(),
                line: None,
                message: format!("{POLICY_ENV}={ours} and {DYNAMO_POLICY_ENV}={theirs} disagree; set one of them"),
            });
            None
        }
        (Some(name), _) => Some((name, POLICY_ENV)),
        (None, Some(name)) => Some((name, DYNAMO_POLICY_ENV)),
        (None, None) => None,
    };
    let mut names: [String; 3] = Default::default();
    for role in WorkerType::ALL {
        let (name, from) = match (
            stage_env(role).and_then(|v| env(v).map(|n| (n, v))),
            &global,
        ) {
            (Some((name, var)), _) => (name, From::Env(var)),
            (None, Some((name, var))) => (name.clone(), From::Env(var)),
            (None, None) => {
                let (name, key) = source.config.worker_selection.for_role(role);
                (name.to_owned(), From::Yaml(key))
            }
        };
        // A name set for every role is wrong once, not once per role.
        if let Some(error) = check(source, &serves, role, &name, &from) {
            if !errors
                .iter()
                .any(|e: &ConfigError| e.message == error.message)
            {
                errors.push(error);
            }
        }
        names[index(role)] = name;
    }
    if errors.is_empty() {
        Ok(RoleDefaults(names))
    } else {
        Err(errors)
    }
}

/// Why `name` cannot be `role`'s instance, if it cannot: it names no instance, or one
/// that does not serve `role` although set for that role alone.
fn check(
    source: &ConfigSource,
    serves: &impl Fn(&str, WorkerType) -> Option<bool>,
    role: WorkerType,
    name: &str,
    from: &From,
) -> Option<ConfigError> {
    // Set for this role alone (its YAML key or stage variable), not as everyone's.
    let for_role = match from {
        From::Yaml(key) => *key == WorkerSelection::role_key(role),
        From::Env(var) => Some(*var) == stage_env(role),
    };
    let known = || source.instance_names().join(", ");
    let message = match (serves(name, role), from) {
        (Some(true), _) => return None,
        // `default` (or a global variable) may name an instance of fewer roles: a
        // request of another role is then refused with 503, naming it.
        (Some(false), _) if !for_role => return None,
        (Some(false), From::Env(var)) => format!(
            "{var}={name}: instance `{name}` does not serve {} workers (its `worker_types`); name one that does",
            role_word(role)
        ),
        (Some(false), From::Yaml(key)) => format!(
            "`worker_selection.{key}: {name}`: instance `{name}` does not serve {} workers (its `worker_types`); name one that does",
            role_word(role)
        ),
        (None, From::Env(var)) => {
            format!("{var}={name} names no instance; set it to one of: {}", known())
        }
        (None, From::Yaml(key)) => format!(
            "`worker_selection.{key}: {name}` names no instance; use one of: {}",
            known()
        ),
    };
    Some(match from {
        From::Env(_) => ConfigError {
            file: source.name.clone(),
            line: None,
            message,
        },
        From::Yaml(key) => source.error_at(key, name, 0, message),
    })
}

/// The `DYN_ROUTER_*` variables set in this process that switchyard does not read, with
/// what to do (printed by `check` and logged by `serve`).
pub fn unread_dynamo_env() -> Vec<String> {
    let mut unread: Vec<String> = std::env::vars_os()
        .filter_map(|(key, _)| key.into_string().ok())
        .filter(|key| key.starts_with("DYN_ROUTER_") && !READ.contains(&key.as_str()))
        .collect();
    unread.sort();
    unread
        .into_iter()
        .map(|key| format!("{key} is set: it is Dynamo's, and switchyard does not read it (it reads {}); set its equivalent in the config (docs/dynamo.md)", READ.join(", ")))
        .collect()
}
