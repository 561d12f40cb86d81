//! The current shape's input views: a scorer sees the surviving candidates as one batch
//! (`WorkerCandidates`), a filter one `WorkerCandidate<'_>` by value; both borrow rows the
//! adapter fills once per call from the SDK's columns.

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

/// KV-cache overlap values of one worker.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WorkerCacheInput {
    device_overlap_blocks: f64,
    host_overlap_blocks: f64,
    disk_overlap_blocks: f64,
    block_size: u32,
}

impl WorkerCacheInput {
    /// The router's cache estimate in blocks and tokens. Switchyard has no weighted
    /// estimate across tiers: this is the device overlap and its tokens.
    #[inline]
    pub fn accounting_cache_estimate(&self) -> (f64, usize) {
        let tokens = self.device_overlap_blocks * f64::from(self.block_size);
        (self.device_overlap_blocks, tokens as usize)
    }

    #[inline]
    pub fn device_overlap_blocks(&self) -> f64 {
        self.device_overlap_blocks
    }

    #[inline]
    pub fn host_overlap_blocks(&self) -> f64 {
        self.host_overlap_blocks
    }

    #[inline]
    pub fn disk_overlap_blocks(&self) -> f64 {
        self.disk_overlap_blocks
    }
}

/// Active-load values of one worker.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WorkerLoadInput {
    available: bool,
    active_prefill_tokens: usize,
    decode_cost_blocks: f64,
    active_requests: usize,
}

impl WorkerLoadInput {
    /// Whether the router supplied load for this worker (always, when LOAD was declared).
    #[inline]
    pub fn is_available(&self) -> bool {
        self.available
    }

    #[inline]
    pub fn active_prefill_tokens(&self) -> usize {
        self.active_prefill_tokens
    }

    #[inline]
    pub fn decode_cost_blocks(&self) -> f64 {
        self.decode_cost_blocks
    }

    #[inline]
    pub fn active_requests(&self) -> usize {
        self.active_requests
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

    /// The one-row candidates of a guide-shaped candidate (the SDK's per-candidate forms;
    /// the router calls the batch ones). `identity` holds its id, rank and taint (NaN: none).
    pub(crate) fn one<'a>(
        &'a mut self,
        candidate: &crate::WorkerCandidate,
        identity: &'a mut ([u64; 1], [u32; 1], [f64; 1]),
        inputs: WorkerInputs,
        block_size: u32,
    ) -> WorkerCandidates<'a> {
        let worker = candidate.worker();
        let taint = candidate
            .routing()
            .and_then(|r| r.preferred_taint_multiplier());
        *identity = (
            [worker.worker_id],
            [worker.dp_rank],
            [taint.unwrap_or(f64::NAN)],
        );
        self.cache.clear();
        self.load.clear();
        if let Some(cache) = candidate.cache() {
            self.cache.push(WorkerCacheInput {
                device_overlap_blocks: cache.device_overlap_blocks(),
                host_overlap_blocks: cache.host_overlap_blocks(),
                disk_overlap_blocks: cache.disk_overlap_blocks(),
                block_size,
            });
        }
        if let Some(load) = candidate.load() {
            self.load.push(WorkerLoadInput {
                available: true,
                active_prefill_tokens: load.active_prefill_tokens(),
                decode_cost_blocks: load.decode_cost_blocks(),
                active_requests: load.active_requests(),
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

    fn fill(&mut self, rows: &CandidateRows<'_>, inputs: WorkerInputs, block_size: u32) {
        self.cache.clear();
        self.load.clear();
        if inputs.contains(WorkerInputs::CACHE) {
            self.cache.extend((0..rows.len()).map(|row| {
                let cache = rows.cache(row);
                WorkerCacheInput {
                    device_overlap_blocks: cache.device_overlap_blocks(),
                    host_overlap_blocks: cache.host_overlap_blocks(),
                    disk_overlap_blocks: cache.disk_overlap_blocks(),
                    block_size,
                }
            }));
        }
        if inputs.contains(WorkerInputs::LOAD) {
            let available = rows.has_load();
            self.load.extend((0..rows.len()).map(|row| {
                let load = rows.load(row);
                WorkerLoadInput {
                    available,
                    active_prefill_tokens: load.active_prefill_tokens(),
                    decode_cost_blocks: load.decode_cost_blocks(),
                    active_requests: load.active_requests(),
                }
            }));
        }
    }
}

/// One picker row: the worker, its total cost and its taint multiplier.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScoredWorkerCandidate {
    worker: WorkerWithDpRank,
    cost: f64,
    preferred_taint_multiplier: Option<f64>,
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
        self.preferred_taint_multiplier
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
        self.scored.clear();
        self.scored
            .extend(worker_ids.iter().zip(dp_ranks).zip(costs).enumerate().map(
                |(row, ((&id, &rank), &cost))| {
                    ScoredWorkerCandidate {
                        worker: WorkerWithDpRank::new(id, rank),
                        cost,
                        preferred_taint_multiplier: taint
                            .and_then(|t| t.get(row).copied())
                            .filter(|m| !m.is_nan()),
                    }
                },
            ));
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
