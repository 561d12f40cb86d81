//! Dynamo's component traits and `WorkerSelectionPolicy`, and the adapters that make each
//! Dynamo component one SDK component.

use core::fmt;

use switchyard_plugin_sdk as sdk;

use crate::context::WorkerSelectionContext;
use crate::inputs::{
    CandidateRows, ScoredWorkerCandidate, WorkerCacheInput, WorkerCandidate, WorkerInputView,
    WorkerInputs, WorkerLoadInput, WorkerRoutingInput,
};
use crate::services::selection::KvRouterConfig;

/// An error a component returns; its message reaches the operator through the router.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerSelectionPolicyError {
    Failed(String),
    NonFiniteCost { scorer_index: usize, row: usize },
    InvalidPickerRow { row: usize, candidate_count: usize },
}

impl WorkerSelectionPolicyError {
    pub fn failed(message: impl Into<String>) -> Self {
        Self::Failed(message.into())
    }
}

impl fmt::Display for WorkerSelectionPolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed(message) => write!(f, "worker selection policy failed: {message}"),
            Self::NonFiniteCost { scorer_index, row } => write!(
                f,
                "scorer {scorer_index} produced a non-finite cost for candidate row {row}"
            ),
            Self::InvalidPickerRow {
                row,
                candidate_count,
            } => write!(
                f,
                "picker returned candidate row {row}, but the candidate table contains {candidate_count} rows"
            ),
        }
    }
}

impl std::error::Error for WorkerSelectionPolicyError {}

impl From<WorkerSelectionPolicyError> for sdk::PolicyError {
    fn from(error: WorkerSelectionPolicyError) -> Self {
        sdk::PolicyError::failed(error.to_string())
    }
}

/// A hard requirement: keep or reject each eligible worker.
pub trait WorkerFilter: Send {
    /// The worker-signal groups this filter reads.
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::NONE
    }

    /// `true` keeps the worker in the candidate set.
    fn keep(
        &mut self,
        context: &WorkerSelectionContext<'_>,
        candidate: &WorkerCandidate,
    ) -> Result<bool, WorkerSelectionPolicyError>;

    /// Switchyard's batch entry (not Dynamo's; do not override): one dynamic call per
    /// selection, the loop over `keep` compiled into the implementing type.
    #[doc(hidden)]
    fn __switchyard_keep_rows(
        &mut self,
        context: &WorkerSelectionContext<'_>,
        rows: &CandidateRows<'_>,
        keep: &mut [bool],
    ) -> Result<(), WorkerSelectionPolicyError> {
        for (row, slot) in keep.iter_mut().enumerate() {
            *slot = self.keep(context, &rows.candidate(row))?;
        }
        Ok(())
    }
}

/// A preference: one finite cost per worker, lower is better; costs of all scorers add.
pub trait WorkerScorer: Send {
    /// The worker-signal groups this scorer reads.
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::NONE
    }

    /// One finite, lower-is-better cost contribution for an eligible worker.
    fn score(
        &mut self,
        context: &WorkerSelectionContext<'_>,
        candidate: &WorkerCandidate,
    ) -> Result<f64, WorkerSelectionPolicyError>;

    /// Switchyard's batch entry (not Dynamo's; do not override), as for filters.
    #[doc(hidden)]
    fn __switchyard_score_rows(
        &mut self,
        context: &WorkerSelectionContext<'_>,
        rows: &CandidateRows<'_>,
        costs: &mut [f64],
        scorer_index: usize,
    ) -> Result<(), WorkerSelectionPolicyError> {
        for (row, cost) in costs.iter_mut().enumerate() {
            let contribution = self.score(context, &rows.candidate(row))?;
            if !contribution.is_finite() {
                return Err(WorkerSelectionPolicyError::NonFiniteCost { scorer_index, row });
            }
            *cost = contribution;
        }
        Ok(())
    }
}

/// The final choice: one row of the scored candidates.
pub trait WorkerPicker: Send {
    /// The optional worker-signal columns this picker reads.
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::NONE
    }

    /// One row index of `input.candidates()`. Row order is unspecified.
    fn pick(
        &mut self,
        context: &WorkerSelectionContext<'_>,
        input: WorkerInputView<'_>,
    ) -> Result<usize, WorkerSelectionPolicyError>;
}

/// The filters, scorers and picker a factory builds for one routing partition.
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

    /// The worker type the factory was called for (`prefill`, `decode` or `select`).
    pub fn worker_type(&self) -> &'static str {
        self.worker_type
    }

    /// The router configuration the factory was handed.
    pub fn kv_router_config(&self) -> &KvRouterConfig {
        &self.kv_router_config
    }

    /// The policy as switchyard components (switchyard addition): each filter, scorer
    /// (weight 1: Dynamo adds costs unweighted) and the picker behind an adapter.
    pub fn into_parts(self) -> sdk::PolicyParts {
        let filters = self
            .filters
            .into_iter()
            .map(|filter| Box::new(FilterAdapter::new(filter)) as Box<dyn sdk::WorkerFilter>)
            .collect();
        let scorers = self
            .scorers
            .into_iter()
            .enumerate()
            .map(|(index, scorer)| {
                Box::new(ScorerAdapter::new(scorer, index)) as Box<dyn sdk::WorkerScorer>
            })
            .collect();
        sdk::PolicyParts::new(filters, scorers, Box::new(PickerAdapter::new(self.picker)))
    }
}

/// A Dynamo filter as an SDK filter.
struct FilterAdapter {
    filter: Box<dyn WorkerFilter>,
    inputs: WorkerInputs,
}

impl FilterAdapter {
    fn new(filter: Box<dyn WorkerFilter>) -> Self {
        let inputs = filter.required_worker_inputs();
        FilterAdapter { filter, inputs }
    }
}

impl sdk::WorkerFilter for FilterAdapter {
    fn required_worker_inputs(&self) -> WorkerInputs {
        self.inputs
    }

    fn keep(
        &mut self,
        context: &sdk::WorkerSelectionContext<'_>,
        candidate: &sdk::WorkerCandidate<'_>,
    ) -> Result<bool, sdk::PolicyError> {
        let context = WorkerSelectionContext::from_switchyard(context);
        let candidate = WorkerCandidate::from_switchyard(candidate);
        Ok(self.filter.keep(&context, &candidate)?)
    }

    fn keep_batch(
        &mut self,
        context: &sdk::WorkerSelectionContext<'_>,
        candidates: &sdk::WorkerCandidates<'_>,
        keep: &mut [bool],
    ) -> Result<(), sdk::PolicyError> {
        let context = WorkerSelectionContext::from_switchyard(context);
        let rows = CandidateRows::new(candidates);
        Ok(self.filter.__switchyard_keep_rows(&context, &rows, keep)?)
    }
}

/// A Dynamo scorer as an SDK scorer.
struct ScorerAdapter {
    scorer: Box<dyn WorkerScorer>,
    inputs: WorkerInputs,
    index: usize,
}

impl ScorerAdapter {
    fn new(scorer: Box<dyn WorkerScorer>, index: usize) -> Self {
        let inputs = scorer.required_worker_inputs();
        ScorerAdapter {
            scorer,
            inputs,
            index,
        }
    }
}

impl sdk::WorkerScorer for ScorerAdapter {
    fn required_worker_inputs(&self) -> WorkerInputs {
        self.inputs
    }

    fn score(
        &mut self,
        context: &sdk::WorkerSelectionContext<'_>,
        candidate: &sdk::WorkerCandidate<'_>,
    ) -> Result<f64, sdk::PolicyError> {
        let context = WorkerSelectionContext::from_switchyard(context);
        let candidate = WorkerCandidate::from_switchyard(candidate);
        Ok(self.scorer.score(&context, &candidate)?)
    }

    fn score_batch(
        &mut self,
        context: &sdk::WorkerSelectionContext<'_>,
        candidates: &sdk::WorkerCandidates<'_>,
        costs: &mut [f64],
    ) -> Result<(), sdk::PolicyError> {
        let context = WorkerSelectionContext::from_switchyard(context);
        let rows = CandidateRows::new(candidates);
        Ok(self
            .scorer
            .__switchyard_score_rows(&context, &rows, costs, self.index)?)
    }
}

/// A Dynamo picker as an SDK picker: the `WorkerInputView` rows live in buffers kept
/// across selections (cleared, not freed), so a selection allocates nothing once they
/// have grown to the partition's size.
struct PickerAdapter {
    picker: Box<dyn WorkerPicker>,
    inputs: WorkerInputs,
    scored: Vec<ScoredWorkerCandidate>,
    cache: Vec<WorkerCacheInput>,
    load: Vec<WorkerLoadInput>,
    routing: Vec<WorkerRoutingInput>,
}

impl PickerAdapter {
    fn new(picker: Box<dyn WorkerPicker>) -> Self {
        let inputs = picker.required_worker_inputs();
        PickerAdapter {
            picker,
            inputs,
            scored: Vec::new(),
            cache: Vec::new(),
            load: Vec::new(),
            routing: Vec::new(),
        }
    }
}

impl sdk::WorkerPicker for PickerAdapter {
    fn required_worker_inputs(&self) -> WorkerInputs {
        self.inputs
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
        let count = rows.len();
        rows.fill_scored(costs, &mut self.scored);
        let with_cache = rows.fill_cache(&mut self.cache);
        let with_load = rows.fill_load(&mut self.load);
        let with_routing = rows.fill_routing(&mut self.routing);
        let view = WorkerInputView::new(
            &self.scored,
            with_cache.then_some(&self.cache[..]),
            with_load.then_some(&self.load[..]),
            with_routing.then_some(&self.routing[..]),
        );
        let context = WorkerSelectionContext::from_switchyard(context);
        let row = self.picker.pick(&context, view)?;
        if row >= count {
            return Err(WorkerSelectionPolicyError::InvalidPickerRow {
                row,
                candidate_count: count,
            }
            .into());
        }
        Ok(row)
    }
}
