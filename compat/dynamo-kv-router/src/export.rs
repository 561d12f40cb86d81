//! What [`export_catalog!`](crate::export_catalog) runs when the router loads the plugin:
//! each policy type of the catalog's registry registered as an SDK policy type.

use switchyard_plugin_sdk::{Partition, PolicyError, PolicyParts, Registrar};

use crate::plugins::RouterPluginRegistry;
use crate::services::selection::{
    KvRouterConfig, RoutingPartitionRef, WorkerSelectionPolicyParameters,
    WorkerSelectionPolicyProviderError, WorkerSelectionPolicyRegistry,
};
use crate::worker_type::WorkerType;

/// The routing group of every switchyard partition (one per model and worker type).
const ROUTING_GROUP: &str = "default";

/// Builds one partition's components.
pub type PartsFactory = Box<dyn FnMut(&Partition<'_>) -> PolicyParts + Send>;

/// Parses one instance's parameters into its partition factory, which Dynamo's factory
/// is handed the router's settings with.
pub type PolicyTypeProvider = Box<
    dyn Fn(
            &WorkerSelectionPolicyParameters,
            &KvRouterConfig,
        ) -> Result<PartsFactory, WorkerSelectionPolicyProviderError>
        + Send
        + Sync,
>;

/// A registry a catalog's `register` fills: the guide revision's
/// `services::selection::WorkerSelectionPolicyRegistry` or the current
/// `plugins::RouterPluginRegistry`.
pub trait Catalog: Default {
    /// The registered types, in registration order.
    fn into_policy_types(self) -> Vec<(String, PolicyTypeProvider)>;
}

impl Catalog for WorkerSelectionPolicyRegistry {
    fn into_policy_types(self) -> Vec<(String, PolicyTypeProvider)> {
        self.into_providers()
            .into_iter()
            .map(|(name, provider)| {
                let provider: PolicyTypeProvider = Box::new(move |parameters, config| {
                    let (factory, config) = (provider(parameters)?, config.clone());
                    Ok(Box::new(move |partition: &Partition<'_>| {
                        let routing = RoutingPartitionRef::new(partition.model, ROUTING_GROUP);
                        factory(&config, partition.worker_type.as_str(), routing).into_parts()
                    }) as PartsFactory)
                });
                (name, provider)
            })
            .collect()
    }
}

impl Catalog for RouterPluginRegistry {
    fn into_policy_types(self) -> Vec<(String, PolicyTypeProvider)> {
        self.into_providers()
            .into_iter()
            .map(|(name, provider)| {
                let provider: PolicyTypeProvider = Box::new(move |parameters, config| {
                    let (factory, config) = (provider(parameters)?, config.clone());
                    Ok(Box::new(move |partition: &Partition<'_>| {
                        let routing = RoutingPartitionRef::new(partition.model, ROUTING_GROUP);
                        let worker_type = WorkerType::from_switchyard(partition.worker_type);
                        factory(&config, worker_type, routing).into_parts()
                    }) as PartsFactory)
                });
                (name, provider)
            })
            .collect()
    }
}

/// Runs the catalog's `register` into a fresh registry, then registers each of its policy
/// types with the router: the provider runs once per configured instance (parameters from
/// the config as JSON), the factory once per partition.
pub fn register_catalog<R: Catalog, E: std::fmt::Display>(
    registrar: &mut Registrar<'_>,
    register: impl FnOnce(&mut R) -> Result<(), E>,
) -> Result<(), PolicyError> {
    let mut registry = R::default();
    register(&mut registry)
        .map_err(|e| PolicyError::failed(format!("the Dynamo catalog's register failed: {e}")))?;
    for (name, provider) in registry.into_policy_types() {
        let type_name = name.clone();
        registrar.policy(&name, move |params| {
            let parameters = WorkerSelectionPolicyParameters::from_json(params.json());
            let config = KvRouterConfig::from_switchyard(params.router_settings());
            let mut factory = provider(&parameters, &config).map_err(|e| {
                PolicyError::failed(format!(
                    "invalid parameters for worker-selection policy type {type_name:?}: {e}"
                ))
            })?;
            Ok(move |partition: &Partition<'_>| Ok(factory(partition)))
        })?;
    }
    Ok(())
}
