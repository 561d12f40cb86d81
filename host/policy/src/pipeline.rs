//! The filter -> score -> pick pipeline of one policy instance.
//!
//! One crossing per component per request, over all candidates at once; the candidate
//! arrays, masks and cost vectors are buffers owned by the instance and reused, so the
//! per-request path allocates nothing once the buffers have grown to the fleet size.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use switchyard_plugin_sdk::{Admission, Saturation, Status, WorkerId, WorkerInputs};

use super::candidates::{CandidateRow, Candidates, KeptColumns};
use super::error::BuildError;
use super::error::SelectError;
use super::histogram::{LatencyHistogram, Stopwatch};
use switchyard_plugin_host::isolation::{share_channels, RemoteInstance};
use switchyard_plugin_host::plugin::{
    AbiRequest, BuiltinInstance, CallError, Columns, Component, ComponentInstance, ComponentKind,
    EngineReport, ErrorBuffer, Labels, Lifecycle, Outcome, PromptBlocks, RouteRequest,
};

/// Per-stage counters. Only the thread running the stage writes them (its selector's
/// lock orders the writers), so plain loads and stores suffice, no atomic
/// read-modify-write on the request path; metrics read them without taking that lock, so
/// a slow component never delays `/metrics`.
#[derive(Default, Debug)]
pub struct StageStats {
    /// Call latency; its count is the number of calls.
    pub latency: LatencyHistogram,
    errors: AtomicU64,
    /// The component panicked or threw: its instance refuses every later call.
    poisoned: AtomicBool,
}

impl StageStats {
    fn add(counter: &AtomicU64, n: u64) {
        counter.store(
            counter.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }
    /// Counts a failed call; a panic or a poisoned instance marks the stage poisoned.
    fn failed(&self, failure: &CallError) {
        Self::add(&self.errors, 1);
        if matches!(failure.status, Status::Panic | Status::Poisoned) {
            self.poisoned.store(true, Ordering::Relaxed);
        }
    }
    pub fn calls(&self) -> u64 {
        self.latency.count()
    }
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
    pub fn poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Relaxed)
    }
}

/// One component instance in a policy: built in, a plugin in this process or an
/// isolated plugin, called alike through [`Component`].
pub struct Stage {
    pub name: Arc<str>,
    /// The kind the stage was registered or built as (checked against the component's).
    pub kind: ComponentKind,
    pub inputs: WorkerInputs,
    component: StageComponent,
    pub stats: Arc<StageStats>,
}

impl Stage {
    pub fn new(
        name: Arc<str>,
        kind: ComponentKind,
        inputs: WorkerInputs,
        component: impl Into<StageComponent>,
    ) -> Self {
        Stage {
            name,
            kind,
            inputs,
            component: component.into(),
            stats: Arc::default(),
        }
    }

    /// An admitter's answer for `request` (admitters run before selection, outside any
    /// pipeline: `crate::admitters`). Timed and counted like every stage's call.
    pub fn admit(
        &mut self,
        request: &AbiRequest<'_>,
        saturation: &Saturation,
        error: &mut ErrorBuffer,
    ) -> Result<Admission, CallError> {
        let watch = Stopwatch::start();
        let result = self.component.admit(request, saturation, error);
        self.stats.latency.record(watch.elapsed_nanos());
        result.inspect_err(|failure| self.stats.failed(failure))
    }

    /// Whether this stage wants lifecycle notifications (plugin components that set them).
    pub fn notified(&self) -> bool {
        self.component.notified()
    }

    /// Delivers one lifecycle notification if the component asked for it; a failure is
    /// counted on the stage (and poisons it on a panic).
    pub fn notify(
        &mut self,
        event: Lifecycle,
        request: Option<&AbiRequest<'_>>,
        outcome: &Outcome,
        error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        if !self.notified() {
            return Ok(());
        }
        let result = self.component.notify(event, request, outcome, error);
        result.inspect_err(|failure| self.stats.failed(failure))
    }

    fn kind_matches(&self) -> bool {
        self.component.kind() == self.kind
    }
}

/// Each worker's cost from one scorer.
pub type WorkerCosts = Vec<(WorkerId, f64)>;

/// What each stage of one selection did (`switchyard select --explain`).
#[derive(Debug, Default)]
pub struct SelectTrace {
    /// Per filter, in order: its name and the workers it dropped.
    pub filters: Vec<(Arc<str>, Vec<WorkerId>)>,
    /// Per scorer, in order: its name, weight, and each remaining worker's cost.
    pub scorers: Vec<(Arc<str>, f64, WorkerCosts)>,
    pub picker: Option<Arc<str>>,
}

/// What one component call wrote, unchecked (`plugin test` judges it).
#[derive(Clone, Debug, PartialEq)]
pub enum RawOutput {
    Keep(Vec<u8>),
    Costs(Vec<f64>),
    Row(usize),
}

impl Stage {
    /// Calls this component once over `candidates`, outside any pipeline: a filter's mask
    /// (every byte 1 before the call), a scorer's costs (NaN before the call), a picker's
    /// row over `costs`. Nothing is checked or compacted: conformance runs read what the
    /// component wrote.
    pub fn call_once(
        &mut self,
        request: &RouteRequest,
        prompt: PromptBlocks,
        candidates: &Candidates,
        costs: &[f64],
    ) -> Result<RawOutput, CallError> {
        let mut error = ErrorBuffer::new();
        request.with_abi(prompt, |raw| match self.kind {
            ComponentKind::Filter => {
                let mut keep = vec![1u8; candidates.len()];
                let columns = candidates.columns(None);
                self.component
                    .filter(raw, &columns, &mut keep, &mut error)
                    .map(|()| RawOutput::Keep(keep))
            }
            ComponentKind::Scorer => {
                let mut out = vec![f64::NAN; candidates.len()];
                let columns = candidates.columns(None);
                self.component
                    .score(raw, &columns, &mut out, &mut error)
                    .map(|()| RawOutput::Costs(out))
            }
            ComponentKind::Picker => {
                let columns = candidates.columns(Some(costs));
                self.component
                    .pick(raw, &columns, &mut error)
                    .map(RawOutput::Row)
            }
            ComponentKind::Admitter => Err(CallError::new(
                Status::InvalidArgument,
                "an admitter sees no candidates: call it with `admit`",
            )),
        })
    }
}

/// A component as a stage holds it: one of the three implementations of [`Component`],
/// by value, so the stage loop's calls dispatch statically (a built-in's call inlines
/// into it) while the pipeline still sees only the trait.
pub enum StageComponent {
    Builtin(BuiltinInstance),
    Plugin(ComponentInstance),
    Isolated(RemoteInstance),
}

impl From<BuiltinInstance> for StageComponent {
    fn from(c: BuiltinInstance) -> Self {
        Self::Builtin(c)
    }
}

impl From<ComponentInstance> for StageComponent {
    fn from(c: ComponentInstance) -> Self {
        Self::Plugin(c)
    }
}

impl From<RemoteInstance> for StageComponent {
    fn from(c: RemoteInstance) -> Self {
        Self::Isolated(c)
    }
}

impl StageComponent {
    /// The isolated instance, if this one runs in another process.
    pub fn isolated(&mut self) -> Option<&mut RemoteInstance> {
        match self {
            Self::Isolated(c) => Some(c),
            _ => None,
        }
    }
}

macro_rules! each {
    ($self:ident, $c:ident => $call:expr) => {
        match $self {
            StageComponent::Builtin($c) => $call,
            StageComponent::Plugin($c) => $call,
            StageComponent::Isolated($c) => $call,
        }
    };
}

impl Component for StageComponent {
    fn kind(&self) -> ComponentKind {
        each!(self, c => c.kind())
    }
    #[inline]
    fn filter(
        &mut self,
        request: &AbiRequest<'_>,
        columns: &Columns<'_>,
        keep: &mut [u8],
        error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        each!(self, c => c.filter(request, columns, keep, error))
    }
    #[inline]
    fn score(
        &mut self,
        request: &AbiRequest<'_>,
        columns: &Columns<'_>,
        costs: &mut [f64],
        error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        each!(self, c => c.score(request, columns, costs, error))
    }
    #[inline]
    fn pick(
        &mut self,
        request: &AbiRequest<'_>,
        columns: &Columns<'_>,
        error: &mut ErrorBuffer,
    ) -> Result<usize, CallError> {
        each!(self, c => c.pick(request, columns, error))
    }
    fn admit(
        &mut self,
        request: &AbiRequest<'_>,
        saturation: &Saturation,
        error: &mut ErrorBuffer,
    ) -> Result<Admission, CallError> {
        each!(self, c => c.admit(request, saturation, error))
    }
    fn notified(&self) -> bool {
        each!(self, c => c.notified())
    }
    fn notify(
        &mut self,
        event: Lifecycle,
        request: Option<&AbiRequest<'_>>,
        outcome: &Outcome,
        error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        each!(self, c => c.notify(event, request, outcome, error))
    }
}

/// One policy instance: its stages and the buffers they reuse.
pub struct Policy {
    filters: Vec<Stage>,
    /// Per filter: the groups some later stage reads (what compaction must keep).
    needed_after: Vec<WorkerInputs>,
    scorers: Vec<(Stage, f64)>,
    picker: Stage,
    inputs: WorkerInputs,
    /// Some stage wants lifecycle notifications.
    notified: bool,
    keep: Vec<u8>,
    contribution: Vec<f64>,
    total: Vec<f64>,
    error: ErrorBuffer,
}

impl Policy {
    /// Assembles a policy from stages: filters and scorers in order, exactly one picker.
    pub fn new(stages: Vec<(Stage, f64)>) -> Result<Self, BuildError> {
        let mut filters = Vec::new();
        let mut scorers = Vec::new();
        let mut pickers = Vec::new();
        for (stage, weight) in stages {
            if !stage.kind_matches() {
                return Err(BuildError::WrongKind {
                    component: stage.name.to_string(),
                    expected: stage.kind.as_str(),
                });
            }
            match stage.kind {
                ComponentKind::Filter => filters.push(stage),
                ComponentKind::Scorer if !weight.is_finite() => {
                    return Err(BuildError::NonFiniteWeight {
                        component: stage.name.to_string(),
                        weight,
                    })
                }
                ComponentKind::Scorer => scorers.push((stage, weight)),
                ComponentKind::Picker => pickers.push(stage),
                ComponentKind::Admitter => {
                    return Err(BuildError::AdmitterInPipeline {
                        component: stage.name.to_string(),
                    })
                }
            }
        }
        if pickers.len() != 1 {
            return Err(BuildError::PickerCount {
                found: pickers.len(),
                built_by: None,
            });
        }
        let mut picker = pickers.remove(0);
        share_channels(
            filters
                .iter_mut()
                .chain(scorers.iter_mut().map(|(s, _)| s))
                .chain(std::iter::once(&mut picker))
                .filter_map(|stage| stage.component.isolated()),
        );
        let inputs = filters
            .iter()
            .chain(scorers.iter().map(|(s, _)| s))
            .chain(std::iter::once(&picker))
            .fold(WorkerInputs::NONE, |acc, s| acc | s.inputs);
        let later = |from: usize| {
            filters[from..]
                .iter()
                .chain(scorers.iter().map(|(s, _)| s))
                .chain(std::iter::once(&picker))
                .fold(WorkerInputs::NONE, |acc, s| acc | s.inputs)
        };
        let needed_after = (0..filters.len()).map(|i| later(i + 1)).collect();
        let notified = filters
            .iter()
            .chain(scorers.iter().map(|(s, _)| s))
            .chain(std::iter::once(&picker))
            .any(Stage::notified);
        Ok(Policy {
            filters,
            needed_after,
            scorers,
            picker,
            inputs,
            notified,
            keep: Vec::new(),
            contribution: Vec::new(),
            total: Vec::new(),
            error: ErrorBuffer::new(),
        })
    }

    /// The union of the groups its components read: what the router must compute.
    pub fn inputs(&self) -> WorkerInputs {
        self.inputs
    }

    /// Whether some component wants lifecycle notifications; when not, the router tracks
    /// nothing for this policy's requests.
    pub fn notified(&self) -> bool {
        self.notified
    }

    /// Delivers `event` to every component that asked for it, in pipeline order. A failure
    /// is counted on the stage and logged; it changes no decision. Returns the failures
    /// (`plugin test` reports them; empty allocates nothing).
    pub fn notify(
        &mut self,
        event: Lifecycle,
        request: Option<&AbiRequest<'_>>,
        outcome: &Outcome,
    ) -> Vec<(Arc<str>, CallError)> {
        let mut failures = Vec::new();
        if !self.notified {
            return failures;
        }
        let error = &mut self.error;
        let stages = self
            .filters
            .iter_mut()
            .chain(self.scorers.iter_mut().map(|(s, _)| s))
            .chain(std::iter::once(&mut self.picker));
        for stage in stages {
            if let Err(failure) = stage.notify(event, request, outcome, error) {
                tracing::warn!(
                    component = %stage.name,
                    callback = event.callback(),
                    status = failure.status.name(),
                    message = %failure.message,
                    "a lifecycle notification failed"
                );
                failures.push((stage.name.clone(), failure));
            }
        }
        failures
    }

    /// Every stage, in pipeline order.
    pub fn stages(&self) -> impl Iterator<Item = &Stage> {
        self.filters
            .iter()
            .chain(self.scorers.iter().map(|(s, _)| s))
            .chain(std::iter::once(&self.picker))
    }

    /// Scorers with their weights.
    pub fn weights(&self) -> impl Iterator<Item = (&str, f64)> {
        self.scorers.iter().map(|(s, w)| (&*s.name, *w))
    }

    /// Runs filters, scorers and the picker over `candidates` (compacted in place by the
    /// filters). Returns the chosen row of the compacted set. With `trace`, what each
    /// stage did is recorded there (`select --explain`); without, nothing is allocated.
    pub fn select(
        &mut self,
        request: &AbiRequest<'_>,
        candidates: &mut Candidates,
        mut trace: Option<&mut SelectTrace>,
    ) -> Result<usize, SelectError> {
        if candidates.is_empty() {
            return Err(SelectError::NoCandidates);
        }
        self.run_filters(request, candidates, trace.as_deref_mut())?;
        let count = candidates.len();
        self.run_scorers(request, candidates, trace.as_deref_mut())?;
        if let Some(trace) = trace {
            trace.picker = Some(self.picker.name.clone());
        }
        let columns = candidates.columns(Some(&self.total));
        let row = timed(&mut self.picker, |stage| {
            stage.component.pick(request, &columns, &mut self.error)
        })
        .map_err(|f| failed(&mut self.picker, f))?;
        if row >= count {
            StageStats::add(&self.picker.stats.errors, 1);
            return Err(SelectError::RowOutOfRange {
                component: self.picker.name.clone(),
                row,
                count,
            });
        }
        Ok(row)
    }

    /// The filters, each compacting `candidates` to the rows it keeps.
    fn run_filters(
        &mut self,
        request: &AbiRequest<'_>,
        candidates: &mut Candidates,
        mut trace: Option<&mut SelectTrace>,
    ) -> Result<(), SelectError> {
        for (filter, &still_needed) in self.filters.iter_mut().zip(&self.needed_after) {
            // Sized only: the boundary sets every byte to 1 before the filter runs.
            self.keep.resize(candidates.len(), 1);
            let columns = candidates.columns(None);
            timed(filter, |stage| {
                stage
                    .component
                    .filter(request, &columns, &mut self.keep, &mut self.error)
            })
            .map_err(|f| failed(filter, f))?;
            if let Some(trace) = trace.as_deref_mut() {
                let dropped = (0..candidates.len())
                    .filter(|&row| self.keep[row] == 0)
                    .map(|row| candidates.worker(row))
                    .collect();
                trace.filters.push((filter.name.clone(), dropped));
            }
            // A byte search (vectorized), not a per-byte loop.
            if !self.keep.contains(&0) {
                continue;
            }
            candidates.retain(&self.keep, still_needed);
            if candidates.is_empty() {
                return Err(SelectError::AllFiltered {
                    component: filter.name.clone(),
                });
            }
        }
        Ok(())
    }

    /// The scorers, their weighted costs summed into `total` per row.
    fn run_scorers(
        &mut self,
        request: &AbiRequest<'_>,
        candidates: &Candidates,
        mut trace: Option<&mut SelectTrace>,
    ) -> Result<(), SelectError> {
        let count = candidates.len();
        // The first scorer, at weight 1, writes the totals themselves: its sum with the
        // zero totals is the cost itself (but -0.0 becomes 0.0), computed in place, so no
        // second buffer is filled and read.
        let first_in_place = self
            .scorers
            .first()
            .is_some_and(|(_, weight)| *weight == 1.0);
        self.total.clear();
        if !first_in_place {
            self.total.resize(count, 0.0);
        }
        for (index, (scorer, weight)) in self.scorers.iter_mut().enumerate() {
            let in_place = index == 0 && first_in_place;
            let costs = match in_place {
                true => &mut self.total,
                false => &mut self.contribution,
            };
            costs.clear();
            costs.resize(count, f64::NAN);
            let columns = candidates.columns(None);
            timed(scorer, |stage| {
                stage
                    .component
                    .score(request, &columns, costs, &mut self.error)
            })
            .map_err(|f| failed(scorer, f))?;
            if let Some(trace) = trace.as_deref_mut() {
                let costs = (0..count)
                    .map(|row| (candidates.worker(row), costs[row]))
                    .collect();
                trace.scorers.push((scorer.name.clone(), *weight, costs));
            }
            // Every row is added and checked without a branch (vectorized); the first bad
            // row is looked for only when there is one.
            let mut all_finite = true;
            if in_place {
                for total in &mut self.total {
                    *total += 0.0;
                    all_finite &= finite(*total);
                }
            } else {
                for (total, &cost) in self.total.iter_mut().zip(&self.contribution) {
                    let sum = *total + *weight * cost;
                    all_finite &= finite(cost) & finite(sum);
                    *total = sum;
                }
            }
            if !all_finite {
                let costs = match in_place {
                    true => &self.total,
                    false => &self.contribution,
                };
                let (row, what, value) = first_non_finite(costs, &self.total);
                StageStats::add(&scorer.stats.errors, 1);
                return Err(SelectError::NonFiniteCost {
                    component: scorer.name.clone(),
                    what,
                    value,
                    worker: candidates.worker(row),
                });
            }
        }
        Ok(())
    }

    /// Total cost per row of the last selection (after filtering).
    pub fn last_costs(&self) -> &[f64] {
        &self.total
    }
}

/// The first row whose cost or running total is not finite (there is one: the vectorized
/// check said so).
#[cold]
fn first_non_finite(costs: &[f64], total: &[f64]) -> (usize, &'static str, f64) {
    (0..costs.len())
        .find_map(|row| {
            let (cost, total) = (costs[row], total[row]);
            if !cost.is_finite() {
                Some((row, "cost", cost))
            } else {
                (!total.is_finite()).then_some((row, "running total", total))
            }
        })
        .unwrap_or((0, "cost", f64::NAN))
}

/// `x.is_finite()` in two vector instructions rather than four: x - x is 0 for every
/// finite x and NaN for infinities and NaN.
#[inline]
#[allow(clippy::eq_op)] // x - x is the test itself
fn finite(x: f64) -> bool {
    x - x == 0.0
}

fn timed<T>(
    stage: &mut Stage,
    call: impl FnOnce(&mut Stage) -> Result<T, CallError>,
) -> Result<T, CallError> {
    let stopwatch = Stopwatch::start();
    let result = call(stage);
    stage
        .stats
        .latency
        .record_exclusive(stopwatch.elapsed_nanos());
    result
}

fn failed(stage: &mut Stage, failure: CallError) -> SelectError {
    stage.stats.failed(&failure);
    SelectError::ComponentFailed {
        component: stage.name.clone(),
        kind: stage.kind.as_str(),
        status: failure.status,
        message: failure.message,
    }
}

/// A policy with its candidate buffers: what one partition holds, and the unit of
/// selection for the router, `switchyard select` and tests.
/// What rows carry by reference besides their plain values: each row's labels (LABELS)
/// and engine report (ENGINE), in row order; rows past either have none.
#[derive(Clone, Debug, Default)]
pub struct RowExtras {
    pub labels: Vec<Arc<Labels>>,
    pub engine: Vec<Arc<EngineReport>>,
}

impl RowExtras {
    fn fill(&self, candidates: &mut Candidates) {
        if !self.labels.is_empty() {
            candidates.fill_labels(self.labels.iter().cloned());
        }
        if !self.engine.is_empty() {
            candidates.fill_engine(self.engine.iter().cloned());
        }
    }
}

/// Where a selection's candidates come from.
pub enum CandidatesFrom<'a> {
    /// Rows of plain values, with each row's labels and engine report (index-aligned;
    /// read only if some component declared LABELS or ENGINE).
    Rows(&'a [CandidateRow], &'a RowExtras),
    /// A partition's kept columns, lent for the call (not copied), and the request's
    /// cache overlaps written as `Candidates::fill_request` says: the router's
    /// per-request path, for benchmarks and tests.
    Lent(
        &'a Arc<KeptColumns>,
        &'a mut dyn FnMut([&mut [u32]; 3]) -> u32,
    ),
    /// Candidates the caller filled for this policy's inputs (compacted in place by
    /// filters).
    Filled(&'a mut Candidates),
}

pub struct Selector {
    pub policy: Policy,
    candidates: Candidates,
}

impl Selector {
    pub fn new(policy: Policy) -> Self {
        Selector {
            policy,
            candidates: Candidates::default(),
        }
    }

    /// The groups the router must compute for this policy.
    pub fn inputs(&self) -> WorkerInputs {
        self.policy.inputs()
    }

    /// Runs the pipeline over `from` for `request`, its prompt measured as `prompt`;
    /// returns the chosen worker. With `trace`, what each stage did is recorded there
    /// (`select --explain`).
    pub fn select(
        &mut self,
        request: &RouteRequest,
        prompt: PromptBlocks,
        from: CandidatesFrom<'_>,
        trace: Option<&mut SelectTrace>,
    ) -> Result<WorkerId, SelectError> {
        let inputs = self.policy.inputs();
        let (candidates, lent) = match from {
            CandidatesFrom::Rows(rows, extras) => {
                self.candidates.fill(inputs, rows.iter().copied());
                extras.fill(&mut self.candidates);
                (&mut self.candidates, false)
            }
            CandidatesFrom::Lent(kept, overlaps) => {
                self.candidates.lend(inputs, kept.clone());
                self.candidates
                    .fill_request(prompt.request_blocks, overlaps);
                (&mut self.candidates, true)
            }
            CandidatesFrom::Filled(candidates) => (candidates, false),
        };
        let policy = &mut self.policy;
        let result = request
            .with_abi(prompt, |raw| policy.select(raw, candidates, trace))
            .map(|row| candidates.worker(row));
        if lent {
            self.candidates.release();
        }
        result
    }

    /// Tells the components that asked (ABI 1.1 `on_selected`) that the request they just
    /// helped route went to `outcome.worker`.
    pub fn notify_selected(
        &mut self,
        request: &RouteRequest,
        prompt: PromptBlocks,
        outcome: &Outcome,
    ) -> Vec<(Arc<str>, CallError)> {
        let policy = &mut self.policy;
        request.with_abi(prompt, |raw| {
            policy.notify(Lifecycle::Selected, Some(raw), outcome)
        })
    }
}
