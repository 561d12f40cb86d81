//! Plugin component types and instances: the def a plugin registered (or handed to a
//! builder), checked and copied, and the live instance handle the pipeline calls.

use std::ffi::c_void;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use switchyard_plugin_sdk::abi::*;
use switchyard_plugin_sdk::{Admission, Placement, Saturation, Status, WorkerId, WorkerInputs};

use super::abi_checks::{inputs_of_minor, read_def};
use super::error_buffer::{CallError, ErrorBuffer};
use super::inputs::AbiRequest;
use super::inputs::Columns;
use super::load_error::LoadError;
use super::logger::PluginLogger;
use super::params::OwnedParams;
use super::partition::PartitionKey;
use crate::plugin::Component;

/// What a component does in the pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ComponentKind {
    Filter,
    Scorer,
    Picker,
    /// Decides, before selection, whether a request is served (ABI 1.3).
    Admitter,
}

impl ComponentKind {
    pub fn from_abi(kind: u32) -> Option<Self> {
        match kind {
            SWITCHYARD_COMPONENT_FILTER => Some(Self::Filter),
            SWITCHYARD_COMPONENT_SCORER => Some(Self::Scorer),
            SWITCHYARD_COMPONENT_PICKER => Some(Self::Picker),
            SWITCHYARD_COMPONENT_ADMITTER => Some(Self::Admitter),
            _ => None,
        }
    }
    /// The kind `as_str` names.
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Filter, Self::Scorer, Self::Picker, Self::Admitter]
            .into_iter()
            .find(|k| k.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Filter => "filter",
            Self::Scorer => "scorer",
            Self::Picker => "picker",
            Self::Admitter => "admitter",
        }
    }
    /// The error of a component that is `what` (`a filter`, `a built-in scorer`, ...)
    /// called as this kind: a host bug, refused instead of calling the wrong code.
    #[cold]
    pub fn wrongly_called(self, what: &str) -> CallError {
        CallError::new(
            Status::InvalidArgument,
            format!("a {what} was called as a {}", self.as_str()),
        )
    }

    /// The kind with its article: `a filter`, `an admitter`.
    pub fn with_article(self) -> &'static str {
        match self {
            Self::Filter => "a filter",
            Self::Scorer => "a scorer",
            Self::Picker => "a picker",
            Self::Admitter => "an admitter",
        }
    }

    /// Where the config lists a component of this kind.
    pub fn config_place(self) -> &'static str {
        match self {
            Self::Filter => "an instance's `filters:`",
            Self::Scorer => "an instance's `scorers:`",
            Self::Picker => "an instance's `picker:`",
            Self::Admitter => "`admission.admitters`",
        }
    }

    /// The ABI callback name after `on_`.
    pub fn callback(self) -> &'static str {
        match self {
            Self::Filter => "filter",
            Self::Scorer => "score",
            Self::Picker => "pick",
            Self::Admitter => "admit",
        }
    }
}

/// A lifecycle notification (ABI 1.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    Selected,
    PrefillComplete,
    Finished,
}

impl Lifecycle {
    /// The ABI callback's name.
    pub fn callback(self) -> &'static str {
        match self {
            Self::Selected => "on_selected",
            Self::PrefillComplete => "on_prefill_complete",
            Self::Finished => "on_finished",
        }
    }
}

/// What became of a routed request, as the lifecycle notifications report it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    /// The router's id for the routed request (the same in all its notifications).
    pub request_id: u64,
    pub worker: WorkerId,
    pub to_prefill_complete: Option<Duration>,
    pub to_finish: Option<Duration>,
    /// The other worker of a disaggregated pair, once chosen (ABI 1.4).
    pub paired: Option<WorkerId>,
}

impl Outcome {
    /// The host form of an outcome read back from its ABI form.
    pub(super) fn from_abi(raw: &switchyard_outcome) -> Self {
        let duration = |s: f64| (s.is_finite() && s >= 0.0).then(|| Duration::from_secs_f64(s));
        Outcome {
            request_id: raw.request_id,
            worker: WorkerId {
                worker_id: raw.worker_id,
                dp_rank: raw.dp_rank,
            },
            to_prefill_complete: duration(raw.seconds_to_prefill_complete),
            to_finish: duration(raw.seconds_to_finish),
            paired: (raw.paired_worker_id != SWITCHYARD_NO_WORKER).then_some(WorkerId {
                worker_id: raw.paired_worker_id,
                dp_rank: raw.paired_dp_rank,
            }),
        }
    }

    pub(super) fn abi(&self) -> switchyard_outcome {
        let seconds = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64());
        switchyard_outcome {
            struct_size: std::mem::size_of::<switchyard_outcome>() as u32,
            dp_rank: self.worker.dp_rank,
            request_id: self.request_id,
            worker_id: self.worker.worker_id,
            seconds_to_prefill_complete: seconds(self.to_prefill_complete),
            seconds_to_finish: seconds(self.to_finish),
            paired_worker_id: self.paired.map_or(SWITCHYARD_NO_WORKER, |w| w.worker_id),
            paired_dp_rank: self.paired.map_or(0, |w| w.dp_rank),
            reserved0: 0,
        }
    }
}

/// A component def copied from a plugin. Its callback for `kind` was checked for NULL
/// once, when it was read, and is kept as a plain function pointer in `call`: no call can
/// reach a NULL one. The def's other callbacks are optional by the ABI (`on_destroy`, the
/// notifications; `on_create` of an instance added by a policy) and read from `def`.
#[derive(Clone)]
pub struct ComponentDef {
    def: switchyard_component_def,
    call: KindCallback,
    inputs: WorkerInputs,
    kind: ComponentKind,
    /// `plugin/type`, as its log lines name it.
    origin: Arc<str>,
}

type FilterFn = unsafe extern "C" fn(
    *mut c_void,
    *const switchyard_request,
    *const switchyard_candidates,
    *mut u8,
    *const switchyard_error,
) -> i32;
type ScoreFn = unsafe extern "C" fn(
    *mut c_void,
    *const switchyard_request,
    *const switchyard_candidates,
    *mut f64,
    *const switchyard_error,
) -> i32;
type PickFn = unsafe extern "C" fn(
    *mut c_void,
    *const switchyard_request,
    *const switchyard_candidates,
    *mut usize,
    *const switchyard_error,
) -> i32;
type AdmitFn = unsafe extern "C" fn(
    *mut c_void,
    *const switchyard_request,
    *const switchyard_saturation,
    *mut switchyard_admission,
    *const switchyard_error,
) -> i32;

/// The callback of a component's kind, known to be set.
#[derive(Clone, Copy)]
enum KindCallback {
    Filter(FilterFn),
    Scorer(ScoreFn),
    Picker(PickFn),
    Admitter(AdmitFn),
}

impl KindCallback {
    /// `def`'s callback for `kind`; `None` when the plugin left it NULL.
    fn of(kind: ComponentKind, def: &switchyard_component_def) -> Option<Self> {
        match kind {
            ComponentKind::Filter => def.on_filter.map(Self::Filter),
            ComponentKind::Scorer => def.on_score.map(Self::Scorer),
            ComponentKind::Picker => def.on_pick.map(Self::Picker),
            ComponentKind::Admitter => def.on_admit.map(Self::Admitter),
        }
    }
}

// SAFETY: the def holds function pointers and a `user_data` the plugin promises valid for
// the library's lifetime and usable from any thread (docs/ABI.md); `type_name` is cleared.
unsafe impl Send for ComponentDef {}
// SAFETY: as for Send; the host never mutates a def after copying it.
unsafe impl Sync for ComponentDef {}

impl ComponentDef {
    pub fn kind(&self) -> ComponentKind {
        self.kind
    }

    pub fn inputs(&self) -> WorkerInputs {
        self.inputs
    }

    /// Validates and copies a def handed over by a plugin of ABI `1.abi_minor` loaded from
    /// `path`. `needs_create`: registered types must create their own instances.
    ///
    /// # Safety
    /// `def` must be NULL or point to at least its declared `struct_size` bytes, with
    /// `type_name` NULL or NUL-terminated.
    pub(super) unsafe fn read(
        path: &Path,
        abi_minor: u16,
        def: *const switchyard_component_def,
        needs_create: bool,
    ) -> Result<(String, ComponentDef), LoadError> {
        let invalid = |name: &str, problem: String| LoadError::InvalidDefinition {
            path: path.to_owned(),
            name: name.to_owned(),
            problem,
        };
        // SAFETY: per this function's contract.
        let (name, def) = unsafe { read_def(path, abi_minor, def) }?;
        let kind = ComponentKind::from_abi(def.kind).ok_or_else(|| {
            invalid(
                &name,
                format!(
                    "unknown component kind {}; expected 0 (filter), 1 (scorer), 2 (picker) or 3 (admitter, ABI 1.3)",
                    def.kind
                ),
            )
        })?;
        if kind == ComponentKind::Admitter && abi_minor < 3 {
            return Err(invalid(
                &name,
                format!("an admitter (kind 3) needs ABI 1.3; the plugin is built for 1.{abi_minor}: rebuild it against this router's header"),
            ));
        }
        let Some(call) = KindCallback::of(kind, &def) else {
            return Err(invalid(
                &name,
                format!("{} must set `on_{}`", kind.with_article(), kind.callback()),
            ));
        };
        if needs_create && def.on_create.is_none() {
            return Err(invalid(
                &name,
                "a registered component must set `on_create`".into(),
            ));
        }
        let defined = inputs_of_minor(abi_minor);
        let unknown = def.inputs & !defined;
        if unknown != 0 {
            return Err(invalid(
                &name,
                format!(
                    "declares input groups {unknown:#x} that ABI 1.{abi_minor} does not define (known: {defined:#x}); declare only SWITCHYARD_INPUT_* bits of the header it is built with"
                ),
            ));
        }
        if kind == ComponentKind::Admitter && def.inputs & !SWITCHYARD_INPUT_ATTRIBUTES != 0 {
            return Err(invalid(
                &name,
                format!(
                    "an admitter declares input groups {:#x}; it sees no candidates, so it may declare only SWITCHYARD_INPUT_ATTRIBUTES ({SWITCHYARD_INPUT_ATTRIBUTES})",
                    def.inputs
                ),
            ));
        }
        let inputs = WorkerInputs::from_bits(def.inputs);
        let origin = Arc::from(name.as_str());
        Ok((
            name,
            ComponentDef {
                def,
                call,
                inputs,
                kind,
                origin,
            },
        ))
    }

    /// Creates an instance for `partition` through the plugin's `on_create`.
    pub fn create(
        &self,
        params: &OwnedParams,
        partition: &PartitionKey,
    ) -> Result<ComponentInstance, CallError> {
        let Some(on_create) = self.def.on_create else {
            return Err(CallError::new(
                Status::InvalidArgument,
                "the type has no on_create",
            ));
        };
        let mut instance: *mut c_void = std::ptr::null_mut();
        let mut error = ErrorBuffer::new();
        let logger = PluginLogger::new(&self.origin);
        let code = params.with_abi_logged(Some(&logger), |p| {
            partition.with_abi(|part| {
                // SAFETY: `user_data` is the plugin's for this def; params, partition and
                // the error buffer live for the call; `instance` is a writable slot.
                unsafe { on_create(self.def.user_data, p, part, &mut instance, &error.as_abi()) }
            })
        });
        error.check(code)?;
        let mut adopted = self.adopt(instance);
        adopted.logger = Some(logger);
        Ok(adopted)
    }

    /// Takes ownership of an instance the plugin created for this def.
    pub(super) fn adopt(&self, instance: *mut c_void) -> ComponentInstance {
        ComponentInstance {
            def: self.clone(),
            instance,
            logger: None,
        }
    }

    /// The def as registered by `plugin` (its log lines name it).
    pub(super) fn registered_by(mut self, plugin: &str) -> Self {
        self.origin = Arc::from(format!("{plugin}/{}", self.origin).as_str());
        self
    }
}

/// One live instance of a plugin component. Destroyed through its def when dropped.
pub struct ComponentInstance {
    def: ComponentDef,
    instance: *mut c_void,
    /// The logger `on_create` was handed (ABI 1.5): dropped after `on_destroy`.
    logger: Option<PluginLogger>,
}

// SAFETY: an instance is only ever called by one thread at a time (its policy is behind a
// lock, and every method takes `&mut self`), which is what the ABI promises plugins.
unsafe impl Send for ComponentInstance {}

impl Component for ComponentInstance {
    fn kind(&self) -> ComponentKind {
        self.def.kind
    }

    /// The plugin's filter over `columns`; `keep` holds one byte per row (set to 1 here,
    /// as the ABI promises).
    #[inline]
    fn filter(
        &mut self,
        request: &AbiRequest<'_>,
        columns: &Columns<'_>,
        keep: &mut [u8],
        error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        let KindCallback::Filter(on_filter) = self.def.call else {
            return Err(self.not_a(ComponentKind::Filter));
        };
        let candidates = columns.abi_view(self.def.inputs);
        if candidates.count != keep.len() {
            return Err(buffer_mismatch(keep.len(), candidates.count));
        }
        // The ABI's promise: all 1 on entry.
        keep.fill(1);
        // SAFETY: the instance was created for this def and is called by one thread;
        // `candidates` borrows `columns` (count rows each) and `keep` has count bytes;
        // everything outlives the call.
        let code = unsafe {
            on_filter(
                self.instance,
                &request.view(self.def.inputs),
                &candidates,
                keep.as_mut_ptr(),
                &error.as_abi(),
            )
        };
        error.check(code)
    }

    /// The plugin's scorer over `columns`; `costs` holds one NaN per row on entry.
    #[inline]
    fn score(
        &mut self,
        request: &AbiRequest<'_>,
        columns: &Columns<'_>,
        costs: &mut [f64],
        error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        let KindCallback::Scorer(on_score) = self.def.call else {
            return Err(self.not_a(ComponentKind::Scorer));
        };
        let candidates = columns.abi_view(self.def.inputs);
        if candidates.count != costs.len() {
            return Err(buffer_mismatch(costs.len(), candidates.count));
        }
        // SAFETY: as in `filter`, with `costs` of count doubles.
        let code = unsafe {
            on_score(
                self.instance,
                &request.view(self.def.inputs),
                &candidates,
                costs.as_mut_ptr(),
                &error.as_abi(),
            )
        };
        error.check(code)
    }

    /// The plugin's picker over `columns` (with costs); the row it chose, unchecked.
    #[inline]
    fn pick(
        &mut self,
        request: &AbiRequest<'_>,
        columns: &Columns<'_>,
        error: &mut ErrorBuffer,
    ) -> Result<usize, CallError> {
        let KindCallback::Picker(on_pick) = self.def.call else {
            return Err(self.not_a(ComponentKind::Picker));
        };
        let candidates = columns.abi_view(self.def.inputs);
        let mut row = usize::MAX;
        // SAFETY: as in `filter`, with `row` a writable slot.
        let code = unsafe {
            on_pick(
                self.instance,
                &request.view(self.def.inputs),
                &candidates,
                &mut row,
                &error.as_abi(),
            )
        };
        error.check(code)?;
        if row == usize::MAX {
            return Err(CallError::new(
                Status::OutOfRange,
                format!(
                    "the picker returned OK with *out_row = SIZE_MAX: it wrote no row, or wrote SIZE_MAX; write a row below the candidate count ({})",
                    candidates.count
                ),
            ));
        }
        Ok(row)
    }

    /// The plugin's admitter: its answer for `request` in a partition as `saturation`
    /// says, checked (a status out of 400-599, an unknown verdict or a tenant that is not
    /// UTF-8 is the plugin's error).
    fn admit(
        &mut self,
        request: &AbiRequest<'_>,
        saturation: &Saturation,
        error: &mut ErrorBuffer,
    ) -> Result<Admission, CallError> {
        let KindCallback::Admitter(on_admit) = self.def.call else {
            return Err(self.not_a(ComponentKind::Admitter));
        };
        let mut message = ErrorBuffer::new();
        let mut decision = switchyard_admission {
            struct_size: std::mem::size_of::<switchyard_admission>() as u32,
            verdict: SWITCHYARD_ADMIT,
            has_priority: 0,
            reserved0: [0; 3],
            priority: 0,
            tenant: switchyard_str {
                ptr: std::ptr::null(),
                len: 0,
            },
            max_wait_ms: 0,
            status: 0,
            retry_after_seconds: 0,
            message: message.as_abi(),
        };
        let saturation = saturation.abi();
        // SAFETY: the instance was created for this def and is called by one thread;
        // request, saturation, decision (and its message buffer) and error outlive the call.
        let code = unsafe {
            on_admit(
                self.instance,
                &request.view(self.def.inputs),
                &saturation,
                &mut decision,
                &error.as_abi(),
            )
        };
        error.check(code)?;
        // SAFETY: the plugin promises `tenant` valid until the instance's next call.
        let tenant = unsafe { borrowed_bytes(decision.tenant) };
        AdmissionFields {
            verdict: decision.verdict,
            priority: (decision.has_priority != 0).then_some(decision.priority),
            tenant,
            max_wait_ms: decision.max_wait_ms,
            status: decision.status,
            retry_after_seconds: decision.retry_after_seconds,
            message: message.written(),
        }
        .checked()
    }

    /// Whether the plugin asked for any lifecycle notification (ABI 1.1). When none of a
    /// policy's components did, the router tracks nothing for it.
    fn notified(&self) -> bool {
        let def = &self.def.def;
        def.on_selected.is_some() || def.on_prefill_complete.is_some() || def.on_finished.is_some()
    }

    /// Delivers one notification, if the plugin set its callback. `request` is given for
    /// `Selected` (the request just routed).
    fn notify(
        &mut self,
        event: Lifecycle,
        request: Option<&AbiRequest<'_>>,
        outcome: &Outcome,
        error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        let outcome = outcome.abi();
        let def = &self.def.def;
        let code = match (event, def.on_selected, request) {
            (Lifecycle::Selected, Some(on_selected), Some(request)) => {
                // SAFETY: the instance was created for this def and is called
                // by one thread (its selector's lock); request, outcome and error live
                // for the call.
                unsafe {
                    on_selected(
                        self.instance,
                        &request.view(self.def.inputs),
                        &outcome,
                        &error.as_abi(),
                    )
                }
            }
            (Lifecycle::PrefillComplete, ..) => match def.on_prefill_complete {
                // SAFETY: as above.
                Some(f) => unsafe { f(self.instance, &outcome, &error.as_abi()) },
                None => return Ok(()),
            },
            (Lifecycle::Finished, ..) => match def.on_finished {
                // SAFETY: as above.
                Some(f) => unsafe { f(self.instance, &outcome, &error.as_abi()) },
                None => return Ok(()),
            },
            _ => return Ok(()),
        };
        error.check(code)
    }
}

impl ComponentInstance {
    /// A def holds the callback of its own kind only (resolved when it was read), so
    /// this is a host bug: a stage called as the wrong kind.
    #[cold]
    fn not_a(&self, called_as: ComponentKind) -> CallError {
        called_as.wrongly_called(self.def.kind.as_str())
    }
}

/// Bytes a tenant an admitter names may have.
pub const MAX_TENANT_BYTES: usize = 256;

/// An admitter's answer as plain values, however it crossed (in process or from an
/// isolated one): checked into an [`Admission`] in one place.
pub struct AdmissionFields<'a> {
    pub verdict: u32,
    pub priority: Option<i32>,
    /// `None`: keep the request's own.
    pub tenant: Option<&'a [u8]>,
    pub max_wait_ms: u64,
    pub status: u32,
    pub retry_after_seconds: u32,
    pub message: &'a [u8],
}

impl AdmissionFields<'_> {
    pub fn checked(self) -> Result<Admission, CallError> {
        let wrong = |what: String| Err(CallError::new(Status::OutOfRange, what));
        match self.verdict {
            SWITCHYARD_ADMIT => {
                let tenant = match self.tenant {
                    None => None,
                    Some(bytes) if bytes.len() > MAX_TENANT_BYTES => {
                        return wrong(format!(
                            "the admitter named a tenant of {} bytes; at most {MAX_TENANT_BYTES}",
                            bytes.len()
                        ))
                    }
                    Some(bytes) => match std::str::from_utf8(bytes) {
                        Ok(tenant) => Some(tenant.to_owned()),
                        Err(_) => return wrong("the admitter named a tenant that is not UTF-8".into()),
                    },
                };
                Ok(Admission::Admit(Placement {
                    priority: self.priority,
                    tenant,
                    max_wait_ms: (self.max_wait_ms > 0).then_some(self.max_wait_ms),
                }))
            }
            SWITCHYARD_REJECT => {
                let status = match self.status {
                    0 => 429,
                    s @ 400..=599 => s as u16,
                    other => {
                        return wrong(format!(
                            "the admitter rejected with status {other}; a rejection's status is 400 to 599 (0 means 429)"
                        ))
                    }
                };
                Ok(Admission::Reject {
                    status,
                    retry_after_seconds: self.retry_after_seconds,
                    message: String::from_utf8_lossy(self.message).into_owned(),
                })
            }
            other => wrong(format!(
                "the admitter answered verdict {other}; expected SWITCHYARD_ADMIT (0) or SWITCHYARD_REJECT (1)"
            )),
        }
    }
}

/// # Safety
/// `s.ptr` is NULL or points to `s.len` bytes readable for `'a`.
unsafe fn borrowed_bytes<'a>(s: switchyard_str) -> Option<&'a [u8]> {
    if s.ptr.is_null() {
        return None;
    }
    // SAFETY: per this function's contract.
    Some(unsafe { std::slice::from_raw_parts(s.ptr.cast(), s.len) })
}

#[cold]
fn buffer_mismatch(rows: usize, count: usize) -> CallError {
    CallError::new(
        Status::OutOfRange,
        format!("the host's output buffer has {rows} rows for {count} candidates"),
    )
}

impl Drop for ComponentInstance {
    fn drop(&mut self) {
        if let Some(destroy) = self.def.def.on_destroy {
            // SAFETY: the instance came from this def and this is its last use.
            unsafe { destroy(self.instance) };
        }
    }
}
