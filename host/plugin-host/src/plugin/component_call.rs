//! The one way a filter, scorer, picker or admitter instance is called, however it runs.
//!
//! [`Component`] has three implementations:
//! - [`BuiltinInstance`] (here): an SDK trait object compiled into the router, called
//!   directly, with the SDK's views made from the same ABI struct a plugin receives;
//! - [`ComponentInstance`](super::ComponentInstance): a plugin in this process, called
//!   through the C ABI (`plugin/component.rs`);
//! - `isolation::RemoteInstance`: a plugin in an isolated process, called through shared
//!   memory (`isolation/remote.rs`).
//!
//! The pipeline calls a stage only through this trait; it holds each stage's component
//! as a `pipeline::StageComponent` (policy crate), the three by value, so the calls
//! dispatch statically.

use std::ptr;

use switchyard_plugin_sdk::{
    Admission, PolicyError, RequestAdmitter, Saturation, Status, WorkerFilter, WorkerInputs,
    WorkerPicker, WorkerScorer,
};

use crate::plugin::inputs::{with_context, with_views};
use crate::plugin::{
    AbiRequest, CallError, Columns, ComponentKind, ErrorBuffer, Lifecycle, Outcome,
};

/// One component instance. Calls take `&mut self`: an instance is called by one thread at
/// a time (its policy's lock), which is what the ABI promises plugins. `error` is the
/// caller's reusable message buffer, for implementations that cross the C ABI here.
///
/// The calls of the other kinds refuse (a host bug: a stage called as the wrong kind);
/// each implementation answers for its own kind.
pub trait Component: Send {
    /// What this instance is.
    fn kind(&self) -> ComponentKind;

    /// Filters `columns`: `keep` holds one byte per row, all 1 on entry.
    fn filter(
        &mut self,
        _request: &AbiRequest<'_>,
        _columns: &Columns<'_>,
        _keep: &mut [u8],
        _error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        Err(ComponentKind::Filter.wrongly_called(self.kind().as_str()))
    }

    /// Scores `columns`: one cost per row into `costs`.
    fn score(
        &mut self,
        _request: &AbiRequest<'_>,
        _columns: &Columns<'_>,
        _costs: &mut [f64],
        _error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        Err(ComponentKind::Scorer.wrongly_called(self.kind().as_str()))
    }

    /// Picks a row of `columns` (costs set); the row is checked by the caller.
    fn pick(
        &mut self,
        _request: &AbiRequest<'_>,
        _columns: &Columns<'_>,
        _error: &mut ErrorBuffer,
    ) -> Result<usize, CallError> {
        Err(ComponentKind::Picker.wrongly_called(self.kind().as_str()))
    }

    /// Decides whether `request` is served, in a partition as `saturation` says.
    fn admit(
        &mut self,
        _request: &AbiRequest<'_>,
        _saturation: &Saturation,
        _error: &mut ErrorBuffer,
    ) -> Result<Admission, CallError> {
        Err(ComponentKind::Admitter.wrongly_called(self.kind().as_str()))
    }

    /// Whether the instance wants lifecycle notifications (built-ins never do).
    fn notified(&self) -> bool {
        false
    }

    /// Delivers one lifecycle notification; `request` is given for `Selected`.
    fn notify(
        &mut self,
        _event: Lifecycle,
        _request: Option<&AbiRequest<'_>>,
        _outcome: &Outcome,
        _error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        Ok(())
    }
}

/// A built-in component: an SDK trait object, as a Rust plugin would register it.
pub enum Builtin {
    Filter(Box<dyn WorkerFilter>),
    Scorer(Box<dyn WorkerScorer>),
    Picker(Box<dyn WorkerPicker>),
    Admitter(Box<dyn RequestAdmitter>),
}

impl Builtin {
    /// The instance that reads the groups `inputs` declares (what its type registered).
    pub fn reading(self, inputs: WorkerInputs) -> BuiltinInstance {
        BuiltinInstance {
            builtin: self,
            inputs,
        }
    }
}

/// A built-in component and the inputs its type declared.
pub struct BuiltinInstance {
    builtin: Builtin,
    inputs: WorkerInputs,
}

impl Component for BuiltinInstance {
    fn kind(&self) -> ComponentKind {
        match self.builtin {
            Builtin::Filter(_) => ComponentKind::Filter,
            Builtin::Scorer(_) => ComponentKind::Scorer,
            Builtin::Picker(_) => ComponentKind::Picker,
            Builtin::Admitter(_) => ComponentKind::Admitter,
        }
    }

    fn filter(
        &mut self,
        request: &AbiRequest<'_>,
        columns: &Columns<'_>,
        keep: &mut [u8],
        _error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        let Builtin::Filter(filter) = &mut self.builtin else {
            return Err(wrong_kind(ComponentKind::Filter));
        };
        // The ABI's promise, "all 1 on entry", is kept for built-ins and plugins alike.
        keep.fill(1);
        // SAFETY: every byte is 1 (just written), a valid `bool` of the same size and
        // alignment; the reborrow ends with this call.
        let keep = unsafe { &mut *(ptr::from_mut(keep) as *mut [bool]) };
        with_views(request, columns, self.inputs, |context, view| {
            filter.keep_batch(context, view, keep)
        })
        .map_err(builtin_failure)
    }

    fn score(
        &mut self,
        request: &AbiRequest<'_>,
        columns: &Columns<'_>,
        costs: &mut [f64],
        _error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        let Builtin::Scorer(scorer) = &mut self.builtin else {
            return Err(wrong_kind(ComponentKind::Scorer));
        };
        with_views(request, columns, self.inputs, |context, view| {
            scorer.score_batch(context, view, costs)
        })
        .map_err(builtin_failure)
    }

    fn pick(
        &mut self,
        request: &AbiRequest<'_>,
        columns: &Columns<'_>,
        _error: &mut ErrorBuffer,
    ) -> Result<usize, CallError> {
        let Builtin::Picker(picker) = &mut self.builtin else {
            return Err(wrong_kind(ComponentKind::Picker));
        };
        with_views(request, columns, self.inputs, |context, view| {
            picker.pick(context, view)
        })
        .map_err(builtin_failure)
    }

    fn admit(
        &mut self,
        request: &AbiRequest<'_>,
        saturation: &Saturation,
        _error: &mut ErrorBuffer,
    ) -> Result<Admission, CallError> {
        let Builtin::Admitter(admitter) = &mut self.builtin else {
            return Err(wrong_kind(ComponentKind::Admitter));
        };
        with_context(request, self.inputs, |context| {
            admitter.admit(context, saturation)
        })
        .map_err(builtin_failure)
    }
}

fn builtin_failure(e: PolicyError) -> CallError {
    CallError::new(Status::Error, e.to_string())
}

#[cold]
fn wrong_kind(called_as: ComponentKind) -> CallError {
    called_as.wrongly_called("built-in component of another kind")
}

#[cfg(test)]
mod tests {
    use switchyard_plugin_sdk::builtins::{ActiveRequests, LowestCostByWorkerId, MinDeviceOverlap};

    use super::*;
    use crate::plugin::{PromptBlocks, RouteRequest};

    /// Three workers: device overlaps 0, 4, 8 blocks; active requests 2, 0, 1.
    struct Fleet {
        worker_id: Vec<u64>,
        dp_rank: Vec<u32>,
        device: Vec<u32>,
        zeros: Vec<u32>,
        zeros64: Vec<u64>,
        active: Vec<u32>,
        taint: Vec<f64>,
    }

    impl Fleet {
        fn new() -> Self {
            Fleet {
                worker_id: vec![10, 11, 12],
                dp_rank: vec![0; 3],
                device: vec![0, 4, 8],
                zeros: vec![0; 3],
                zeros64: vec![0; 3],
                active: vec![2, 0, 1],
                taint: vec![f64::NAN; 3],
            }
        }
        fn columns<'a>(&'a self, costs: Option<&'a [f64]>) -> Columns<'a> {
            Columns {
                inputs: WorkerInputs::CACHE | WorkerInputs::LOAD,
                worker_id: &self.worker_id,
                dp_rank: &self.dp_rank,
                device_overlap_blocks: &self.device,
                host_overlap_blocks: &self.zeros,
                disk_overlap_blocks: &self.zeros,
                shared_beyond_device_blocks: &self.zeros,
                active_prefill_tokens: &self.zeros64,
                decode_cost_blocks: &self.zeros64,
                active_requests: &self.active,
                preferred_taint_multiplier: &self.taint,
                costs,
                ..Columns::default()
            }
        }
    }

    #[test]
    fn a_builtin_runs_its_own_kind_with_the_views_its_inputs_declare() {
        let fleet = Fleet::new();
        let (request, prompt) = (RouteRequest::default(), PromptBlocks::new(16, 8));
        let mut error = ErrorBuffer::new();
        let mut filter =
            Builtin::Filter(Box::new(MinDeviceOverlap::at_least(4.0))).reading(WorkerInputs::CACHE);
        let mut scorer = Builtin::Scorer(Box::new(ActiveRequests)).reading(WorkerInputs::LOAD);
        let mut picker =
            Builtin::Picker(Box::new(LowestCostByWorkerId)).reading(WorkerInputs::NONE);
        assert_eq!(filter.kind(), ComponentKind::Filter);
        request.with_abi(prompt, |raw| {
            // Garbage on entry: the call keeps the ABI's promise of all 1 first.
            let mut keep = vec![7u8; 3];
            filter
                .filter(raw, &fleet.columns(None), &mut keep, &mut error)
                .unwrap();
            assert_eq!(keep, [0, 1, 1]);
            let mut costs = vec![f64::NAN; 3];
            scorer
                .score(raw, &fleet.columns(None), &mut costs, &mut error)
                .unwrap();
            assert_eq!(costs, [2.0, 0.0, 1.0]);
            let row = picker
                .pick(raw, &fleet.columns(Some(&costs)), &mut error)
                .unwrap();
            assert_eq!(row, 1, "the lowest cost");
        });
    }

    #[test]
    fn a_builtin_that_did_not_declare_a_group_does_not_see_it() {
        let fleet = Fleet::new();
        let (request, prompt) = (RouteRequest::default(), PromptBlocks::new(16, 8));
        // The scorer reads LOAD but its type declared nothing: the SDK's view has no
        // load column, and the scorer's own error comes back as the call's.
        let mut scorer = Builtin::Scorer(Box::new(ActiveRequests)).reading(WorkerInputs::NONE);
        let mut costs = vec![f64::NAN; 3];
        let failure = request
            .with_abi(prompt, |raw| {
                scorer.score(
                    raw,
                    &fleet.columns(None),
                    &mut costs,
                    &mut ErrorBuffer::new(),
                )
            })
            .unwrap_err();
        assert_eq!(failure.status, Status::Error);
        assert!(
            failure.message.contains("load input unavailable"),
            "{}",
            failure.message
        );
    }

    #[test]
    fn a_component_called_as_another_kind_is_refused_not_run() {
        let fleet = Fleet::new();
        let (request, prompt) = (RouteRequest::default(), PromptBlocks::new(16, 8));
        let mut scorer = Builtin::Scorer(Box::new(ActiveRequests)).reading(WorkerInputs::LOAD);
        let mut keep = vec![1u8; 3];
        let failure = request
            .with_abi(prompt, |raw| {
                scorer.filter(
                    raw,
                    &fleet.columns(None),
                    &mut keep,
                    &mut ErrorBuffer::new(),
                )
            })
            .unwrap_err();
        assert_eq!(failure.status, Status::InvalidArgument);
        assert!(
            failure.message.contains("called as a filter"),
            "{}",
            failure.message
        );
        assert!(!scorer.notified(), "built-ins ask for no notifications");
    }
}
