//! The filter -> score -> pick pipeline of one policy instance.
//!
//! One crossing per component per request, over all candidates at once; the candidate
//! arrays, masks and cost vectors are buffers owned by the instance and reused, so the
//! per-request path allocates nothing once the buffers have grown to the fleet size.

use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;
use std::time::Instant;

use switchyard_plugin_sdk::abi::*;
use switchyard_plugin_sdk::{
    CandidateCache, CandidateLoad, WorkerCandidates, WorkerFilter, WorkerId, WorkerInputs,
    WorkerPicker, WorkerScorer, WorkerSelectionContext,
};

use crate::loader::ErrorBuffer;
use crate::registry::{ComponentKind, PluginComponentDef};

/// The candidates of one request, as index-aligned arrays (the ABI's layout). Only the
/// groups in `groups` are filled.
#[derive(Default)]
pub struct Candidates {
    groups: WorkerInputs,
    worker_id: Vec<u64>,
    dp_rank: Vec<u32>,
    device_overlap_blocks: Vec<u32>,
    host_overlap_blocks: Vec<u32>,
    disk_overlap_blocks: Vec<u32>,
    shared_beyond_device_blocks: Vec<u32>,
    active_prefill_tokens: Vec<u64>,
    decode_cost_blocks: Vec<u64>,
    active_requests: Vec<u32>,
    preferred_taint_multiplier: Vec<f64>,
}

/// Everything known about one candidate; groups not computed are left at their defaults.
#[derive(Clone, Copy, Debug)]
pub struct CandidateRow {
    pub worker: WorkerId,
    pub cache: CandidateCache,
    pub load: CandidateLoad,
    /// NaN: no preferred-routing multiplier.
    pub preferred_taint_multiplier: f64,
}

impl CandidateRow {
    pub fn new(worker: WorkerId) -> Self {
        CandidateRow {
            worker,
            cache: CandidateCache {
                device_overlap_blocks: 0,
                host_overlap_blocks: 0,
                disk_overlap_blocks: 0,
                shared_beyond_device_blocks: 0,
            },
            load: CandidateLoad {
                active_prefill_tokens: 0,
                decode_cost_blocks: 0,
                active_requests: 0,
            },
            preferred_taint_multiplier: f64::NAN,
        }
    }
}

impl Candidates {
    /// Fills the set from `rows` for a request that needs `groups`, in one pass over the
    /// rows writing each needed column in place (buffers are reused).
    pub fn fill<I>(&mut self, groups: WorkerInputs, rows: I)
    where
        I: IntoIterator<Item = CandidateRow>,
        I::IntoIter: ExactSizeIterator,
    {
        let rows = rows.into_iter();
        let n = rows.len();
        self.groups = groups;
        let cache = groups.contains(WorkerInputs::CACHE);
        let load = groups.contains(WorkerInputs::LOAD);
        let routing = groups.contains(WorkerInputs::ROUTING);
        // Columns are written through their spare capacity (no zero-fill first); each
        // wanted column gets its length set once every row is written.
        fn spare<T>(
            column: &mut Vec<T>,
            wanted: bool,
            n: usize,
        ) -> &mut [std::mem::MaybeUninit<T>] {
            column.clear();
            if wanted {
                column.reserve(n);
                &mut column.spare_capacity_mut()[..n]
            } else {
                &mut []
            }
        }
        let worker_id = spare(&mut self.worker_id, true, n);
        let dp_rank = spare(&mut self.dp_rank, true, n);
        let device = spare(&mut self.device_overlap_blocks, cache, n);
        let host = spare(&mut self.host_overlap_blocks, cache, n);
        let disk = spare(&mut self.disk_overlap_blocks, cache, n);
        let shared = spare(&mut self.shared_beyond_device_blocks, cache, n);
        let prefill = spare(&mut self.active_prefill_tokens, load, n);
        let decode = spare(&mut self.decode_cost_blocks, load, n);
        let active = spare(&mut self.active_requests, load, n);
        let taint = spare(&mut self.preferred_taint_multiplier, routing, n);
        let mut filled = 0;
        for (i, row) in rows.take(n).enumerate() {
            worker_id[i].write(row.worker.worker_id);
            dp_rank[i].write(row.worker.dp_rank);
            if cache {
                device[i].write(row.cache.device_overlap_blocks);
                host[i].write(row.cache.host_overlap_blocks);
                disk[i].write(row.cache.disk_overlap_blocks);
                shared[i].write(row.cache.shared_beyond_device_blocks);
            }
            if load {
                prefill[i].write(row.load.active_prefill_tokens);
                decode[i].write(row.load.decode_cost_blocks);
                active[i].write(row.load.active_requests);
            }
            if routing {
                taint[i].write(row.preferred_taint_multiplier);
            }
            filled = i + 1;
        }
        fn commit<T>(column: &mut Vec<T>, wanted: bool, filled: usize) {
            if wanted {
                // SAFETY: rows 0..filled of the spare capacity were written above.
                unsafe { column.set_len(filled) };
            }
        }
        commit(&mut self.worker_id, true, filled);
        commit(&mut self.dp_rank, true, filled);
        commit(&mut self.device_overlap_blocks, cache, filled);
        commit(&mut self.host_overlap_blocks, cache, filled);
        commit(&mut self.disk_overlap_blocks, cache, filled);
        commit(&mut self.shared_beyond_device_blocks, cache, filled);
        commit(&mut self.active_prefill_tokens, load, filled);
        commit(&mut self.decode_cost_blocks, load, filled);
        commit(&mut self.active_requests, load, filled);
        commit(&mut self.preferred_taint_multiplier, routing, filled);
    }

    pub fn len(&self) -> usize {
        self.worker_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.worker_id.is_empty()
    }

    pub fn worker(&self, row: usize) -> WorkerId {
        WorkerId {
            worker_id: self.worker_id[row],
            dp_rank: self.dp_rank[row],
        }
    }

    /// Keeps the rows whose `keep` byte is non-zero, in order. Only identity and the groups
    /// in `still_needed` are compacted; the others are dropped (and read as absent).
    fn retain(&mut self, keep: &[u8], still_needed: WorkerInputs) {
        // Branch-free: every row is copied, the write position advances only for kept rows.
        fn compact<T: Copy>(values: &mut Vec<T>, keep: &[u8]) {
            let mut next = 0;
            for (row, &k) in keep.iter().enumerate().take(values.len()) {
                values[next] = values[row];
                next += usize::from(k != 0);
            }
            values.truncate(next);
        }
        fn compact_or_drop<T: Copy>(values: &mut Vec<T>, keep: &[u8], needed: bool) {
            if needed {
                compact(values, keep);
            } else {
                values.clear();
            }
        }
        self.groups = WorkerInputs::from_bits(self.groups.bits() & still_needed.bits());
        let cache = self.groups.contains(WorkerInputs::CACHE);
        let load = self.groups.contains(WorkerInputs::LOAD);
        let routing = self.groups.contains(WorkerInputs::ROUTING);
        compact(&mut self.worker_id, keep);
        compact(&mut self.dp_rank, keep);
        compact_or_drop(&mut self.device_overlap_blocks, keep, cache);
        compact_or_drop(&mut self.host_overlap_blocks, keep, cache);
        compact_or_drop(&mut self.disk_overlap_blocks, keep, cache);
        compact_or_drop(&mut self.shared_beyond_device_blocks, keep, cache);
        compact_or_drop(&mut self.active_prefill_tokens, keep, load);
        compact_or_drop(&mut self.decode_cost_blocks, keep, load);
        compact_or_drop(&mut self.active_requests, keep, load);
        compact_or_drop(&mut self.preferred_taint_multiplier, keep, routing);
    }

    /// The ABI view for a component that declared `inputs`: undeclared groups are NULL.
    fn view(&self, inputs: WorkerInputs, costs: *const f64) -> switchyard_candidates {
        fn group<T>(declared: bool, values: &[T]) -> *const T {
            if declared {
                values.as_ptr()
            } else {
                ptr::null()
            }
        }
        let inputs = WorkerInputs::from_bits(inputs.bits() & self.groups.bits());
        let cache = inputs.contains(WorkerInputs::CACHE);
        let load = inputs.contains(WorkerInputs::LOAD);
        let routing = inputs.contains(WorkerInputs::ROUTING);
        switchyard_candidates {
            struct_size: std::mem::size_of::<switchyard_candidates>() as u32,
            inputs: inputs.bits(),
            count: self.len(),
            worker_id: self.worker_id.as_ptr(),
            dp_rank: self.dp_rank.as_ptr(),
            device_overlap_blocks: group(cache, &self.device_overlap_blocks),
            host_overlap_blocks: group(cache, &self.host_overlap_blocks),
            disk_overlap_blocks: group(cache, &self.disk_overlap_blocks),
            shared_beyond_device_blocks: group(cache, &self.shared_beyond_device_blocks),
            active_prefill_tokens: group(load, &self.active_prefill_tokens),
            decode_cost_blocks: group(load, &self.decode_cost_blocks),
            active_requests: group(load, &self.active_requests),
            preferred_taint_multiplier: group(routing, &self.preferred_taint_multiplier),
            costs,
        }
    }
}

/// One live instance of a plugin component. Destroyed through its def when dropped.
pub struct PluginInstance {
    def: PluginComponentDef,
    instance: *mut c_void,
}

// SAFETY: an instance is only ever called by one thread at a time (its policy is behind a
// lock), which is what the ABI promises plugins.
unsafe impl Send for PluginInstance {}

impl PluginInstance {
    pub fn new(def: PluginComponentDef, instance: *mut c_void) -> Self {
        PluginInstance { def, instance }
    }
}

impl Drop for PluginInstance {
    fn drop(&mut self) {
        if let Some(destroy) = self.def.raw().on_destroy {
            destroy(self.instance);
        }
    }
}

/// How a stage runs: a built-in trait object, called directly, or a plugin instance,
/// called through the C ABI.
pub enum StageImpl {
    Filter(Box<dyn WorkerFilter>),
    Scorer(Box<dyn WorkerScorer>),
    Picker(Box<dyn WorkerPicker>),
    Plugin(PluginInstance),
}

/// Per-stage counters, read by metrics.
#[derive(Default, Clone, Copy, Debug)]
pub struct StageStats {
    pub calls: u64,
    pub errors: u64,
    pub nanos: u64,
}

/// One component instance in a policy.
pub struct Stage {
    pub name: Arc<str>,
    pub kind: ComponentKind,
    pub inputs: WorkerInputs,
    imp: StageImpl,
    pub stats: StageStats,
}

/// A component failed; the message is its own.
struct Failure {
    status: i32,
    message: String,
}

impl Stage {
    pub fn new(name: Arc<str>, kind: ComponentKind, inputs: WorkerInputs, imp: StageImpl) -> Self {
        Stage {
            name,
            kind,
            inputs,
            imp,
            stats: StageStats::default(),
        }
    }

    fn filter(
        &mut self,
        request: &switchyard_request,
        candidates: &switchyard_candidates,
        keep: &mut [u8],
        error: &mut ErrorBuffer,
    ) -> Result<(), Failure> {
        match &mut self.imp {
            StageImpl::Filter(filter) => {
                let (context, view) = views(request, candidates);
                // SAFETY: `keep` holds only 0/1 (filled with 1 by the caller), valid bools.
                let keep = unsafe { &mut *(ptr::from_mut(keep) as *mut [bool]) };
                filter
                    .keep_batch(&context, &view, keep)
                    .map_err(builtin_failure)
            }
            StageImpl::Plugin(p) => {
                let on_filter = p.def.raw().on_filter.expect("checked at registration");
                status(
                    on_filter(
                        p.instance,
                        request,
                        candidates,
                        keep.as_mut_ptr(),
                        &error.as_abi(),
                    ),
                    error,
                )
            }
            _ => unreachable!("stage kinds are checked when the policy is built"),
        }
    }

    fn score(
        &mut self,
        request: &switchyard_request,
        candidates: &switchyard_candidates,
        costs: &mut [f64],
        error: &mut ErrorBuffer,
    ) -> Result<(), Failure> {
        match &mut self.imp {
            StageImpl::Scorer(scorer) => {
                let (context, view) = views(request, candidates);
                scorer
                    .score_batch(&context, &view, costs)
                    .map_err(builtin_failure)
            }
            StageImpl::Plugin(p) => {
                let on_score = p.def.raw().on_score.expect("checked at registration");
                status(
                    on_score(
                        p.instance,
                        request,
                        candidates,
                        costs.as_mut_ptr(),
                        &error.as_abi(),
                    ),
                    error,
                )
            }
            _ => unreachable!("stage kinds are checked when the policy is built"),
        }
    }

    fn pick(
        &mut self,
        request: &switchyard_request,
        candidates: &switchyard_candidates,
        error: &mut ErrorBuffer,
    ) -> Result<usize, Failure> {
        match &mut self.imp {
            StageImpl::Picker(picker) => {
                let (context, view) = views(request, candidates);
                picker.pick(&context, &view).map_err(builtin_failure)
            }
            StageImpl::Plugin(p) => {
                let on_pick = p.def.raw().on_pick.expect("checked at registration");
                let mut row = usize::MAX;
                status(
                    on_pick(p.instance, request, candidates, &mut row, &error.as_abi()),
                    error,
                )
                .map(|()| row)
            }
            _ => unreachable!("stage kinds are checked when the policy is built"),
        }
    }

    fn kind_matches(&self) -> bool {
        matches!(
            (&self.imp, self.kind),
            (StageImpl::Plugin(_), _)
                | (StageImpl::Filter(_), ComponentKind::Filter)
                | (StageImpl::Scorer(_), ComponentKind::Scorer)
                | (StageImpl::Picker(_), ComponentKind::Picker)
        )
    }
}

fn views<'a>(
    request: &'a switchyard_request,
    candidates: &'a switchyard_candidates,
) -> (WorkerSelectionContext<'a>, WorkerCandidates<'a>) {
    // SAFETY: both were built by the host for this call.
    unsafe {
        (
            WorkerSelectionContext::from_abi(request),
            WorkerCandidates::from_abi(candidates),
        )
    }
}

fn builtin_failure(e: switchyard_plugin_sdk::PolicyError) -> Failure {
    Failure {
        status: SWITCHYARD_STATUS_ERROR,
        message: e.to_string(),
    }
}

fn status(code: i32, error: &ErrorBuffer) -> Result<(), Failure> {
    if code == SWITCHYARD_STATUS_OK {
        Ok(())
    } else {
        Err(Failure {
            status: code,
            message: error.message(),
        })
    }
}

/// Why a selection failed. Every variant names the component at fault, if any.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SelectError {
    #[error("no eligible worker in the partition")]
    NoCandidates,
    #[error("filter `{component}` rejected every worker")]
    AllFiltered { component: Arc<str> },
    #[error("{kind} `{component}` failed ({}): {message}", status_name(*status))]
    ComponentFailed {
        component: Arc<str>,
        kind: &'static str,
        status: i32,
        message: String,
    },
    #[error("scorer `{component}` gave a non-finite {what} {value} for worker {} (dp_rank {}); scorers must return finite costs", worker.worker_id, worker.dp_rank)]
    NonFiniteCost {
        component: Arc<str>,
        what: &'static str,
        value: f64,
        worker: WorkerId,
    },
    #[error("picker `{component}` returned row {row}, but there are {count} candidates")]
    RowOutOfRange {
        component: Arc<str>,
        row: usize,
        count: usize,
    },
}

impl SelectError {
    /// The component at fault, if a component is.
    pub fn component(&self) -> Option<&str> {
        match self {
            SelectError::NoCandidates => None,
            SelectError::AllFiltered { component }
            | SelectError::ComponentFailed { component, .. }
            | SelectError::NonFiniteCost { component, .. }
            | SelectError::RowOutOfRange { component, .. } => Some(component),
        }
    }
    /// True when the request simply had nowhere to go (not a plugin fault).
    pub fn is_no_worker(&self) -> bool {
        matches!(
            self,
            SelectError::NoCandidates | SelectError::AllFiltered { .. }
        )
    }
}

pub fn status_name(status: i32) -> &'static str {
    match status {
        SWITCHYARD_STATUS_OK => "ok",
        SWITCHYARD_STATUS_ERROR => "error",
        SWITCHYARD_STATUS_INVALID_PARAMETERS => "invalid parameters",
        SWITCHYARD_STATUS_PANIC => "panicked",
        SWITCHYARD_STATUS_POISONED => "poisoned",
        SWITCHYARD_STATUS_NOT_FOUND => "not found",
        SWITCHYARD_STATUS_WRONG_TYPE => "wrong type",
        SWITCHYARD_STATUS_OUT_OF_RANGE => "out of range",
        SWITCHYARD_STATUS_INVALID_ARGUMENT => "invalid argument",
        SWITCHYARD_STATUS_DUPLICATE => "duplicate",
        _ => "unknown status",
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
    keep: Vec<u8>,
    contribution: Vec<f64>,
    total: Vec<f64>,
    error: ErrorBuffer,
}

impl Policy {
    /// Assembles a policy from stages: filters and scorers in order, exactly one picker.
    pub fn new(stages: Vec<(Stage, f64)>) -> Result<Self, String> {
        let mut filters = Vec::new();
        let mut scorers = Vec::new();
        let mut pickers = Vec::new();
        for (stage, weight) in stages {
            if !stage.kind_matches() {
                return Err(format!(
                    "component `{}` is not a {}",
                    stage.name,
                    stage.kind.as_str()
                ));
            }
            match stage.kind {
                ComponentKind::Filter => filters.push(stage),
                ComponentKind::Scorer => {
                    if !weight.is_finite() {
                        return Err(format!(
                            "scorer `{}` has a non-finite weight {weight}",
                            stage.name
                        ));
                    }
                    scorers.push((stage, weight))
                }
                ComponentKind::Picker => pickers.push(stage),
            }
        }
        let picker = match (pickers.pop(), pickers.is_empty()) {
            (Some(picker), true) => picker,
            (None, _) => return Err("a policy needs exactly one picker; it has none".into()),
            (Some(_), false) => {
                return Err(format!(
                    "a policy needs exactly one picker; it has {}",
                    pickers.len() + 1
                ))
            }
        };
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
        Ok(Policy {
            filters,
            needed_after,
            scorers,
            picker,
            inputs,
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
    /// filters). Returns the chosen row of the compacted set.
    pub fn select(
        &mut self,
        request: &switchyard_request,
        candidates: &mut Candidates,
    ) -> Result<usize, SelectError> {
        if candidates.is_empty() {
            return Err(SelectError::NoCandidates);
        }
        for (filter, &still_needed) in self.filters.iter_mut().zip(&self.needed_after) {
            self.keep.clear();
            self.keep.resize(candidates.len(), 1);
            let view = candidates.view(filter.inputs, ptr::null());
            timed(filter, |stage| {
                stage.filter(request, &view, &mut self.keep, &mut self.error)
            })
            .map_err(|f| failed(filter, f))?;
            if self.keep.iter().all(|&k| k != 0) {
                continue;
            }
            candidates.retain(&self.keep, still_needed);
            if candidates.is_empty() {
                return Err(SelectError::AllFiltered {
                    component: filter.name.clone(),
                });
            }
        }
        let count = candidates.len();
        self.total.clear();
        self.total.resize(count, 0.0);
        for (scorer, weight) in &mut self.scorers {
            self.contribution.clear();
            self.contribution.resize(count, f64::NAN);
            let view = candidates.view(scorer.inputs, ptr::null());
            timed(scorer, |stage| {
                stage.score(request, &view, &mut self.contribution, &mut self.error)
            })
            .map_err(|f| failed(scorer, f))?;
            for row in 0..count {
                let cost = self.contribution[row];
                let total = self.total[row] + *weight * cost;
                let bad = if !cost.is_finite() {
                    Some(("cost", cost))
                } else if !total.is_finite() {
                    Some(("running total", total))
                } else {
                    None
                };
                if let Some((what, value)) = bad {
                    scorer.stats.errors += 1;
                    return Err(SelectError::NonFiniteCost {
                        component: scorer.name.clone(),
                        what,
                        value,
                        worker: candidates.worker(row),
                    });
                }
                self.total[row] = total;
            }
        }
        let view = candidates.view(self.picker.inputs, self.total.as_ptr());
        let row = timed(&mut self.picker, |stage| {
            stage.pick(request, &view, &mut self.error)
        })
        .map_err(|f| failed(&mut self.picker, f))?;
        if row >= count {
            self.picker.stats.errors += 1;
            return Err(SelectError::RowOutOfRange {
                component: self.picker.name.clone(),
                row,
                count,
            });
        }
        Ok(row)
    }

    /// Total cost per row of the last selection (after filtering).
    pub fn last_costs(&self) -> &[f64] {
        &self.total
    }
}

fn timed<T>(
    stage: &mut Stage,
    call: impl FnOnce(&mut Stage) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let start = Instant::now();
    let result = call(stage);
    stage.stats.calls += 1;
    stage.stats.nanos += start.elapsed().as_nanos() as u64;
    result
}

fn failed(stage: &mut Stage, failure: Failure) -> SelectError {
    stage.stats.errors += 1;
    SelectError::ComponentFailed {
        component: stage.name.clone(),
        kind: stage.kind.as_str(),
        status: failure.status,
        message: failure.message,
    }
}

/// A policy with its candidate buffers: what one partition holds, and the unit of
/// selection for the router, `switchyard select` and tests.
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

    /// Runs the pipeline over `rows` for `request`; returns the chosen worker.
    pub fn select<I>(
        &mut self,
        request: &crate::request::RequestContext,
        rows: I,
    ) -> Result<WorkerId, SelectError>
    where
        I: IntoIterator<Item = CandidateRow>,
        I::IntoIter: ExactSizeIterator,
    {
        self.candidates.fill(self.policy.inputs(), rows);
        let (policy, candidates) = (&mut self.policy, &mut self.candidates);
        request
            .with_abi(|raw| policy.select(raw, candidates))
            .map(|row| candidates.worker(row))
    }
}
