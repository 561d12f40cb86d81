//! Components the router builds in, for plugins to reuse instead of retyping: the parts
//! of the reference's `least-busy` policy. The router's `builtin.min-device-overlap`,
//! `builtin.active-requests` and its compiled-in `builtin.least-busy` are these very
//! types, so a plugin that uses them decides exactly as the built-in does.

use serde::Deserialize;

use crate::{
    keep_at_least, Params, PolicyError, WorkerCandidate, WorkerCandidates, WorkerFilter,
    WorkerInputs, WorkerPicker, WorkerScorer, WorkerSelectionContext,
};

/// `value` if it is a finite number >= 0, else the error that names the parameter `name`.
pub fn finite_non_negative(name: &str, value: f64) -> Result<f64, PolicyError> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(PolicyError::failed(format!(
            "`{name}` must be a finite number >= 0, got {value}"
        )))
    }
}

/// Keeps the workers with at least `min_blocks` device-resident overlap blocks.
pub struct MinDeviceOverlap {
    min_blocks: f64,
}

impl MinDeviceOverlap {
    /// The filter for a threshold already checked (see [`finite_non_negative`]).
    pub fn at_least(min_blocks: f64) -> Self {
        MinDeviceOverlap { min_blocks }
    }

    /// The filter its own parameters describe: `{min_blocks: N}` (default 0).
    pub fn from_params(params: &Params<'_>) -> Result<Self, PolicyError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Parameters {
            #[serde(default)]
            min_blocks: f64,
        }
        let p: Parameters = params.deserialize()?;
        Ok(Self::at_least(finite_non_negative(
            "min_blocks",
            p.min_blocks,
        )?))
    }
}

impl WorkerFilter for MinDeviceOverlap {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::CACHE
    }
    fn keep(
        &mut self,
        _: &WorkerSelectionContext<'_>,
        candidate: &WorkerCandidate<'_>,
    ) -> Result<bool, PolicyError> {
        let cache = candidate.cache().ok_or("cache input unavailable")?;
        Ok(f64::from(cache.device_overlap_blocks) >= self.min_blocks)
    }
    // The batch form sees every candidate in one call: one tight loop over the column.
    fn keep_batch(
        &mut self,
        _: &WorkerSelectionContext<'_>,
        candidates: &WorkerCandidates<'_>,
        keep: &mut [bool],
    ) -> Result<(), PolicyError> {
        let device = candidates
            .cache()
            .ok_or("cache input unavailable")?
            .device_overlap_blocks;
        keep_at_least(device, self.min_blocks, keep);
        Ok(())
    }
}

/// Cost = the worker's active requests.
pub struct ActiveRequests;

impl WorkerScorer for ActiveRequests {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::LOAD
    }
    fn score(
        &mut self,
        _: &WorkerSelectionContext<'_>,
        candidate: &WorkerCandidate<'_>,
    ) -> Result<f64, PolicyError> {
        let load = candidate.load().ok_or("load input unavailable")?;
        Ok(f64::from(load.active_requests))
    }
    fn score_batch(
        &mut self,
        _: &WorkerSelectionContext<'_>,
        candidates: &WorkerCandidates<'_>,
        costs: &mut [f64],
    ) -> Result<(), PolicyError> {
        let active = candidates
            .load()
            .ok_or("load input unavailable")?
            .active_requests;
        for (cost, &n) in costs.iter_mut().zip(active) {
            *cost = f64::from(n);
        }
        Ok(())
    }
}

/// The lowest total cost, ties to the lowest worker id: the choice does not depend on
/// candidate order ([`WorkerCandidates::lowest_cost_row`]).
pub struct LowestCostByWorkerId;

impl WorkerPicker for LowestCostByWorkerId {
    fn pick(
        &mut self,
        _: &WorkerSelectionContext<'_>,
        candidates: &WorkerCandidates<'_>,
    ) -> Result<usize, PolicyError> {
        candidates
            .lowest_cost_row()
            .ok_or_else(|| PolicyError::failed("no candidates"))
    }
}
