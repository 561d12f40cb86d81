//! Plugin policy types: the def a plugin registered, the factory its `on_validate` made
//! from an instance's parameters, and the builder its `on_build` adds components to.

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use switchyard_plugin_sdk::abi::*;
use switchyard_plugin_sdk::{str_from_abi, write_error, Status, WorkerInputs};

use super::abi_checks::read_def;
use super::call_window::CallWindow;
use super::component::{ComponentDef, ComponentInstance, ComponentKind};
use super::error_buffer::{host_guard, CallError, ErrorBuffer};
use super::load_error::LoadError;
use super::logger::PluginLogger;
use super::params::OwnedParams;
use super::partition::PartitionKey;

/// A policy's `on_validate`.
type ValidateFn = unsafe extern "C" fn(
    *mut c_void,
    *const switchyard_params,
    *mut *mut c_void,
    *const switchyard_error,
) -> i32;
/// A policy's `on_build`.
type BuildFn = unsafe extern "C" fn(
    *mut c_void,
    *const switchyard_partition,
    *const switchyard_policy_builder,
    *const switchyard_error,
) -> i32;

/// A policy def copied from a plugin, its callbacks checked for NULL once, when it was
/// read: the two every policy needs are plain function pointers here, so no call can
/// reach a NULL one; `on_destroy_factory` stays optional (NULL: nothing to free).
pub struct PolicyDef {
    user_data: *mut c_void,
    on_validate: ValidateFn,
    on_build: BuildFn,
    on_destroy_factory: Option<unsafe extern "C" fn(*mut c_void)>,
    abi_minor: u16,
    path: PathBuf,
    /// `plugin/type`, as its log lines name it.
    origin: String,
}

// SAFETY: the def holds function pointers and a `user_data` the plugin promises valid for
// the library's lifetime and usable from any thread (docs/ABI.md).
unsafe impl Send for PolicyDef {}
// SAFETY: as for Send; the host never mutates a def after copying it.
unsafe impl Sync for PolicyDef {}

impl PolicyDef {
    /// Validates and copies a def handed over by a plugin of ABI `1.abi_minor`; a def
    /// without `on_validate` or `on_build` is refused here.
    ///
    /// # Safety
    /// `def` must be NULL or point to at least its declared `struct_size` bytes, with
    /// `type_name` NULL or NUL-terminated.
    pub(super) unsafe fn read(
        path: &Path,
        abi_minor: u16,
        def: *const switchyard_policy_def,
    ) -> Result<(String, PolicyDef), LoadError> {
        // SAFETY: per this function's contract.
        let (name, def) = unsafe { read_def(path, abi_minor, def) }?;
        let (Some(on_validate), Some(on_build)) = (def.on_validate, def.on_build) else {
            return Err(LoadError::InvalidDefinition {
                path: path.to_owned(),
                name,
                problem: "a policy must set `on_validate` and `on_build`".into(),
            });
        };
        let type_name = name.clone();
        Ok((
            name,
            PolicyDef {
                user_data: def.user_data,
                on_validate,
                on_build,
                on_destroy_factory: def.on_destroy_factory,
                abi_minor,
                path: path.to_owned(),
                origin: type_name,
            },
        ))
    }

    /// The def as registered by `plugin` (its log lines name it).
    pub(super) fn registered_by(mut self, plugin: &str) -> Self {
        self.origin = format!("{plugin}/{}", self.origin);
        self
    }

    /// Validates an instance's parameters once (`on_validate`); the factory then builds
    /// one policy per partition.
    pub fn validate(
        self: &Arc<Self>,
        params: &OwnedParams,
    ) -> Result<PluginPolicyFactory, CallError> {
        let on_validate = self.on_validate;
        let mut factory: *mut c_void = std::ptr::null_mut();
        let mut error = ErrorBuffer::new();
        let logger = PluginLogger::new(&self.origin);
        let code = params.with_abi_logged(Some(&logger), |p| {
            // SAFETY: `user_data` is the plugin's for this def; the params and the error
            // buffer live for the call; `factory` is a writable slot.
            unsafe { on_validate(self.user_data, p, &mut factory, &error.as_abi()) }
        });
        error.check(code)?;
        Ok(PluginPolicyFactory {
            def: self.clone(),
            factory: Mutex::new(FactoryHandle(factory)),
            _logger: logger,
        })
    }
}

struct FactoryHandle(*mut c_void);
// SAFETY: a factory is used by one thread at a time (behind a Mutex), as the ABI allows.
unsafe impl Send for FactoryHandle {}

/// A plugin policy validated for one instance's parameters.
pub struct PluginPolicyFactory {
    def: Arc<PolicyDef>,
    factory: Mutex<FactoryHandle>,
    /// The logger `on_validate` was handed (ABI 1.5): dropped after `on_destroy_factory`.
    _logger: PluginLogger,
}

/// A component a plugin policy added while building one partition.
pub struct BuiltComponent {
    pub name: String,
    pub kind: ComponentKind,
    pub inputs: WorkerInputs,
    pub instance: ComponentInstance,
    pub weight: f64,
}

/// What a plugin policy's `on_build` added, in order: its own component instances, or
/// (ABI 1.1, `callback_add_registered`) registered types the router created, as `T`.
pub enum Built<T> {
    Plugin(BuiltComponent),
    Registered { component: T, weight: f64 },
}

/// Creates an instance of a registered component type by name for `callback_add_registered`.
/// The registry lives in the layer above; it hands this down.
pub type CreateRegistered<'a, T> = &'a dyn Fn(&str, &OwnedParams) -> Result<T, CallError>;

impl PluginPolicyFactory {
    /// Builds the components (filters and scorers in order, one picker) for `partition`.
    /// `on_build` returning OK although the host refused a component it added is an
    /// error too: the operator's component would silently be missing.
    pub fn build<T>(
        &self,
        partition: &PartitionKey,
        create_registered: CreateRegistered<'_, T>,
    ) -> Result<Vec<Built<T>>, CallError> {
        let factory = self.factory.lock();
        let on_build = self.def.on_build;
        let mut context = BuildContext {
            path: &self.def.path,
            abi_minor: self.def.abi_minor,
            built: Vec::new(),
            refused: None,
            create_registered,
        };
        let window = CallWindow::open(&mut context);
        let builder: &'static switchyard_policy_builder =
            Box::leak(Box::new(switchyard_policy_builder {
                struct_size: std::mem::size_of::<switchyard_policy_builder>() as u32,
                host_data: std::ptr::from_ref(window).cast_mut().cast(),
                callback_add_component: Some(add_component::<T>),
                callback_add_registered: Some(add_registered::<T>),
            }));
        let mut error = ErrorBuffer::new();
        let code = partition.with_abi(|part| {
            // SAFETY: the factory came from this def's on_validate and is used by one
            // thread (the lock); the builder lives forever, the context, partition and
            // error buffer for the call (the window closes before they go).
            unsafe { on_build(factory.0, part, builder, &error.as_abi()) }
        });
        window.close();
        error.check(code)?;
        match context.refused {
            Some(refused) => Err(CallError::new(
                Status::InvalidArgument,
                format!(
                    "on_build returned OK, but the router refused a component it added: {refused}"
                ),
            )),
            None => Ok(context.built),
        }
    }
}

impl Drop for PluginPolicyFactory {
    fn drop(&mut self) {
        if let Some(destroy) = self.def.on_destroy_factory {
            // SAFETY: the factory came from this def's on_validate; this is its last use.
            unsafe { destroy(self.factory.get_mut().0) };
        }
    }
}

/// Collects the components a plugin policy adds during one `on_build` call.
struct BuildContext<'a, T> {
    path: &'a Path,
    abi_minor: u16,
    built: Vec<Built<T>>,
    /// The first component the host refused, kept even if the plugin ignores the status.
    refused: Option<String>,
    create_registered: CreateRegistered<'a, T>,
}

/// Runs `add` on the build context behind `builder`, or refuses a builder used after its
/// `on_build` returned.
///
/// # Safety
/// `builder` must be NULL or a builder made by `PluginPolicyFactory::build::<T>`; `error`
/// the plugin's buffer for this callback.
unsafe fn with_context<T>(
    builder: *const switchyard_policy_builder,
    error: *const switchyard_error,
    add: impl FnOnce(&mut BuildContext<'_, T>) -> i32,
) -> i32 {
    // SAFETY: builders and their windows are never freed; the window was opened on a
    // BuildContext<T> (per this function's contract).
    let window = unsafe {
        builder
            .as_ref()
            .and_then(|b| CallWindow::from_host_data(b.host_data))
    };
    host_guard(Some(error), Status::InvalidArgument.code(), || {
        // SAFETY: as above.
        let done = window.and_then(|w| unsafe { w.with::<BuildContext<'_, T>, _>(add) });
        done.unwrap_or_else(|| {
            let message = "the builder was used after on_build returned: keep no pointer to it";
            // SAFETY: `error` is the buffer the plugin passed to this callback.
            unsafe { write_error(error, message) };
            Status::InvalidArgument.code()
        })
    })
}

/// `callback_add_component`: the host side of the builder.
///
/// # Safety
/// Called by the plugin during `on_build`, with the builder it was handed.
unsafe extern "C" fn add_component<T>(
    builder: *const switchyard_policy_builder,
    def: *const switchyard_component_def,
    instance: *mut c_void,
    weight: f64,
    error: *const switchyard_error,
) -> i32 {
    let add = |context: &mut BuildContext<'_, T>| {
        // SAFETY: the plugin hands over a def of its declared size.
        match unsafe { ComponentDef::read(context.path, context.abi_minor, def, false) } {
            Ok((name, def)) => {
                context.built.push(Built::Plugin(BuiltComponent {
                    name,
                    kind: def.kind(),
                    inputs: def.inputs(),
                    instance: def.adopt(instance),
                    weight,
                }));
                Status::Ok.code()
            }
            Err(e) => {
                // The host owns `instance` whatever the status; without a usable def it
                // can only be leaked, which the message says.
                let message = format!("{e} (the instance is leaked)");
                // SAFETY: `error` is the buffer the plugin passed to this callback.
                unsafe { write_error(error, &message) };
                context.refused.get_or_insert(message);
                Status::InvalidArgument.code()
            }
        }
    };
    // SAFETY: the plugin passes the builder of this on_build and its error buffer.
    unsafe { with_context(builder, error, add) }
}

/// `callback_add_registered` (ABI 1.1): adds an instance of a registered type, created
/// by the router from its name and JSON parameters.
///
/// # Safety
/// Called by the plugin during `on_build`, with the builder it was handed and strings
/// valid for the call.
unsafe extern "C" fn add_registered<T>(
    builder: *const switchyard_policy_builder,
    type_name: switchyard_str,
    params_json: switchyard_str,
    weight: f64,
    error: *const switchyard_error,
) -> i32 {
    let add = |context: &mut BuildContext<'_, T>| {
        // SAFETY: the plugin's strings are valid for the call.
        let (name, json) = unsafe { (str_from_abi(type_name), str_from_abi(params_json)) };
        let result = match (name, json.map(str::trim)) {
            (None | Some(""), _) => Err(CallError::new(
                Status::InvalidArgument,
                "callback_add_registered: the type name is empty, NULL or not UTF-8",
            )),
            (Some(name), json) => params_from_json(name, json.unwrap_or(""))
                .and_then(|params| (context.create_registered)(name, &params)),
        };
        match result {
            Ok(component) => {
                context.built.push(Built::Registered { component, weight });
                Status::Ok.code()
            }
            Err(e) => {
                // SAFETY: `error` is the buffer the plugin passed to this callback.
                unsafe { write_error(error, &e.message) };
                context.refused.get_or_insert(e.message);
                e.status.code()
            }
        }
    };
    // SAFETY: the plugin passes the builder of this on_build and its error buffer.
    unsafe { with_context(builder, error, add) }
}

/// The parameters `callback_add_registered` was given: a JSON object, or empty for `{}`.
fn params_from_json(type_name: &str, json: &str) -> Result<OwnedParams, CallError> {
    if json.is_empty() {
        return Ok(OwnedParams::new(Default::default()));
    }
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(serde_json::Value::Object(object)) => Ok(OwnedParams::new(object)),
        Ok(other) => Err(CallError::new(
            Status::InvalidParameters,
            format!("callback_add_registered(`{type_name}`): the parameters must be a JSON object, found `{other}`"),
        )),
        Err(e) => Err(CallError::new(
            Status::InvalidParameters,
            format!("callback_add_registered(`{type_name}`): the parameters are not JSON ({e}): `{json}`"),
        )),
    }
}
