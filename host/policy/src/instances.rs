//! Configured policy instances: a policy type with validated parameters, or a composition
//! of component types. Each builds one `Policy` per partition.

use std::sync::Arc;

use super::error::BuildError;
use super::pipeline::Policy;
use super::registry::{ComponentType, Origin, PolicyFactory};
use switchyard_config::OnError;
use switchyard_plugin_host::plugin::{OwnedParams, PartitionKey};
use switchyard_plugin_sdk::WorkerType;

/// One component of a composition, with its parameters.
pub struct ComponentUse {
    pub component: Arc<ComponentType>,
    pub params: OwnedParams,
    pub weight: f64,
}

pub enum InstanceKind {
    Policy {
        policy_type: String,
        /// Where the type comes from (`built in`, or the plugin and its library), for
        /// errors about what its build made.
        origin: String,
        factory: PolicyFactory,
    },
    Composition {
        components: Vec<ComponentUse>,
    },
}

/// A per-instance time budget for selections (`call_budget_ms`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CallBudget {
    pub limit: std::time::Duration,
    /// Consecutive over-budget selections that trip the instance.
    pub trip_after: u32,
    pub cooldown: std::time::Duration,
}

/// A configured instance: what `worker_selection.instances[]` names.
pub struct InstanceFactory {
    pub name: String,
    pub on_error: OnError,
    pub kind: InstanceKind,
    pub budget: Option<CallBudget>,
    /// The worker types it serves (`worker_types:`; all three when the config lists
    /// none): it is built for those partitions only.
    pub serves: Vec<WorkerType>,
}

impl InstanceFactory {
    /// Whether it serves requests to `role`'s workers.
    pub fn serves(&self, role: WorkerType) -> bool {
        self.serves.contains(&role)
    }

    /// The roles it serves, as the config spells them (`prefill, decode`).
    pub fn roles(&self) -> String {
        role_words(&self.serves)
    }

    /// Builds this instance's policy for `partition`.
    pub fn build(&self, partition: &PartitionKey) -> Result<Policy, BuildError> {
        let stages = match &self.kind {
            InstanceKind::Policy {
                factory,
                policy_type,
                origin,
            } => {
                let stages = factory.build(partition)?;
                return Policy::new(stages).map_err(|e| match e {
                    BuildError::PickerCount { found, .. } => BuildError::PickerCount {
                        found,
                        built_by: Some(format!("policy type `{policy_type}` ({origin})")),
                    },
                    other => other,
                });
            }
            InstanceKind::Composition { components } => components
                .iter()
                .map(|c| {
                    c.component
                        .create(&c.params, partition)
                        .map(|stage| (stage, c.weight))
                })
                .collect::<Result<_, _>>()?,
        };
        Policy::new(stages)
    }

    /// Whether every component this instance builds is the router's own: a built-in
    /// policy type, or a composition of built-in components (no plugin library's code,
    /// in process or isolated).
    pub fn runs_only_router_code(&self) -> bool {
        match &self.kind {
            InstanceKind::Policy { factory, .. } => {
                matches!(factory, PolicyFactory::Builtin { .. })
            }
            InstanceKind::Composition { components } => components
                .iter()
                .all(|c| matches!(c.component.origin, Origin::Builtin)),
        }
    }

    /// A one-line description for summaries.
    pub fn describe(&self) -> String {
        match &self.kind {
            InstanceKind::Policy { policy_type, .. } => format!("policy type `{policy_type}`"),
            InstanceKind::Composition { components } => components
                .iter()
                .map(|c| format!("{} {}", c.component.kind.as_str(), c.component.name))
                .collect::<Vec<_>>()
                .join(" -> "),
        }
    }
}

/// A worker type as the config spells it (`aggregated` for the SDK's `select`).
pub fn role_word(role: WorkerType) -> &'static str {
    match role {
        WorkerType::Select => "aggregated",
        other => other.as_str(),
    }
}

/// `roles` as a config names them, in a list: "aggregated, prefill".
pub fn role_words(roles: &[WorkerType]) -> String {
    roles
        .iter()
        .map(|&r| role_word(r))
        .collect::<Vec<_>>()
        .join(", ")
}
