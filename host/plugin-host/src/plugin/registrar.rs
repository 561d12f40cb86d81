//! The registrar a plugin's `on_register` receives: the host side of
//! `callback_register_component` and `callback_register_policy`.

use std::path::Path;
use std::sync::Arc;

use switchyard_plugin_sdk::abi::*;
use switchyard_plugin_sdk::{write_error, Status};

use super::abi_checks::{PluginInfo, HOST_ABI_MINOR};
use super::call_window::CallWindow;
use super::component::ComponentDef;
use super::error_buffer::{host_guard, ErrorBuffer};
use super::load_error::LoadError;
use super::policy_def::PolicyDef;

/// Every type one library registered, in registration order.
#[derive(Default)]
pub struct Registered {
    pub components: Vec<(String, ComponentDef)>,
    pub policies: Vec<(String, Arc<PolicyDef>)>,
    /// Every type name, in registration order.
    pub names: Vec<String>,
}

/// Where a registered name already comes from, if anywhere (the router's registry).
pub type TakenBy<'a> = &'a dyn Fn(&str) -> Option<String>;

struct RegistrationContext<'a> {
    path: &'a Path,
    plugin: &'a PluginInfo,
    taken_by: TakenBy<'a>,
    registered: Registered,
    errors: Vec<LoadError>,
}

impl RegistrationContext<'_> {
    fn check_name(&self, kind: &'static str, name: String) -> Result<String, LoadError> {
        if name.trim().is_empty() {
            return Err(LoadError::EmptyTypeName {
                path: self.path.to_owned(),
                kind,
            });
        }
        let first = if self.registered.names.contains(&name) {
            Some(format!(
                "plugin `{}` ({})",
                self.plugin.name,
                self.path.display()
            ))
        } else {
            (self.taken_by)(&name)
        };
        match first {
            Some(first) => Err(LoadError::DuplicateType {
                path: self.path.to_owned(),
                name,
                first,
            }),
            None => Ok(name),
        }
    }

    /// Records `error` for the load result and tells the plugin about it too.
    fn refuse(&mut self, error: LoadError, out: *const switchyard_error) -> i32 {
        let status = match &error {
            LoadError::DuplicateType { .. } => Status::Duplicate,
            _ => Status::InvalidArgument,
        };
        // SAFETY: `out` is the error buffer the plugin passed to the registrar callback.
        unsafe { write_error(out, &error.to_string()) };
        self.errors.push(error);
        status.code()
    }
}

/// Runs the plugin's `on_register` with a registrar; returns what it registered, or the
/// first refused definition, or its own failure.
///
/// # Safety
/// `on_register` must be the checked descriptor's callback of the library at `path`.
pub(super) unsafe fn register(
    path: &Path,
    plugin: &PluginInfo,
    on_register: unsafe extern "C" fn(*const switchyard_registrar, *const switchyard_error) -> i32,
    taken_by: TakenBy<'_>,
) -> Result<Registered, LoadError> {
    let mut context = RegistrationContext {
        path,
        plugin,
        taken_by,
        registered: Registered::default(),
        errors: Vec::new(),
    };
    let window = CallWindow::open(&mut context);
    let registrar: &'static switchyard_registrar = Box::leak(Box::new(switchyard_registrar {
        struct_size: std::mem::size_of::<switchyard_registrar>() as u32,
        host_abi_minor: u32::from(HOST_ABI_MINOR),
        host_data: std::ptr::from_ref(window).cast_mut().cast(),
        callback_register_component: Some(register_component),
        callback_register_policy: Some(register_policy),
    }));
    let mut buffer = ErrorBuffer::new();
    // SAFETY: per this function's contract; the registrar and its window live forever,
    // the context and the error buffer for the call (the window closes before they go).
    let code = unsafe { on_register(registrar, &buffer.as_abi()) };
    window.close();
    let RegistrationContext {
        errors, registered, ..
    } = context;
    if let Some(first) = errors.into_iter().next() {
        return Err(first);
    }
    buffer
        .check(code)
        .map_err(|failed| LoadError::RegistrationFailed {
            path: path.to_owned(),
            status: failed.status,
            message: failed.message,
        })?;
    Ok(registered)
}

/// Runs `f` on the registration context behind a registrar pointer while its
/// `on_register` call is in progress; refuses a late call, saying why.
///
/// # Safety
/// `registrar` must be NULL or a registrar `register` built; `error` the plugin's buffer.
unsafe fn in_window(
    registrar: *const switchyard_registrar,
    error: *const switchyard_error,
    f: impl FnOnce(&mut RegistrationContext<'_>) -> i32,
) -> i32 {
    // SAFETY: per this function's contract; registrars and their windows are never freed.
    let window = unsafe {
        registrar
            .as_ref()
            .and_then(|r| CallWindow::from_host_data(r.host_data))
    };
    // SAFETY: the window was opened on a RegistrationContext.
    let done = window.and_then(|w| unsafe { w.with::<RegistrationContext<'_>, _>(f) });
    done.unwrap_or_else(|| {
        let message = "the registrar was used after on_register returned: keep no pointer to it";
        // SAFETY: `error` is the buffer the plugin passed to this callback.
        unsafe { write_error(error, message) };
        Status::InvalidArgument.code()
    })
}

/// # Safety
/// Called by the plugin during `on_register`, with the registrar it was handed.
unsafe extern "C" fn register_component(
    registrar: *const switchyard_registrar,
    def: *const switchyard_component_def,
    error: *const switchyard_error,
) -> i32 {
    let register = |context: &mut RegistrationContext<'_>| {
        let minor = context.plugin.abi_minor;
        // SAFETY: the plugin hands over a def of its declared size.
        let result = unsafe { ComponentDef::read(context.path, minor, def, true) }
            .and_then(|(name, def)| Ok((context.check_name(def.kind().as_str(), name)?, def)))
            .map(|(name, def)| (name, def.registered_by(&context.plugin.name)));
        match result {
            Ok((name, def)) => {
                context.registered.names.push(name.clone());
                context.registered.components.push((name, def));
                Status::Ok.code()
            }
            Err(e) => context.refuse(e, error),
        }
    };
    // SAFETY: per this function's contract.
    host_guard(Some(error), Status::InvalidArgument.code(), || unsafe {
        in_window(registrar, error, register)
    })
}

/// # Safety
/// Called by the plugin during `on_register`, with the registrar it was handed.
unsafe extern "C" fn register_policy(
    registrar: *const switchyard_registrar,
    def: *const switchyard_policy_def,
    error: *const switchyard_error,
) -> i32 {
    let register = |context: &mut RegistrationContext<'_>| {
        let path = context.path;
        // SAFETY: the plugin hands over a def of its declared size.
        // `read` refuses a def without `on_validate` or `on_build`.
        let result = unsafe { PolicyDef::read(path, context.plugin.abi_minor, def) }
            .and_then(|(name, def)| Ok((context.check_name("policy", name)?, def)))
            .map(|(name, def)| (name, def.registered_by(&context.plugin.name)));
        match result {
            Ok((name, def)) => {
                context.registered.names.push(name.clone());
                context.registered.policies.push((name, Arc::new(def)));
                Status::Ok.code()
            }
            Err(e) => context.refuse(e, error),
        }
    };
    // SAFETY: per this function's contract.
    host_guard(Some(error), Status::InvalidArgument.code(), || unsafe {
        in_window(registrar, error, register)
    })
}
