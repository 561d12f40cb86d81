//! The registrar a plugin's register function is handed, and running that function.

use std::ffi::CString;

use super::boundary::{guard, read_error};
use super::components::{checked, component_def, on_create, AdmitterSlot, CreateFn, Kind};
use super::policies::{on_build, on_destroy_factory, on_validate, BuildFn, ValidateFn};
use crate::abi::*;
use crate::admission::RequestAdmitter;
use crate::component::{
    Notifications, PolicyParts, WorkerFilter, WorkerInputs, WorkerPicker, WorkerScorer,
};
use crate::params::Params;
use crate::view::Partition;
use crate::PolicyError;

/// Handed to the plugin's register function: registers component and policy types.
pub struct Registrar<'a> {
    raw: &'a switchyard_registrar,
    error: *const switchyard_error,
}

impl Registrar<'_> {
    /// The host's ABI minor version.
    pub fn host_abi_minor(&self) -> u32 {
        self.raw.host_abi_minor
    }

    fn component<C: Kind>(
        &mut self,
        type_name: &str,
        inputs: WorkerInputs,
        notifications: Notifications,
        create: Box<CreateFn<C>>,
    ) -> Result<(), PolicyError> {
        let name =
            CString::new(type_name).map_err(|_| PolicyError::failed("type name contains NUL"))?;
        let user_data = Box::into_raw(Box::new(create));
        let mut def = component_def::<C>(&name, inputs, notifications, user_data.cast());
        def.on_create = Some(on_create::<C>);
        let register = self.raw.callback_register_component.ok_or_else(|| {
            PolicyError::failed("the host's registrar has no register_component callback")
        })?;
        // SAFETY: the registrar and error buffer are the host's for this on_register call.
        let status = unsafe { register(self.raw, &def, self.error) };
        if status == SWITCHYARD_STATUS_OK {
            Ok(()) // user_data now lives as long as the library.
        } else {
            // SAFETY: the host refused the def, so nothing else holds `user_data`.
            drop(unsafe { Box::from_raw(user_data) });
            // SAFETY: the host wrote its message into this call's buffer.
            Err(PolicyError::failed(unsafe { read_error(self.error) }))
        }
    }

    /// Registers a filter type. `inputs` must cover what its instances declare.
    pub fn filter<F: WorkerFilter + 'static>(
        &mut self,
        type_name: &str,
        inputs: WorkerInputs,
        create: impl Fn(&Params<'_>, &Partition<'_>) -> Result<F, PolicyError> + Send + Sync + 'static,
    ) -> Result<(), PolicyError> {
        self.notified_filter(type_name, inputs, Notifications::NONE, create)
    }

    /// Registers a scorer type. `inputs` must cover what its instances declare.
    pub fn scorer<S: WorkerScorer + 'static>(
        &mut self,
        type_name: &str,
        inputs: WorkerInputs,
        create: impl Fn(&Params<'_>, &Partition<'_>) -> Result<S, PolicyError> + Send + Sync + 'static,
    ) -> Result<(), PolicyError> {
        self.notified_scorer(type_name, inputs, Notifications::NONE, create)
    }

    /// Registers a picker type. `inputs` must cover what its instances declare.
    pub fn picker<P: WorkerPicker + 'static>(
        &mut self,
        type_name: &str,
        inputs: WorkerInputs,
        create: impl Fn(&Params<'_>, &Partition<'_>) -> Result<P, PolicyError> + Send + Sync + 'static,
    ) -> Result<(), PolicyError> {
        self.notified_picker(type_name, inputs, Notifications::NONE, create)
    }

    /// Registers an admitter type (ABI 1.3). `inputs` is `WorkerInputs::ATTRIBUTES` or
    /// `WorkerInputs::NONE`; list instances in the config's `admission.admitters`.
    pub fn admitter<A: RequestAdmitter + 'static>(
        &mut self,
        type_name: &str,
        inputs: WorkerInputs,
        create: impl Fn(&Params<'_>, &Partition<'_>) -> Result<A, PolicyError> + Send + Sync + 'static,
    ) -> Result<(), PolicyError> {
        self.typed(type_name, inputs, Notifications::NONE, create, |a: A| {
            AdmitterSlot {
                admitter: Box::new(a),
                last: None,
            }
        })
    }

    /// `filter`, for a type whose instances implement `Lifecycle`: the router delivers
    /// `notifications` (which must cover what the instances ask for).
    pub fn notified_filter<F: WorkerFilter + 'static>(
        &mut self,
        type_name: &str,
        inputs: WorkerInputs,
        notifications: Notifications,
        create: impl Fn(&Params<'_>, &Partition<'_>) -> Result<F, PolicyError> + Send + Sync + 'static,
    ) -> Result<(), PolicyError> {
        self.typed(type_name, inputs, notifications, create, |c: F| {
            Box::new(c) as Box<dyn WorkerFilter>
        })
    }

    /// `scorer`, for a type whose instances implement `Lifecycle` (see `notified_filter`).
    pub fn notified_scorer<S: WorkerScorer + 'static>(
        &mut self,
        type_name: &str,
        inputs: WorkerInputs,
        notifications: Notifications,
        create: impl Fn(&Params<'_>, &Partition<'_>) -> Result<S, PolicyError> + Send + Sync + 'static,
    ) -> Result<(), PolicyError> {
        self.typed(type_name, inputs, notifications, create, |c: S| {
            Box::new(c) as Box<dyn WorkerScorer>
        })
    }

    /// `picker`, for a type whose instances implement `Lifecycle` (see `notified_filter`).
    pub fn notified_picker<P: WorkerPicker + 'static>(
        &mut self,
        type_name: &str,
        inputs: WorkerInputs,
        notifications: Notifications,
        create: impl Fn(&Params<'_>, &Partition<'_>) -> Result<P, PolicyError> + Send + Sync + 'static,
    ) -> Result<(), PolicyError> {
        self.typed(type_name, inputs, notifications, create, |c: P| {
            Box::new(c) as Box<dyn WorkerPicker>
        })
    }

    /// Registers a component type whose instances are `T`, held behind the ABI as `C`
    /// (`erase` boxes one), checked against what the type declares when created.
    fn typed<C: Kind, T: 'static>(
        &mut self,
        type_name: &str,
        inputs: WorkerInputs,
        notifications: Notifications,
        create: impl Fn(&Params<'_>, &Partition<'_>) -> Result<T, PolicyError> + Send + Sync + 'static,
        erase: fn(T) -> C,
    ) -> Result<(), PolicyError> {
        let declared = (inputs, notifications);
        self.component::<C>(
            type_name,
            inputs,
            notifications,
            Box::new(move |p, part| checked(declared, erase(create(p, part)?))),
        )
    }

    /// Registers a policy type: `provider` parses and validates the parameters once and
    /// returns the factory that builds the components of each partition.
    pub fn policy<B>(
        &mut self,
        type_name: &str,
        provider: impl Fn(&Params<'_>) -> Result<B, PolicyError> + Send + Sync + 'static,
    ) -> Result<(), PolicyError>
    where
        B: FnMut(&Partition<'_>) -> Result<PolicyParts, PolicyError> + Send + 'static,
    {
        let name =
            CString::new(type_name).map_err(|_| PolicyError::failed("type name contains NUL"))?;
        let validate: Box<ValidateFn> =
            Box::new(move |p| Ok(Box::new(provider(p)?) as Box<BuildFn>));
        let user_data = Box::into_raw(Box::new((validate, type_name.to_owned())));
        let def = switchyard_policy_def {
            struct_size: core::mem::size_of::<switchyard_policy_def>() as u32,
            reserved0: 0,
            type_name: name.as_ptr(),
            user_data: user_data.cast(),
            on_validate: Some(on_validate),
            on_destroy_factory: Some(on_destroy_factory),
            on_build: Some(on_build),
        };
        let register = self.raw.callback_register_policy.ok_or_else(|| {
            PolicyError::failed("the host's registrar has no register_policy callback")
        })?;
        // SAFETY: the registrar and error buffer are the host's for this on_register call.
        let status = unsafe { register(self.raw, &def, self.error) };
        if status == SWITCHYARD_STATUS_OK {
            Ok(())
        } else {
            // SAFETY: the host refused the def, so nothing else holds `user_data`.
            drop(unsafe { Box::from_raw(user_data) });
            // SAFETY: the host wrote its message into this call's buffer.
            Err(PolicyError::failed(unsafe { read_error(self.error) }))
        }
    }
}

/// Runs the plugin's register function behind the boundary. Used by `export_plugin!`.
///
/// # Safety
/// `registrar` and `error` must be what the host passed to `on_register`.
pub unsafe fn run_register(
    registrar: *const switchyard_registrar,
    error: *const switchyard_error,
    register: fn(&mut Registrar<'_>) -> Result<(), PolicyError>,
) -> i32 {
    guard(error, None, SWITCHYARD_STATUS_ERROR, || {
        // SAFETY: per this function's contract.
        let raw =
            unsafe { registrar.as_ref() }.ok_or_else(|| PolicyError::failed("NULL registrar"))?;
        register(&mut Registrar { raw, error })
    })
}
