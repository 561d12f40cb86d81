//! Driving a policy over rows without a router (switchyard addition, for a policy's unit
//! tests and benchmarks): filters, then scorers (costs summed), then the picker, through
//! the same SDK calls the router makes, over columns this module owns.

use core::ptr;

use switchyard_plugin_sdk::abi::{
    switchyard_candidates, switchyard_request, SWITCHYARD_AFFINITY_NONE, SWITCHYARD_NO_WORKER,
};
use switchyard_plugin_sdk::{
    PolicyError, PolicyParts, WorkerCandidates, WorkerInputs, WorkerSelectionContext as SdkContext,
};

use crate::context::WorkerSelectionContext;
use crate::inputs::{CandidateRows, WorkerCandidate};
use crate::protocols::WorkerWithDpRank;
use crate::WorkerSelectionPolicy;

/// One worker's signals, as the router would hand them (the SDK's column types).
#[derive(Clone, Copy, Debug, Default)]
pub struct Row {
    pub worker: WorkerWithDpRank,
    pub device_overlap_blocks: u32,
    pub host_overlap_blocks: u32,
    pub disk_overlap_blocks: u32,
    pub shared_beyond_device_blocks: u32,
    pub active_prefill_tokens: u64,
    pub decode_cost_blocks: u64,
    pub active_requests: u32,
    pub preferred_taint_multiplier: Option<f64>,
}

impl Row {
    /// Worker `worker_id` (rank 0) with every signal zero.
    pub fn worker(worker_id: u64) -> Self {
        Row {
            worker: WorkerWithDpRank::from_worker_id(worker_id),
            ..Row::default()
        }
    }
}

/// Index-aligned columns, as in `switchyard_candidates`.
#[derive(Clone, Default)]
struct Columns {
    worker_id: Vec<u64>,
    dp_rank: Vec<u32>,
    device: Vec<u32>,
    host: Vec<u32>,
    disk: Vec<u32>,
    shared: Vec<u32>,
    prefill: Vec<u64>,
    decode: Vec<u64>,
    active: Vec<u32>,
    taint: Vec<f64>,
}

/// Keeps the rows `keep` marks, in order (what the router's compaction does).
fn retain<T: Copy>(column: &mut Vec<T>, keep: &[bool]) {
    let mut kept = 0;
    for row in 0..column.len() {
        if keep[row] {
            column[kept] = column[row];
            kept += 1;
        }
    }
    column.truncate(kept);
}

fn column<T>(values: &[T], inputs: WorkerInputs, group: WorkerInputs) -> *const T {
    if inputs.contains(group) {
        values.as_ptr()
    } else {
        ptr::null()
    }
}

impl Columns {
    fn push(&mut self, row: &Row) {
        self.worker_id.push(row.worker.worker_id);
        self.dp_rank.push(row.worker.dp_rank);
        self.device.push(row.device_overlap_blocks);
        self.host.push(row.host_overlap_blocks);
        self.disk.push(row.disk_overlap_blocks);
        self.shared.push(row.shared_beyond_device_blocks);
        self.prefill.push(row.active_prefill_tokens);
        self.decode.push(row.decode_cost_blocks);
        self.active.push(row.active_requests);
        self.taint
            .push(row.preferred_taint_multiplier.unwrap_or(f64::NAN));
    }

    /// `source`'s rows, in this value's buffers (a derived `clone_from` would allocate
    /// new ones).
    fn reset_from(&mut self, source: &Columns) {
        self.worker_id.clone_from(&source.worker_id);
        self.dp_rank.clone_from(&source.dp_rank);
        self.device.clone_from(&source.device);
        self.host.clone_from(&source.host);
        self.disk.clone_from(&source.disk);
        self.shared.clone_from(&source.shared);
        self.prefill.clone_from(&source.prefill);
        self.decode.clone_from(&source.decode);
        self.active.clone_from(&source.active);
        self.taint.clone_from(&source.taint);
    }

    fn retain(&mut self, keep: &[bool]) {
        retain(&mut self.worker_id, keep);
        retain(&mut self.dp_rank, keep);
        retain(&mut self.device, keep);
        retain(&mut self.host, keep);
        retain(&mut self.disk, keep);
        retain(&mut self.shared, keep);
        retain(&mut self.prefill, keep);
        retain(&mut self.decode, keep);
        retain(&mut self.active, keep);
        retain(&mut self.taint, keep);
    }

    /// The ABI view of these columns with only the groups `inputs` names.
    fn raw(&self, inputs: WorkerInputs, costs: Option<&[f64]>) -> switchyard_candidates {
        let (cache, load, routing) = (
            WorkerInputs::CACHE,
            WorkerInputs::LOAD,
            WorkerInputs::ROUTING,
        );
        switchyard_candidates {
            struct_size: core::mem::size_of::<switchyard_candidates>() as u32,
            inputs: (inputs.bits()) & (cache | load | routing).bits(),
            count: self.worker_id.len(),
            worker_id: self.worker_id.as_ptr(),
            dp_rank: self.dp_rank.as_ptr(),
            device_overlap_blocks: column(&self.device, inputs, cache),
            host_overlap_blocks: column(&self.host, inputs, cache),
            disk_overlap_blocks: column(&self.disk, inputs, cache),
            shared_beyond_device_blocks: column(&self.shared, inputs, cache),
            active_prefill_tokens: column(&self.prefill, inputs, load),
            decode_cost_blocks: column(&self.decode, inputs, load),
            active_requests: column(&self.active, inputs, load),
            preferred_taint_multiplier: column(&self.taint, inputs, routing),
            costs: costs.map_or(ptr::null(), <[f64]>::as_ptr),
            labels_host_data: ptr::null(),
            callback_get_label: None,
            engine_host_data: ptr::null(),
            callback_get_engine: None,
            callback_get_adapter: None,
        }
    }
}

/// A request of `request_blocks` blocks of 16 tokens, no session.
fn request(request_blocks: u64) -> switchyard_request {
    switchyard_request {
        struct_size: core::mem::size_of::<switchyard_request>() as u32,
        block_size: 16,
        request_blocks,
        expected_output_tokens: 0,
        priority_jump: 0.0,
        router_temperature_override: 0.0,
        strict_priority: 0,
        tracks_prefill_tokens: 1,
        has_expected_output_tokens: 0,
        has_router_temperature_override: 0,
        reserved0: 0,
        session: ptr::null(),
        attributes: ptr::null(),
        affinity_worker_id: SWITCHYARD_NO_WORKER,
        affinity_dp_rank: 0,
        affinity_mode: SWITCHYARD_AFFINITY_NONE,
    }
}

/// Calls `f` with Dynamo's context of a request of `request_blocks` blocks.
pub fn with_context<R>(request_blocks: u64, f: impl FnOnce(&WorkerSelectionContext<'_>) -> R) -> R {
    let raw = request(request_blocks);
    // SAFETY: `raw` is a complete request with no session or attributes, alive for the call.
    let context = unsafe { SdkContext::from_abi(&raw) };
    f(&WorkerSelectionContext::from_switchyard(&context))
}

/// `row` as a filter or scorer that requested `inputs` sees it.
pub fn candidate(row: &Row, inputs: WorkerInputs) -> WorkerCandidate {
    let mut columns = Columns::default();
    columns.push(row);
    let raw = columns.raw(inputs, None);
    // SAFETY: every non-NULL array of `raw` holds one row and outlives the view.
    let view = unsafe { WorkerCandidates::from_abi(&raw) };
    CandidateRows::new(&view).candidate(0)
}

/// One set of rows, selected over as often as wanted; buffers are reused.
pub struct Selection {
    rows: Columns,
    work: Columns,
    keep: Vec<bool>,
    costs: Vec<f64>,
    totals: Vec<f64>,
}

impl Selection {
    pub fn new(rows: &[Row]) -> Self {
        let mut columns = Columns::default();
        rows.iter().for_each(|row| columns.push(row));
        Selection {
            work: columns.clone(),
            rows: columns,
            keep: Vec::new(),
            costs: Vec::new(),
            totals: Vec::new(),
        }
    }

    /// The worker `parts` picks for a request of `request_blocks` blocks.
    pub fn select(
        &mut self,
        parts: &mut PolicyParts,
        request_blocks: u64,
    ) -> Result<WorkerWithDpRank, PolicyError> {
        let raw_request = request(request_blocks);
        // SAFETY: a complete request with no session or attributes, alive for the call.
        let context = unsafe { SdkContext::from_abi(&raw_request) };
        self.work.reset_from(&self.rows);
        for filter in &mut parts.filters {
            let raw = self.work.raw(filter.required_worker_inputs(), None);
            // SAFETY: every non-NULL array of `raw` holds `count` rows and outlives the view.
            let view = unsafe { WorkerCandidates::from_abi(&raw) };
            self.keep.clear();
            self.keep.resize(view.len(), true);
            filter.keep_batch(&context, &view, &mut self.keep)?;
            if self.keep.contains(&false) {
                self.work.retain(&self.keep);
            }
        }
        let count = self.work.worker_id.len();
        if count == 0 {
            return Err(PolicyError::failed("every worker was filtered out"));
        }
        self.totals.clear();
        self.totals.resize(count, 0.0);
        for (scorer, weight) in &mut parts.scorers {
            let raw = self.work.raw(scorer.required_worker_inputs(), None);
            // SAFETY: as for the filters.
            let view = unsafe { WorkerCandidates::from_abi(&raw) };
            self.costs.clear();
            self.costs.resize(count, f64::NAN);
            scorer.score_batch(&context, &view, &mut self.costs)?;
            for (total, cost) in self.totals.iter_mut().zip(&self.costs) {
                *total += *weight * cost;
            }
        }
        let raw = self
            .work
            .raw(parts.picker.required_worker_inputs(), Some(&self.totals));
        // SAFETY: as for the filters; `costs` holds `count` totals.
        let view = unsafe { WorkerCandidates::from_abi(&raw) };
        let row = parts.picker.pick(&context, &view)?;
        if row >= count {
            return Err(PolicyError::failed(format!(
                "picker returned row {row} of {count}"
            )));
        }
        Ok(view.worker(row).into())
    }
}

/// The worker `policy` picks among `rows` for a request of `request_blocks` blocks.
pub fn select(
    policy: WorkerSelectionPolicy,
    request_blocks: u64,
    rows: &[Row],
) -> Result<WorkerWithDpRank, PolicyError> {
    Selection::new(rows).select(&mut policy.into_parts(), request_blocks)
}
