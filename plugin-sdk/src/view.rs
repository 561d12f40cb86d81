//! Safe, borrowed views of the ABI's request and candidate structs.
//!
//! The host builds `switchyard_request` / `switchyard_candidates` once per call; these
//! views read them without copying. Built-in components in the host read the very same
//! views, so a plugin and a built-in see identical data.

use core::slice;

use crate::abi::*;
use crate::WorkerInputs;

/// Reads a `switchyard_str` as `&str`; `None` when absent (NULL) or not UTF-8.
///
/// # Safety
/// `s.ptr` must be NULL or point to `s.len` readable bytes that outlive `'a`.
pub unsafe fn str_from_abi<'a>(s: switchyard_str) -> Option<&'a str> {
    if s.ptr.is_null() {
        return None;
    }
    // SAFETY: per this function's contract.
    core::str::from_utf8(unsafe { slice::from_raw_parts(s.ptr.cast::<u8>(), s.len) }).ok()
}

/// A `switchyard_str` borrowing `s`.
pub fn str_to_abi(s: &str) -> switchyard_str {
    switchyard_str {
        ptr: s.as_ptr().cast(),
        len: s.len(),
    }
}

/// The worker type of a partition, of a worker and of what a request asks for. In JSON
/// `prefill`, `decode` or `select` (the default); a config's worker `role` spells
/// `Select` as `aggregated`.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum WorkerType {
    Prefill,
    Decode,
    /// One pool of aggregated workers. Spelled `select` (the SDK's and the ABI's word) or
    /// `aggregated` (the config's and Dynamo's) wherever a worker type is read.
    #[default]
    #[serde(alias = "aggregated")]
    Select,
}

impl WorkerType {
    pub fn from_abi(value: u32) -> Option<Self> {
        match value {
            SWITCHYARD_WORKER_TYPE_PREFILL => Some(Self::Prefill),
            SWITCHYARD_WORKER_TYPE_DECODE => Some(Self::Decode),
            SWITCHYARD_WORKER_TYPE_SELECT => Some(Self::Select),
            _ => None,
        }
    }
    pub fn to_abi(self) -> u32 {
        match self {
            Self::Prefill => SWITCHYARD_WORKER_TYPE_PREFILL,
            Self::Decode => SWITCHYARD_WORKER_TYPE_DECODE,
            Self::Select => SWITCHYARD_WORKER_TYPE_SELECT,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prefill => "prefill",
            Self::Decode => "decode",
            Self::Select => "select",
        }
    }
    pub const ALL: [WorkerType; 3] = [Self::Prefill, Self::Decode, Self::Select];
}

/// A routing partition (model x worker type), as handed to `create` and `build`.
#[derive(Clone, Copy, Debug)]
pub struct Partition<'a> {
    pub worker_type: WorkerType,
    pub model: &'a str,
}

impl<'a> Partition<'a> {
    /// # Safety
    /// `raw` must be a valid host-provided partition for `'a`.
    pub unsafe fn from_abi(raw: &'a switchyard_partition) -> Self {
        Partition {
            worker_type: WorkerType::from_abi(raw.worker_type).unwrap_or(WorkerType::Select),
            // SAFETY: per this function's contract.
            model: unsafe { str_from_abi(raw.model) }.unwrap_or(""),
        }
    }
}

/// What triggered a session turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputTrigger {
    UserMessage,
    ToolResult,
    Other,
}

/// Session metadata of a request.
#[derive(Clone, Copy)]
pub struct SessionContext<'a> {
    raw: &'a switchyard_session,
}

impl<'a> SessionContext<'a> {
    pub fn session_id(&self) -> &'a str {
        // SAFETY: the host's session strings are valid for the call (`from_abi`).
        unsafe { str_from_abi(self.raw.session_id) }.unwrap_or("")
    }
    pub fn parent_session_id(&self) -> Option<&'a str> {
        // SAFETY: as in `session_id`.
        unsafe { str_from_abi(self.raw.parent_session_id) }
    }
    pub fn session_final(&self) -> Option<bool> {
        (self.raw.has_session_final != 0).then_some(self.raw.session_final != 0)
    }
    /// `Some(evict_session)` when the request carries KV lifecycle hints.
    pub fn evict_session(&self) -> Option<bool> {
        (self.raw.has_kv_hints != 0).then_some(self.raw.evict_session != 0)
    }
    pub fn input_trigger(&self) -> Option<InputTrigger> {
        match self.raw.input_trigger {
            SWITCHYARD_TRIGGER_USER_MESSAGE => Some(InputTrigger::UserMessage),
            SWITCHYARD_TRIGGER_TOOL_RESULT => Some(InputTrigger::ToolResult),
            SWITCHYARD_TRIGGER_OTHER => Some(InputTrigger::Other),
            _ => None,
        }
    }
}

/// The request context every component sees.
#[derive(Clone, Copy)]
pub struct WorkerSelectionContext<'a> {
    raw: &'a switchyard_request,
}

impl<'a> WorkerSelectionContext<'a> {
    /// # Safety
    /// `raw` must be a valid host-provided request (and session, if any) for `'a`.
    pub unsafe fn from_abi(raw: &'a switchyard_request) -> Self {
        WorkerSelectionContext { raw }
    }
    pub fn request_blocks(&self) -> u64 {
        self.raw.request_blocks
    }
    pub fn block_size(&self) -> u32 {
        self.raw.block_size
    }
    pub fn tracks_prefill_tokens(&self) -> bool {
        self.raw.tracks_prefill_tokens != 0
    }
    pub fn expected_output_tokens(&self) -> Option<u64> {
        (self.raw.has_expected_output_tokens != 0).then_some(self.raw.expected_output_tokens)
    }
    pub fn priority_jump(&self) -> f64 {
        self.raw.priority_jump
    }
    pub fn strict_priority(&self) -> i32 {
        self.raw.strict_priority
    }
    pub fn router_temperature_override(&self) -> Option<f64> {
        (self.raw.has_router_temperature_override != 0)
            .then_some(self.raw.router_temperature_override)
    }
    pub fn session_context(&self) -> Option<SessionContext<'a>> {
        // SAFETY: the host guarantees `session` is NULL or valid for the call.
        unsafe { self.raw.session.as_ref() }.map(|raw| SessionContext { raw })
    }
    /// The request's attributes (ABI 1.2): `None` unless the component declared
    /// `WorkerInputs::ATTRIBUTES` and the router speaks 1.2 or later.
    pub fn attributes(&self) -> Option<RequestAttributes<'a>> {
        let end =
            core::mem::offset_of!(switchyard_request, attributes) + core::mem::size_of::<usize>();
        if (self.raw.struct_size as usize) < end {
            return None;
        }
        // SAFETY: the host guarantees `attributes` is NULL or valid for the call.
        unsafe { self.raw.attributes.as_ref() }.map(|raw| RequestAttributes { raw })
    }
    /// The worker the request's session is bound to, and how (ABI 1.5,
    /// `router.session_affinity`); `None` without a binding or from a router older than
    /// 1.5. Advisory: the worker may be absent from the candidates.
    pub fn affinity_target(&self) -> Option<AffinityTarget> {
        let end = core::mem::offset_of!(switchyard_request, affinity_mode) + 4;
        if (self.raw.struct_size as usize) < end {
            return None;
        }
        let mode = match self.raw.affinity_mode {
            SWITCHYARD_AFFINITY_SOFT => AffinityMode::Soft,
            SWITCHYARD_AFFINITY_HARD => AffinityMode::Hard,
            _ => return None,
        };
        (self.raw.affinity_worker_id != SWITCHYARD_NO_WORKER).then_some(AffinityTarget {
            worker: WorkerId {
                worker_id: self.raw.affinity_worker_id,
                dp_rank: self.raw.affinity_dp_rank,
            },
            mode,
        })
    }
}

/// How strongly the router binds a session to its worker (ABI 1.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AffinityMode {
    /// Kept there while the worker is under the router's soft threshold and not busy.
    Soft,
    /// Kept there while the worker is a candidate.
    Hard,
}

impl AffinityMode {
    pub fn to_abi(self) -> u32 {
        match self {
            AffinityMode::Soft => SWITCHYARD_AFFINITY_SOFT,
            AffinityMode::Hard => SWITCHYARD_AFFINITY_HARD,
        }
    }
}

/// The worker a request's session is bound to (ABI 1.5): Dynamo's `affinity_target`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AffinityTarget {
    pub worker: WorkerId,
    pub mode: AffinityMode,
}

/// What the request says about itself (ABI 1.2, the ATTRIBUTES group).
#[derive(Clone, Copy)]
pub struct RequestAttributes<'a> {
    raw: &'a switchyard_request_attributes,
}

impl<'a> RequestAttributes<'a> {
    /// The request's id: the client's or gateway's `x-request-id`, or the router's own.
    pub fn request_id(&self) -> &'a str {
        // SAFETY: the host's strings are valid for the call (`attributes`).
        unsafe { str_from_abi(self.raw.request_id) }.unwrap_or("")
    }
    /// The model the request names (an adapter's base model).
    pub fn model(&self) -> &'a str {
        // SAFETY: as in `request_id`.
        unsafe { str_from_abi(self.raw.model) }.unwrap_or("")
    }
    /// The LoRA adapter asked for; `None` for the base model.
    pub fn lora_adapter(&self) -> Option<&'a str> {
        // SAFETY: as in `request_id`.
        unsafe { str_from_abi(self.raw.lora_adapter) }
    }
    /// Who sends the request, when the router knows (`request_attributes.tenant`).
    pub fn tenant(&self) -> Option<&'a str> {
        // SAFETY: as in `request_id`.
        unsafe { str_from_abi(self.raw.tenant) }
    }
    /// The value of request header `name` (case-insensitive), if the operator listed it
    /// in `request_attributes.headers` and the request carries it.
    pub fn header(&self, name: &str) -> Option<&'a str> {
        let get = self.raw.callback_get_header?;
        let mut out = switchyard_str {
            ptr: core::ptr::null(),
            len: 0,
        };
        // SAFETY: the host's callback reads the attributes it handed out and writes a
        // string borrowed from them for the call.
        let status = unsafe { get(self.raw, str_to_abi(name), &mut out) };
        if status != SWITCHYARD_STATUS_OK {
            return None;
        }
        // SAFETY: as above.
        unsafe { str_from_abi(out) }
    }
}

/// What became of a routed request, as a lifecycle notification reports it (ABI 1.1).
#[derive(Clone, Copy)]
pub struct Outcome<'a> {
    raw: &'a switchyard_outcome,
}

impl<'a> Outcome<'a> {
    /// # Safety
    /// `raw` must be a valid host-provided outcome for `'a`.
    pub unsafe fn from_abi(raw: &'a switchyard_outcome) -> Self {
        Outcome { raw }
    }
    /// The router's id for the routed request: the same in all its notifications.
    pub fn request_id(&self) -> u64 {
        self.raw.request_id
    }
    pub fn worker(&self) -> WorkerId {
        WorkerId {
            worker_id: self.raw.worker_id,
            dp_rank: self.raw.dp_rank,
        }
    }
    pub fn seconds_to_prefill_complete(&self) -> Option<f64> {
        Some(self.raw.seconds_to_prefill_complete).filter(|s| !s.is_nan())
    }
    pub fn seconds_to_finish(&self) -> Option<f64> {
        Some(self.raw.seconds_to_finish).filter(|s| !s.is_nan())
    }
    /// The other worker of a disaggregated pair (ABI 1.4): the decode worker in a
    /// prefill partition's notifications, the prefill worker in a decode partition's.
    /// `None` for a request served whole, before the other side is chosen, or from a
    /// router older than 1.4.
    pub fn paired_worker(&self) -> Option<WorkerId> {
        let end = core::mem::offset_of!(switchyard_outcome, reserved0);
        (self.raw.struct_size as usize >= end && self.raw.paired_worker_id != SWITCHYARD_NO_WORKER)
            .then_some(WorkerId {
                worker_id: self.raw.paired_worker_id,
                dp_rank: self.raw.paired_dp_rank,
            })
    }
}

/// Worker identity: ID and data-parallel rank. Ordered by ID, then rank (policies sort
/// rows by `(load, worker)` for a choice that does not depend on candidate order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId {
    pub worker_id: u64,
    pub dp_rank: u32,
}

/// CACHE group, index-aligned with the candidates.
#[derive(Clone, Copy)]
pub struct CacheInputs<'a> {
    pub device_overlap_blocks: &'a [u32],
    pub host_overlap_blocks: &'a [u32],
    pub disk_overlap_blocks: &'a [u32],
    pub shared_beyond_device_blocks: &'a [u32],
}

/// LOAD group, index-aligned with the candidates.
#[derive(Clone, Copy)]
pub struct LoadInputs<'a> {
    pub active_prefill_tokens: &'a [u64],
    pub decode_cost_blocks: &'a [u64],
    pub active_requests: &'a [u32],
}

/// ROUTING group, index-aligned with the candidates. NaN means "no multiplier".
#[derive(Clone, Copy)]
pub struct RoutingInputs<'a> {
    pub preferred_taint_multiplier: &'a [f64],
}

/// All candidates of one call, as index-aligned arrays. Candidate order is unspecified.
#[derive(Clone, Copy)]
pub struct WorkerCandidates<'a> {
    raw: &'a switchyard_candidates,
}

/// # Safety
/// `ptr` must be NULL or valid for `len` reads for `'a`.
unsafe fn array<'a, T>(ptr: *const T, len: usize) -> Option<&'a [T]> {
    if ptr.is_null() {
        None
    } else if len == 0 {
        Some(&[])
    } else {
        // SAFETY: per this function's contract.
        Some(unsafe { slice::from_raw_parts(ptr, len) })
    }
}

impl<'a> WorkerCandidates<'a> {
    /// # Safety
    /// `raw` must be a valid host-provided candidate set for `'a`: every non-NULL array
    /// holds `count` elements.
    pub unsafe fn from_abi(raw: &'a switchyard_candidates) -> Self {
        WorkerCandidates { raw }
    }
    pub fn len(&self) -> usize {
        self.raw.count
    }
    pub fn is_empty(&self) -> bool {
        self.raw.count == 0
    }
    /// The input groups present in this view (those the component declared).
    pub fn inputs(&self) -> WorkerInputs {
        WorkerInputs::from_bits(self.raw.inputs)
    }
    pub fn worker_ids(&self) -> &'a [u64] {
        // SAFETY: every non-NULL array holds `count` elements (`from_abi`).
        unsafe { array(self.raw.worker_id, self.raw.count) }.unwrap_or(&[])
    }
    pub fn dp_ranks(&self) -> &'a [u32] {
        // SAFETY: as in `worker_ids`.
        unsafe { array(self.raw.dp_rank, self.raw.count) }.unwrap_or(&[])
    }
    pub fn worker(&self, row: usize) -> WorkerId {
        WorkerId {
            worker_id: self.worker_ids()[row],
            dp_rank: self.dp_ranks()[row],
        }
    }
    /// `None` unless the component declared `WorkerInputs::CACHE`.
    pub fn cache(&self) -> Option<CacheInputs<'a>> {
        let n = self.raw.count;
        // SAFETY: as in `worker_ids`.
        unsafe {
            Some(CacheInputs {
                device_overlap_blocks: array(self.raw.device_overlap_blocks, n)?,
                host_overlap_blocks: array(self.raw.host_overlap_blocks, n)?,
                disk_overlap_blocks: array(self.raw.disk_overlap_blocks, n)?,
                shared_beyond_device_blocks: array(self.raw.shared_beyond_device_blocks, n)?,
            })
        }
    }
    /// `None` unless the component declared `WorkerInputs::LOAD`.
    pub fn load(&self) -> Option<LoadInputs<'a>> {
        let n = self.raw.count;
        // SAFETY: as in `worker_ids`.
        unsafe {
            Some(LoadInputs {
                active_prefill_tokens: array(self.raw.active_prefill_tokens, n)?,
                decode_cost_blocks: array(self.raw.decode_cost_blocks, n)?,
                active_requests: array(self.raw.active_requests, n)?,
            })
        }
    }
    /// `None` unless the component declared `WorkerInputs::ROUTING`.
    pub fn routing(&self) -> Option<RoutingInputs<'a>> {
        let n = self.raw.count;
        // SAFETY: as in `worker_ids`.
        unsafe {
            Some(RoutingInputs {
                preferred_taint_multiplier: array(self.raw.preferred_taint_multiplier, n)?,
            })
        }
    }
    /// Whether the LABELS group is readable here: the component declared it and the
    /// router speaks ABI 1.1 or later (an older router's struct ends before the callback).
    pub fn has_labels(&self) -> bool {
        self.label_callback().is_some()
    }
    fn label_callback(
        &self,
    ) -> Option<
        unsafe extern "C" fn(
            *const switchyard_candidates,
            usize,
            switchyard_str,
            *mut switchyard_str,
        ) -> i32,
    > {
        let end = core::mem::offset_of!(switchyard_candidates, callback_get_label)
            + core::mem::size_of::<usize>();
        if (self.raw.struct_size as usize) < end {
            return None;
        }
        self.raw.callback_get_label
    }
    /// The value of label `key` of the worker in `row`. `None` when the worker has no such
    /// label, `row` is out of range, or LABELS was not declared (see `has_labels`).
    pub fn label(&self, row: usize, key: &str) -> Option<&'a str> {
        let get = self.label_callback()?;
        let mut out = switchyard_str {
            ptr: core::ptr::null(),
            len: 0,
        };
        // SAFETY: the host's callback reads the candidates it was handed with (`from_abi`)
        // and writes a string borrowed from them for `'a`.
        let status = unsafe { get(self.raw, row, str_to_abi(key), &mut out) };
        if status != SWITCHYARD_STATUS_OK {
            return None;
        }
        // SAFETY: as above.
        unsafe { str_from_abi(out) }
    }
    /// Whether the ENGINE group is readable here: the component declared it and the
    /// router speaks ABI 1.2 or later.
    pub fn has_engine(&self) -> bool {
        let end = core::mem::offset_of!(switchyard_candidates, callback_get_adapter)
            + core::mem::size_of::<usize>();
        (self.raw.struct_size as usize) >= end && self.raw.callback_get_engine.is_some()
    }
    /// The engine-reported load of the worker in `row`: `None` when its engine has not
    /// been scraped, `row` is out of range, or ENGINE was not declared (`has_engine`).
    pub fn engine(&self, row: usize) -> Option<EngineLoad> {
        if !self.has_engine() {
            return None;
        }
        let get = self.raw.callback_get_engine?;
        let mut out = switchyard_engine_load {
            struct_size: core::mem::size_of::<switchyard_engine_load>() as u32,
            state: 0,
            sample_age_seconds: f64::NAN,
            running_requests: f64::NAN,
            waiting_requests: f64::NAN,
            kv_cache_usage: f64::NAN,
            running_adapters: f64::NAN,
            waiting_adapters: f64::NAN,
        };
        // SAFETY: the host's callback reads the candidates it was handed with and writes
        // at most `out.struct_size` bytes.
        if unsafe { get(self.raw, row, &mut out) } != SWITCHYARD_STATUS_OK {
            return None;
        }
        Some(EngineLoad {
            state: if out.state == SWITCHYARD_ENGINE_FRESH {
                EngineState::Fresh
            } else {
                EngineState::Stale
            },
            sample_age_seconds: out.sample_age_seconds,
            running_requests: out.running_requests,
            waiting_requests: out.waiting_requests,
            kv_cache_usage: out.kv_cache_usage,
            running_adapters: out.running_adapters,
            waiting_adapters: out.waiting_adapters,
        })
    }
    /// LoRA adapter `adapter`'s state on the worker in `row`, as of its last sample;
    /// `None` when neither running nor waiting there (or ENGINE is not readable).
    pub fn adapter(&self, row: usize, adapter: &str) -> Option<AdapterState> {
        if !self.has_engine() {
            return None;
        }
        let get = self.raw.callback_get_adapter?;
        let mut state = 0u32;
        // SAFETY: as in `engine`.
        if unsafe { get(self.raw, row, str_to_abi(adapter), &mut state) } != SWITCHYARD_STATUS_OK {
            return None;
        }
        match state {
            SWITCHYARD_ADAPTER_RUNNING => Some(AdapterState::Running),
            SWITCHYARD_ADAPTER_WAITING => Some(AdapterState::Waiting),
            _ => None,
        }
    }
    /// Total costs per row; present in picker calls only.
    pub fn costs(&self) -> Option<&'a [f64]> {
        // SAFETY: as in `worker_ids`.
        unsafe { array(self.raw.costs, self.raw.count) }
    }
    /// For pickers: the row of the lowest cost (in `f64::total_cmp`'s order), ties to the
    /// lowest (worker id, dp rank), so the choice does not depend on candidate order.
    /// `None` without costs or candidates. Ids are read only for rows at the lowest cost.
    pub fn lowest_cost_row(&self) -> Option<usize> {
        crate::lowest_cost::lowest_cost_row(self.costs()?, self.worker_ids(), self.dp_ranks())
    }
    /// One row, for per-candidate component methods.
    pub fn row(&self, row: usize) -> WorkerCandidate<'a> {
        WorkerCandidate { all: *self, row }
    }
}

/// Whether an engine sample is current (ABI 1.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineState {
    /// The last scrape succeeded.
    Fresh,
    /// The last scrape failed: the values are the last good ones, `sample_age_seconds` old.
    Stale,
}

/// One engine's own report of its load (ABI 1.2, the ENGINE group).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineLoad {
    pub state: EngineState,
    pub sample_age_seconds: f64,
    pub running_requests: f64,
    pub waiting_requests: f64,
    /// 0 to 1; NaN when the engine does not say.
    pub kv_cache_usage: f64,
    /// NaN when the engine does not say.
    pub running_adapters: f64,
    /// NaN when the engine does not say.
    pub waiting_adapters: f64,
}

/// A LoRA adapter's state on an engine (ABI 1.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdapterState {
    /// Requests for the adapter run on the engine.
    Running,
    /// Requests for the adapter wait on the engine; none runs.
    Waiting,
}

/// One candidate row, read through its candidate set.
#[derive(Clone, Copy)]
pub struct WorkerCandidate<'a> {
    all: WorkerCandidates<'a>,
    row: usize,
}

/// One row's CACHE inputs.
#[derive(Clone, Copy, Debug)]
pub struct CandidateCache {
    pub device_overlap_blocks: u32,
    pub host_overlap_blocks: u32,
    pub disk_overlap_blocks: u32,
    pub shared_beyond_device_blocks: u32,
}

/// One row's LOAD inputs.
#[derive(Clone, Copy, Debug)]
pub struct CandidateLoad {
    pub active_prefill_tokens: u64,
    pub decode_cost_blocks: u64,
    pub active_requests: u32,
}

impl<'a> WorkerCandidate<'a> {
    pub fn row(&self) -> usize {
        self.row
    }
    pub fn worker(&self) -> WorkerId {
        self.all.worker(self.row)
    }
    pub fn cache(&self) -> Option<CandidateCache> {
        let c = self.all.cache()?;
        let r = self.row;
        Some(CandidateCache {
            device_overlap_blocks: c.device_overlap_blocks[r],
            host_overlap_blocks: c.host_overlap_blocks[r],
            disk_overlap_blocks: c.disk_overlap_blocks[r],
            shared_beyond_device_blocks: c.shared_beyond_device_blocks[r],
        })
    }
    pub fn load(&self) -> Option<CandidateLoad> {
        let l = self.all.load()?;
        let r = self.row;
        Some(CandidateLoad {
            active_prefill_tokens: l.active_prefill_tokens[r],
            decode_cost_blocks: l.decode_cost_blocks[r],
            active_requests: l.active_requests[r],
        })
    }
    /// `Some(None)` when ROUTING was declared but the worker has no multiplier.
    pub fn preferred_taint_multiplier(&self) -> Option<Option<f64>> {
        let m = self.all.routing()?.preferred_taint_multiplier[self.row];
        Some((!m.is_nan()).then_some(m))
    }
    /// The value of the worker's label `key` (LABELS group); `None` when it has none.
    pub fn label(&self, key: &str) -> Option<&'a str> {
        self.all.label(self.row, key)
    }
    /// The worker's engine-reported load (ENGINE group); `None` when not scraped.
    pub fn engine(&self) -> Option<EngineLoad> {
        self.all.engine(self.row)
    }
    /// LoRA adapter `adapter`'s state on the worker (ENGINE group).
    pub fn adapter(&self, adapter: &str) -> Option<AdapterState> {
        self.all.adapter(self.row, adapter)
    }
    /// The row's total cost; picker calls only.
    pub fn cost(&self) -> Option<f64> {
        Some(self.all.costs()?[self.row])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ptr;

    /// `lowest_cost_row` over (cost, worker id) rows, dp rank 0.
    fn lowest(rows: &[(f64, u64)]) -> Option<usize> {
        let costs: Vec<f64> = rows.iter().map(|r| r.0).collect();
        let ids: Vec<u64> = rows.iter().map(|r| r.1).collect();
        let ranks = vec![0u32; rows.len()];
        let raw = switchyard_candidates {
            struct_size: std::mem::size_of::<switchyard_candidates>() as u32,
            inputs: 0,
            count: rows.len(),
            worker_id: ids.as_ptr(),
            dp_rank: ranks.as_ptr(),
            device_overlap_blocks: ptr::null(),
            host_overlap_blocks: ptr::null(),
            disk_overlap_blocks: ptr::null(),
            shared_beyond_device_blocks: ptr::null(),
            active_prefill_tokens: ptr::null(),
            decode_cost_blocks: ptr::null(),
            active_requests: ptr::null(),
            preferred_taint_multiplier: ptr::null(),
            costs: costs.as_ptr(),
            labels_host_data: ptr::null(),
            callback_get_label: None,
            engine_host_data: ptr::null(),
            callback_get_engine: None,
            callback_get_adapter: None,
        };
        // SAFETY: every non-NULL array holds `count` elements and outlives the view.
        unsafe { WorkerCandidates::from_abi(&raw) }.lowest_cost_row()
    }

    /// The view hands its costs, ids and ranks to the helper (checked against a sort in
    /// `lowest_cost`).
    #[test]
    fn lowest_cost_row_reads_the_views_columns() {
        assert_eq!(lowest(&[]), None);
        assert_eq!(lowest(&[(3.0, 9), (1.0, 8), (1.0, 2), (2.0, 1)]), Some(2));
        assert_eq!(lowest(&[(0.0, 1), (-0.0, 7)]), Some(1));
    }

    /// Dynamo's examples pick by `min_by_key(|row| (load, worker))`: ids order by worker
    /// id, then rank.
    #[test]
    fn worker_ids_order_by_id_then_rank() {
        let id = |worker_id, dp_rank| WorkerId { worker_id, dp_rank };
        let mut rows = [(1, id(7, 0)), (0, id(9, 1)), (0, id(9, 0)), (0, id(3, 2))];
        rows.sort();
        assert_eq!(
            rows,
            [(0, id(3, 2)), (0, id(9, 0)), (0, id(9, 1)), (1, id(7, 0))]
        );
    }

    #[test]
    fn the_pair_is_read_only_from_a_1_4_outcome() {
        let mut raw = switchyard_outcome {
            struct_size: core::mem::size_of::<switchyard_outcome>() as u32,
            dp_rank: 0,
            request_id: 1,
            worker_id: 3,
            seconds_to_prefill_complete: f64::NAN,
            seconds_to_finish: f64::NAN,
            paired_worker_id: 7,
            paired_dp_rank: 1,
            reserved0: 0,
        };
        let paired = |raw: &switchyard_outcome| {
            // SAFETY: `raw` is a valid outcome for the call.
            unsafe { Outcome::from_abi(raw) }.paired_worker()
        };
        assert_eq!(
            paired(&raw),
            Some(WorkerId {
                worker_id: 7,
                dp_rank: 1
            })
        );
        raw.paired_worker_id = SWITCHYARD_NO_WORKER;
        assert_eq!(paired(&raw), None);
        // A 1.3 router's outcome ends before the pair: whatever lies past it is not read.
        raw.paired_worker_id = 7;
        raw.struct_size = 40;
        assert_eq!(paired(&raw), None);
    }
}
