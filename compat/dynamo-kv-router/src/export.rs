//! What [`export_catalog!`](crate::export_catalog) runs when the router loads the plugin:
//! each policy type of the catalog's registry registered as an SDK policy type.

use switchyard_plugin_sdk::{Partition, PolicyError, Registrar};

use crate::services::selection::{
    KvRouterConfig, RoutingPartitionRef, WorkerSelectionPolicyParameters,
    WorkerSelectionPolicyRegistry,
};

/// The routing group of every switchyard partition (one per model and worker type).
const ROUTING_GROUP: &str = "default";

/// Runs the catalog's `register` into a fresh registry, then registers each of its policy
/// types with the router: the provider runs once per configured instance (parameters from
/// the config as JSON), the factory once per partition.
pub fn register_catalog<E: std::fmt::Display>(
    registrar: &mut Registrar<'_>,
    register: impl FnOnce(&mut WorkerSelectionPolicyRegistry) -> Result<(), E>,
) -> Result<(), PolicyError> {
    let mut registry = WorkerSelectionPolicyRegistry::default();
    register(&mut registry)
        .map_err(|e| PolicyError::failed(format!("the Dynamo catalog's register failed: {e}")))?;
    for (name, provider) in registry.into_providers() {
        let type_name = name.clone();
        registrar.policy(&name, move |params| {
            let parameters = WorkerSelectionPolicyParameters::from_json(params.json());
            let factory = provider(&parameters).map_err(|e| {
                PolicyError::failed(format!(
                    "invalid parameters for worker-selection policy type {type_name:?}: {e}"
                ))
            })?;
            let config = KvRouterConfig::default();
            Ok(move |partition: &Partition<'_>| {
                let routing = RoutingPartitionRef::new(partition.model, ROUTING_GROUP);
                Ok(factory(&config, partition.worker_type.as_str(), routing).into_parts())
            })
        })?;
    }
    Ok(())
}
