//! The current shape's input views: a scorer sees the surviving candidates as one batch
//! (`WorkerCandidates`), a filter one `WorkerCandidate<'_>` by value; both borrow rows the
//! adapter fills once per call from the SDK's columns.

use core::fmt;
use core::mem::MaybeUninit;
use core::ops::BitOr;

use switchyard_plugin_sdk as sdk;

use crate::inputs::CandidateRows;
use crate::protocols::WorkerWithDpRank;

/// Optional worker-signal groups a component reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerInputs(u8);

impl WorkerInputs {
    pub const NONE: Self = Self(0);
    /// KV-cache overlap inputs.
    pub const CACHE: Self = Self(1 << 0);
    /// Active-load inputs.
    pub const LOAD: Self = Self(1 << 1);
    /// Preferred-taint routing metadata.
    pub const PREFERRED_TAINT: Self = Self(1 << 2);
    /// Active-request counts (read with the LOAD group here).
    pub const OCCUPANCY: Self = Self(1 << 5);

    #[inline]
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// The SDK groups these map onto.
    #[inline]
    pub(crate) fn to_switchyard(self) -> sdk::WorkerInputs {
        let mut inputs = sdk::WorkerInputs::NONE;
        if self.contains(Self::CACHE) {
            inputs = inputs | sdk::WorkerInputs::CACHE;
        }
        if self.contains(Self::LOAD) || self.contains(Self::OCCUPANCY) {
            inputs = inputs | sdk::WorkerInputs::LOAD;
        }
        if self.contains(Self::PREFERRED_TAINT) {
            inputs = inputs | sdk::WorkerInputs::ROUTING;
        }
        inputs
    }
}

impl BitOr for WorkerInputs {
    type Output = Self;

    #[inline]
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

/// KV-cache overlap values of one worker. Held as the router's integers (16 bytes a row
/// to fill per call instead of 32), converted to Dynamo's types by the accessors, so only
/// what a component reads is converted.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
// A fixed layout (the four `u32` in this order): `fill_cache_rows` writes it.
#[repr(C)]
pub struct WorkerCacheInput {
    device_overlap_blocks: u32,
    host_overlap_blocks: u32,
    disk_overlap_blocks: u32,
    block_size: u32,
}

impl WorkerCacheInput {
    /// The router's cache estimate in blocks and tokens. Switchyard has no weighted
    /// estimate across tiers: this is the device overlap and its tokens.
    #[inline]
    pub fn accounting_cache_estimate(&self) -> (f64, usize) {
        let blocks = self.device_overlap_blocks();
        let tokens = blocks * f64::from(self.block_size);
        (blocks, tokens as usize)
    }

    #[inline]
    pub fn device_overlap_blocks(&self) -> f64 {
        f64::from(self.device_overlap_blocks)
    }

    #[inline]
    pub fn host_overlap_blocks(&self) -> f64 {
        f64::from(self.host_overlap_blocks)
    }

    #[inline]
    pub fn disk_overlap_blocks(&self) -> f64 {
        f64::from(self.disk_overlap_blocks)
    }
}

/// Active-load values of one worker, held as the router's integers as for the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WorkerLoadInput {
    active_prefill_tokens: u64,
    decode_cost_blocks: u64,
    active_requests: u32,
    available: bool,
}

impl WorkerLoadInput {
    /// Whether the router supplied load for this worker (always, when LOAD was declared).
    #[inline]
    pub fn is_available(&self) -> bool {
        self.available
    }

    #[inline]
    pub fn active_prefill_tokens(&self) -> usize {
        usize::try_from(self.active_prefill_tokens).unwrap_or(usize::MAX)
    }

    #[inline]
    pub fn decode_cost_blocks(&self) -> f64 {
        self.decode_cost_blocks as f64
    }

    #[inline]
    pub fn active_requests(&self) -> usize {
        self.active_requests as usize
    }
}

/// The surviving rows as a component sees them: the identity and taint columns borrowed
/// from the router's view, the declared groups materialized in the adapter's buffers.
#[derive(Clone, Copy)]
struct Rows<'a> {
    worker_ids: &'a [u64],
    dp_ranks: &'a [u32],
    cache: &'a [WorkerCacheInput],
    load: &'a [WorkerLoadInput],
    taint: Option<&'a [f64]>,
}

/// One worker, restricted to the component's declared inputs.
#[derive(Clone, Copy)]
pub struct WorkerCandidate<'a> {
    rows: Rows<'a>,
    row: usize,
    inputs: WorkerInputs,
}

impl<'a> WorkerCandidate<'a> {
    #[inline]
    pub fn worker(self) -> WorkerWithDpRank {
        WorkerWithDpRank::new(self.rows.worker_ids[self.row], self.rows.dp_ranks[self.row])
    }

    /// `None` unless the component declared CACHE.
    #[inline]
    pub fn cache(self) -> Option<&'a WorkerCacheInput> {
        if self.inputs.contains(WorkerInputs::CACHE) {
            self.rows.cache.get(self.row)
        } else {
            None
        }
    }

    /// `None` unless the component declared LOAD.
    #[inline]
    pub fn load(self) -> Option<&'a WorkerLoadInput> {
        if self.inputs.contains(WorkerInputs::LOAD) {
            self.rows.load.get(self.row)
        } else {
            None
        }
    }

    /// `None` without PREFERRED_TAINT or without a preference.
    #[inline]
    pub fn preferred_taint_multiplier(self) -> Option<f64> {
        if !self.inputs.contains(WorkerInputs::PREFERRED_TAINT) {
            return None;
        }
        self.rows
            .taint
            .and_then(|taint| taint.get(self.row).copied())
            .filter(|m| !m.is_nan())
    }
}

/// The surviving candidates, one component's view.
#[derive(Clone, Copy)]
pub struct WorkerCandidates<'a> {
    rows: Rows<'a>,
    inputs: WorkerInputs,
}

impl<'a> WorkerCandidates<'a> {
    /// The number of candidates: the cost buffer's length.
    #[inline]
    pub fn len(self) -> usize {
        self.rows.worker_ids.len()
    }

    #[inline]
    pub fn is_empty(self) -> bool {
        self.rows.worker_ids.is_empty()
    }

    #[inline]
    pub fn get(self, row: usize) -> Option<WorkerCandidate<'a>> {
        (row < self.len()).then_some(WorkerCandidate {
            rows: self.rows,
            row,
            inputs: self.inputs,
        })
    }

    #[inline]
    pub fn iter(
        self,
    ) -> impl ExactSizeIterator<Item = WorkerCandidate<'a>> + DoubleEndedIterator + Clone {
        (0..self.len()).map(move |row| WorkerCandidate {
            rows: self.rows,
            row,
            inputs: self.inputs,
        })
    }
}

/// The declared groups of the rows a component is handed, kept across calls (cleared,
/// not freed): a selection allocates nothing once they have grown.
#[derive(Default)]
pub(crate) struct GroupBuffers {
    cache: Vec<WorkerCacheInput>,
    load: Vec<WorkerLoadInput>,
}

impl GroupBuffers {
    /// Refills the declared groups from the router's columns; the candidates over them.
    pub(crate) fn candidates<'a>(
        &'a mut self,
        rows: &CandidateRows<'a>,
        inputs: WorkerInputs,
        block_size: u32,
    ) -> WorkerCandidates<'a> {
        self.fill(rows, inputs, block_size);
        let (worker_ids, dp_ranks, taint) = rows.identity_columns();
        WorkerCandidates {
            rows: Rows {
                worker_ids,
                dp_ranks,
                cache: &self.cache,
                load: &self.load,
                taint,
            },
            inputs,
        }
    }

    /// The one-row candidates of an SDK candidate (the SDK's per-candidate forms; the
    /// router calls the batch ones). `identity` holds its id, rank and taint (NaN: none).
    pub(crate) fn one<'a>(
        &'a mut self,
        candidate: &sdk::WorkerCandidate<'_>,
        identity: &'a mut ([u64; 1], [u32; 1], [f64; 1]),
        inputs: WorkerInputs,
        block_size: u32,
    ) -> WorkerCandidates<'a> {
        let worker = candidate.worker();
        let taint = candidate.preferred_taint_multiplier().flatten();
        *identity = (
            [worker.worker_id],
            [worker.dp_rank],
            [taint.unwrap_or(f64::NAN)],
        );
        self.cache.clear();
        self.load.clear();
        if let Some(cache) = candidate.cache() {
            self.cache.push(WorkerCacheInput {
                device_overlap_blocks: cache.device_overlap_blocks,
                host_overlap_blocks: cache.host_overlap_blocks,
                disk_overlap_blocks: cache.disk_overlap_blocks,
                block_size,
            });
        }
        if let Some(load) = candidate.load() {
            self.load.push(WorkerLoadInput {
                available: true,
                active_prefill_tokens: load.active_prefill_tokens,
                decode_cost_blocks: load.decode_cost_blocks,
                active_requests: load.active_requests,
            });
        }
        WorkerCandidates {
            rows: Rows {
                worker_ids: &identity.0,
                dp_ranks: &identity.1,
                cache: &self.cache,
                load: &self.load,
                taint: Some(&identity.2),
            },
            inputs,
        }
    }

    /// Refills the declared groups, one pass over the router's columns per group (zipped,
    /// so no row is bounds-checked); a declared group the router left out reads zero.
    fn fill(&mut self, rows: &CandidateRows<'_>, inputs: WorkerInputs, block_size: u32) {
        let count = rows.len();
        self.cache.clear();
        self.load.clear();
        if inputs.contains(WorkerInputs::CACHE) {
            match rows.cache_columns() {
                Some(c) => fill_cache_rows(
                    &mut self.cache,
                    [
                        c.device_overlap_blocks,
                        c.host_overlap_blocks,
                        c.disk_overlap_blocks,
                    ],
                    block_size,
                ),
                None => self.cache.resize(
                    count,
                    WorkerCacheInput {
                        block_size,
                        ..WorkerCacheInput::default()
                    },
                ),
            }
        }
        if inputs.contains(WorkerInputs::LOAD) {
            match rows.load_columns() {
                Some(l) => self.load.extend(
                    l.active_prefill_tokens
                        .iter()
                        .zip(l.decode_cost_blocks)
                        .zip(l.active_requests)
                        .map(|((&prefill, &decode), &active)| WorkerLoadInput {
                            active_prefill_tokens: prefill,
                            decode_cost_blocks: decode,
                            active_requests: active,
                            available: true,
                        }),
                ),
                None => self.load.resize(count, WorkerLoadInput::default()),
            }
        }
    }
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<WorkerCacheInput>() == 16);
    assert!(offset_of!(WorkerCacheInput, device_overlap_blocks) == 0);
    assert!(offset_of!(WorkerCacheInput, host_overlap_blocks) == 4);
    assert!(offset_of!(WorkerCacheInput, disk_overlap_blocks) == 8);
    assert!(offset_of!(WorkerCacheInput, block_size) == 12);
};

/// Refills `buffer` with one cache row per row the device, host and disk columns all
/// hold, each with `block_size`.
fn fill_cache_rows(buffer: &mut Vec<WorkerCacheInput>, columns: [&[u32]; 3], block_size: u32) {
    let count = columns.iter().map(|c| c.len()).min().unwrap_or(0);
    let [device, host, disk] = columns.map(|c| &c[..count]);
    buffer.clear();
    buffer.reserve(count);
    let written = write_cache_quads(
        &mut buffer.spare_capacity_mut()[..count],
        [device, host, disk],
        block_size,
    );
    // SAFETY: `write_cache_quads` initialized the first `written` rows (in the capacity).
    unsafe { buffer.set_len(written) };
    buffer.extend(
        device[written..]
            .iter()
            .zip(&host[written..])
            .zip(&disk[written..])
            .map(|((&device, &host), &disk)| WorkerCacheInput {
                device_overlap_blocks: device,
                host_overlap_blocks: host,
                disk_overlap_blocks: disk,
                block_size,
            }),
    );
}

/// Writes rows four at a time: a 4x4 transpose of the three columns and the block size
/// into four 16-byte stores, where the plain loop stores sixteen fields (half the time
/// at 1,024 rows). The number of rows written, from the start; the columns hold
/// `out.len()` rows.
#[cfg(target_arch = "x86_64")]
fn write_cache_quads(
    out: &mut [MaybeUninit<WorkerCacheInput>],
    [device, host, disk]: [&[u32]; 3],
    block_size: u32,
) -> usize {
    use core::arch::x86_64::*;
    // SAFETY: SSE2 is part of x86_64.
    let block = unsafe { _mm_set1_epi32(block_size as i32) };
    let quads = out
        .chunks_exact_mut(4)
        .zip(device.chunks_exact(4))
        .zip(host.chunks_exact(4))
        .zip(disk.chunks_exact(4));
    let mut written = 0;
    for (((out, device), host), disk) in quads {
        // SAFETY: SSE2 is part of x86_64; each chunk holds four elements, so the loads
        // read within the columns and the stores write `out`'s four 16-byte rows, laid
        // out as the const assertions above say.
        unsafe {
            let device = _mm_loadu_si128(device.as_ptr().cast());
            let host = _mm_loadu_si128(host.as_ptr().cast());
            let disk = _mm_loadu_si128(disk.as_ptr().cast());
            // (device, host) and (disk, block) of rows 0-1 and 2-3.
            let (low, high) = (
                _mm_unpacklo_epi32(device, host),
                _mm_unpackhi_epi32(device, host),
            );
            let (tail_low, tail_high) = (
                _mm_unpacklo_epi32(disk, block),
                _mm_unpackhi_epi32(disk, block),
            );
            let rows = out.as_mut_ptr().cast::<__m128i>();
            _mm_storeu_si128(rows, _mm_unpacklo_epi64(low, tail_low));
            _mm_storeu_si128(rows.add(1), _mm_unpackhi_epi64(low, tail_low));
            _mm_storeu_si128(rows.add(2), _mm_unpacklo_epi64(high, tail_high));
            _mm_storeu_si128(rows.add(3), _mm_unpackhi_epi64(high, tail_high));
        }
        written += 4;
    }
    written
}

#[cfg(not(target_arch = "x86_64"))]
fn write_cache_quads(
    _out: &mut [MaybeUninit<WorkerCacheInput>],
    _columns: [&[u32]; 3],
    _block_size: u32,
) -> usize {
    0
}

/// One picker row: the worker, its total cost and its taint multiplier (held as the
/// router's column holds it, NaN for none: a 32-byte row to fill per call, not 40).
#[derive(Clone, Copy)]
pub struct ScoredWorkerCandidate {
    worker: WorkerWithDpRank,
    cost: f64,
    preferred_taint_multiplier: f64,
}

impl ScoredWorkerCandidate {
    #[inline]
    pub fn worker(&self) -> WorkerWithDpRank {
        self.worker
    }

    #[inline]
    pub fn cost(&self) -> f64 {
        self.cost
    }

    /// The taint multiplier, when the picker declared PREFERRED_TAINT.
    #[inline]
    pub fn preferred_taint_multiplier(&self) -> Option<f64> {
        Some(self.preferred_taint_multiplier).filter(|m| !m.is_nan())
    }
}

/// Compares what the accessors return (no multiplier equals no multiplier).
impl PartialEq for ScoredWorkerCandidate {
    fn eq(&self, other: &Self) -> bool {
        (self.worker, self.cost, self.preferred_taint_multiplier())
            == (other.worker, other.cost, other.preferred_taint_multiplier())
    }
}

impl fmt::Debug for ScoredWorkerCandidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScoredWorkerCandidate")
            .field("worker", &self.worker)
            .field("cost", &self.cost)
            .field(
                "preferred_taint_multiplier",
                &self.preferred_taint_multiplier(),
            )
            .finish()
    }
}

/// A picker's index-aligned view.
#[derive(Clone, Copy)]
pub struct WorkerInputView<'a> {
    candidates: &'a [ScoredWorkerCandidate],
    cache: Option<&'a [WorkerCacheInput]>,
    load: Option<&'a [WorkerLoadInput]>,
}

impl<'a> WorkerInputView<'a> {
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
}

/// The picker's rows, refilled per call into buffers kept across calls.
#[derive(Default)]
pub(crate) struct PickerRows {
    scored: Vec<ScoredWorkerCandidate>,
    groups: GroupBuffers,
}

impl PickerRows {
    /// Refills the buffers from the router's picker view; the view over them.
    pub(crate) fn view<'a>(
        &'a mut self,
        rows: &CandidateRows<'a>,
        costs: &[f64],
        inputs: WorkerInputs,
        block_size: u32,
    ) -> WorkerInputView<'a> {
        self.groups.fill(rows, inputs, block_size);
        let (worker_ids, dp_ranks, taint) = rows.identity_columns();
        let taint = taint.filter(|_| inputs.contains(WorkerInputs::PREFERRED_TAINT));
        let scored = worker_ids.iter().zip(dp_ranks).zip(costs);
        let row = |((&id, &rank), &cost): ((&u64, &u32), &f64), taint: f64| ScoredWorkerCandidate {
            worker: WorkerWithDpRank::new(id, rank),
            cost,
            preferred_taint_multiplier: taint,
        };
        self.scored.clear();
        // One loop per case, so neither checks the taint column per row.
        match taint {
            Some(taint) => self
                .scored
                .extend(scored.zip(taint).map(|(identity, &t)| row(identity, t))),
            None => self
                .scored
                .extend(scored.map(|identity| row(identity, f64::NAN))),
        }
        WorkerInputView {
            candidates: &self.scored,
            cache: inputs
                .contains(WorkerInputs::CACHE)
                .then_some(&self.groups.cache[..]),
            load: inputs
                .contains(WorkerInputs::LOAD)
                .then_some(&self.groups.load[..]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transposed stores write what the plain loop writes, for counts around the
    /// quads and a reused buffer (shorter, then longer than before).
    #[test]
    fn cache_rows_are_the_columns_row_by_row() {
        let mut buffer = Vec::new();
        for count in [9u32, 0, 1, 3, 4, 5, 8, 2] {
            let device: Vec<u32> = (0..count).collect();
            let host: Vec<u32> = (0..count).map(|i| u32::MAX - i).collect();
            let disk: Vec<u32> = (0..count).map(|i| 1000 + i).collect();
            fill_cache_rows(&mut buffer, [&device, &host, &disk], 16);
            let expected: Vec<_> = (0..count as usize)
                .map(|i| WorkerCacheInput {
                    device_overlap_blocks: device[i],
                    host_overlap_blocks: host[i],
                    disk_overlap_blocks: disk[i],
                    block_size: 16,
                })
                .collect();
            assert_eq!(buffer, expected, "{count} rows");
        }
    }

    /// Rows stop at the shortest column, as the zipped columns did.
    #[test]
    fn cache_rows_stop_at_the_shortest_column() {
        let mut buffer = Vec::new();
        fill_cache_rows(&mut buffer, [&[1; 6], &[2; 5], &[3; 7]], 32);
        assert_eq!(buffer.len(), 5);
        assert!(buffer.iter().all(|row| row.device_overlap_blocks() == 1.0
            && row.host_overlap_blocks() == 2.0
            && row.disk_overlap_blocks() == 3.0
            && row.accounting_cache_estimate() == (1.0, 32)));
    }
}
