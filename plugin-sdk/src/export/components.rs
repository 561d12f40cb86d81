//! Component instances behind the ABI: the def each kind (filter, scorer, picker,
//! admitter) installs, and the trampolines from its `on_*` callbacks to the safe traits.

use core::ffi::{c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::boundary::guard;
use crate::abi::*;
use crate::admission::{Admission, RequestAdmitter, Saturation};
use crate::component::{
    Lifecycle, Notifications, WorkerFilter, WorkerInputs, WorkerPicker, WorkerScorer,
};
use crate::log::{Entered, Logger};
use crate::params::Params;
use crate::view::{Outcome, Partition, WorkerCandidates, WorkerSelectionContext};
use crate::PolicyError;

/// An instance behind the ABI: the component and its poison flag.
pub(super) struct Slot<C> {
    component: C,
    poisoned: bool,
    /// The router's log for this instance (ABI 1.5): `tracing` events in its calls go there.
    logger: Option<Logger>,
}

/// Creates a component of one kind from params and a partition.
pub(super) type CreateFn<C> =
    dyn Fn(&Params<'_>, &Partition<'_>) -> Result<C, PolicyError> + Send + Sync;

/// What distinguishes the three component kinds at the boundary.
pub(super) trait Kind: Send + Sized + 'static {
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
pub(super) struct AdmitterSlot {
    pub(super) admitter: Box<dyn RequestAdmitter>,
    pub(super) last: Option<Admission>,
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
    let _log = Entered::new(slot.logger);
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

pub(super) fn component_def<C: Kind>(
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
    let _log = Entered::new(slot.logger);
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

pub(super) fn into_instance<C: Kind>(component: C, logger: Option<Logger>) -> *mut c_void {
    Box::into_raw(Box::new(Slot {
        component,
        poisoned: false,
        logger,
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
pub(super) unsafe extern "C" fn on_create<C: Kind>(
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
        let logger = params.logger();
        let _log = Entered::new(logger);
        let component = create(&params, &partition)?;
        // SAFETY: the host passes a writable out-pointer.
        unsafe { *out_instance = into_instance(component, logger) };
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
            let slot = unsafe { Box::from_raw(instance.cast::<Slot<C>>()) };
            let _log = Entered::new(slot.logger);
            drop(slot);
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
    let _log = Entered::new(slot.logger);
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
    let _log = Entered::new(slot.logger);
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
    let _log = Entered::new(slot.logger);
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

/// Refuses a component that reads more groups, or wants more notifications, than its
/// type declared (the host computes only declared groups, and delivers only declared
/// notifications).
pub(super) fn checked<C: Kind>(
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
