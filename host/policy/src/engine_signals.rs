//! Built-in components that read what engines report of themselves (ENGINE) and what a
//! request says of itself (ATTRIBUTES), ABI 1.2:
//!
//! - `builtin.engine-queue` (scorer): the engine's queue and batch, never below what the
//!   router itself booked there.
//! - `builtin.kv-usage` (filter): leaves out engines whose KV cache is fuller than
//!   `max_usage`.
//! - `builtin.lora-affinity` (scorer): prefers engines already running the request's
//!   LoRA adapter.
//! - [`OutsideLoad`]: the `default` policy's `engine_load_weight` term, load the engine
//!   reports that the router did not book (traffic around it, other routers).
//!
//! A sample older than `max_age_ms` counts as none; without one each falls back to what
//! the router knows (its bookings), so a failed scrape degrades routing to the
//! bookings-only behaviour instead of failing it.

use serde::Deserialize;
use switchyard_plugin_sdk::{
    AdapterState, EngineLoad, PolicyError, WorkerCandidate, WorkerFilter, WorkerInputs,
    WorkerScorer, WorkerSelectionContext,
};

use super::registry::Registry;
use switchyard_plugin_host::plugin::Builtin;
use switchyard_plugin_host::plugin::ComponentKind;
use switchyard_plugin_sdk::builtins::finite_non_negative;

pub fn register(registry: &mut Registry) {
    use ComponentKind::*;
    registry.add_builtin_component(
        "builtin.engine-queue",
        Scorer,
        WorkerInputs::ENGINE | WorkerInputs::LOAD,
        |p, _| Ok(Builtin::Scorer(Box::new(EngineQueue::from_params(p)?))),
    );
    registry.add_builtin_component("builtin.kv-usage", Filter, WorkerInputs::ENGINE, |p, _| {
        Ok(Builtin::Filter(Box::new(KvUsage::from_params(p)?)))
    });
    registry.add_builtin_component(
        "builtin.lora-affinity",
        Scorer,
        WorkerInputs::ENGINE | WorkerInputs::ATTRIBUTES,
        |p, _| Ok(Builtin::Scorer(Box::new(LoraAffinity::from_params(p)?))),
    );
}

fn default_max_age_ms() -> f64 {
    5_000.0
}

/// The row's sample, if it is younger than `max_age_ms`.
fn recent(c: &WorkerCandidate<'_>, max_age_ms: f64) -> Option<EngineLoad> {
    c.engine()
        .filter(|e| e.sample_age_seconds * 1000.0 <= max_age_ms)
}

/// Cost = `waiting_weight * waiting + running_weight * max(running, booked)`: the engine's
/// own queue and batch, where the router's bookings since the last sample still count.
pub struct EngineQueue {
    waiting_weight: f64,
    running_weight: f64,
    max_age_ms: f64,
}

impl EngineQueue {
    fn from_params(params: &switchyard_plugin_sdk::Params<'_>) -> Result<Self, PolicyError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {
            #[serde(default = "one")]
            waiting_weight: f64,
            #[serde(default = "one")]
            running_weight: f64,
            #[serde(default = "default_max_age_ms")]
            max_age_ms: f64,
        }
        fn one() -> f64 {
            1.0
        }
        let p: P = params.deserialize()?;
        Ok(EngineQueue {
            waiting_weight: finite_non_negative("waiting_weight", p.waiting_weight)?,
            running_weight: finite_non_negative("running_weight", p.running_weight)?,
            max_age_ms: finite_non_negative("max_age_ms", p.max_age_ms)?,
        })
    }
}

impl WorkerScorer for EngineQueue {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::ENGINE | WorkerInputs::LOAD
    }
    fn score(
        &mut self,
        _: &WorkerSelectionContext<'_>,
        c: &WorkerCandidate<'_>,
    ) -> Result<f64, PolicyError> {
        let booked = f64::from(c.load().ok_or("load input unavailable")?.active_requests);
        let (waiting, running) = match recent(c, self.max_age_ms) {
            Some(e) => (e.waiting_requests, e.running_requests.max(booked)),
            None => (0.0, booked),
        };
        Ok(self.waiting_weight * waiting + self.running_weight * running)
    }
}

/// Keeps engines whose KV cache is at most `max_usage` full (unknown: kept). When every
/// candidate is over, all are kept (`keep_all_when_none_fits`, the default) rather than
/// failing the selection.
pub struct KvUsage {
    max_usage: f64,
    max_age_ms: f64,
    keep_all_when_none_fits: bool,
}

impl KvUsage {
    fn from_params(params: &switchyard_plugin_sdk::Params<'_>) -> Result<Self, PolicyError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {
            #[serde(default = "default_max_usage")]
            max_usage: f64,
            #[serde(default = "default_max_age_ms")]
            max_age_ms: f64,
            #[serde(default = "yes")]
            keep_all_when_none_fits: bool,
        }
        fn default_max_usage() -> f64 {
            0.9
        }
        fn yes() -> bool {
            true
        }
        let p: P = params.deserialize()?;
        if !(0.0..=1.0).contains(&p.max_usage) {
            return Err(PolicyError::failed(format!(
                "`max_usage` is a fraction from 0 to 1, got {}",
                p.max_usage
            )));
        }
        Ok(KvUsage {
            max_usage: p.max_usage,
            max_age_ms: finite_non_negative("max_age_ms", p.max_age_ms)?,
            keep_all_when_none_fits: p.keep_all_when_none_fits,
        })
    }
}

impl WorkerFilter for KvUsage {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::ENGINE
    }
    fn keep(
        &mut self,
        _: &WorkerSelectionContext<'_>,
        c: &WorkerCandidate<'_>,
    ) -> Result<bool, PolicyError> {
        Ok(recent(c, self.max_age_ms)
            .is_none_or(|e| e.kv_cache_usage.is_nan() || e.kv_cache_usage <= self.max_usage))
    }
    fn keep_batch(
        &mut self,
        ctx: &WorkerSelectionContext<'_>,
        candidates: &switchyard_plugin_sdk::WorkerCandidates<'_>,
        keep: &mut [bool],
    ) -> Result<(), PolicyError> {
        for (row, k) in keep.iter_mut().enumerate() {
            *k = self.keep(ctx, &candidates.row(row))?;
        }
        if self.keep_all_when_none_fits && !keep.contains(&true) {
            keep.fill(true);
        }
        Ok(())
    }
}

/// Cost 0 where the request's LoRA adapter runs, `waiting_cost` where it only waits, 1
/// elsewhere; 0 everywhere for a request without an adapter.
pub struct LoraAffinity {
    waiting_cost: f64,
    max_age_ms: f64,
}

impl LoraAffinity {
    fn from_params(params: &switchyard_plugin_sdk::Params<'_>) -> Result<Self, PolicyError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {
            #[serde(default = "half")]
            waiting_cost: f64,
            #[serde(default = "default_max_age_ms")]
            max_age_ms: f64,
        }
        fn half() -> f64 {
            0.5
        }
        let p: P = params.deserialize()?;
        Ok(LoraAffinity {
            waiting_cost: finite_non_negative("waiting_cost", p.waiting_cost)?,
            max_age_ms: finite_non_negative("max_age_ms", p.max_age_ms)?,
        })
    }
}

impl WorkerScorer for LoraAffinity {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::ENGINE | WorkerInputs::ATTRIBUTES
    }
    fn score(
        &mut self,
        ctx: &WorkerSelectionContext<'_>,
        c: &WorkerCandidate<'_>,
    ) -> Result<f64, PolicyError> {
        let Some(adapter) = ctx.attributes().and_then(|a| a.lora_adapter()) else {
            return Ok(0.0);
        };
        if recent(c, self.max_age_ms).is_none() {
            return Ok(1.0);
        }
        Ok(match c.adapter(adapter) {
            Some(AdapterState::Running) => 0.0,
            Some(AdapterState::Waiting) => self.waiting_cost,
            None => 1.0,
        })
    }
}

/// Requests the engine reports that the router did not book (traffic that bypasses it, or
/// another router's), each counted as one more prompt of this request's size ahead of it:
/// `request_blocks * max(0, running + waiting - booked)`. The `default` policy adds it
/// with weight `engine_load_weight`.
pub struct OutsideLoad {
    pub max_age_ms: f64,
}

impl WorkerScorer for OutsideLoad {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::ENGINE | WorkerInputs::LOAD
    }
    fn score(
        &mut self,
        ctx: &WorkerSelectionContext<'_>,
        c: &WorkerCandidate<'_>,
    ) -> Result<f64, PolicyError> {
        let booked = f64::from(c.load().ok_or("load input unavailable")?.active_requests);
        Ok(recent(c, self.max_age_ms).map_or(0.0, |e| {
            ctx.request_blocks().max(1) as f64
                * (e.running_requests + e.waiting_requests - booked).max(0.0)
        }))
    }
}
