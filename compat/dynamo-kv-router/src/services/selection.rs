//! Dynamo's `services::selection` policy registration: parameters, provider and registry
//! errors, the factory and the registry.

use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;

pub use crate::policy::{
    WorkerFilter, WorkerPicker, WorkerScorer, WorkerSelectionPolicy, WorkerSelectionPolicyError,
};

/// The router settings a factory is handed: the router's own cost-model knobs (ABI 1.5,
/// [`KvRouterConfig::from_switchyard`]), Dynamo's defaults where it has none.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct KvRouterConfig {
    pub overlap_score_weight: f64,
    pub router_temperature: f64,
    pub prefill_load_scale: f64,
    pub decode_active_request_weight: f64,
}

impl Default for KvRouterConfig {
    fn default() -> Self {
        KvRouterConfig {
            overlap_score_weight: 1.0,
            router_temperature: 0.0,
            prefill_load_scale: 1.0,
            decode_active_request_weight: 0.0,
        }
    }
}

impl KvRouterConfig {
    /// The router's knobs (`worker_selection.builtin_default`) in Dynamo's terms:
    /// `uncached_weight` (a block to prefill against a block of load) is Dynamo's
    /// `overlap_score_weight`, `temperature` its `router_temperature`,
    /// `prefill_load_scale` the same; `decode_active_request_weight` has no switchyard
    /// knob and keeps Dynamo's default, as does everything from a router older than 1.5.
    pub fn from_switchyard(router: Option<switchyard_plugin_sdk::RouterSettings>) -> Self {
        let mut config = KvRouterConfig::default();
        if let Some(router) = router {
            config.overlap_score_weight = router.uncached_weight;
            config.router_temperature = router.temperature;
            config.prefill_load_scale = router.prefill_load_scale;
        }
        config
    }
}

/// The routing partition a factory builds a policy for: a model and a routing group
/// (switchyard has one group per model and worker type: `default`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RoutingPartitionRef<'a> {
    model: &'a str,
    routing_group: &'a str,
}

impl<'a> RoutingPartitionRef<'a> {
    pub fn new(model: &'a str, routing_group: &'a str) -> Self {
        RoutingPartitionRef {
            model,
            routing_group,
        }
    }

    pub fn model(&self) -> &'a str {
        self.model
    }

    pub fn routing_group(&self) -> &'a str {
        self.routing_group
    }
}

/// Creates one policy per routing partition: `(router config, worker type, partition)`;
/// the worker type is `prefill`, `decode` or `select`.
pub type WorkerSelectionPolicyFactory = Arc<
    dyn for<'a> Fn(&KvRouterConfig, &'static str, RoutingPartitionRef<'a>) -> WorkerSelectionPolicy
        + Send
        + Sync,
>;

/// Parses one instance's parameters and creates its partition factory.
pub type WorkerSelectionPolicyProvider = Arc<
    dyn Fn(
            &WorkerSelectionPolicyParameters,
        ) -> Result<WorkerSelectionPolicyFactory, WorkerSelectionPolicyProviderError>
        + Send
        + Sync,
>;

/// One policy instance's `parameters` from the config (JSON in switchyard, where Dynamo
/// holds YAML: the same values deserialize alike).
#[derive(Debug, Clone)]
pub struct WorkerSelectionPolicyParameters(String);

impl WorkerSelectionPolicyParameters {
    /// Parameters from their JSON text (`{}` when the config gives none).
    pub fn from_json(json: impl Into<String>) -> Self {
        Self(json.into())
    }

    /// Deserializes the parameter mapping into a policy-owned type.
    pub fn deserialize<T: DeserializeOwned>(
        &self,
    ) -> Result<T, WorkerSelectionPolicyProviderError> {
        serde_json::from_str(&self.0)
            .map_err(|source| WorkerSelectionPolicyProviderError::new(source.to_string()))
    }
}

/// A policy's own validation failure while creating its factory.
#[derive(Debug, Clone)]
pub struct WorkerSelectionPolicyProviderError {
    message: String,
}

impl WorkerSelectionPolicyProviderError {
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

impl fmt::Display for WorkerSelectionPolicyProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for WorkerSelectionPolicyProviderError {}

/// Why a registration failed.
#[derive(Debug)]
pub enum WorkerSelectionPolicyRegistryError {
    EmptyName,
    ReservedDefault,
    Duplicate {
        name: String,
    },
    Provider {
        policy_type: String,
        source: WorkerSelectionPolicyProviderError,
    },
}

impl fmt::Display for WorkerSelectionPolicyRegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EmptyName => f.write_str("worker-selection policy type must not be empty"),
            Self::ReservedDefault => f.write_str(
                "worker-selection policy type 'default' is reserved for Dynamo's built-in selector",
            ),
            Self::Duplicate { name } => {
                write!(
                    f,
                    "worker-selection policy type {name:?} is already registered"
                )
            }
            Self::Provider {
                policy_type,
                source,
            } => write!(
                f,
                "invalid parameters for worker-selection policy type {policy_type:?}: {source}"
            ),
        }
    }
}

impl std::error::Error for WorkerSelectionPolicyRegistryError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Provider { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The policy types a catalog registers, in registration order.
#[derive(Clone, Default)]
pub struct WorkerSelectionPolicyRegistry {
    providers: Vec<(String, WorkerSelectionPolicyProvider)>,
}

impl WorkerSelectionPolicyRegistry {
    /// Registers a policy type.
    pub fn register(
        &mut self,
        name: impl Into<String>,
        provider: WorkerSelectionPolicyProvider,
    ) -> Result<(), WorkerSelectionPolicyRegistryError> {
        let name = name.into();
        if name.is_empty() {
            return Err(WorkerSelectionPolicyRegistryError::EmptyName);
        }
        if name == "default" {
            return Err(WorkerSelectionPolicyRegistryError::ReservedDefault);
        }
        if self.providers.iter().any(|(known, _)| *known == name) {
            return Err(WorkerSelectionPolicyRegistryError::Duplicate { name });
        }
        self.providers.push((name, provider));
        Ok(())
    }

    /// The registered type names, in registration order (switchyard addition).
    pub fn policy_types(&self) -> impl Iterator<Item = &str> {
        self.providers.iter().map(|(name, _)| name.as_str())
    }

    /// Runs the provider of `policy_type` over `parameters` (switchyard addition: what the
    /// router does at startup for each configured instance).
    pub fn provide(
        &self,
        policy_type: &str,
        parameters: &WorkerSelectionPolicyParameters,
    ) -> Result<WorkerSelectionPolicyFactory, WorkerSelectionPolicyRegistryError> {
        let (_, provider) = self
            .providers
            .iter()
            .find(|(name, _)| name == policy_type)
            .ok_or_else(|| WorkerSelectionPolicyRegistryError::Provider {
                policy_type: policy_type.to_owned(),
                source: WorkerSelectionPolicyProviderError::new(format!(
                    "unknown type; registered: {}",
                    self.policy_types().collect::<Vec<_>>().join(", ")
                )),
            })?;
        provider(parameters).map_err(|source| WorkerSelectionPolicyRegistryError::Provider {
            policy_type: policy_type.to_owned(),
            source,
        })
    }

    pub(crate) fn into_providers(self) -> Vec<(String, WorkerSelectionPolicyProvider)> {
        self.providers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider(
        parameters: &WorkerSelectionPolicyParameters,
    ) -> Result<WorkerSelectionPolicyFactory, WorkerSelectionPolicyProviderError> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Parameters {
            #[allow(dead_code)]
            threshold: usize,
        }
        let _: Parameters = parameters.deserialize()?;
        Ok(Arc::new(|_, _, _| unreachable!("not built in these tests")))
    }

    #[test]
    fn registration_refuses_empty_reserved_and_duplicate_names() {
        let mut registry = WorkerSelectionPolicyRegistry::default();
        let provider: WorkerSelectionPolicyProvider = Arc::new(provider);
        assert!(matches!(
            registry.register("", provider.clone()),
            Err(WorkerSelectionPolicyRegistryError::EmptyName)
        ));
        assert!(matches!(
            registry.register("default", provider.clone()),
            Err(WorkerSelectionPolicyRegistryError::ReservedDefault)
        ));
        registry.register("beta", provider.clone()).unwrap();
        registry.register("alpha", provider.clone()).unwrap();
        assert!(matches!(
            registry.register("beta", provider),
            Err(WorkerSelectionPolicyRegistryError::Duplicate { name }) if name == "beta"
        ));
        assert_eq!(
            registry.policy_types().collect::<Vec<_>>(),
            ["beta", "alpha"]
        );
    }

    #[test]
    fn parameters_are_checked_by_the_provider_and_named_in_the_error() {
        let mut registry = WorkerSelectionPolicyRegistry::default();
        registry.register("alpha", Arc::new(provider)).unwrap();
        let good = WorkerSelectionPolicyParameters::from_json(r#"{"threshold": 3}"#);
        assert!(registry.provide("alpha", &good).is_ok());
        let bad = WorkerSelectionPolicyParameters::from_json(r#"{"threshold": 3, "x": 1}"#);
        let error = registry.provide("alpha", &bad).err().unwrap().to_string();
        assert!(
            error.starts_with(
                "invalid parameters for worker-selection policy type \"alpha\": unknown field `x`"
            ),
            "{error}"
        );
        assert!(registry.provide("gamma", &good).is_err());
    }

    /// The router's knobs reach Dynamo's config; what switchyard lacks keeps Dynamo's
    /// default.
    #[test]
    fn the_routers_knobs_become_dynamos_config() {
        let router = switchyard_plugin_sdk::RouterSettings {
            block_size: 16,
            host_cache_weight: 0.75,
            disk_cache_weight: 0.25,
            uncached_weight: 4.0,
            prefill_load_scale: 2.5,
            temperature: 0.5,
            engine_load_weight: 0.0,
        };
        let config = KvRouterConfig::from_switchyard(Some(router));
        assert_eq!(
            (
                config.overlap_score_weight,
                config.router_temperature,
                config.prefill_load_scale,
                config.decode_active_request_weight
            ),
            (4.0, 0.5, 2.5, 0.0)
        );
        assert_eq!(
            KvRouterConfig::from_switchyard(None),
            KvRouterConfig::default()
        );
    }
}
