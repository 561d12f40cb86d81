//! One component call laid out in a shared-memory region, for plugins isolated in a child
//! process (docs/isolation.md). The request and the candidate columns cross in the ABI's
//! own layout: each column is a copy of the pipeline's buffer at a fixed offset, and the
//! child hands the plugin views pointing straight into the region. No serialization
//! format on this path.
//!
//! The parent (the router) writes a call and reads the answer; the child reads the call,
//! runs the instance, and writes the answer in place. Which side may touch the region when
//! is decided by two sequence words ([`SyncWords`]); the waiting itself is the isolation
//! layer's. The parent trusts nothing it reads back: every answer is a plain number or
//! byte (any bit pattern is a valid value), a row is range-checked by the pipeline, and a
//! message length is clamped.

use std::ptr::{self, NonNull};
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use switchyard_plugin_sdk::abi::*;
use switchyard_plugin_sdk::{Admission, Saturation, Status, WorkerInputs};

use super::component::{
    AdmissionFields, ComponentInstance, ComponentKind, Lifecycle, Outcome, MAX_TENANT_BYTES,
};
use super::engine::{EngineReading, EngineReport, EngineSample};
use super::error_buffer::{CallError, ErrorBuffer};
use super::inputs::Columns;
use super::inputs::{AbiRequest, RequestAttributes};
use super::labels::Labels;

mod child;
mod log_area;
mod strings;

use strings::{decode_attributes, encode_attributes, Reader};

/// What the parent asks of the child's call thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Op {
    Filter = 1,
    Score = 2,
    Pick = 3,
    Notify = 4,
    /// The channel is closed: the child's call thread ends.
    Close = 5,
    /// An admitter's `on_admit` (ABI 1.3).
    Admit = 6,
}

impl Op {
    fn from_u32(op: u32) -> Option<Op> {
        [
            Op::Filter,
            Op::Score,
            Op::Pick,
            Op::Notify,
            Op::Close,
            Op::Admit,
        ]
        .into_iter()
        .find(|o| *o as u32 == op)
    }

    pub fn of(kind: ComponentKind) -> Op {
        match kind {
            ComponentKind::Filter => Op::Filter,
            ComponentKind::Scorer => Op::Score,
            ComponentKind::Picker => Op::Pick,
            ComponentKind::Admitter => Op::Admit,
        }
    }
}

/// What a call carries besides the request and the columns.
#[derive(Clone, Copy)]
pub enum Extra<'a> {
    None,
    /// A lifecycle notification's event and outcome.
    Notification(Lifecycle, &'a Outcome),
    /// An admitter's view of its partition.
    Saturation(&'a Saturation),
}

/// `done_seq` once the child is gone: every waiting caller fails.
pub const BROKEN: u32 = u32::MAX;

/// The words both processes synchronise on, each pair on a cache line of its own.
#[repr(C)]
pub struct SyncWords {
    /// Bumped by the parent to post a call (never [`BROKEN`]).
    pub call_seq: AtomicU32,
    /// 1 while the child's call thread sleeps on `call_seq`.
    pub child_waiting: AtomicU32,
    _line0: [u32; 14],
    /// Set by the child to the call it answered.
    pub done_seq: AtomicU32,
    /// 1 while the parent sleeps on `done_seq`.
    pub parent_waiting: AtomicU32,
    _line1: [u32; 14],
}

const ERROR_BYTES: usize = 1024;
const STRING_BYTES: usize = 8192;
/// An admitter's answer text: its tenant, then its message.
const ANSWER_BYTES: usize = MAX_TENANT_BYTES + ERROR_BYTES;

const TRACKS_PREFILL: u32 = 1;
const HAS_EXPECTED_OUTPUT: u32 = 2;
const HAS_TEMPERATURE: u32 = 4;
const HAS_SESSION: u32 = 8;
const HAS_SESSION_FINAL: u32 = 16;
const SESSION_FINAL: u32 = 32;
const HAS_KV_HINTS: u32 = 64;
const EVICT_SESSION: u32 = 128;
const HAS_PARENT_SESSION: u32 = 256;
const HAS_ATTRIBUTES: u32 = 512;

/// The fixed part of a call, after the sync words. Plain numbers only: no pointer crosses.
#[repr(C)]
struct CallFields {
    op: u32,
    instance: u32,
    count: u64,
    /// The groups written for this call (present in the parent's columns and declared).
    inputs: u32,
    event: u32,
    block_size: u32,
    strict_priority: i32,
    request_blocks: u64,
    expected_output_tokens: u64,
    priority_jump: f64,
    router_temperature_override: f64,
    flags: u32,
    input_trigger: u32,
    session_id_len: u32,
    parent_session_id_len: u32,
    /// Where the attributes' encoding starts in `strings`, and its length.
    attributes_at: u32,
    attributes_len: u32,
    /// The session's binding (ABI 1.5), as `switchyard_request` carries it.
    affinity_worker_id: u64,
    affinity_dp_rank: u32,
    affinity_mode: u32,
    outcome: switchyard_outcome,
    saturation: switchyard_saturation,
    // The answer.
    status: i32,
    error_len: u32,
    row: u64,
    error: [u8; ERROR_BYTES],
    strings: [u8; STRING_BYTES],
    admission: AdmissionAnswer,
    /// Plugin log lines the child had queued (ABI 1.5), as JSON; `log_len` bytes.
    log_len: u32,
    log: [u8; log_area::LOG_BYTES],
}

/// An admitter's answer, as plain numbers and bytes (`AdmissionFields`, crossed).
#[repr(C)]
struct AdmissionAnswer {
    verdict: u32,
    has_priority: u32,
    priority: i32,
    status: u32,
    retry_after_seconds: u32,
    /// `u32::MAX`: no tenant named.
    tenant_len: u32,
    message_len: u32,
    max_wait_ms: u64,
    /// The tenant at 0, the message at `MAX_TENANT_BYTES`.
    text: [u8; ANSWER_BYTES],
}

/// The region's columns, in order.
#[derive(Clone, Copy)]
enum Col {
    WorkerId,
    DpRank,
    Device,
    Host,
    Disk,
    Shared,
    Prefill,
    Decode,
    Active,
    Taint,
    Costs,
    OutCosts,
    Keep,
    LabelEnds,
    LabelBytes,
    /// ENGINE: per row `[state, age seconds, running, waiting, KV usage]` (state 0: none).
    Engine,
    EngineEnds,
    EngineBytes,
}

const COLUMNS: usize = 18;
/// A row of `Col::Engine`.
type EngineRow = [f64; 5];

/// Where each column lives in a region sized for `rows` candidates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallLayout {
    rows: usize,
    label_bytes: usize,
    offsets: [usize; COLUMNS],
    size: usize,
}

impl CallLayout {
    pub fn new(rows: usize, label_bytes: usize) -> Self {
        let widths: [(usize, usize); COLUMNS] = [
            (8, rows),
            (4, rows),
            (4, rows),
            (4, rows),
            (4, rows),
            (4, rows),
            (8, rows),
            (8, rows),
            (4, rows),
            (8, rows),
            (8, rows),
            (8, rows),
            (1, rows),
            (4, rows),
            (1, label_bytes),
            (std::mem::size_of::<EngineRow>(), rows),
            (4, rows),
            (1, label_bytes),
        ];
        let mut at = std::mem::size_of::<SyncWords>() + std::mem::size_of::<CallFields>();
        let mut offsets = [0; COLUMNS];
        for (slot, (width, count)) in offsets.iter_mut().zip(widths) {
            at = at.next_multiple_of(64);
            *slot = at;
            at += width * count;
        }
        CallLayout {
            rows,
            label_bytes,
            offsets,
            size: at.next_multiple_of(4096),
        }
    }

    /// Bytes the region needs.
    pub fn size(&self) -> usize {
        self.size
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
}

/// One call channel's region, as either side sees it.
pub struct SharedCall {
    base: NonNull<u8>,
    layout: CallLayout,
    /// Parent side: the columns' version and groups the region holds now, so that the
    /// stages of one request write each column once.
    written_version: u64,
    written_groups: WorkerInputs,
}

// SAFETY: the region is process-shared memory owned by whoever holds this (see `new`);
// the sequence words decide which process may touch it, and one thread per process uses
// a `SharedCall` at a time (`&mut self` for every access but the atomics).
unsafe impl Send for SharedCall {}

impl SharedCall {
    /// # Safety
    /// `base` must point to at least `layout.size()` bytes, mapped readable and writable,
    /// aligned to a page, that stay mapped for as long as the returned value lives.
    pub unsafe fn new(base: NonNull<u8>, layout: CallLayout) -> Self {
        SharedCall {
            base,
            layout,
            written_version: 0,
            written_groups: WorkerInputs::NONE,
        }
    }

    pub fn layout(&self) -> &CallLayout {
        &self.layout
    }

    pub fn sync(&self) -> &SyncWords {
        // SAFETY: the region starts with the sync words (page-aligned, see `new`), and
        // atomics may be shared between processes.
        unsafe { self.base.cast::<SyncWords>().as_ref() }
    }

    fn fields(&mut self) -> &mut CallFields {
        // SAFETY: see `fields_ptr`; `&mut self` makes this the only borrow in this process.
        unsafe { &mut *fields_ptr(self.base) }
    }

    fn column<T: Copy>(&mut self, col: Col, len: usize) -> &mut [T] {
        // SAFETY: `&mut self` makes this the only borrow of the region in this process.
        unsafe { view_mut(self.base, &self.layout, col, len) }
    }

    /// The columns must be written again (the child that held them was replaced).
    pub fn forget_columns(&mut self) {
        self.written_version = 0;
        self.written_groups = WorkerInputs::NONE;
    }

    // ---- the parent's side ----

    /// Writes a call for `instance` of a component that declared `declared`. The columns
    /// are copied only where this region does not hold them already for the same
    /// `columns.version`. Returns the candidate count.
    pub fn write_call(
        &mut self,
        op: Op,
        instance: u32,
        request: Option<&AbiRequest<'_>>,
        columns: Option<&Columns<'_>>,
        declared: WorkerInputs,
        extra: Extra<'_>,
    ) -> Result<usize, CallError> {
        let mut count = 0;
        let mut present = WorkerInputs::NONE;
        if let Some(columns) = columns {
            count = columns.len();
            if count > self.layout.rows {
                return Err(CallError::new(
                    Status::OutOfRange,
                    format!(
                        "{count} candidates do not fit the isolation channel ({} rows); raise `isolation.max_candidates`",
                        self.layout.rows
                    ),
                ));
            }
            present = self.write_columns(columns, declared)?;
            if op == Op::Pick {
                let costs = columns.costs.unwrap_or(&[]);
                let out = self.column::<f64>(Col::Costs, costs.len());
                out.copy_from_slice(&costs[..out.len()]);
            }
        }
        if let Some(request) = request {
            self.write_request(request, declared)?;
        }
        let fields = self.fields();
        fields.op = op as u32;
        fields.instance = instance;
        fields.count = count as u64;
        fields.inputs = present.bits();
        fields.status = Status::Error.code();
        fields.error_len = 0;
        fields.row = u64::MAX;
        match extra {
            Extra::Notification(event, outcome) => {
                fields.event = event as u32;
                fields.outcome = outcome.abi();
            }
            Extra::Saturation(saturation) => fields.saturation = saturation.abi(),
            Extra::None => {}
        }
        Ok(count)
    }

    /// Writes what a `declared` component may read of `columns`; the groups it gets.
    fn write_columns(
        &mut self,
        columns: &Columns<'_>,
        declared: WorkerInputs,
    ) -> Result<WorkerInputs, CallError> {
        let n = columns.len();
        let wanted = [
            WorkerInputs::CACHE,
            WorkerInputs::LOAD,
            WorkerInputs::ROUTING,
            WorkerInputs::LABELS,
            WorkerInputs::ENGINE,
        ]
        .into_iter()
        .filter(|g| declared.contains(*g) && columns.inputs.contains(*g))
        .fold(WorkerInputs::NONE, |acc, g| acc | g);
        let same = columns.version != 0 && columns.version == self.written_version;
        if !same {
            self.written_version = columns.version;
            self.written_groups = WorkerInputs::NONE;
            copy(self.column(Col::WorkerId, n), columns.worker_id);
            copy(self.column(Col::DpRank, n), columns.dp_rank);
        }
        let missing =
            |g: WorkerInputs, written: WorkerInputs| wanted.contains(g) && !written.contains(g);
        if missing(WorkerInputs::CACHE, self.written_groups) {
            copy(self.column(Col::Device, n), columns.device_overlap_blocks);
            copy(self.column(Col::Host, n), columns.host_overlap_blocks);
            copy(self.column(Col::Disk, n), columns.disk_overlap_blocks);
            copy(
                self.column(Col::Shared, n),
                columns.shared_beyond_device_blocks,
            );
        }
        if missing(WorkerInputs::LOAD, self.written_groups) {
            copy(self.column(Col::Prefill, n), columns.active_prefill_tokens);
            copy(self.column(Col::Decode, n), columns.decode_cost_blocks);
            copy(self.column(Col::Active, n), columns.active_requests);
        }
        if missing(WorkerInputs::ROUTING, self.written_groups) {
            copy(
                self.column(Col::Taint, n),
                columns.preferred_taint_multiplier,
            );
        }
        if missing(WorkerInputs::LABELS, self.written_groups) {
            self.write_labels(columns.labels)?;
        }
        // Engine reports change under the same columns version (the scraper writes the
        // shared cells), so they are written on every call that wants them.
        if wanted.contains(WorkerInputs::ENGINE) {
            self.write_engine(columns.engine)?;
        }
        self.written_groups = self.written_groups
            | WorkerInputs::from_bits(wanted.bits() & !WorkerInputs::ENGINE.bits());
        Ok(wanted)
    }

    /// Each row's engine reading: its numbers in `Col::Engine`, its adapter lists in
    /// `Col::EngineBytes` (`[count][len][name]...` running, then waiting; count
    /// `u32::MAX` when the engine does not say), rows ending at `EngineEnds[row]`.
    fn write_engine(&mut self, engine: &[Arc<EngineReport>]) -> Result<(), CallError> {
        let capacity = self.layout.label_bytes;
        let mut at = 0usize;
        for (row, report) in engine.iter().enumerate() {
            let reading = report.read();
            let record: EngineRow = match &reading {
                None => [0.0; 5],
                Some(r) => [
                    if r.fresh { 1.0 } else { 2.0 },
                    r.age.as_secs_f64(),
                    r.sample.running_requests,
                    r.sample.waiting_requests,
                    r.sample.kv_cache_usage,
                ],
            };
            self.column::<EngineRow>(Col::Engine, engine.len())[row] = record;
            if let Some(r) = &reading {
                for list in [&r.sample.running_adapters, &r.sample.waiting_adapters] {
                    let names = list.as_deref().unwrap_or(&[]);
                    let need = 4 + names.iter().map(|n| 4 + n.len()).sum::<usize>();
                    if at + need > capacity {
                        return Err(CallError::new(
                            Status::OutOfRange,
                            format!("the candidates' adapter names take more than the isolation channel's {capacity} bytes"),
                        ));
                    }
                    let bytes = self.column::<u8>(Col::EngineBytes, capacity);
                    let count = list.as_ref().map_or(u32::MAX, |l| l.len() as u32);
                    bytes[at..at + 4].copy_from_slice(&count.to_le_bytes());
                    at += 4;
                    for name in names {
                        bytes[at..at + 4].copy_from_slice(&(name.len() as u32).to_le_bytes());
                        bytes[at + 4..at + 4 + name.len()].copy_from_slice(name.as_bytes());
                        at += 4 + name.len();
                    }
                }
            }
            self.column::<u32>(Col::EngineEnds, engine.len())[row] = at as u32;
        }
        Ok(())
    }

    /// Each row's labels as `[u32 key length][key][u32 value length][value]...`, rows
    /// ending at `LabelEnds[row]`.
    fn write_labels(&mut self, labels: &[Arc<Labels>]) -> Result<(), CallError> {
        let capacity = self.layout.label_bytes;
        let mut at = 0usize;
        for (row, set) in labels.iter().enumerate() {
            for (key, value) in set.iter() {
                for part in [key, value] {
                    let len = part.len();
                    if at + 4 + len > capacity {
                        self.written_groups = WorkerInputs::NONE;
                        self.written_version = 0;
                        return Err(CallError::new(
                            Status::OutOfRange,
                            format!("the candidates' labels take more than the isolation channel's {capacity} bytes"),
                        ));
                    }
                    let bytes = self.column::<u8>(Col::LabelBytes, capacity);
                    bytes[at..at + 4].copy_from_slice(&(len as u32).to_le_bytes());
                    bytes[at + 4..at + 4 + len].copy_from_slice(part.as_bytes());
                    at += 4 + len;
                }
            }
            self.column::<u32>(Col::LabelEnds, labels.len())[row] = at as u32;
        }
        Ok(())
    }

    fn write_request(
        &mut self,
        request: &AbiRequest<'_>,
        declared: WorkerInputs,
    ) -> Result<(), CallError> {
        let raw = &request.raw;
        // SAFETY: a non-NULL session pointer borrows the live request (see `AbiRequest`).
        let session = unsafe { raw.session.as_ref() };
        let mut flags = 0;
        let mut bit = |on: bool, b: u32| {
            if on {
                flags |= b;
            }
        };
        bit(raw.tracks_prefill_tokens != 0, TRACKS_PREFILL);
        bit(raw.has_expected_output_tokens != 0, HAS_EXPECTED_OUTPUT);
        bit(raw.has_router_temperature_override != 0, HAS_TEMPERATURE);
        let mut strings = (0, u32::MAX);
        let mut trigger = SWITCHYARD_TRIGGER_NONE;
        if let Some(s) = session {
            bit(true, HAS_SESSION);
            bit(s.has_session_final != 0, HAS_SESSION_FINAL);
            bit(s.session_final != 0, SESSION_FINAL);
            bit(s.has_kv_hints != 0, HAS_KV_HINTS);
            bit(s.evict_session != 0, EVICT_SESSION);
            bit(!s.parent_session_id.ptr.is_null(), HAS_PARENT_SESSION);
            trigger = s.input_trigger;
            // SAFETY: the session's strings borrow the live request, `len` bytes each.
            let (id, parent) = unsafe { (abi_bytes(s.session_id), abi_bytes(s.parent_session_id)) };
            if id.len() + parent.len() > STRING_BYTES {
                return Err(CallError::new(
                    Status::InvalidArgument,
                    format!("session ids longer than {STRING_BYTES} bytes together cannot cross to an isolated plugin"),
                ));
            }
            let fields = self.fields();
            fields.strings[..id.len()].copy_from_slice(id);
            fields.strings[id.len()..id.len() + parent.len()].copy_from_slice(parent);
            strings = (id.len() as u32, parent.len() as u32);
        }
        let attributes = request
            .attributes()
            .filter(|_| declared.contains(WorkerInputs::ATTRIBUTES));
        let mut encoded = (0, 0);
        if let Some(attributes) = attributes {
            // After the session ids (the parent's length is `u32::MAX` without a session).
            let parent = if strings.1 == u32::MAX { 0 } else { strings.1 };
            let at = (strings.0 + parent) as usize;
            let fields = self.fields();
            let len = encode_attributes(&attributes, &mut fields.strings[at..]).ok_or_else(|| {
                CallError::new(
                    Status::InvalidArgument,
                    format!("the request's attributes and session ids take more than {STRING_BYTES} bytes together and cannot cross to an isolated plugin"),
                )
            })?;
            bit(true, HAS_ATTRIBUTES);
            encoded = (at as u32, len as u32);
        }
        let fields = self.fields();
        fields.attributes_at = encoded.0;
        fields.attributes_len = encoded.1;
        fields.block_size = raw.block_size;
        fields.strict_priority = raw.strict_priority;
        fields.request_blocks = raw.request_blocks;
        fields.expected_output_tokens = raw.expected_output_tokens;
        fields.priority_jump = raw.priority_jump;
        fields.router_temperature_override = raw.router_temperature_override;
        fields.flags = flags;
        fields.input_trigger = trigger;
        fields.session_id_len = strings.0;
        fields.parent_session_id_len = strings.1;
        fields.affinity_worker_id = raw.affinity_worker_id;
        fields.affinity_dp_rank = raw.affinity_dp_rank;
        fields.affinity_mode = raw.affinity_mode;
        Ok(())
    }

    /// The answer's status, with the plugin's message when it is not OK.
    pub fn read_status(&mut self) -> Result<(), CallError> {
        let fields = self.fields();
        if fields.status == Status::Ok.code() {
            return Ok(());
        }
        let len = (fields.error_len as usize).min(ERROR_BYTES);
        let message = String::from_utf8_lossy(&fields.error[..len]).into_owned();
        Err(CallError::new(
            Status::from_code(fields.status),
            if message.is_empty() {
                "(the plugin gave no message)".to_owned()
            } else {
                message
            },
        ))
    }

    pub fn read_keep(&mut self, keep: &mut [u8]) {
        let n = keep.len();
        keep.copy_from_slice(self.column::<u8>(Col::Keep, n));
    }

    pub fn read_costs(&mut self, costs: &mut [f64]) {
        let n = costs.len();
        costs.copy_from_slice(self.column::<f64>(Col::OutCosts, n));
    }

    pub fn read_row(&mut self) -> usize {
        usize::try_from(self.fields().row).unwrap_or(usize::MAX)
    }

    /// The admitter's answer, checked as an in-process one is (lengths clamped first).
    pub fn read_admission(&mut self) -> Result<Admission, CallError> {
        let answer = &self.fields().admission;
        let tenant = (answer.tenant_len != u32::MAX)
            .then(|| &answer.text[..(answer.tenant_len as usize).min(MAX_TENANT_BYTES + 1)]);
        let message_len = (answer.message_len as usize).min(ERROR_BYTES);
        AdmissionFields {
            verdict: answer.verdict,
            priority: (answer.has_priority != 0).then_some(answer.priority),
            tenant,
            max_wait_ms: answer.max_wait_ms,
            status: answer.status,
            retry_after_seconds: answer.retry_after_seconds,
            message: &answer.text[MAX_TENANT_BYTES..MAX_TENANT_BYTES + message_len],
        }
        .checked()
    }
}

/// The call's fields in the region at `base`.
///
/// # Safety (of using the pointer)
/// `base` is a region as `SharedCall::new` requires; `CallFields` follows the sync words,
/// and any bit pattern is a valid `CallFields`.
fn fields_ptr(base: NonNull<u8>) -> *mut CallFields {
    base.as_ptr()
        .wrapping_add(std::mem::size_of::<SyncWords>())
        .cast::<CallFields>()
}

/// Column `col` of the region at `base`, its first `len` elements (at most its capacity).
///
/// # Safety
/// `base` is a region laid out by `layout` (`SharedCall::new`), `T` is the column's
/// element type, and no other live borrow covers the column mutably.
unsafe fn view<'r, T: Copy>(
    base: NonNull<u8>,
    layout: &CallLayout,
    col: Col,
    len: usize,
) -> &'r [T] {
    // SAFETY: per this function's contract.
    unsafe { view_mut(base, layout, col, len) }
}

/// # Safety
/// As `view`, and no other live borrow covers the column at all.
unsafe fn view_mut<'r, T: Copy>(
    base: NonNull<u8>,
    layout: &CallLayout,
    col: Col,
    len: usize,
) -> &'r mut [T] {
    let capacity = match col {
        Col::LabelBytes | Col::EngineBytes => layout.label_bytes,
        _ => layout.rows,
    };
    // SAFETY: the layout placed `capacity` elements of the column's width at a 64-aligned
    // offset inside the region; at most that many are viewed.
    unsafe {
        std::slice::from_raw_parts_mut(
            base.as_ptr().add(layout.offsets[col as usize]).cast::<T>(),
            len.min(capacity),
        )
    }
}

/// `src` into `dst`, as many as both hold (a column shorter than the candidates, which
/// the ABI view would have passed as NULL, leaves the rest as it was).
fn copy<T: Copy>(dst: &mut [T], src: &[T]) {
    let n = dst.len().min(src.len());
    dst[..n].copy_from_slice(&src[..n]);
}

/// # Safety
/// `s.ptr` is NULL or points to `s.len` readable bytes.
unsafe fn abi_bytes<'a>(s: switchyard_str) -> &'a [u8] {
    if s.ptr.is_null() {
        &[]
    } else {
        // SAFETY: per this function's contract.
        unsafe { std::slice::from_raw_parts(s.ptr.cast(), s.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_cross_whole_or_not_at_all() {
        let attributes = RequestAttributes {
            request_id: "r-1".into(),
            model: "m".into(),
            lora_adapter: Some("sql".into()),
            tenant: None,
            headers: vec![
                ("x-zone".into(), "a".into()),
                ("x-empty".into(), String::new()),
            ],
        };
        let mut out = [0u8; 256];
        let len = encode_attributes(&attributes, &mut out).unwrap();
        assert_eq!(decode_attributes(&out[..len]), Some(attributes.clone()));
        assert_eq!(encode_attributes(&attributes, &mut out[..len - 1]), None);
        assert_eq!(
            decode_attributes(&out[..len - 1]).map(|a| a.headers.len()),
            Some(1)
        );
    }

    #[test]
    fn columns_do_not_overlap_and_stay_aligned() {
        for rows in [1, 7, 1024, 65_536] {
            let layout = CallLayout::new(rows, 4096);
            let widths = [8, 4, 4, 4, 4, 4, 8, 8, 4, 8, 8, 8, 1, 4, 1, 40, 4, 1];
            for (i, width) in widths.iter().enumerate() {
                assert_eq!(layout.offsets[i] % 64, 0);
                let len = if [14, 17].contains(&i) { 4096 } else { rows };
                let end = layout.offsets[i] + width * len;
                let next = layout.offsets.get(i + 1).copied().unwrap_or(layout.size);
                assert!(end <= next, "column {i} runs into the next");
            }
            assert_eq!(layout.size % 4096, 0);
        }
    }
}
