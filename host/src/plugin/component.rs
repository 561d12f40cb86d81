//! Plugin component types and instances: the def a plugin registered (or handed to a
//! builder), checked and copied, and the live instance handle the pipeline calls.

use std::ffi::c_void;
use std::path::Path;

use switchyard_plugin_sdk::abi::*;
use switchyard_plugin_sdk::{Status, WorkerInputs};

use super::abi_checks::read_def;
use super::columns::Columns;
use super::error_buffer::{CallError, ErrorBuffer};
use super::load_error::LoadError;
use super::params::OwnedParams;
use super::partition::PartitionKey;
use super::request::AbiRequest;

/// What a component does in the pipeline.
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
    /// The error of a component that is `what` (`a filter`, `a built-in scorer`, ...)
    /// called as this kind: a host bug, refused instead of calling the wrong code.
    #[cold]
    pub fn wrongly_called(self, what: &str) -> CallError {
        CallError::new(
            Status::InvalidArgument,
            format!("a {what} was called as a {}", self.as_str()),
        )
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

/// A component def copied from a plugin; its callback for `kind` is known to be set.
#[derive(Clone)]
pub struct ComponentDef {
    def: switchyard_component_def,
    inputs: WorkerInputs,
    kind: ComponentKind,
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
                    "unknown component kind {}; expected 0 (filter), 1 (scorer) or 2 (picker)",
                    def.kind
                ),
            )
        })?;
        let callback_missing = match kind {
            ComponentKind::Filter => def.on_filter.is_none(),
            ComponentKind::Scorer => def.on_score.is_none(),
            ComponentKind::Picker => def.on_pick.is_none(),
        };
        if callback_missing {
            return Err(invalid(
                &name,
                format!("a {} must set `on_{}`", kind.as_str(), kind.callback()),
            ));
        }
        if needs_create && def.on_create.is_none() {
            return Err(invalid(
                &name,
                "a registered component must set `on_create`".into(),
            ));
        }
        let unknown = def.inputs & !SWITCHYARD_INPUT_ALL;
        if unknown != 0 {
            return Err(invalid(
                &name,
                format!(
                    "declares input groups {unknown:#x} that ABI 1.{abi_minor} does not define (known: {SWITCHYARD_INPUT_ALL:#x}); declare only SWITCHYARD_INPUT_* bits"
                ),
            ));
        }
        let inputs = WorkerInputs::from_bits(def.inputs);
        Ok((name, ComponentDef { def, inputs, kind }))
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
        let code = params.with_abi(|p| {
            partition.with_abi(|part| {
                // SAFETY: `user_data` is the plugin's for this def; params, partition and
                // the error buffer live for the call; `instance` is a writable slot.
                unsafe { on_create(self.def.user_data, p, part, &mut instance, &error.as_abi()) }
            })
        });
        error.check(code)?;
        Ok(self.adopt(instance))
    }

    /// Takes ownership of an instance the plugin created for this def.
    pub(super) fn adopt(&self, instance: *mut c_void) -> ComponentInstance {
        ComponentInstance {
            def: self.clone(),
            instance,
        }
    }
}

/// One live instance of a plugin component. Destroyed through its def when dropped.
pub struct ComponentInstance {
    def: ComponentDef,
    instance: *mut c_void,
}

// SAFETY: an instance is only ever called by one thread at a time (its policy is behind a
// lock, and every method takes `&mut self`), which is what the ABI promises plugins.
unsafe impl Send for ComponentInstance {}

impl ComponentInstance {
    pub fn kind(&self) -> ComponentKind {
        self.def.kind
    }

    /// The plugin's filter over `columns`; `keep` holds one byte per row (set to 1 here,
    /// as the ABI promises).
    #[inline]
    pub fn filter(
        &mut self,
        request: &AbiRequest<'_>,
        columns: &Columns<'_>,
        keep: &mut [u8],
        error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        let Some(on_filter) = self.def.def.on_filter else {
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
                &request.raw,
                &candidates,
                keep.as_mut_ptr(),
                &error.as_abi(),
            )
        };
        error.check(code)
    }

    /// The plugin's scorer over `columns`; `costs` holds one NaN per row on entry.
    #[inline]
    pub fn score(
        &mut self,
        request: &AbiRequest<'_>,
        columns: &Columns<'_>,
        costs: &mut [f64],
        error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        let Some(on_score) = self.def.def.on_score else {
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
                &request.raw,
                &candidates,
                costs.as_mut_ptr(),
                &error.as_abi(),
            )
        };
        error.check(code)
    }

    /// The plugin's picker over `columns` (with costs); the row it chose, unchecked.
    #[inline]
    pub fn pick(
        &mut self,
        request: &AbiRequest<'_>,
        columns: &Columns<'_>,
        error: &mut ErrorBuffer,
    ) -> Result<usize, CallError> {
        let Some(on_pick) = self.def.def.on_pick else {
            return Err(self.not_a(ComponentKind::Picker));
        };
        let candidates = columns.abi_view(self.def.inputs);
        let mut row = usize::MAX;
        // SAFETY: as in `filter`, with `row` a writable slot.
        let code = unsafe {
            on_pick(
                self.instance,
                &request.raw,
                &candidates,
                &mut row,
                &error.as_abi(),
            )
        };
        error.check(code)?;
        if row == usize::MAX {
            return Err(CallError::new(
                Status::OutOfRange,
                "the picker returned OK without writing a row to *out_row",
            ));
        }
        Ok(row)
    }

    /// A def's callback for another kind is never set (checked when it was read), so
    /// this is a host bug: a stage called as the wrong kind.
    #[cold]
    fn not_a(&self, called_as: ComponentKind) -> CallError {
        called_as.wrongly_called(self.def.kind.as_str())
    }
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
