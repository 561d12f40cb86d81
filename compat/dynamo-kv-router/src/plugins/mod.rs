//! Dynamo's current `plugins` module: `plugins::worker_selection` and the catalog
//! registry `RouterPluginRegistry` (worker-selection types only).

pub mod worker_selection;

use self::worker_selection::{WorkerSelectionPolicyProvider, WorkerSelectionPolicyRegistryError};

/// The policy types a catalog registers, in registration order.
#[derive(Clone, Default)]
pub struct RouterPluginRegistry {
    providers: Vec<(String, WorkerSelectionPolicyProvider)>,
}

impl RouterPluginRegistry {
    /// Registers a worker-selection policy type.
    pub fn register_worker_selection(
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

    /// Dynamo's compatibility entry point for worker-only catalogs.
    pub fn register(
        &mut self,
        name: impl Into<String>,
        provider: WorkerSelectionPolicyProvider,
    ) -> Result<(), WorkerSelectionPolicyRegistryError> {
        self.register_worker_selection(name, provider)
    }

    /// Whether nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.providers.is_empty()
    }

    /// The registered type names, in registration order (switchyard addition).
    pub fn policy_types(&self) -> impl Iterator<Item = &str> {
        self.providers.iter().map(|(name, _)| name.as_str())
    }

    /// The provider of `policy_type` (switchyard addition, for tests).
    pub fn provider(&self, policy_type: &str) -> Option<&WorkerSelectionPolicyProvider> {
        self.providers
            .iter()
            .find(|(name, _)| name == policy_type)
            .map(|(_, provider)| provider)
    }

    pub(crate) fn into_providers(self) -> Vec<(String, WorkerSelectionPolicyProvider)> {
        self.providers
    }
}
