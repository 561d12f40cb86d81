//! Policy types behind the ABI: validating parameters once (`on_validate`) and building
//! each partition's components through the host's builder (`on_build`).

use core::ffi::c_void;
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::boundary::{guard, read_error};
use super::components::{component_def, into_instance, Kind};
use crate::abi::*;
use crate::component::PolicyParts;
use crate::log::{Entered, Logger};
use crate::params::Params;
use crate::view::Partition;
use crate::PolicyError;

/// Validates a policy's parameters once; yields the per-partition builder.
pub(super) type ValidateFn = dyn Fn(&Params<'_>) -> Result<Box<BuildFn>, PolicyError> + Send + Sync;
/// Builds a policy's components for one partition.
pub(super) type BuildFn = dyn FnMut(&Partition<'_>) -> Result<PolicyParts, PolicyError> + Send;

struct Factory {
    type_name: String,
    build: Box<BuildFn>,
    /// The router's log for this factory (ABI 1.5), and for the components it builds.
    logger: Option<Logger>,
}

/// # Safety
/// Called by the host per ABI with this def's `user_data` and params valid for the call.
pub(super) unsafe extern "C" fn on_validate(
    user_data: *mut c_void,
    params: *const switchyard_params,
    out_factory: *mut *mut c_void,
    error: *const switchyard_error,
) -> i32 {
    guard(error, None, SWITCHYARD_STATUS_INVALID_PARAMETERS, || {
        // SAFETY: user_data is the leaked pair `Registrar::policy` registered.
        let (validate, type_name) = unsafe { &*user_data.cast::<(Box<ValidateFn>, String)>() };
        // SAFETY: the host's params are valid for the call.
        let params = unsafe { Params::from_abi(&*params) };
        let logger = params.logger();
        let _log = Entered::new(logger);
        let build = validate(&params)?;
        let factory = Box::new(Factory {
            type_name: type_name.clone(),
            build,
            logger,
        });
        // SAFETY: the host passes a writable out-pointer.
        unsafe { *out_factory = Box::into_raw(factory).cast() };
        Ok(())
    })
}

/// # Safety
/// `factory` must come from `on_validate` and is not used again.
pub(super) unsafe extern "C" fn on_destroy_factory(factory: *mut c_void) {
    if !factory.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: the factory was boxed by `on_validate`; this is its last use.
            let factory = unsafe { Box::from_raw(factory.cast::<Factory>()) };
            let _log = Entered::new(factory.logger);
            drop(factory);
        }));
    }
}

fn add_part<C: Kind>(
    (builder, logger): (&switchyard_policy_builder, Option<Logger>),
    name: String,
    mut component: C,
    weight: f64,
    error: *const switchyard_error,
) -> Result<(), PolicyError> {
    let name =
        CString::new(name).map_err(|_| PolicyError::failed("component name contains NUL"))?;
    let notifications = component.notifications();
    let def = component_def::<C>(
        &name,
        component.inputs(),
        notifications,
        core::ptr::null_mut(),
    );
    let add = builder
        .callback_add_component
        .ok_or_else(|| PolicyError::failed("the host's builder has no add_component callback"))?;
    // SAFETY: `builder` and `error` are the host's for this on_build call; the def and the
    // instance are ours to hand over.
    let status = unsafe {
        add(
            builder,
            &def,
            into_instance(component, logger),
            weight,
            error,
        )
    };
    if status == SWITCHYARD_STATUS_OK {
        Ok(())
    } else {
        // SAFETY: the host wrote its message into this call's buffer.
        Err(PolicyError::failed(unsafe { read_error(error) }))
    }
}

/// # Safety
/// Called by the host per ABI with a factory from `on_validate` and pointers valid for the
/// call.
pub(super) unsafe extern "C" fn on_build(
    factory: *mut c_void,
    partition: *const switchyard_partition,
    builder: *const switchyard_policy_builder,
    error: *const switchyard_error,
) -> i32 {
    guard(error, None, SWITCHYARD_STATUS_ERROR, || {
        // SAFETY: the host passes the factory `on_validate` made, never concurrently.
        let factory = unsafe { &mut *factory.cast::<Factory>() };
        // SAFETY: builder and partition are the host's, valid for the call.
        let (builder, partition) = unsafe { (&*builder, Partition::from_abi(&*partition)) };
        let _log = Entered::new(factory.logger);
        let parts = (factory.build)(&partition)?;
        let builder = (builder, factory.logger);
        let name = &factory.type_name;
        for (i, filter) in parts.filters.into_iter().enumerate() {
            add_part(builder, format!("{name}/filter.{i}"), filter, 1.0, error)?;
        }
        for (i, (scorer, weight)) in parts.scorers.into_iter().enumerate() {
            add_part(builder, format!("{name}/scorer.{i}"), scorer, weight, error)?;
        }
        add_part(builder, format!("{name}/picker"), parts.picker, 1.0, error)
    })
}
