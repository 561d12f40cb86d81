//! The registry of component and policy types, built-in and from plugins, and the code
//! that turns a type plus parameters into live instances (`Stage`s).

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use switchyard_plugin_sdk::abi::*;
use switchyard_plugin_sdk::{
    Params, Partition, PolicyError, PolicyParts, WorkerInputs, WorkerType,
};

use crate::loader::{read_component_def, ErrorBuffer, LoadedPlugin};
use crate::params::OwnedParams;
use crate::pipeline::{PluginInstance, Stage, StageImpl};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ComponentKind {
    Filter,
    Scorer,
    Picker,
}

impl ComponentKind {
    pub fn from_abi(kind: u32) -> Option<Self> {
        match kind {
            SWITCHYARD_COMPONENT_FILTER => Some(Self::Filter),
            SWITCHYARD_COMPONENT_SCORER => Some(Self::Scorer),
            SWITCHYARD_COMPONENT_PICKER => Some(Self::Picker),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Filter => "filter",
            Self::Scorer => "scorer",
            Self::Picker => "picker",
        }
    }
    /// The ABI callback name after `on_`.
    pub fn callback(self) -> &'static str {
        match self {
            Self::Filter => "filter",
            Self::Scorer => "score",
            Self::Picker => "pick",
        }
    }
}

/// Where a type comes from.
#[derive(Clone, Debug)]
pub enum Origin {
    Builtin,
    Plugin { path: PathBuf, plugin: String },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Builtin => f.write_str("the router (built-in)"),
            Origin::Plugin { path, plugin } => write!(f, "plugin `{plugin}` ({})", path.display()),
        }
    }
}

/// A routing partition as the host keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionKey {
    pub model: String,
    pub worker_type: WorkerType,
}

impl PartitionKey {
    pub fn new(model: impl Into<String>, worker_type: WorkerType) -> Self {
        PartitionKey {
            model: model.into(),
            worker_type,
        }
    }
    pub fn with_abi<R>(&self, f: impl FnOnce(&switchyard_partition) -> R) -> R {
        let raw = switchyard_partition {
            struct_size: std::mem::size_of::<switchyard_partition>() as u32,
            worker_type: self.worker_type.to_abi(),
            model: switchyard_plugin_sdk::str_to_abi(&self.model),
        };
        f(&raw)
    }
    pub fn view(&self) -> Partition<'_> {
        Partition {
            worker_type: self.worker_type,
            model: &self.model,
        }
    }
}

impl fmt::Display for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.model, self.worker_type.as_str())
    }
}

/// A component def copied from a plugin (its `type_name` is kept as a `String` instead).
#[derive(Clone)]
pub struct PluginComponentDef {
    def: switchyard_component_def,
    inputs: WorkerInputs,
    kind: ComponentKind,
}

// SAFETY: the def holds function pointers and a `user_data` the plugin promises valid for
// the library's lifetime and usable from any thread (docs/ABI.md).
unsafe impl Send for PluginComponentDef {}
unsafe impl Sync for PluginComponentDef {}

impl PluginComponentDef {
    pub fn new(
        mut def: switchyard_component_def,
        inputs: WorkerInputs,
        kind: ComponentKind,
    ) -> Self {
        def.type_name = std::ptr::null();
        PluginComponentDef { def, inputs, kind }
    }
    pub fn kind(&self) -> ComponentKind {
        self.kind
    }
    pub fn inputs(&self) -> WorkerInputs {
        self.inputs
    }
    pub fn raw(&self) -> &switchyard_component_def {
        &self.def
    }
}

/// A policy def copied from a plugin.
pub struct PluginPolicyDef {
    def: switchyard_policy_def,
    abi_minor: u16,
    path: PathBuf,
}

unsafe impl Send for PluginPolicyDef {}
unsafe impl Sync for PluginPolicyDef {}

impl PluginPolicyDef {
    pub fn new(mut def: switchyard_policy_def, abi_minor: u16, path: PathBuf) -> Self {
        def.type_name = std::ptr::null();
        PluginPolicyDef {
            def,
            abi_minor,
            path,
        }
    }
}

/// Builds a built-in component from its parameters.
pub type BuiltinComponentFn = fn(&Params<'_>, &Partition<'_>) -> Result<StageImpl, PolicyError>;
/// Builds a built-in policy's per-partition factory from its parameters.
pub type BuiltinPolicyFn = fn(&Params<'_>) -> Result<Box<BuildFn>, PolicyError>;
/// Builds the parts of one partition's policy.
pub type BuildFn = dyn FnMut(&Partition<'_>) -> Result<PolicyParts, PolicyError> + Send;

enum ComponentSource {
    Builtin(BuiltinComponentFn),
    Plugin(PluginComponentDef),
}

/// A registered filter, scorer or picker type.
pub struct ComponentType {
    pub name: String,
    pub kind: ComponentKind,
    pub inputs: WorkerInputs,
    pub origin: Origin,
    source: ComponentSource,
}

impl ComponentType {
    /// Creates an instance for `partition`; the error is the plugin's (or built-in's) own
    /// message.
    pub fn create(&self, params: &OwnedParams, partition: &PartitionKey) -> Result<Stage, String> {
        let name: Arc<str> = Arc::from(self.name.as_str());
        match &self.source {
            ComponentSource::Builtin(create) => {
                let imp = params
                    .with_view(|p| create(p, &partition.view()))
                    .map_err(|e| e.to_string())?;
                Ok(Stage::new(name, self.kind, self.inputs, imp))
            }
            ComponentSource::Plugin(def) => {
                let on_create = def.raw().on_create.ok_or("the type has no on_create")?;
                let mut instance: *mut c_void = std::ptr::null_mut();
                let mut error = ErrorBuffer::new();
                let status = params.with_abi(|p| {
                    partition.with_abi(|part| {
                        on_create(def.raw().user_data, p, part, &mut instance, &error.as_abi())
                    })
                });
                if status != SWITCHYARD_STATUS_OK {
                    return Err(format!("{} (status {status})", error.message()));
                }
                let imp = StageImpl::Plugin(PluginInstance::new(def.clone(), instance));
                Ok(Stage::new(name, self.kind, self.inputs, imp))
            }
        }
    }
}

enum PolicySource {
    Builtin(BuiltinPolicyFn),
    Plugin(Arc<PluginPolicyDef>),
}

/// A registered policy type.
pub struct PolicyType {
    pub name: String,
    pub origin: Origin,
    source: PolicySource,
}

impl PolicyType {
    /// Validates the parameters once; the factory then builds one policy per partition.
    pub fn validate(&self, params: &OwnedParams) -> Result<PolicyFactory, String> {
        match &self.source {
            PolicySource::Builtin(provider) => {
                let build = params
                    .with_view(|p| provider(p))
                    .map_err(|e| e.to_string())?;
                Ok(PolicyFactory::Builtin {
                    name: self.name.clone(),
                    build: Mutex::new(build),
                })
            }
            PolicySource::Plugin(def) => {
                let on_validate = def.def.on_validate.ok_or("the policy has no on_validate")?;
                let mut factory: *mut c_void = std::ptr::null_mut();
                let mut error = ErrorBuffer::new();
                let status = params
                    .with_abi(|p| on_validate(def.def.user_data, p, &mut factory, &error.as_abi()));
                if status != SWITCHYARD_STATUS_OK {
                    return Err(format!("{} (status {status})", error.message()));
                }
                Ok(PolicyFactory::Plugin {
                    def: def.clone(),
                    factory: Mutex::new(PluginFactory(factory)),
                })
            }
        }
    }
}

pub struct PluginFactory(*mut c_void);
// SAFETY: a factory is used by one thread at a time (behind a Mutex), as the ABI allows.
unsafe impl Send for PluginFactory {}

/// A validated policy: builds the stages of each partition's instance.
pub enum PolicyFactory {
    Builtin {
        name: String,
        build: Mutex<Box<BuildFn>>,
    },
    Plugin {
        def: Arc<PluginPolicyDef>,
        factory: Mutex<PluginFactory>,
    },
}

impl Drop for PolicyFactory {
    fn drop(&mut self) {
        if let PolicyFactory::Plugin { def, factory } = self {
            let factory = factory.get_mut().unwrap_or_else(|e| e.into_inner());
            if let Some(destroy) = def.def.on_destroy_factory {
                destroy(factory.0);
            }
        }
    }
}

/// Collects the components a plugin policy adds during `on_build`.
struct BuildContext {
    path: PathBuf,
    abi_minor: u16,
    stages: Vec<(Stage, f64)>,
}

extern "C" fn add_component(
    builder: *const switchyard_policy_builder,
    def: *const switchyard_component_def,
    instance: *mut c_void,
    weight: f64,
    error: *const switchyard_error,
) -> i32 {
    // SAFETY: `builder` is the one `PolicyFactory::build` made; host_data is its context.
    let context = unsafe { &mut *(*builder).host_data.cast::<BuildContext>() };
    match unsafe { read_component_def(&context.path, context.abi_minor, def, false) } {
        Ok((name, def)) => {
            let (kind, inputs) = (def.kind(), def.inputs());
            let stage = Stage::new(
                Arc::from(name),
                kind,
                inputs,
                StageImpl::Plugin(PluginInstance::new(def, instance)),
            );
            context.stages.push((stage, weight));
            SWITCHYARD_STATUS_OK
        }
        Err(e) => {
            // The host owns `instance` whatever the status; without a usable def it can
            // only be leaked, which the message says.
            // SAFETY: `error` is the buffer the plugin passed to this callback.
            unsafe {
                switchyard_plugin_sdk::write_error(error, &format!("{e} (the instance is leaked)"))
            };
            SWITCHYARD_STATUS_INVALID_ARGUMENT
        }
    }
}

impl PolicyFactory {
    /// Builds the stages (filters and scorers in order, one picker) for one partition.
    pub fn build(&self, partition: &PartitionKey) -> Result<Vec<(Stage, f64)>, String> {
        match self {
            PolicyFactory::Builtin { name, build } => {
                let mut build = build.lock().unwrap_or_else(|e| e.into_inner());
                let parts = build(&partition.view()).map_err(|e| e.to_string())?;
                Ok(crate::builtin::stages_of(name, parts))
            }
            PolicyFactory::Plugin { def, factory } => {
                let factory = factory.lock().unwrap_or_else(|e| e.into_inner());
                let on_build = def.def.on_build.ok_or("the policy has no on_build")?;
                let mut context = BuildContext {
                    path: def.path.clone(),
                    abi_minor: def.abi_minor,
                    stages: Vec::new(),
                };
                let builder = switchyard_policy_builder {
                    struct_size: std::mem::size_of::<switchyard_policy_builder>() as u32,
                    host_data: std::ptr::from_mut(&mut context).cast(),
                    callback_add_component: add_component,
                };
                let mut error = ErrorBuffer::new();
                let status =
                    partition.with_abi(|part| on_build(factory.0, part, &builder, &error.as_abi()));
                if status != SWITCHYARD_STATUS_OK {
                    return Err(format!("{} (status {status})", error.message()));
                }
                Ok(context.stages)
            }
        }
    }
}

/// Every type the router knows, and the plugins they came from.
#[derive(Default)]
pub struct Registry {
    components: BTreeMap<String, Arc<ComponentType>>,
    policies: BTreeMap<String, Arc<PolicyType>>,
    plugins: Vec<LoadedPlugin>,
}

impl Registry {
    /// A registry with the built-in types.
    pub fn with_builtins() -> Self {
        let mut registry = Registry::default();
        crate::builtin::register(&mut registry);
        registry
    }

    pub fn origin_of(&self, name: &str) -> Option<&Origin> {
        self.components
            .get(name)
            .map(|c| &c.origin)
            .or_else(|| self.policies.get(name).map(|p| &p.origin))
    }

    pub fn add_builtin_component(
        &mut self,
        name: &str,
        kind: ComponentKind,
        inputs: WorkerInputs,
        create: BuiltinComponentFn,
    ) {
        self.components.insert(
            name.to_owned(),
            Arc::new(ComponentType {
                name: name.to_owned(),
                kind,
                inputs,
                origin: Origin::Builtin,
                source: ComponentSource::Builtin(create),
            }),
        );
    }

    pub fn add_builtin_policy(&mut self, name: &str, provider: BuiltinPolicyFn) {
        self.policies.insert(
            name.to_owned(),
            Arc::new(PolicyType {
                name: name.to_owned(),
                origin: Origin::Builtin,
                source: PolicySource::Builtin(provider),
            }),
        );
    }

    pub fn add_plugin_component(&mut self, name: String, origin: Origin, def: PluginComponentDef) {
        let (kind, inputs) = (def.kind(), def.inputs());
        self.components.insert(
            name.clone(),
            Arc::new(ComponentType {
                name,
                kind,
                inputs,
                origin,
                source: ComponentSource::Plugin(def),
            }),
        );
    }

    pub fn add_plugin_policy(&mut self, name: String, origin: Origin, def: PluginPolicyDef) {
        self.policies.insert(
            name.clone(),
            Arc::new(PolicyType {
                name,
                origin,
                source: PolicySource::Plugin(Arc::new(def)),
            }),
        );
    }

    pub fn add_plugin(&mut self, plugin: LoadedPlugin) {
        self.plugins.push(plugin);
    }

    pub fn plugins(&self) -> &[LoadedPlugin] {
        &self.plugins
    }

    pub fn component(&self, name: &str) -> Option<&Arc<ComponentType>> {
        self.components.get(name)
    }

    pub fn policy(&self, name: &str) -> Option<&Arc<PolicyType>> {
        self.policies.get(name)
    }

    pub fn components(&self) -> impl Iterator<Item = &Arc<ComponentType>> {
        self.components.values()
    }

    pub fn policies(&self) -> impl Iterator<Item = &Arc<PolicyType>> {
        self.policies.values()
    }

    /// Every registered type name of `kind` (None: policies), for "unknown type" errors.
    pub fn names_of(&self, kind: Option<ComponentKind>) -> Vec<&str> {
        match kind {
            None => self.policies.keys().map(String::as_str).collect(),
            Some(kind) => self
                .components
                .values()
                .filter(|c| c.kind == kind)
                .map(|c| c.name.as_str())
                .collect(),
        }
    }
}
