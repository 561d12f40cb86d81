//! The candidates of one request: index-aligned columns (the ABI's structure of arrays).
//!
//! What does not depend on the request (identity, booked load, routing, labels) is a
//! [`KeptColumns`]: the router keeps one per partition up to date as bookings change and
//! lends it to each selection (shared, never written while lent), so a request writes
//! only what depends on it: its cache overlaps and decode cost. A filter that drops rows
//! compacts into this set's own buffers; one that drops none costs nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use switchyard_plugin_sdk::{CandidateCache, CandidateLoad, WorkerId, WorkerInputs};

use super::columns::{KeepBits, RequestColumns};
use switchyard_plugin_host::plugin::{Columns, EngineReport, Labels};

/// The request-independent columns of a set of workers, index-aligned.
#[derive(Clone, Debug, Default)]
pub struct KeptColumns {
    pub worker_id: Vec<u64>,
    pub dp_rank: Vec<u32>,
    pub active_prefill_tokens: Vec<u64>,
    /// Decode blocks already booked; a request's decode cost adds its uncached blocks.
    pub active_decode_blocks: Vec<u64>,
    pub active_requests: Vec<u32>,
    /// NaN: no preferred-routing multiplier.
    pub preferred_taint_multiplier: Vec<f64>,
    /// Shared, so that copying the columns (while a selection reads the previous ones)
    /// does not touch every worker's labels.
    pub labels: Arc<Vec<Arc<Labels>>>,
    /// Each worker's engine report (ENGINE): shared cells the metrics scraper writes, so
    /// a new sample reaches the next selection without touching these columns.
    pub engine: Arc<Vec<Arc<EngineReport>>>,
}

impl KeptColumns {
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

    /// The row of `worker`, if it is one of these.
    pub fn row_of(&self, worker: WorkerId) -> Option<usize> {
        self.worker_id
            .iter()
            .zip(&self.dp_rank)
            .position(|(&id, &rank)| id == worker.worker_id && rank == worker.dp_rank)
    }

    /// Sets a row's booked load.
    pub fn set_load(&mut self, row: usize, prefill_tokens: u64, decode_blocks: u64, requests: u32) {
        if let (Some(p), Some(d), Some(a)) = (
            self.active_prefill_tokens.get_mut(row),
            self.active_decode_blocks.get_mut(row),
            self.active_requests.get_mut(row),
        ) {
            (*p, *d, *a) = (prefill_tokens, decode_blocks, requests);
        }
    }

    /// Empties every column, keeping their buffers.
    pub fn clear(&mut self) {
        self.worker_id.clear();
        self.dp_rank.clear();
        self.active_prefill_tokens.clear();
        self.active_decode_blocks.clear();
        self.active_requests.clear();
        self.preferred_taint_multiplier.clear();
        Arc::make_mut(&mut self.labels).clear();
        Arc::make_mut(&mut self.engine).clear();
    }

    /// Becomes a copy of `other`, reusing these buffers.
    pub fn copy_from(&mut self, other: &KeptColumns) {
        self.worker_id.clone_from(&other.worker_id);
        self.dp_rank.clone_from(&other.dp_rank);
        self.active_prefill_tokens
            .clone_from(&other.active_prefill_tokens);
        self.active_decode_blocks
            .clone_from(&other.active_decode_blocks);
        self.active_requests.clone_from(&other.active_requests);
        self.preferred_taint_multiplier
            .clone_from(&other.preferred_taint_multiplier);
        self.labels = other.labels.clone();
        self.engine = other.engine.clone();
    }
}

/// Every column, holding only the rows the filters so far kept.
#[derive(Default)]
struct Compacted {
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
    labels: Vec<Arc<Labels>>,
    engine: Vec<Arc<EngineReport>>,
}

impl Compacted {
    /// Becomes the rows of `from` whose `keep` byte is non-zero, in the groups `groups`
    /// (identity always).
    fn gather(&mut self, from: &Columns<'_>, keep: &[u8], bits: &KeepBits, groups: WorkerInputs) {
        fn pick<T: Copy>(to: &mut Vec<T>, from: &[T], bits: &KeepBits, wanted: bool) {
            match wanted {
                true => bits.compact(to, from),
                false => to.clear(),
            }
        }
        let cache = groups.contains(WorkerInputs::CACHE);
        let load = groups.contains(WorkerInputs::LOAD);
        let routing = groups.contains(WorkerInputs::ROUTING);
        pick(&mut self.worker_id, from.worker_id, bits, true);
        pick(&mut self.dp_rank, from.dp_rank, bits, true);
        pick(
            &mut self.device_overlap_blocks,
            from.device_overlap_blocks,
            bits,
            cache,
        );
        pick(
            &mut self.host_overlap_blocks,
            from.host_overlap_blocks,
            bits,
            cache,
        );
        pick(
            &mut self.disk_overlap_blocks,
            from.disk_overlap_blocks,
            bits,
            cache,
        );
        pick(
            &mut self.shared_beyond_device_blocks,
            from.shared_beyond_device_blocks,
            bits,
            cache,
        );
        pick(
            &mut self.active_prefill_tokens,
            from.active_prefill_tokens,
            bits,
            load,
        );
        pick(
            &mut self.decode_cost_blocks,
            from.decode_cost_blocks,
            bits,
            load,
        );
        pick(&mut self.active_requests, from.active_requests, bits, load);
        pick(
            &mut self.preferred_taint_multiplier,
            from.preferred_taint_multiplier,
            bits,
            routing,
        );
        self.labels.clear();
        if groups.contains(WorkerInputs::LABELS) {
            let kept = from.labels.iter().zip(keep).filter(|(_, &k)| k != 0);
            self.labels.extend(kept.map(|(labels, _)| labels.clone()));
        }
        self.engine.clear();
        if groups.contains(WorkerInputs::ENGINE) {
            let kept = from.engine.iter().zip(keep).filter(|(_, &k)| k != 0);
            self.engine.extend(kept.map(|(engine, _)| engine.clone()));
        }
    }
}

/// The candidates of one request, as index-aligned arrays (the ABI's layout). Only the
/// groups in `groups` are filled.
pub struct Candidates {
    groups: WorkerInputs,
    /// The request-independent columns: a partition's, lent for this request, or this
    /// set's own when filled from rows.
    kept: Arc<KeptColumns>,
    /// This set's own kept columns while `kept` is lent.
    own: Option<Arc<KeptColumns>>,
    request: RequestColumns,
    /// Two sets of compacted columns: a filter's survivors are gathered from the current
    /// columns into the other one.
    compacted: [Compacted; 2],
    /// Which of `compacted` holds the columns now; none: `kept` and `request` do.
    current: Option<usize>,
    /// The last filter's keep mask as bits, read once for every column.
    bits: KeepBits,
    /// Changes whenever the contents do (see `Columns::version`).
    version: u64,
}

/// Bits of a version that count changes; the bits above identify the set, so that
/// versions stay unique in the process (a policy may see several threads' sets).
const CHANGE_BITS: u32 = 40;

impl Default for Candidates {
    fn default() -> Self {
        static NEXT_SET: AtomicU64 = AtomicU64::new(1);
        Candidates {
            groups: WorkerInputs::default(),
            kept: Arc::default(),
            own: None,
            request: RequestColumns::default(),
            compacted: Default::default(),
            current: None,
            bits: KeepBits::default(),
            version: NEXT_SET.fetch_add(1, Ordering::Relaxed) << CHANGE_BITS,
        }
    }
}

/// Everything known about one candidate but its labels (`Candidates::fill_labels`);
/// groups not computed are left at their defaults. `Copy`, so the per-request fill is a
/// plain copy per row.
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

/// `n` rows of `column`'s spare capacity when `wanted` (the column is emptied either
/// way): columns are written in place, without a zero-fill first, and committed once
/// every row is written.
fn spare<T>(column: &mut Vec<T>, wanted: bool, n: usize) -> &mut [std::mem::MaybeUninit<T>] {
    column.clear();
    if wanted {
        column.reserve(n);
        &mut column.spare_capacity_mut()[..n]
    } else {
        &mut []
    }
}

/// # Safety
/// When `wanted`, rows `0..filled` of `column`'s spare capacity were written.
unsafe fn commit<T>(column: &mut Vec<T>, wanted: bool, filled: usize) {
    if wanted {
        // SAFETY: per this function's contract.
        unsafe { column.set_len(filled) };
    }
}

impl Candidates {
    /// Fills the set from `rows` for a request that needs `groups`, in one pass over the
    /// rows writing each needed column in place (buffers are reused). For callers that
    /// hold rows (tools, tests); the router lends kept columns instead (`lend`).
    pub fn fill<I>(&mut self, groups: WorkerInputs, rows: I)
    where
        I: IntoIterator<Item = CandidateRow>,
        I::IntoIter: ExactSizeIterator,
    {
        let rows = rows.into_iter();
        let n = rows.len();
        self.start(groups);
        let cache = groups.contains(WorkerInputs::CACHE);
        let load = groups.contains(WorkerInputs::LOAD);
        let routing = groups.contains(WorkerInputs::ROUTING);
        self.release();
        // Unique once given back: no copy is made.
        let kept = Arc::make_mut(&mut self.kept);
        // Set by `fill_labels`, if the group is wanted.
        Arc::make_mut(&mut kept.labels).clear();
        Arc::make_mut(&mut kept.engine).clear();
        kept.active_decode_blocks.clear();
        let worker_id = spare(&mut kept.worker_id, true, n);
        let dp_rank = spare(&mut kept.dp_rank, true, n);
        let prefill = spare(&mut kept.active_prefill_tokens, load, n);
        let active = spare(&mut kept.active_requests, load, n);
        let taint = spare(&mut kept.preferred_taint_multiplier, routing, n);
        let request = &mut self.request;
        let device = spare(&mut request.device_overlap_blocks, cache, n);
        let host = spare(&mut request.host_overlap_blocks, cache, n);
        let disk = spare(&mut request.disk_overlap_blocks, cache, n);
        let shared = spare(&mut request.shared_beyond_device_blocks, cache, n);
        let decode = spare(&mut request.decode_cost_blocks, load, n);
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
        // SAFETY: rows 0..filled of each wanted column were written above.
        unsafe {
            let kept = Arc::make_mut(&mut self.kept);
            commit(&mut kept.worker_id, true, filled);
            commit(&mut kept.dp_rank, true, filled);
            commit(&mut kept.active_prefill_tokens, load, filled);
            commit(&mut kept.active_requests, load, filled);
            commit(&mut kept.preferred_taint_multiplier, routing, filled);
            let request = &mut self.request;
            commit(&mut request.device_overlap_blocks, cache, filled);
            commit(&mut request.host_overlap_blocks, cache, filled);
            commit(&mut request.disk_overlap_blocks, cache, filled);
            commit(&mut request.shared_beyond_device_blocks, cache, filled);
            commit(&mut request.decode_cost_blocks, load, filled);
        }
    }

    /// Sets the LABELS column, one entry per row in fill order, when the set holds that
    /// group (otherwise does nothing); rows past the given labels have none. Kept apart
    /// from `fill`: labels are reference-counted, and rows stay plain copies.
    pub fn fill_labels(&mut self, labels: impl IntoIterator<Item = Arc<Labels>>) {
        self.touch();
        let wanted = self.groups.contains(WorkerInputs::LABELS);
        let kept = self.own_kept();
        let rows = kept.len();
        let column = Arc::make_mut(&mut kept.labels);
        column.clear();
        if wanted {
            column.extend(labels.into_iter().take(rows));
            column.resize_with(rows, Labels::none);
        }
    }

    /// Sets the ENGINE column as `fill_labels` sets LABELS; rows past the given reports
    /// have none.
    pub fn fill_engine(&mut self, engine: impl IntoIterator<Item = Arc<EngineReport>>) {
        self.touch();
        let wanted = self.groups.contains(WorkerInputs::ENGINE);
        let kept = self.own_kept();
        let rows = kept.len();
        let column = Arc::make_mut(&mut kept.engine);
        column.clear();
        if wanted {
            column.extend(engine.into_iter().take(rows));
            column.resize_with(rows, EngineReport::none);
        }
    }

    /// Starts a request over `kept`, a partition's columns, lent until `release` (or the
    /// next fill): nothing of them is copied. `fill_request` then writes what depends on
    /// the request.
    pub fn lend(&mut self, groups: WorkerInputs, kept: Arc<KeptColumns>) {
        self.start(groups);
        let own = std::mem::replace(&mut self.kept, kept);
        if self.own.is_none() {
            self.own = Some(own);
        }
    }

    /// Writes the request's columns for the lent rows: `overlaps` writes each row's
    /// device, host and disk overlaps into the three columns it is given (one value per
    /// lent row) and returns the fleet prefix; the blocks shared beyond the device and,
    /// with LOAD, the decode cost (booked blocks plus the request's blocks not cached on
    /// the device) follow from them.
    #[inline]
    pub fn fill_request(
        &mut self,
        request_blocks: u64,
        overlaps: impl FnOnce([&mut [u32]; 3]) -> u32,
    ) {
        self.touch();
        let cache = self.groups.contains(WorkerInputs::CACHE);
        let load = self.groups.contains(WorkerInputs::LOAD);
        let kept = &*self.kept;
        let booked = load.then_some(&kept.active_decode_blocks[..]);
        self.request
            .write(kept.len(), cache, booked, request_blocks, overlaps);
    }

    /// Gives back lent columns (their partition can then update them in place).
    pub fn release(&mut self) {
        if let Some(own) = self.own.take() {
            self.kept = own;
        }
    }

    /// The request-independent columns of these candidates (lent or own).
    pub fn kept(&self) -> &KeptColumns {
        &self.kept
    }

    /// Each row's device-cache overlap in blocks, as `fill_request` wrote it (every
    /// request's, whatever groups the policy reads).
    pub fn device_overlaps(&self) -> &[u32] {
        &self.request.device_overlap_blocks
    }

    /// The device-cache overlap `fill_request` wrote for `worker` (0 if not a row).
    pub fn device_overlap(&self, worker: WorkerId) -> u32 {
        self.kept
            .row_of(worker)
            .and_then(|row| self.request.device_overlap_blocks.get(row).copied())
            .unwrap_or(0)
    }

    fn start(&mut self, groups: WorkerInputs) {
        self.groups = groups;
        self.current = None;
        self.touch();
    }

    /// This set's own kept columns, lent ones given back first.
    fn own_kept(&mut self) -> &mut KeptColumns {
        self.release();
        // Unique once given back: no copy is made.
        Arc::make_mut(&mut self.kept)
    }

    pub fn len(&self) -> usize {
        match self.current {
            Some(i) => self.compacted[i].worker_id.len(),
            None => self.kept.len(),
        }
    }

    /// The contents changed: a new version (no shared counter on the request path).
    fn touch(&mut self) {
        let set = self.version >> CHANGE_BITS << CHANGE_BITS;
        let changes = (self.version + 1) & ((1 << CHANGE_BITS) - 1);
        self.version = set | changes;
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn worker(&self, row: usize) -> WorkerId {
        let columns = self.columns(None);
        WorkerId {
            worker_id: columns.worker_id[row],
            dp_rank: columns.dp_rank[row],
        }
    }

    /// Keeps the rows whose `keep` byte is non-zero, in order. Only identity and the groups
    /// in `still_needed` are kept; the others are dropped (and read as absent). The rows
    /// are gathered into this set's own buffers: lent columns are never written.
    pub fn retain(&mut self, keep: &[u8], still_needed: WorkerInputs) {
        let keep = &keep[..self.len().min(keep.len())];
        self.touch();
        self.groups = WorkerInputs::from_bits(self.groups.bits() & still_needed.bits());
        let into = match self.current {
            Some(i) => 1 - i,
            None => 0,
        };
        // Taken out for the gather (moving the buffers, not copying them), so the current
        // columns can be read meanwhile.
        let mut compacted = std::mem::take(&mut self.compacted[into]);
        self.bits.read(keep);
        compacted.gather(&self.columns(None), keep, &self.bits, self.groups);
        self.compacted[into] = compacted;
        self.current = Some(into);
    }

    /// The columns as the boundary hands them to components; `costs` for pickers.
    pub fn columns<'a>(&'a self, costs: Option<&'a [f64]>) -> Columns<'a> {
        if let Some(i) = self.current {
            let c = &self.compacted[i];
            return Columns {
                inputs: self.groups,
                version: self.version,
                worker_id: &c.worker_id,
                dp_rank: &c.dp_rank,
                device_overlap_blocks: &c.device_overlap_blocks,
                host_overlap_blocks: &c.host_overlap_blocks,
                disk_overlap_blocks: &c.disk_overlap_blocks,
                shared_beyond_device_blocks: &c.shared_beyond_device_blocks,
                active_prefill_tokens: &c.active_prefill_tokens,
                decode_cost_blocks: &c.decode_cost_blocks,
                active_requests: &c.active_requests,
                preferred_taint_multiplier: &c.preferred_taint_multiplier,
                labels: &c.labels,
                engine: &c.engine,
                costs,
            };
        }
        let (kept, request) = (&*self.kept, &self.request);
        Columns {
            inputs: self.groups,
            version: self.version,
            worker_id: &kept.worker_id,
            dp_rank: &kept.dp_rank,
            device_overlap_blocks: &request.device_overlap_blocks,
            host_overlap_blocks: &request.host_overlap_blocks,
            disk_overlap_blocks: &request.disk_overlap_blocks,
            shared_beyond_device_blocks: &request.shared_beyond_device_blocks,
            active_prefill_tokens: &kept.active_prefill_tokens,
            decode_cost_blocks: &request.decode_cost_blocks,
            active_requests: &kept.active_requests,
            preferred_taint_multiplier: &kept.preferred_taint_multiplier,
            labels: &kept.labels,
            engine: &kept.engine,
            costs,
        }
    }
}
