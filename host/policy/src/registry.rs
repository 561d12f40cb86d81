//! The registry of component and policy types, built-in and from plugins, and the code
//! that turns a type plus parameters into live instances (`Stage`s).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use switchyard_plugin_sdk::{Params, Partition, PolicyError, PolicyParts, WorkerInputs};

use super::error::{BuildError, Refusal};
use super::pipeline::Stage;
use crate::pipeline::StageComponent;
use switchyard_config::IsolationSettings;
use switchyard_plugin_host::isolation::{self, BuiltPart, IsolatedProcess};
use switchyard_plugin_host::plugin::{
    self, Built, CallError, ComponentDef, ComponentKind, LoadError, LoadedPlugin, OwnedParams,
    PartitionKey, PluginImage, PluginSpec, PolicyDef, Status,
};
use switchyard_plugin_host::plugin::{Builtin, Component};

/// Every registered component type by name; shared with the plugin policies that compose
/// them (`callback_add_registered`).
type ComponentTable = BTreeMap<String, Arc<ComponentType>>;

/// Where a type comes from.
#[derive(Clone, Debug)]
pub enum Origin {
    Builtin,
    Plugin {
        path: PathBuf,
        plugin: String,
        /// The isolated process it runs in (`isolation: process`), if any.
        process: Option<String>,
    },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Builtin => f.write_str("the router (built-in)"),
            Origin::Plugin {
                path,
                plugin,
                process: None,
            } => write!(f, "plugin `{plugin}` ({})", path.display()),
            Origin::Plugin {
                path,
                plugin,
                process: Some(process),
            } => write!(
                f,
                "plugin `{plugin}` ({}, isolated in process `{process}`)",
                path.display()
            ),
        }
    }
}

/// Builds a built-in component from its parameters.
pub type BuiltinComponentFn = fn(&Params<'_>, &Partition<'_>) -> Result<Builtin, PolicyError>;
/// Builds a built-in policy's per-partition factory from its parameters.
pub type BuiltinPolicyFn = fn(&Params<'_>) -> Result<Box<BuildFn>, PolicyError>;
/// Builds the parts of one partition's policy.
pub type BuildFn = dyn FnMut(&Partition<'_>) -> Result<PolicyParts, PolicyError> + Send;

enum ComponentSource {
    Builtin(BuiltinComponentFn),
    Plugin(ComponentDef),
    Isolated(Arc<IsolatedProcess>),
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
    /// Creates an instance for `partition`.
    pub fn create(
        &self,
        params: &OwnedParams,
        partition: &PartitionKey,
    ) -> Result<Stage, BuildError> {
        let refused = |refusal: Refusal| BuildError::Create {
            component: self.name.clone(),
            refusal,
        };
        let component: StageComponent = match &self.source {
            ComponentSource::Builtin(create) => StageComponent::Builtin(
                params
                    .with_view(|p| create(p, &partition.view()))
                    .map_err(|e| refused(e.into()))?
                    .reading(self.inputs),
            ),
            ComponentSource::Plugin(def) => StageComponent::Plugin(
                def.create(params, partition)
                    .map_err(|e| refused(e.into()))?,
            ),
            ComponentSource::Isolated(process) => StageComponent::Isolated(
                isolation::create_component(
                    process,
                    &self.name,
                    self.kind,
                    self.inputs,
                    params,
                    partition,
                )
                .map_err(|e| refused(e.into()))?,
            ),
        };
        Ok(Stage::new(
            Arc::from(self.name.as_str()),
            self.kind,
            self.inputs,
            component,
        ))
    }
}

enum PolicySource {
    Builtin(BuiltinPolicyFn),
    Plugin(Arc<PolicyDef>),
    Isolated(Arc<IsolatedProcess>),
}

/// A registered policy type.
pub struct PolicyType {
    pub name: String,
    pub origin: Origin,
    source: PolicySource,
}

impl PolicyType {
    /// Validates the parameters once; the factory then builds one policy per partition
    /// (a plugin policy may add any component type of `registry` to it).
    pub fn validate(
        &self,
        params: &OwnedParams,
        registry: &Registry,
    ) -> Result<PolicyFactory, BuildError> {
        let refused = |refusal: Refusal| BuildError::Validate {
            policy_type: self.name.clone(),
            refusal,
        };
        match &self.source {
            PolicySource::Builtin(provider) => {
                let build = params
                    .with_view(|p| provider(p))
                    .map_err(|e| refused(e.into()))?;
                Ok(PolicyFactory::Builtin {
                    name: self.name.clone(),
                    build: Mutex::new(build),
                })
            }
            PolicySource::Plugin(def) => Ok(PolicyFactory::Plugin {
                name: self.name.clone(),
                factory: def.validate(params).map_err(|e| refused(e.into()))?,
                components: registry.components.clone(),
            }),
            PolicySource::Isolated(process) => {
                isolation::validate_policy(process, &self.name, params)
                    .map_err(|e| refused(e.into()))?;
                Ok(PolicyFactory::Isolated {
                    name: self.name.clone(),
                    process: process.clone(),
                    params: Box::new(params.clone()),
                    components: registry.components.clone(),
                })
            }
        }
    }
}

/// A validated policy: builds the stages of each partition's instance.
pub enum PolicyFactory {
    Builtin {
        name: String,
        build: Mutex<Box<BuildFn>>,
    },
    Plugin {
        name: String,
        factory: plugin::PluginPolicyFactory,
        components: Arc<ComponentTable>,
    },
    /// A policy type of an isolated library: built in its process for each partition.
    Isolated {
        name: String,
        process: Arc<IsolatedProcess>,
        /// Boxed: the other variants are much smaller.
        params: Box<OwnedParams>,
        components: Arc<ComponentTable>,
    },
}

/// Creates a registered component type for a plugin policy's `callback_add_registered`.
fn create_registered(
    components: &ComponentTable,
    type_name: &str,
    params: &OwnedParams,
    partition: &PartitionKey,
) -> Result<Stage, CallError> {
    let Some(component) = components.get(type_name) else {
        let known: Vec<&str> = components.keys().map(String::as_str).collect();
        return Err(CallError::new(
            Status::InvalidArgument,
            format!(
                "callback_add_registered: no component type `{type_name}`; registered: {}",
                known.join(", ")
            ),
        ));
    };
    component
        .create(params, partition)
        .map_err(|e| CallError::new(Status::InvalidParameters, e.to_string()))
}

/// One stage an isolated policy built: its own component (in the child process), or a
/// registered type created here.
fn isolated_stage(
    part: BuiltPart,
    components: &ComponentTable,
    partition: &PartitionKey,
) -> Result<(Stage, f64), CallError> {
    match part {
        BuiltPart::Own(instance, weight) => Ok((
            Stage::new(
                Arc::from(instance.name()),
                instance.kind(),
                instance.inputs(),
                instance,
            ),
            weight,
        )),
        BuiltPart::Registered {
            type_name,
            params,
            weight,
        } => {
            let params = match serde_json::from_str(&params) {
                Ok(serde_json::Value::Object(map)) => OwnedParams::new(map),
                _ => OwnedParams::default(),
            };
            create_registered(components, &type_name, &params, partition)
                .map(|stage| (stage, weight))
        }
    }
}

impl PolicyFactory {
    /// Builds the stages (filters and scorers in order, one picker) for one partition.
    pub fn build(&self, partition: &PartitionKey) -> Result<Vec<(Stage, f64)>, BuildError> {
        match self {
            PolicyFactory::Builtin { name, build } => {
                let mut build = build.lock().unwrap_or_else(|e| e.into_inner());
                let parts = build(&partition.view()).map_err(|e| BuildError::Build {
                    policy_type: name.clone(),
                    refusal: e.into(),
                })?;
                Ok(stages_of(name, parts))
            }
            PolicyFactory::Plugin {
                name,
                factory,
                components,
            } => {
                let create = |type_name: &str, params: &OwnedParams| {
                    create_registered(components, type_name, params, partition)
                };
                let built = factory
                    .build(partition, &create)
                    .map_err(|e| BuildError::Build {
                        policy_type: name.clone(),
                        refusal: e.into(),
                    })?;
                Ok(built
                    .into_iter()
                    .map(|built| match built {
                        Built::Plugin(c) => {
                            let stage = Stage::new(Arc::from(c.name), c.kind, c.inputs, c.instance);
                            (stage, c.weight)
                        }
                        Built::Registered { component, weight } => (component, weight),
                    })
                    .collect())
            }
            PolicyFactory::Isolated {
                name,
                process,
                params,
                components,
            } => {
                let failed = |e: CallError| BuildError::Build {
                    policy_type: name.clone(),
                    refusal: e.into(),
                };
                let registered = components.keys().cloned().collect();
                let parts = isolation::build_policy(process, name, params, partition, registered)
                    .map_err(failed)?;
                parts
                    .into_iter()
                    .map(|part| isolated_stage(part, components, partition).map_err(failed))
                    .collect()
            }
        }
    }
}

/// Every type the router knows, and the plugins they came from.
#[derive(Default)]
pub struct Registry {
    components: Arc<ComponentTable>,
    policies: BTreeMap<String, Arc<PolicyType>>,
    plugins: Vec<LoadedPlugin>,
    /// Isolated processes by name (`isolation: process`).
    processes: BTreeMap<String, Arc<IsolatedProcess>>,
}

impl Registry {
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
        Arc::make_mut(&mut self.components).insert(
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

    /// Loads one plugin library and adds its types. A file already loaded into this
    /// registry is skipped (its pin is still checked, against the bytes loaded).
    pub fn load_plugin(&mut self, spec: &PluginSpec) -> Result<(), LoadError> {
        self.load_plugin_from(spec, None)
    }

    /// `load_plugin`, from `image` when given (the file's bytes, read once before).
    pub fn load_plugin_from(
        &mut self,
        spec: &PluginSpec,
        image: Option<&Arc<PluginImage>>,
    ) -> Result<(), LoadError> {
        let canonical = plugin::library::canonical(&spec.path)?;
        let already = self
            .plugins
            .iter()
            .find(|p| std::fs::canonicalize(&p.path).ok().as_ref() == Some(&canonical));
        if let Some(loaded) = already {
            plugin::library::verify_pin(spec, &loaded.sha256)?;
            tracing::info!(path = %spec.path.display(), "plugin listed more than once; loaded once");
            return Ok(());
        }
        let taken_by = |name: &str| self.origin_of(name).map(ToString::to_string);
        let loaded = plugin::library::load_from(spec, image, &taken_by)?;
        let origin = Origin::Plugin {
            path: loaded.plugin.path.clone(),
            plugin: loaded.plugin.info.name.clone(),
            process: None,
        };
        for (name, def) in loaded.registered.components {
            let (kind, inputs) = (def.kind(), def.inputs());
            let source = ComponentSource::Plugin(def);
            let origin = origin.clone();
            let component = ComponentType {
                name: name.clone(),
                kind,
                inputs,
                origin,
                source,
            };
            Arc::make_mut(&mut self.components).insert(name, Arc::new(component));
        }
        for (name, def) in loaded.registered.policies {
            let origin = origin.clone();
            let source = PolicySource::Plugin(def);
            self.policies.insert(
                name.clone(),
                Arc::new(PolicyType {
                    name,
                    origin,
                    source,
                }),
            );
        }
        self.plugins.push(loaded.plugin);
        Ok(())
    }

    /// Loads one plugin library into the isolated process `process` (started on first
    /// use) and adds its types; their instances live and run in that process. The child
    /// loads `image` (the file read here when None): the bytes the router checked.
    pub fn load_plugin_isolated(
        &mut self,
        spec: &PluginSpec,
        image: Option<&Arc<PluginImage>>,
        process: &str,
        settings: &IsolationSettings,
    ) -> Result<(), LoadError> {
        let image = match image {
            Some(image) => image.clone(),
            None => PluginImage::read(&spec.path)?,
        };
        let child = match self.processes.get(process) {
            Some(child) => child.clone(),
            None => {
                let child =
                    IsolatedProcess::start(process, settings).map_err(|e| LoadError::InChild {
                        path: spec.path.clone(),
                        message: format!(
                            "{}: cannot start the isolated process `{process}`: {e}",
                            spec.path.display()
                        ),
                    })?;
                self.processes.insert(process.to_owned(), child.clone());
                child
            }
        };
        let taken = self
            .components
            .iter()
            .map(|(name, c)| (name.clone(), c.origin.to_string()))
            .chain(
                self.policies
                    .iter()
                    .map(|(name, p)| (name.clone(), p.origin.to_string())),
            )
            .collect();
        let library = child.load(spec, Some(image), taken)?;
        let origin = Origin::Plugin {
            path: library.plugin.path.clone(),
            plugin: library.plugin.info.name.clone(),
            process: Some(process.to_owned()),
        };
        for info in library.components {
            let Some(kind) = ComponentKind::from_name(&info.kind) else {
                return Err(LoadError::InvalidDefinition {
                    path: library.plugin.path.clone(),
                    name: info.name.clone(),
                    problem: format!("the isolated process reports unknown kind `{}`", info.kind),
                });
            };
            let component = ComponentType {
                name: info.name.clone(),
                kind,
                inputs: WorkerInputs::from_bits(info.inputs),
                origin: origin.clone(),
                source: ComponentSource::Isolated(child.clone()),
            };
            Arc::make_mut(&mut self.components).insert(info.name, Arc::new(component));
        }
        for name in library.policies {
            self.policies.insert(
                name.clone(),
                Arc::new(PolicyType {
                    name,
                    origin: origin.clone(),
                    source: PolicySource::Isolated(child.clone()),
                }),
            );
        }
        let mut plugin = library.plugin;
        plugin.isolated_in = Some(process.to_owned());
        self.plugins.push(plugin);
        Ok(())
    }

    /// The isolated processes (for metrics).
    pub fn processes(&self) -> impl Iterator<Item = &Arc<IsolatedProcess>> {
        self.processes.values()
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

/// Turns a built-in policy's parts into named stages.
fn stages_of(policy: &str, parts: PolicyParts) -> Vec<(Stage, f64)> {
    let name = |part: String| -> Arc<str> { Arc::from(format!("{policy}/{part}")) };
    let mut stages = Vec::new();
    for (i, filter) in parts.filters.into_iter().enumerate() {
        let inputs = filter.required_worker_inputs();
        stages.push((
            Stage::new(
                name(format!("filter.{i}")),
                ComponentKind::Filter,
                inputs,
                Builtin::Filter(filter).reading(inputs),
            ),
            1.0,
        ));
    }
    for (i, (scorer, weight)) in parts.scorers.into_iter().enumerate() {
        let inputs = scorer.required_worker_inputs();
        stages.push((
            Stage::new(
                name(format!("scorer.{i}")),
                ComponentKind::Scorer,
                inputs,
                Builtin::Scorer(scorer).reading(inputs),
            ),
            weight,
        ));
    }
    let inputs = parts.picker.required_worker_inputs();
    stages.push((
        Stage::new(
            name("picker".into()),
            ComponentKind::Picker,
            inputs,
            Builtin::Picker(parts.picker).reading(inputs),
        ),
        1.0,
    ));
    stages
}
