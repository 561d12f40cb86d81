//! Dynamo's per-worker inputs (`WorkerCandidate`, the picker's `WorkerInputView`), read
//! from the SDK's columns in Dynamo's numeric types.

use switchyard_plugin_sdk as sdk;

use crate::protocols::WorkerWithDpRank;

/// The optional input groups a component reads (Dynamo's `CACHE`, `LOAD`, `ROUTING`;
/// the SDK's other groups are accepted and not read by Dynamo's accessors).
pub use sdk::WorkerInputs;

/// One worker's CACHE group: raw tier counts in blocks (a missing tier reads zero). Held
/// as the router's integers and converted by the accessors, so a component converts only
/// what it reads and a picker's rows are 16 bytes to fill, not 32.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WorkerCacheInput {
    device_overlap_blocks: u32,
    host_overlap_blocks: u32,
    disk_overlap_blocks: u32,
    shared_beyond_device_blocks: u32,
}

impl WorkerCacheInput {
    /// Device-resident prefix overlap in blocks.
    #[inline]
    pub fn device_overlap_blocks(&self) -> f64 {
        f64::from(self.device_overlap_blocks)
    }

    /// Host-pinned prefix overlap in blocks.
    #[inline]
    pub fn host_overlap_blocks(&self) -> f64 {
        f64::from(self.host_overlap_blocks)
    }

    /// Disk prefix overlap in blocks.
    #[inline]
    pub fn disk_overlap_blocks(&self) -> f64 {
        f64::from(self.disk_overlap_blocks)
    }

    /// Shared-cache hits beyond the device-resident prefix.
    #[inline]
    pub fn shared_beyond_device_blocks(&self) -> u32 {
        self.shared_beyond_device_blocks
    }
}

/// One worker's LOAD group, held as the router's integers as for the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WorkerLoadInput {
    active_prefill_tokens: u64,
    decode_cost_blocks: u64,
    active_requests: u32,
}

impl WorkerLoadInput {
    /// Tokens active in the worker's prefill stage.
    #[inline]
    pub fn active_prefill_tokens(&self) -> usize {
        usize::try_from(self.active_prefill_tokens).unwrap_or(usize::MAX)
    }

    /// Projected active decode footprint in blocks, including this request's.
    #[inline]
    pub fn decode_cost_blocks(&self) -> f64 {
        self.decode_cost_blocks as f64
    }

    /// Requests active on the worker.
    #[inline]
    pub fn active_requests(&self) -> usize {
        self.active_requests as usize
    }
}

/// One worker's ROUTING group.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WorkerRoutingInput {
    preferred_taint_multiplier: Option<f64>,
}

impl WorkerRoutingInput {
    /// The cost multiplier from preferred routing constraints, if any.
    #[inline]
    pub fn preferred_taint_multiplier(&self) -> Option<f64> {
        self.preferred_taint_multiplier
    }
}

/// One eligible worker, as a filter or scorer sees it.
#[derive(Clone, Copy, Debug)]
pub struct WorkerCandidate {
    worker: WorkerWithDpRank,
    inputs: WorkerInputs,
    cache: WorkerCacheInput,
    load: WorkerLoadInput,
    routing: WorkerRoutingInput,
}

impl WorkerCandidate {
    /// The worker ID and data-parallel rank.
    #[inline]
    pub fn worker(&self) -> WorkerWithDpRank {
        self.worker
    }

    /// The CACHE group; `None` unless the component requested it.
    #[inline]
    pub fn cache(&self) -> Option<&WorkerCacheInput> {
        self.inputs
            .contains(WorkerInputs::CACHE)
            .then_some(&self.cache)
    }

    /// The LOAD group; `None` unless the component requested it.
    #[inline]
    pub fn load(&self) -> Option<&WorkerLoadInput> {
        self.inputs
            .contains(WorkerInputs::LOAD)
            .then_some(&self.load)
    }

    /// The ROUTING group; `None` unless the component requested it.
    #[inline]
    pub fn routing(&self) -> Option<&WorkerRoutingInput> {
        self.inputs
            .contains(WorkerInputs::ROUTING)
            .then_some(&self.routing)
    }

    /// The candidate in row `row` of the SDK's per-candidate view.
    #[inline]
    pub fn from_switchyard(candidate: &sdk::WorkerCandidate<'_>) -> Self {
        let mut inputs = WorkerInputs::NONE;
        let cache = candidate
            .cache()
            .map_or_else(WorkerCacheInput::default, |c| {
                inputs = inputs | WorkerInputs::CACHE;
                WorkerCacheInput {
                    device_overlap_blocks: c.device_overlap_blocks,
                    host_overlap_blocks: c.host_overlap_blocks,
                    disk_overlap_blocks: c.disk_overlap_blocks,
                    shared_beyond_device_blocks: c.shared_beyond_device_blocks,
                }
            });
        let load = candidate.load().map_or_else(WorkerLoadInput::default, |l| {
            inputs = inputs | WorkerInputs::LOAD;
            WorkerLoadInput {
                active_prefill_tokens: l.active_prefill_tokens,
                decode_cost_blocks: l.decode_cost_blocks,
                active_requests: l.active_requests,
            }
        });
        let routing =
            candidate
                .preferred_taint_multiplier()
                .map_or_else(WorkerRoutingInput::default, |m| {
                    inputs = inputs | WorkerInputs::ROUTING;
                    WorkerRoutingInput {
                        preferred_taint_multiplier: m,
                    }
                });
        WorkerCandidate {
            worker: candidate.worker().into(),
            inputs,
            cache,
            load,
            routing,
        }
    }
}

/// The SDK's candidate columns, read once per call, from which each row's
/// [`WorkerCandidate`] is made on the stack (what the adapters hand to Dynamo's filters
/// and scorers).
#[derive(Clone, Copy)]
pub struct CandidateRows<'a> {
    inputs: WorkerInputs,
    worker_ids: &'a [u64],
    dp_ranks: &'a [u32],
    cache: Option<sdk::CacheInputs<'a>>,
    load: Option<sdk::LoadInputs<'a>>,
    routing: Option<&'a [f64]>,
}

impl<'a> CandidateRows<'a> {
    #[inline]
    pub fn new(candidates: &sdk::WorkerCandidates<'a>) -> Self {
        let (cache, load) = (candidates.cache(), candidates.load());
        let routing = candidates.routing().map(|r| r.preferred_taint_multiplier);
        let mut inputs = WorkerInputs::NONE;
        for (present, group) in [
            (cache.is_some(), WorkerInputs::CACHE),
            (load.is_some(), WorkerInputs::LOAD),
            (routing.is_some(), WorkerInputs::ROUTING),
        ] {
            if present {
                inputs = inputs | group;
            }
        }
        CandidateRows {
            inputs,
            worker_ids: candidates.worker_ids(),
            dp_ranks: candidates.dp_ranks(),
            cache,
            load,
            routing,
        }
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.worker_ids.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.worker_ids.is_empty()
    }

    /// The worker-id, rank and taint columns (the current shape's views borrow them).
    #[inline]
    pub(crate) fn identity_columns(&self) -> (&'a [u64], &'a [u32], Option<&'a [f64]>) {
        (self.worker_ids, self.dp_ranks, self.routing)
    }

    /// The CACHE columns, when present (the current shape's views copy them).
    #[inline]
    pub(crate) fn cache_columns(&self) -> Option<sdk::CacheInputs<'a>> {
        self.cache
    }

    /// The LOAD columns, when present.
    #[inline]
    pub(crate) fn load_columns(&self) -> Option<sdk::LoadInputs<'a>> {
        self.load
    }

    /// Whether the LOAD columns are present.
    #[inline]
    pub fn has_load(&self) -> bool {
        self.load.is_some()
    }

    #[inline(always)]
    pub fn worker(&self, row: usize) -> WorkerWithDpRank {
        WorkerWithDpRank::new(self.worker_ids[row], self.dp_ranks[row])
    }

    #[inline(always)]
    pub fn cache(&self, row: usize) -> WorkerCacheInput {
        self.cache
            .map_or_else(WorkerCacheInput::default, |c| WorkerCacheInput {
                device_overlap_blocks: c.device_overlap_blocks[row],
                host_overlap_blocks: c.host_overlap_blocks[row],
                disk_overlap_blocks: c.disk_overlap_blocks[row],
                shared_beyond_device_blocks: c.shared_beyond_device_blocks[row],
            })
    }

    #[inline(always)]
    pub fn load(&self, row: usize) -> WorkerLoadInput {
        self.load
            .map_or_else(WorkerLoadInput::default, |l| WorkerLoadInput {
                active_prefill_tokens: l.active_prefill_tokens[row],
                decode_cost_blocks: l.decode_cost_blocks[row],
                active_requests: l.active_requests[row],
            })
    }

    #[inline(always)]
    pub fn routing(&self, row: usize) -> WorkerRoutingInput {
        WorkerRoutingInput {
            preferred_taint_multiplier: self.routing.map(|m| m[row]).filter(|m| !m.is_nan()),
        }
    }

    /// Refills `buffer` with the picker's rows (`costs` is index-aligned).
    #[inline]
    pub(crate) fn fill_scored(&self, costs: &[f64], buffer: &mut Vec<ScoredWorkerCandidate>) {
        fill_scored(buffer, self.worker_ids, self.dp_ranks, costs);
    }

    /// The picker's rows: each worker with its total cost (`costs` is index-aligned).
    #[inline]
    pub fn scored<'c>(&self, costs: &'c [f64]) -> impl Iterator<Item = ScoredWorkerCandidate> + 'c
    where
        'a: 'c,
    {
        let (ids, ranks) = (self.worker_ids, self.dp_ranks);
        ids.iter()
            .zip(ranks)
            .zip(costs)
            .map(|((&id, &rank), &cost)| {
                ScoredWorkerCandidate::new(WorkerWithDpRank::new(id, rank), cost)
            })
    }

    /// Refills `buffer` with every row's CACHE group, one zipped pass (no row is
    /// bounds-checked); `false` (and nothing filled) without the group.
    pub(crate) fn fill_cache(&self, buffer: &mut Vec<WorkerCacheInput>) -> bool {
        buffer.clear();
        let Some(c) = self.cache else { return false };
        buffer.extend(
            c.device_overlap_blocks
                .iter()
                .zip(c.host_overlap_blocks)
                .zip(c.disk_overlap_blocks)
                .zip(c.shared_beyond_device_blocks)
                .map(|(((&device, &host), &disk), &shared)| WorkerCacheInput {
                    device_overlap_blocks: device,
                    host_overlap_blocks: host,
                    disk_overlap_blocks: disk,
                    shared_beyond_device_blocks: shared,
                }),
        );
        true
    }

    /// As `fill_cache`, for the LOAD group.
    pub(crate) fn fill_load(&self, buffer: &mut Vec<WorkerLoadInput>) -> bool {
        buffer.clear();
        let Some(l) = self.load else { return false };
        buffer.extend(
            l.active_prefill_tokens
                .iter()
                .zip(l.decode_cost_blocks)
                .zip(l.active_requests)
                .map(|((&prefill, &decode), &active)| WorkerLoadInput {
                    active_prefill_tokens: prefill,
                    decode_cost_blocks: decode,
                    active_requests: active,
                }),
        );
        true
    }

    /// As `fill_cache`, for the ROUTING group (NaN: no multiplier).
    pub(crate) fn fill_routing(&self, buffer: &mut Vec<WorkerRoutingInput>) -> bool {
        buffer.clear();
        let Some(taint) = self.routing else {
            return false;
        };
        buffer.extend(taint.iter().map(|&m| WorkerRoutingInput {
            preferred_taint_multiplier: (!m.is_nan()).then_some(m),
        }));
        true
    }

    /// Row `row` as Dynamo's candidate.
    #[inline(always)]
    pub fn candidate(&self, row: usize) -> WorkerCandidate {
        WorkerCandidate {
            worker: self.worker(row),
            inputs: self.inputs,
            cache: self.cache(row),
            load: self.load(row),
            routing: self.routing(row),
        }
    }
}

/// One picker row: the worker and its total cost.
#[derive(Clone, Copy, Debug, PartialEq)]
// A fixed layout (worker id, rank, 4 bytes of padding, cost: 24 bytes), so the picker
// adapter writes two rows as three 16-byte stores (`fill_scored`).
#[repr(C)]
pub struct ScoredWorkerCandidate {
    worker: WorkerWithDpRank,
    cost: f64,
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<ScoredWorkerCandidate>() == 24);
    assert!(offset_of!(ScoredWorkerCandidate, worker) == 0);
    assert!(offset_of!(ScoredWorkerCandidate, cost) == 16);
    assert!(offset_of!(WorkerWithDpRank, worker_id) == 0);
    assert!(offset_of!(WorkerWithDpRank, dp_rank) == 8);
};

/// Refills `buffer` with the picker's rows: worker `ids[row]`, `ranks[row]` at cost
/// `costs[row]`, for the rows all three hold.
pub(crate) fn fill_scored(
    buffer: &mut Vec<ScoredWorkerCandidate>,
    ids: &[u64],
    ranks: &[u32],
    costs: &[f64],
) {
    let count = ids.len().min(ranks.len()).min(costs.len());
    let (ids, ranks, costs) = (&ids[..count], &ranks[..count], &costs[..count]);
    buffer.clear();
    buffer.reserve(count);
    let paired = write_pairs(&mut buffer.spare_capacity_mut()[..count], ids, ranks, costs);
    // SAFETY: `write_pairs` initialized the first `paired` rows (within the capacity).
    unsafe { buffer.set_len(paired) };
    buffer.extend(
        ids[paired..]
            .iter()
            .zip(&ranks[paired..])
            .zip(&costs[paired..])
            .map(|((&id, &rank), &cost)| {
                ScoredWorkerCandidate::new(WorkerWithDpRank::new(id, rank), cost)
            }),
    );
}

/// Writes rows two at a time, each pair as three 16-byte stores where the plain loop
/// stores six fields (about a third less time per row at 768 rows); the number of rows
/// written (`out`'s rows in pairs, from the start). The columns hold `out.len()` rows.
#[cfg(target_arch = "x86_64")]
fn write_pairs(
    out: &mut [core::mem::MaybeUninit<ScoredWorkerCandidate>],
    ids: &[u64],
    ranks: &[u32],
    costs: &[f64],
) -> usize {
    use core::arch::x86_64::*;
    let pairs = out
        .chunks_exact_mut(2)
        .zip(ids.chunks_exact(2))
        .zip(ranks.chunks_exact(2))
        .zip(costs.chunks_exact(2));
    let mut written = 0;
    for (((out, ids), ranks), costs) in pairs {
        // SAFETY: SSE2 is part of x86_64; each chunk holds two elements, so the loads
        // read within `ids`, `ranks` and `costs`, and the stores write the 48 bytes of
        // `out`'s two rows, laid out as the const assertions above say (the rank
        // zero-extended over the padding).
        unsafe {
            let id = _mm_loadu_si128(ids.as_ptr().cast());
            let rank =
                _mm_unpacklo_epi32(_mm_loadl_epi64(ranks.as_ptr().cast()), _mm_setzero_si128());
            let cost = _mm_castpd_si128(_mm_loadu_pd(costs.as_ptr()));
            let rows = out.as_mut_ptr().cast::<__m128i>();
            _mm_storeu_si128(rows, _mm_unpacklo_epi64(id, rank));
            _mm_storeu_si128(
                rows.add(1),
                _mm_unpacklo_epi64(cost, _mm_unpackhi_epi64(id, id)),
            );
            _mm_storeu_si128(rows.add(2), _mm_unpackhi_epi64(rank, cost));
        }
        written += 2;
    }
    written
}

#[cfg(not(target_arch = "x86_64"))]
fn write_pairs(
    _out: &mut [core::mem::MaybeUninit<ScoredWorkerCandidate>],
    _ids: &[u64],
    _ranks: &[u32],
    _costs: &[f64],
) -> usize {
    0
}

impl ScoredWorkerCandidate {
    #[inline]
    pub fn new(worker: WorkerWithDpRank, cost: f64) -> Self {
        ScoredWorkerCandidate { worker, cost }
    }

    /// The row's worker ID and data-parallel rank.
    #[inline]
    pub fn worker(&self) -> WorkerWithDpRank {
        self.worker
    }

    /// The sum of all scorer contributions for the row.
    #[inline]
    pub fn cost(&self) -> f64 {
        self.cost
    }
}

/// A picker's borrowed, index-aligned view of the scored candidates and the optional
/// groups it requested.
#[derive(Clone, Copy)]
pub struct WorkerInputView<'a> {
    candidates: &'a [ScoredWorkerCandidate],
    cache: Option<&'a [WorkerCacheInput]>,
    load: Option<&'a [WorkerLoadInput]>,
    routing: Option<&'a [WorkerRoutingInput]>,
}

impl<'a> WorkerInputView<'a> {
    /// A view over index-aligned rows (the adapters' buffers, or a test's).
    #[inline]
    pub fn new(
        candidates: &'a [ScoredWorkerCandidate],
        cache: Option<&'a [WorkerCacheInput]>,
        load: Option<&'a [WorkerLoadInput]>,
        routing: Option<&'a [WorkerRoutingInput]>,
    ) -> Self {
        WorkerInputView {
            candidates,
            cache,
            load,
            routing,
        }
    }

    #[inline]
    pub fn candidates(self) -> &'a [ScoredWorkerCandidate] {
        self.candidates
    }

    #[inline]
    pub fn cache(self) -> Option<&'a [WorkerCacheInput]> {
        self.cache
    }

    #[inline]
    pub fn load(self) -> Option<&'a [WorkerLoadInput]> {
        self.load
    }

    #[inline]
    pub fn routing(self) -> Option<&'a [WorkerRoutingInput]> {
        self.routing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paired stores write what the plain loop writes, for even and odd counts and
    /// a reused buffer (shorter, then longer than before).
    #[test]
    fn picker_rows_are_the_columns_row_by_row() {
        let mut buffer = Vec::new();
        for count in [5, 0, 1, 2, 7, 8, 3] {
            let ids: Vec<u64> = (0..count).map(|i| u64::MAX - i).collect();
            let ranks: Vec<u32> = (0..count).map(|i| u32::MAX - i as u32).collect();
            let costs: Vec<f64> = (0..count).map(|i| -0.5 * i as f64).collect();
            fill_scored(&mut buffer, &ids, &ranks, &costs);
            let expected: Vec<_> = (0..count as usize)
                .map(|i| {
                    ScoredWorkerCandidate::new(WorkerWithDpRank::new(ids[i], ranks[i]), costs[i])
                })
                .collect();
            assert_eq!(buffer, expected, "{count} rows");
        }
    }

    /// Rows stop at the shortest column, as the zipped columns did.
    #[test]
    fn picker_rows_stop_at_the_shortest_column() {
        let mut buffer = Vec::new();
        fill_scored(&mut buffer, &[1, 2, 3], &[0, 1, 2], &[0.5, 1.5]);
        assert_eq!(
            buffer,
            [
                ScoredWorkerCandidate::new(WorkerWithDpRank::new(1, 0), 0.5),
                ScoredWorkerCandidate::new(WorkerWithDpRank::new(2, 1), 1.5),
            ]
        );
    }
}
