//! The candidates of one request: index-aligned columns (the ABI's structure of arrays),
//! filled in one pass from the router's rows and compacted in place by filters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use switchyard_plugin_sdk::{CandidateCache, CandidateLoad, WorkerId, WorkerInputs};

use crate::plugin::{Columns, Labels};

/// The candidates of one request, as index-aligned arrays (the ABI's layout). Only the
/// groups in `groups` are filled.
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
    labels: Vec<Arc<Labels>>,
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
            worker_id: Vec::new(),
            dp_rank: Vec::new(),
            device_overlap_blocks: Vec::new(),
            host_overlap_blocks: Vec::new(),
            disk_overlap_blocks: Vec::new(),
            shared_beyond_device_blocks: Vec::new(),
            active_prefill_tokens: Vec::new(),
            decode_cost_blocks: Vec::new(),
            active_requests: Vec::new(),
            preferred_taint_multiplier: Vec::new(),
            labels: Vec::new(),
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
        self.touch();
        // Set by `fill_labels`, if the group is wanted.
        self.labels.clear();
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

    /// Sets the LABELS column, one entry per row in fill order, when the set holds that
    /// group (otherwise does nothing); rows past the given labels have none. Kept apart
    /// from `fill`: labels are reference-counted, and rows stay plain copies.
    pub fn fill_labels(&mut self, labels: impl IntoIterator<Item = Arc<Labels>>) {
        self.touch();
        self.labels.clear();
        if !self.groups.contains(WorkerInputs::LABELS) {
            return;
        }
        let rows = self.len();
        self.labels.extend(labels.into_iter().take(rows));
        self.labels.resize_with(rows, Labels::none);
    }

    pub fn len(&self) -> usize {
        self.worker_id.len()
    }

    /// The contents changed: a new version (no shared counter on the request path).
    fn touch(&mut self) {
        let set = self.version >> CHANGE_BITS << CHANGE_BITS;
        let changes = (self.version + 1) & ((1 << CHANGE_BITS) - 1);
        self.version = set | changes;
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
    pub(super) fn retain(&mut self, keep: &[u8], still_needed: WorkerInputs) {
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
        self.touch();
        self.groups = WorkerInputs::from_bits(self.groups.bits() & still_needed.bits());
        let cache = self.groups.contains(WorkerInputs::CACHE);
        let load = self.groups.contains(WorkerInputs::LOAD);
        let routing = self.groups.contains(WorkerInputs::ROUTING);
        if self.groups.contains(WorkerInputs::LABELS) {
            let mut verdicts = keep.iter();
            self.labels
                .retain(|_| verdicts.next().is_some_and(|&k| k != 0));
        } else {
            self.labels.clear();
        }
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

    /// The columns as the boundary hands them to components; `costs` for pickers.
    pub fn columns<'a>(&'a self, costs: Option<&'a [f64]>) -> Columns<'a> {
        Columns {
            inputs: self.groups,
            version: self.version,
            worker_id: &self.worker_id,
            dp_rank: &self.dp_rank,
            device_overlap_blocks: &self.device_overlap_blocks,
            host_overlap_blocks: &self.host_overlap_blocks,
            disk_overlap_blocks: &self.disk_overlap_blocks,
            shared_beyond_device_blocks: &self.shared_beyond_device_blocks,
            active_prefill_tokens: &self.active_prefill_tokens,
            decode_cost_blocks: &self.decode_cost_blocks,
            active_requests: &self.active_requests,
            preferred_taint_multiplier: &self.preferred_taint_multiplier,
            labels: &self.labels,
            costs,
        }
    }
}
