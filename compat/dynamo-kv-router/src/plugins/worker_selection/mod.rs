//! Dynamo's current `plugins::worker_selection` shape: a batch scorer over
//! `WorkerCandidates`, a filter handed `WorkerCandidate<'_>` by value, factories handed a
//! [`WorkerType`], and the adapters that make each component one SDK component.

mod inputs;

use std::sync::Arc;

use switchyard_plugin_sdk as sdk;

use self::inputs::{GroupBuffers, PickerRows};
pub use self::inputs::{
    ScoredWorkerCandidate, WorkerCacheInput, WorkerCandidate, WorkerCandidates, WorkerInputView,
    WorkerInputs, WorkerLoadInput,
};
pub use crate::context::WorkerSelectionInputTrigger;
pub use crate::context::{SessionContext, WorkerSelectionContext};
use crate::inputs::CandidateRows;
pub use crate::policy::WorkerSelectionPolicyError;
pub use crate::services::selection::{
    KvRouterConfig, RoutingPartitionRef, WorkerSelectionPolicyParameters,
    WorkerSelectionPolicyProviderError, WorkerSelectionPolicyRegistryError,
};
pub use crate::worker_type::WorkerType;

/// Creates one policy per routing partition.
pub type WorkerSelectionPolicyFactory = Arc<
    dyn for<'a> Fn(&KvRouterConfig, WorkerType, RoutingPartitionRef<'a>) -> WorkerSelectionPolicy
        + Send
        + Sync,
>;

/// Parses one instance's parameters and creates its partition factory.
pub type WorkerSelectionPolicyProvider = Arc<
    dyn Fn(
            &WorkerSelectionPolicyParameters,
        ) -> Result<WorkerSelectionPolicyFactory, WorkerSelectionPolicyProviderError>
        + Send
        + Sync,
>;

/// Adds one finite cost contribution to each surviving worker, all in one call.
pub trait WorkerScorer: Send {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::NONE
    }

    /// `costs` has `candidates.len()` slots, NaN on entry: write one finite cost to each.
    fn score(
        &mut self,
        context: &WorkerSelectionContext<'_>,
        candidates: WorkerCandidates<'_>,
        costs: &mut [f64],
    ) -> Result<(), WorkerSelectionPolicyError>;
}

/// Keeps or rejects one eligible worker; filters run in declaration order.
pub trait WorkerFilter: Send {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::NONE
    }

    fn keep(
        &mut self,
        context: &WorkerSelectionContext<'_>,
        candidate: WorkerCandidate<'_>,
    ) -> Result<bool, WorkerSelectionPolicyError>;

    /// Switchyard's batch entry (not Dynamo's; do not override): one dynamic call per
    /// selection.
    #[doc(hidden)]
    fn __switchyard_keep_rows(
        &mut self,
        context: &WorkerSelectionContext<'_>,
        candidates: WorkerCandidates<'_>,
        keep: &mut [bool],
    ) -> Result<(), WorkerSelectionPolicyError> {
        for (candidate, slot) in candidates.iter().zip(keep) {
            *slot = self.keep(context, candidate)?;
        }
        Ok(())
    }
}

/// Selects one row after all filters and scorers ran.
pub trait WorkerPicker: Send {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::NONE
    }

    fn pick(
        &mut self,
        context: &WorkerSelectionContext<'_>,
        input: WorkerInputView<'_>,
    ) -> Result<usize, WorkerSelectionPolicyError>;
}

/// The filters, scorers and picker a factory builds for one partition.
pub struct WorkerSelectionPolicy {
    kv_router_config: KvRouterConfig,
    worker_type: &'static str,
    filters: Vec<Box<dyn WorkerFilter>>,
    scorers: Vec<Box<dyn WorkerScorer>>,
    picker: Box<dyn WorkerPicker>,
}

impl WorkerSelectionPolicy {
    pub fn new(
        kv_router_config: KvRouterConfig,
        worker_type: &'static str,
        scorers: Vec<Box<dyn WorkerScorer>>,
        picker: Box<dyn WorkerPicker>,
    ) -> Self {
        Self::new_with_filters(kv_router_config, worker_type, Vec::new(), scorers, picker)
    }

    pub fn new_with_filters(
        kv_router_config: KvRouterConfig,
        worker_type: &'static str,
        filters: Vec<Box<dyn WorkerFilter>>,
        scorers: Vec<Box<dyn WorkerScorer>>,
        picker: Box<dyn WorkerPicker>,
    ) -> Self {
        WorkerSelectionPolicy {
            kv_router_config,
            worker_type,
            filters,
            scorers,
            picker,
        }
    }

    pub fn worker_type(&self) -> &'static str {
        self.worker_type
    }

    pub fn kv_router_config(&self) -> &KvRouterConfig {
        &self.kv_router_config
    }

    /// The policy as switchyard components (switchyard addition).
    pub fn into_parts(self) -> sdk::PolicyParts {
        let filters = self
            .filters
            .into_iter()
            .map(|filter| Box::new(Adapter::new(filter)) as Box<dyn sdk::WorkerFilter>)
            .collect();
        let scorers = self
            .scorers
            .into_iter()
            .enumerate()
            .map(|(index, scorer)| {
                let mut adapter = Adapter::new(scorer);
                adapter.index = index;
                Box::new(adapter) as Box<dyn sdk::WorkerScorer>
            })
            .collect();
        sdk::PolicyParts::new(filters, scorers, Box::new(Adapter::new(self.picker)))
    }
}

/// One Dynamo component behind an SDK trait, with the groups of the rows it is handed
/// kept across calls (cleared, not freed).
struct Adapter<C: ?Sized> {
    component: Box<C>,
    inputs: WorkerInputs,
    groups: GroupBuffers,
    picker_rows: PickerRows,
    identity: ([u64; 1], [u32; 1], [f64; 1]),
    index: usize,
}

/// What the adapters need of each component trait.
trait Declares {
    fn declared(&self) -> WorkerInputs;
}

impl Declares for dyn WorkerFilter {
    fn declared(&self) -> WorkerInputs {
        self.required_worker_inputs()
    }
}

impl Declares for dyn WorkerScorer {
    fn declared(&self) -> WorkerInputs {
        self.required_worker_inputs()
    }
}

impl Declares for dyn WorkerPicker {
    fn declared(&self) -> WorkerInputs {
        self.required_worker_inputs()
    }
}

impl<C: ?Sized + Declares> Adapter<C> {
    fn new(component: Box<C>) -> Self {
        let inputs = component.declared();
        Adapter {
            component,
            inputs,
            groups: GroupBuffers::default(),
            picker_rows: PickerRows::default(),
            identity: ([0], [0], [f64::NAN]),
            index: 0,
        }
    }
}

/// The context and the one-row candidates of an SDK candidate, for the per-candidate
/// forms (the router calls the batch ones).
macro_rules! one_row {
    ($self:ident, $context:ident, $candidate:ident) => {{
        let rows = $self.groups.one(
            $candidate,
            &mut $self.identity,
            $self.inputs,
            $context.block_size(),
        );
        (WorkerSelectionContext::from_switchyard($context), rows)
    }};
}

impl sdk::WorkerFilter for Adapter<dyn WorkerFilter> {
    fn required_worker_inputs(&self) -> sdk::WorkerInputs {
        self.inputs.to_switchyard()
    }

    fn keep(
        &mut self,
        context: &sdk::WorkerSelectionContext<'_>,
        candidate: &sdk::WorkerCandidate<'_>,
    ) -> Result<bool, sdk::PolicyError> {
        let (context, rows) = one_row!(self, context, candidate);
        let mut keep = [true];
        self.component
            .__switchyard_keep_rows(&context, rows, &mut keep)?;
        Ok(keep[0])
    }

    fn keep_batch(
        &mut self,
        context: &sdk::WorkerSelectionContext<'_>,
        candidates: &sdk::WorkerCandidates<'_>,
        keep: &mut [bool],
    ) -> Result<(), sdk::PolicyError> {
        let rows = CandidateRows::new(candidates);
        let view = self
            .groups
            .candidates(&rows, self.inputs, context.block_size());
        let context = WorkerSelectionContext::from_switchyard(context);
        Ok(self
            .component
            .__switchyard_keep_rows(&context, view, keep)?)
    }
}

impl Adapter<dyn WorkerScorer> {
    /// A scorer must write a finite cost to every slot. One branch-free pass (it
    /// vectorizes; a search that stops at the first bad cost does not), then the search
    /// only when a cost is bad.
    fn check_costs(&self, costs: &[f64]) -> Result<(), sdk::PolicyError> {
        if costs
            .iter()
            .fold(true, |finite, cost| finite & cost.is_finite())
        {
            return Ok(());
        }
        match costs.iter().position(|cost| !cost.is_finite()) {
            Some(row) => Err(WorkerSelectionPolicyError::NonFiniteCost {
                scorer_index: self.index,
                row,
            }
            .into()),
            None => Ok(()),
        }
    }
}

impl sdk::WorkerScorer for Adapter<dyn WorkerScorer> {
    fn required_worker_inputs(&self) -> sdk::WorkerInputs {
        self.inputs.to_switchyard()
    }

    fn score(
        &mut self,
        context: &sdk::WorkerSelectionContext<'_>,
        candidate: &sdk::WorkerCandidate<'_>,
    ) -> Result<f64, sdk::PolicyError> {
        let (context, rows) = one_row!(self, context, candidate);
        let mut cost = [f64::NAN];
        self.component.score(&context, rows, &mut cost)?;
        self.check_costs(&cost)?;
        Ok(cost[0])
    }

    fn score_batch(
        &mut self,
        context: &sdk::WorkerSelectionContext<'_>,
        candidates: &sdk::WorkerCandidates<'_>,
        costs: &mut [f64],
    ) -> Result<(), sdk::PolicyError> {
        let rows = CandidateRows::new(candidates);
        let view = self
            .groups
            .candidates(&rows, self.inputs, context.block_size());
        let context = WorkerSelectionContext::from_switchyard(context);
        self.component.score(&context, view, costs)?;
        self.check_costs(costs)
    }
}

impl sdk::WorkerPicker for Adapter<dyn WorkerPicker> {
    fn required_worker_inputs(&self) -> sdk::WorkerInputs {
        self.inputs.to_switchyard()
    }

    fn pick(
        &mut self,
        context: &sdk::WorkerSelectionContext<'_>,
        candidates: &sdk::WorkerCandidates<'_>,
    ) -> Result<usize, sdk::PolicyError> {
        let costs = candidates
            .costs()
            .ok_or_else(|| sdk::PolicyError::failed("the picker was called without costs"))?;
        let rows = CandidateRows::new(candidates);
        let view = self
            .picker_rows
            .view(&rows, costs, self.inputs, context.block_size());
        let context = WorkerSelectionContext::from_switchyard(context);
        let row = self.component.pick(&context, view)?;
        if row >= costs.len() {
            return Err(WorkerSelectionPolicyError::InvalidPickerRow {
                row,
                candidate_count: costs.len(),
            }
            .into());
        }
        Ok(row)
    }
}
