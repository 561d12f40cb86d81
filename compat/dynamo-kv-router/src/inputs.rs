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
pub struct ScoredWorkerCandidate {
    worker: WorkerWithDpRank,
    cost: f64,
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
