//! The boundary: trampolines from the C ABI to the safe traits, the registrar, and the
//! `export_plugin!` macro. Every callback body runs inside `guard`, the one place where
//! panics are caught, turned into a status code and a message, and poison the instance.

use core::ffi::{c_char, c_void, CStr};
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::abi::*;
use crate::admission::{Admission, RequestAdmitter, Saturation};
use crate::component::{
    Lifecycle, Notifications, PolicyParts, WorkerFilter, WorkerInputs, WorkerPicker, WorkerScorer,
};
use crate::params::Params;
use crate::view::{Outcome, Partition, WorkerCandidates, WorkerSelectionContext};
use crate::PolicyError;

/// Writes `message` into a host error buffer, truncated on a UTF-8 boundary.
///
/// # Safety
/// `error` must be NULL or point to a `switchyard_error` whose buffer holds `capacity`
/// writable bytes.
pub unsafe fn write_error(error: *const switchyard_error, message: &str) {
    // SAFETY: the host passes a valid buffer of `capacity` bytes (or NULL).
    let Some(error) = (unsafe { error.as_ref() }) else {
        return;
    };
    if error.buffer.is_null() || error.capacity == 0 {
        return;
    }
    let mut len = message.len().min(error.capacity - 1);
    while !message.is_char_boundary(len) {
        len -= 1;
    }
    // SAFETY: `len < capacity`, so the bytes and the NUL fit the host's buffer.
    unsafe {
        core::ptr::copy_nonoverlapping(message.as_ptr(), error.buffer.cast::<u8>(), len);
        *error.buffer.add(len) = 0;
    }
}

/// Reads back the message a host callback wrote into `error`.
///
/// # Safety
/// `error` must be NULL or the host's buffer of this call, NUL-terminated by the host.
unsafe fn read_error(error: *const switchyard_error) -> String {
    // SAFETY: per this function's contract.
    match unsafe { error.as_ref() } {
        // SAFETY: the host NUL-terminates its buffer before handing it out.
        Some(e) if !e.buffer.is_null() && e.capacity > 0 => unsafe { CStr::from_ptr(e.buffer) }
            .to_string_lossy()
            .into_owned(),
        _ => String::new(),
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string panic payload")
}

/// Runs `body` at the boundary: a poisoned instance refuses the call; an error becomes
/// `status_on_error`; a panic becomes `SWITCHYARD_STATUS_PANIC` and poisons the instance.
fn guard(
    error: *const switchyard_error,
    poisoned: Option<&mut bool>,
    status_on_error: i32,
    body: impl FnOnce() -> Result<(), PolicyError>,
) -> i32 {
    // SAFETY: every caller passes the error buffer the host handed to this callback.
    let report = |message: &str| unsafe { write_error(error, message) };
    if poisoned.as_deref() == Some(&true) {
        report("instance is poisoned: it panicked in an earlier call");
        return SWITCHYARD_STATUS_POISONED;
    }
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => SWITCHYARD_STATUS_OK,
        Ok(Err(e)) => {
            report(e.message());
            status_on_error
        }
        Err(payload) => {
            if let Some(flag) = poisoned {
                *flag = true;
            }
            report(&format!("panicked: {}", panic_message(&*payload)));
            SWITCHYARD_STATUS_PANIC
        }
    }
}

/// An instance behind the ABI: the component and its poison flag.
struct Slot<C> {
    component: C,
    poisoned: bool,
}

/// Creates a component of one kind from params and a partition.
type CreateFn<C> = dyn Fn(&Params<'_>, &Partition<'_>) -> Result<C, PolicyError> + Send + Sync;

/// What distinguishes the three component kinds at the boundary.
trait Kind: Send + Sized + 'static {
    const KIND: u32;
    fn inputs(&self) -> WorkerInputs;
    fn lifecycle(&mut self) -> Option<&mut dyn Lifecycle>;
    fn install(def: &mut switchyard_component_def);
    /// The notifications this instance wants.
    fn notifications(&mut self) -> Notifications {
        self.lifecycle()
            .map_or(Notifications::NONE, |l| l.notifications())
    }
}

impl Kind for Box<dyn WorkerFilter> {
    const KIND: u32 = SWITCHYARD_COMPONENT_FILTER;
    fn inputs(&self) -> WorkerInputs {
        self.required_worker_inputs()
    }
    fn lifecycle(&mut self) -> Option<&mut dyn Lifecycle> {
        WorkerFilter::lifecycle(self.as_mut())
    }
    fn install(def: &mut switchyard_component_def) {
        def.on_filter = Some(on_filter);
    }
}

impl Kind for Box<dyn WorkerScorer> {
    const KIND: u32 = SWITCHYARD_COMPONENT_SCORER;
    fn inputs(&self) -> WorkerInputs {
        self.required_worker_inputs()
    }
    fn lifecycle(&mut self) -> Option<&mut dyn Lifecycle> {
        WorkerScorer::lifecycle(self.as_mut())
    }
    fn install(def: &mut switchyard_component_def) {
        def.on_score = Some(on_score);
    }
}

impl Kind for Box<dyn WorkerPicker> {
    const KIND: u32 = SWITCHYARD_COMPONENT_PICKER;
    fn inputs(&self) -> WorkerInputs {
        self.required_worker_inputs()
    }
    fn lifecycle(&mut self) -> Option<&mut dyn Lifecycle> {
        WorkerPicker::lifecycle(self.as_mut())
    }
    fn install(def: &mut switchyard_component_def) {
        def.on_pick = Some(on_pick);
    }
}

/// An admitter behind the ABI, with its last answer: the tenant it names must outlive
/// `on_admit` (the host copies it after the call returns).
struct AdmitterSlot {
    admitter: Box<dyn RequestAdmitter>,
    last: Option<Admission>,
}

impl Kind for AdmitterSlot {
    const KIND: u32 = SWITCHYARD_COMPONENT_ADMITTER;
    fn inputs(&self) -> WorkerInputs {
        self.admitter.required_worker_inputs()
    }
    fn lifecycle(&mut self) -> Option<&mut dyn Lifecycle> {
        None
    }
    fn install(def: &mut switchyard_component_def) {
        def.on_admit = Some(on_admit);
    }
}

/// # Safety
/// Called by the host per ABI 1.3: an admitter instance of this def, and pointers valid
/// for the call.
unsafe extern "C" fn on_admit(
    instance: *mut c_void,
    request: *const switchyard_request,
    saturation: *const switchyard_saturation,
    decision: *mut switchyard_admission,
    error: *const switchyard_error,
) -> i32 {
    // SAFETY: the host calls on_admit only with instances this def created.
    let slot = unsafe { slot::<AdmitterSlot>(instance) };
    guard(
        error,
        Some(&mut slot.poisoned),
        SWITCHYARD_STATUS_ERROR,
        || {
            // SAFETY: the host's request, saturation and decision are valid for the call.
            let (context, saturation, decision) = unsafe {
                (
                    WorkerSelectionContext::from_abi(&*request),
                    Saturation::from_abi(&*saturation),
                    &mut *decision,
                )
            };
            let answer = slot.component.admitter.admit(&context, &saturation)?;
            // SAFETY: `decision` is the host's for this call, as its message buffer.
            unsafe { answer.write_abi(decision) };
            slot.component.last = Some(answer);
            Ok(())
        },
    )
}

fn component_def<C: Kind>(
    type_name: &CStr,
    inputs: WorkerInputs,
    notifications: Notifications,
    user_data: *mut c_void,
) -> switchyard_component_def {
    let mut def = switchyard_component_def {
        struct_size: core::mem::size_of::<switchyard_component_def>() as u32,
        kind: C::KIND,
        inputs: inputs.bits(),
        reserved0: 0,
        type_name: type_name.as_ptr(),
        user_data,
        on_create: None,
        on_destroy: Some(on_destroy::<C>),
        on_filter: None,
        on_score: None,
        on_pick: None,
        on_selected: None,
        on_prefill_complete: None,
        on_finished: None,
        on_admit: None,
    };
    C::install(&mut def);
    if notifications.contains(Notifications::SELECTED) {
        def.on_selected = Some(on_selected::<C>);
    }
    if notifications.contains(Notifications::PREFILL_COMPLETE) {
        def.on_prefill_complete = Some(on_prefill_complete::<C>);
    }
    if notifications.contains(Notifications::FINISHED) {
        def.on_finished = Some(on_finished::<C>);
    }
    def
}

/// Runs `notify` on the instance's `Lifecycle` at the boundary.
///
/// # Safety
/// `instance` must come from `into_instance::<C>`; `error` is the host's for the call.
unsafe fn lifecycle_call<C: Kind>(
    instance: *mut c_void,
    error: *const switchyard_error,
    notify: impl FnOnce(&mut dyn Lifecycle) -> Result<(), PolicyError>,
) -> i32 {
    // SAFETY: per this function's contract.
    let slot = unsafe { slot::<C>(instance) };
    guard(
        error,
        Some(&mut slot.poisoned),
        SWITCHYARD_STATUS_ERROR,
        || match slot.component.lifecycle() {
            Some(lifecycle) => notify(lifecycle),
            None => Ok(()),
        },
    )
}

/// # Safety
/// Called by the host per ABI 1.1 with an instance of this def and pointers valid for the
/// call.
unsafe extern "C" fn on_selected<C: Kind>(
    instance: *mut c_void,
    request: *const switchyard_request,
    outcome: *const switchyard_outcome,
    error: *const switchyard_error,
) -> i32 {
    // SAFETY: the host passes an instance of this def, and request and outcome valid for
    // the call.
    unsafe {
        lifecycle_call::<C>(instance, error, |l| {
            l.on_selected(
                &WorkerSelectionContext::from_abi(&*request),
                &Outcome::from_abi(&*outcome),
            )
        })
    }
}

/// # Safety
/// As for `on_selected`.
unsafe extern "C" fn on_prefill_complete<C: Kind>(
    instance: *mut c_void,
    outcome: *const switchyard_outcome,
    error: *const switchyard_error,
) -> i32 {
    // SAFETY: as in `on_selected`.
    unsafe {
        lifecycle_call::<C>(instance, error, |l| {
            l.on_prefill_complete(&Outcome::from_abi(&*outcome))
        })
    }
}

/// # Safety
/// As for `on_selected`.
unsafe extern "C" fn on_finished<C: Kind>(
    instance: *mut c_void,
    outcome: *const switchyard_outcome,
    error: *const switchyard_error,
) -> i32 {
    // SAFETY: as in `on_selected`.
    unsafe {
        lifecycle_call::<C>(instance, error, |l| {
            l.on_finished(&Outcome::from_abi(&*outcome))
        })
    }
}

fn into_instance<C: Kind>(component: C) -> *mut c_void {
    Box::into_raw(Box::new(Slot {
        component,
        poisoned: false,
    }))
    .cast()
}

/// # Safety
/// `instance` must come from `into_instance::<C>` and not be in use elsewhere.
unsafe fn slot<'a, C>(instance: *mut c_void) -> &'a mut Slot<C> {
    // SAFETY: per this function's contract.
    unsafe { &mut *instance.cast::<Slot<C>>() }
}

/// # Safety
/// Called by the host per ABI: `user_data` is this def's, the other pointers are valid for
/// the call.
unsafe extern "C" fn on_create<C: Kind>(
    user_data: *mut c_void,
    params: *const switchyard_params,
    partition: *const switchyard_partition,
    out_instance: *mut *mut c_void,
    error: *const switchyard_error,
) -> i32 {
    guard(error, None, SWITCHYARD_STATUS_INVALID_PARAMETERS, || {
        // SAFETY: user_data is the leaked CreateFn registered with this def; the host
        // passes valid params and partition for the call.
        let create = unsafe { &*user_data.cast::<Box<CreateFn<C>>>() };
        // SAFETY: the host's params and partition are valid for the call.
        let (params, partition) =
            unsafe { (Params::from_abi(&*params), Partition::from_abi(&*partition)) };
        let component = create(&params, &partition)?;
        // SAFETY: the host passes a writable out-pointer.
        unsafe { *out_instance = into_instance(component) };
        Ok(())
    })
}

/// # Safety
/// `instance` must come from `on_create::<C>` and is not used again.
unsafe extern "C" fn on_destroy<C: Kind>(instance: *mut c_void) {
    if !instance.is_null() {
        // A panicking Drop must not unwind into the host.
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: the instance was boxed by `into_instance::<C>`; this is its last use.
            drop(unsafe { Box::from_raw(instance.cast::<Slot<C>>()) })
        }));
    }
}

/// # Safety
/// Called by the host per ABI: a filter instance and arrays valid for the call.
unsafe extern "C" fn on_filter(
    instance: *mut c_void,
    request: *const switchyard_request,
    candidates: *const switchyard_candidates,
    keep: *mut u8,
    error: *const switchyard_error,
) -> i32 {
    // SAFETY: the host calls on_filter only with instances this def created.
    let slot = unsafe { slot::<Box<dyn WorkerFilter>>(instance) };
    guard(
        error,
        Some(&mut slot.poisoned),
        SWITCHYARD_STATUS_ERROR,
        || {
            // SAFETY: the host's request and candidates are valid for the call.
            let (context, candidates) = unsafe {
                (
                    WorkerSelectionContext::from_abi(&*request),
                    WorkerCandidates::from_abi(&*candidates),
                )
            };
            // SAFETY: the host fills `keep` with 1s (valid bools) for `count` rows.
            let keep =
                unsafe { core::slice::from_raw_parts_mut(keep.cast::<bool>(), candidates.len()) };
            slot.component.keep_batch(&context, &candidates, keep)
        },
    )
}

/// # Safety
/// Called by the host per ABI: a scorer instance and arrays valid for the call.
unsafe extern "C" fn on_score(
    instance: *mut c_void,
    request: *const switchyard_request,
    candidates: *const switchyard_candidates,
    costs: *mut f64,
    error: *const switchyard_error,
) -> i32 {
    // SAFETY: the host calls on_score only with instances this def created.
    let slot = unsafe { slot::<Box<dyn WorkerScorer>>(instance) };
    guard(
        error,
        Some(&mut slot.poisoned),
        SWITCHYARD_STATUS_ERROR,
        || {
            // SAFETY: the host's request and candidates are valid for the call.
            let (context, candidates) = unsafe {
                (
                    WorkerSelectionContext::from_abi(&*request),
                    WorkerCandidates::from_abi(&*candidates),
                )
            };
            // SAFETY: the host passes `count` writable costs.
            let costs = unsafe { core::slice::from_raw_parts_mut(costs, candidates.len()) };
            slot.component.score_batch(&context, &candidates, costs)
        },
    )
}

/// # Safety
/// Called by the host per ABI: a picker instance and arrays valid for the call.
unsafe extern "C" fn on_pick(
    instance: *mut c_void,
    request: *const switchyard_request,
    candidates: *const switchyard_candidates,
    out_row: *mut usize,
    error: *const switchyard_error,
) -> i32 {
    // SAFETY: the host calls on_pick only with instances this def created.
    let slot = unsafe { slot::<Box<dyn WorkerPicker>>(instance) };
    guard(
        error,
        Some(&mut slot.poisoned),
        SWITCHYARD_STATUS_ERROR,
        || {
            // SAFETY: the host's request and candidates are valid for the call.
            let (context, candidates) = unsafe {
                (
                    WorkerSelectionContext::from_abi(&*request),
                    WorkerCandidates::from_abi(&*candidates),
                )
            };
            let row = slot.component.pick(&context, &candidates)?;
            // SAFETY: the host passes a writable out-pointer.
            unsafe { *out_row = row };
            Ok(())
        },
    )
}

/// Validates a policy's parameters once; yields the per-partition builder.
type ValidateFn = dyn Fn(&Params<'_>) -> Result<Box<BuildFn>, PolicyError> + Send + Sync;
/// Builds a policy's components for one partition.
type BuildFn = dyn FnMut(&Partition<'_>) -> Result<PolicyParts, PolicyError> + Send;

struct Factory {
    type_name: String,
    build: Box<BuildFn>,
}

/// # Safety
/// Called by the host per ABI with this def's `user_data` and params valid for the call.
unsafe extern "C" fn on_validate(
    user_data: *mut c_void,
    params: *const switchyard_params,
    out_factory: *mut *mut c_void,
    error: *const switchyard_error,
) -> i32 {
    guard(error, None, SWITCHYARD_STATUS_INVALID_PARAMETERS, || {
        // SAFETY: user_data is the leaked pair `Registrar::policy` registered.
        let (validate, type_name) = unsafe { &*user_data.cast::<(Box<ValidateFn>, String)>() };
        // SAFETY: the host's params are valid for the call.
        let build = validate(unsafe { &Params::from_abi(&*params) })?;
        let factory = Box::new(Factory {
            type_name: type_name.clone(),
            build,
        });
        // SAFETY: the host passes a writable out-pointer.
        unsafe { *out_factory = Box::into_raw(factory).cast() };
        Ok(())
    })
}

/// # Safety
/// `factory` must come from `on_validate` and is not used again.
unsafe extern "C" fn on_destroy_factory(factory: *mut c_void) {
    if !factory.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: the factory was boxed by `on_validate`; this is its last use.
            drop(unsafe { Box::from_raw(factory.cast::<Factory>()) })
        }));
    }
}

fn add_part<C: Kind>(
    builder: &switchyard_policy_builder,
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
    let status = unsafe { add(builder, &def, into_instance(component), weight, error) };
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
unsafe extern "C" fn on_build(
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
        let parts = (factory.build)(&partition)?;
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

/// Refuses a component that reads more groups, or wants more notifications, than its
/// type declared (the host computes only declared groups, and delivers only declared
/// notifications).
fn checked<C: Kind>(
    (declared, notifications): (WorkerInputs, Notifications),
    mut component: C,
) -> Result<C, PolicyError> {
    let wanted = component.inputs();
    if !declared.contains(wanted) {
        return Err(PolicyError::failed(format!(
            "component reads input groups {wanted:?} but its type was registered with {declared:?}"
        )));
    }
    let asked = component.notifications();
    if !notifications.contains(asked) {
        return Err(PolicyError::failed(format!(
            "component asks for lifecycle notifications {asked:?} but its type was registered with {notifications:?}: register it with `notified_filter` / `notified_scorer` / `notified_picker` and those notifications"
        )));
    }
    Ok(component)
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

/// The static descriptor `export_plugin!` defines. Holds only pointers to static data.
#[repr(transparent)]
pub struct Descriptor(pub switchyard_plugin_descriptor);

// SAFETY: every pointer in it refers to immutable static data.
unsafe impl Sync for Descriptor {}

/// `SWITCHYARD_SDK_REVISION`, NUL-terminated.
pub const SDK_REVISION_NUL: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

impl Descriptor {
    pub const fn new(
        name_nul: &'static str,
        version_nul: &'static str,
        vendor_nul: &'static str,
        on_register: unsafe extern "C" fn(
            *const switchyard_registrar,
            *const switchyard_error,
        ) -> i32,
    ) -> Self {
        Descriptor(switchyard_plugin_descriptor {
            struct_size: core::mem::size_of::<switchyard_plugin_descriptor>() as u32,
            abi_major: SWITCHYARD_ABI_MAJOR,
            abi_minor: SWITCHYARD_ABI_MINOR,
            layout_fingerprint: SWITCHYARD_LAYOUT_FINGERPRINT,
            component_def_size: core::mem::size_of::<switchyard_component_def>() as u32,
            policy_def_size: core::mem::size_of::<switchyard_policy_def>() as u32,
            sdk_revision: SDK_REVISION_NUL.as_ptr() as *const c_char,
            plugin_name: name_nul.as_ptr() as *const c_char,
            plugin_version: version_nul.as_ptr() as *const c_char,
            plugin_vendor: vendor_nul.as_ptr() as *const c_char,
            on_register: Some(on_register),
        })
    }
}

/// Exports the entry symbol `switchyard_plugin_entry_v1` of a Rust plugin, and writes its
/// static manifest (see [`crate::manifest`]) into the library.
///
/// ```ignore
/// switchyard_plugin_sdk::export_plugin! {
///     name: "acme-routing",
///     version: env!("CARGO_PKG_VERSION"),
///     vendor: "Acme Corp",
///     register: register,   // fn(&mut Registrar) -> Result<(), PolicyError>
///     // Optional: the types `register` registers, so `plugin inspect` can list them
///     // without loading the library. The loader refuses a library whose registration
///     // differs from what it declares.
///     types: [
///         scorer("acme.least-busy", WorkerInputs::LOAD),
///         policy("acme.routing"),
///     ],
/// }
/// ```
#[macro_export]
macro_rules! export_plugin {
    (name: $name:expr, version: $version:expr, vendor: $vendor:expr, register: $register:path
     $(, types: [ $( $kind:ident ( $type_name:expr $(, $inputs:expr)? ) ),* $(,)? ])? $(,)?) => {
        #[no_mangle]
        pub extern "C" fn switchyard_plugin_entry_v1(
        ) -> *const $crate::abi::switchyard_plugin_descriptor {
            /// # Safety
            /// Called by the host with its registrar and error buffer.
            unsafe extern "C" fn on_register(
                registrar: *const $crate::abi::switchyard_registrar,
                error: *const $crate::abi::switchyard_error,
            ) -> i32 {
                // SAFETY: the host passes its registrar and error buffer for this call.
                unsafe { $crate::export::run_register(registrar, error, $register) }
            }
            static DESCRIPTOR: $crate::export::Descriptor = $crate::export::Descriptor::new(
                concat!($name, "\0"),
                concat!($version, "\0"),
                concat!($vendor, "\0"),
                on_register,
            );
            const TYPES: &[$crate::manifest::TypeDecl] = &[$($(
                $crate::manifest::TypeDecl {
                    kind: $crate::manifest::kind::$kind,
                    name: $type_name,
                    inputs: $crate::WorkerInputs::NONE$(.union($inputs))?.bits(),
                },
            )*)?];
            const LEN: usize = $crate::manifest::len($name, $version, $vendor, TYPES);
            #[used]
            #[link_section = ".switchyard_manifest"]
            static MANIFEST: [u8; LEN] =
                $crate::manifest::build::<LEN>($name, $version, $vendor, TYPES);
            // Referenced so that no linker garbage-collects the section.
            ::core::hint::black_box(&MANIFEST);
            &DESCRIPTOR.0
        }
    };
}
