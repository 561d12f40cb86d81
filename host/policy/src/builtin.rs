//! Built-in components and policies. They implement the same SDK traits a Rust plugin
//! does and read the same views; only the C boundary is missing.
//!
//! The `default` policy's cost (docs/default-policy.md):
//!
//! ```text
//! credit  = device + host_cache_weight * max(0, host - device)
//!                  + disk_cache_weight * max(0, disk - max(device, host))
//! new     = max(0, request_blocks - credit)
//! prefill = uncached_weight * new + active_prefill_tokens / block_size
//! cost    = prefill_load_scale * prefill + decode_cost_blocks
//! ```
//! picked by `builtin.softmax` (temperature 0: the minimum, ties at random).

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;
use switchyard_plugin_sdk::builtins::{
    finite_non_negative, ActiveRequests, LowestCostByWorkerId, MinDeviceOverlap,
};
use switchyard_plugin_sdk::{
    CandidateCache, Params, Partition, PolicyError, PolicyParts, WorkerCandidate, WorkerCandidates,
    WorkerInputs, WorkerPicker, WorkerScorer, WorkerSelectionContext,
};

use super::registry::{BuildFn, Registry};
use switchyard_plugin_host::plugin::Builtin;
use switchyard_plugin_host::plugin::ComponentKind;
use switchyard_plugin_sdk::RouterSettings;

impl Registry {
    /// A registry with the built-in types.
    pub fn with_builtins() -> Self {
        let mut registry = Registry::default();
        register(&mut registry);
        registry
    }
}

pub fn register(registry: &mut Registry) {
    use ComponentKind::*;
    registry.add_builtin_component(
        "builtin.min-device-overlap",
        Filter,
        WorkerInputs::CACHE,
        |p, _| Ok(Builtin::Filter(Box::new(MinDeviceOverlap::from_params(p)?))),
    );
    registry.add_builtin_component(
        "builtin.active-requests",
        Scorer,
        WorkerInputs::LOAD,
        |p, _| {
            p.reject_unknown_keys(&[])?;
            Ok(Builtin::Scorer(Box::new(ActiveRequests)))
        },
    );
    registry.add_builtin_component("builtin.kv-overlap", Scorer, WorkerInputs::CACHE, |p, _| {
        Ok(Builtin::Scorer(Box::new(KvOverlap {
            weights: p.deserialize()?,
        })))
    });
    registry.add_builtin_component(
        "builtin.default-cost",
        Scorer,
        WorkerInputs::CACHE | WorkerInputs::LOAD,
        |p, _| Ok(Builtin::Scorer(Box::new(DefaultCost::from_params(p)?))),
    );
    registry.add_builtin_component("builtin.lowest-cost", Picker, WorkerInputs::NONE, |p, _| {
        Ok(Builtin::Picker(Box::new(LowestCost::from_params(p)?)))
    });
    registry.add_builtin_component("builtin.softmax", Picker, WorkerInputs::NONE, |p, _| {
        Ok(Builtin::Picker(Box::new(Softmax::from_params(p)?)))
    });
    super::engine_signals::register(registry);
    super::admitters::register(registry);
    registry.add_builtin_policy("default", default_policy);
    registry.add_builtin_policy("builtin.least-busy", least_busy_policy);
}

fn rng(seed: Option<u64>) -> SmallRng {
    seed.map_or_else(SmallRng::from_entropy, SmallRng::seed_from_u64)
}

/// Weights of the lower cache tiers in the overlap credit.
#[derive(Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TierWeights {
    pub host_cache_weight: f64,
    pub disk_cache_weight: f64,
}

impl Default for TierWeights {
    fn default() -> Self {
        TierWeights {
            host_cache_weight: 0.75,
            disk_cache_weight: 0.25,
        }
    }
}

impl TierWeights {
    /// Blocks of the prompt credited as cached: the device prefix in full, the host prefix
    /// beyond it and the disk prefix beyond both at their weights.
    pub fn credit(&self, cache: &CandidateCache) -> f64 {
        let device = f64::from(cache.device_overlap_blocks);
        let host = f64::from(cache.host_overlap_blocks);
        let disk = f64::from(cache.disk_overlap_blocks);
        device
            + self.host_cache_weight * (host - device).max(0.0)
            + self.disk_cache_weight * (disk - device.max(host)).max(0.0)
    }
}

/// Cost = prompt blocks not covered by the (weighted) cached prefix.
pub struct KvOverlap {
    weights: TierWeights,
}

impl WorkerScorer for KvOverlap {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::CACHE
    }
    fn score(
        &mut self,
        ctx: &WorkerSelectionContext<'_>,
        c: &WorkerCandidate<'_>,
    ) -> Result<f64, PolicyError> {
        let cache = c.cache().ok_or("cache input unavailable")?;
        Ok((ctx.request_blocks() as f64 - self.weights.credit(&cache)).max(0.0))
    }
}

/// The default policy's cost: new prefill work plus queued prefill, against decode load.
pub struct DefaultCost {
    weights: TierWeights,
    uncached_weight: f64,
    prefill_load_scale: f64,
}

impl DefaultCost {
    fn from_params(params: &Params<'_>) -> Result<Self, PolicyError> {
        let p: DefaultParams = params.deserialize()?;
        p.validate()?;
        Ok(p.cost())
    }
}

impl WorkerScorer for DefaultCost {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::CACHE | WorkerInputs::LOAD
    }
    fn score(
        &mut self,
        ctx: &WorkerSelectionContext<'_>,
        c: &WorkerCandidate<'_>,
    ) -> Result<f64, PolicyError> {
        let cache = c.cache().ok_or("cache input unavailable")?;
        let load = c.load().ok_or("load input unavailable")?;
        Ok(self.cost(
            ctx,
            &cache,
            load.active_prefill_tokens,
            load.decode_cost_blocks,
        ))
    }
    fn score_batch(
        &mut self,
        ctx: &WorkerSelectionContext<'_>,
        candidates: &WorkerCandidates<'_>,
        costs: &mut [f64],
    ) -> Result<(), PolicyError> {
        let cache = candidates.cache().ok_or("cache input unavailable")?;
        let load = candidates.load().ok_or("load input unavailable")?;
        for (row, cost) in costs.iter_mut().enumerate() {
            let row_cache = CandidateCache {
                device_overlap_blocks: cache.device_overlap_blocks[row],
                host_overlap_blocks: cache.host_overlap_blocks[row],
                disk_overlap_blocks: cache.disk_overlap_blocks[row],
                shared_beyond_device_blocks: cache.shared_beyond_device_blocks[row],
            };
            *cost = self.cost(
                ctx,
                &row_cache,
                load.active_prefill_tokens[row],
                load.decode_cost_blocks[row],
            );
        }
        Ok(())
    }
}

impl DefaultCost {
    fn cost(
        &self,
        ctx: &WorkerSelectionContext<'_>,
        cache: &CandidateCache,
        prefill_tokens: u64,
        decode_blocks: u64,
    ) -> f64 {
        let new_blocks = (ctx.request_blocks() as f64 - self.weights.credit(cache)).max(0.0);
        let queued_blocks = prefill_tokens as f64 / f64::from(ctx.block_size().max(1));
        self.prefill_load_scale * (self.uncached_weight * new_blocks + queued_blocks)
            + decode_blocks as f64
    }
}

/// Lowest total cost. Ties: uniformly at random (`tie_break: random`, seedable with
/// `seed`) or the lowest worker id (`tie_break: worker-id`, deterministic).
pub struct LowestCost {
    by_worker_id: bool,
    rng: SmallRng,
}

impl LowestCost {
    fn from_params(params: &Params<'_>) -> Result<Self, PolicyError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "kebab-case")]
        enum TieBreak {
            Random,
            WorkerId,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {
            tie_break: Option<TieBreak>,
            seed: Option<u64>,
        }
        let p: P = params.deserialize()?;
        Ok(LowestCost {
            by_worker_id: matches!(p.tie_break, Some(TieBreak::WorkerId)),
            rng: rng(p.seed),
        })
    }
}

/// The lowest-cost row, ties at random, without allocating.
fn lowest_random(costs: &[f64], rng: &mut SmallRng) -> Option<usize> {
    lowest_random_of(costs, cost_range(costs).0, rng)
}

/// The smallest and largest cost (NaNs ignored), kept in four lanes so that each compare
/// does not wait on the one before (one chain is about four cycles a row; this one
/// vectorizes). `(inf, -inf)` when there is none.
fn cost_range(costs: &[f64]) -> (f64, f64) {
    let mut lo = [f64::INFINITY; 4];
    let mut hi = [f64::NEG_INFINITY; 4];
    let fours = costs.chunks_exact(4);
    let rest = fours.remainder();
    for four in fours {
        for lane in 0..4 {
            lo[lane] = lo[lane].min(four[lane]);
            hi[lane] = hi[lane].max(four[lane]);
        }
    }
    for (lane, &cost) in rest.iter().enumerate() {
        lo[lane] = lo[lane].min(cost);
        hi[lane] = hi[lane].max(cost);
    }
    (
        lo[0].min(lo[1]).min(lo[2].min(lo[3])),
        hi[0].max(hi[1]).max(hi[2].max(hi[3])),
    )
}

/// A row whose cost is `min`, uniformly at random among those that tie: counted in one
/// pass, found in a second, with one draw only when several tie (a draw per tied row, as
/// a reservoir makes, was most of a 1,000-worker pick). With no such row (every cost
/// NaN), the last row, as before.
fn lowest_random_of(costs: &[f64], min: f64, rng: &mut SmallRng) -> Option<usize> {
    let ties = costs.iter().filter(|&&cost| cost == min).count();
    let nth = match ties {
        0 => return costs.len().checked_sub(1),
        1 => 0,
        _ => rng.gen_range(0..ties),
    };
    costs
        .iter()
        .enumerate()
        .filter(|(_, &cost)| cost == min)
        .nth(nth)
        .map(|(row, _)| row)
}

impl WorkerPicker for LowestCost {
    fn pick(
        &mut self,
        _: &WorkerSelectionContext<'_>,
        c: &WorkerCandidates<'_>,
    ) -> Result<usize, PolicyError> {
        let costs = c.costs().ok_or("costs unavailable")?;
        let row = if self.by_worker_id {
            c.lowest_cost_row()
        } else {
            lowest_random(costs, &mut self.rng)
        };
        row.ok_or_else(|| PolicyError::failed("no candidates"))
    }
}

/// Samples `p ~ exp(-(c - c_min) / ((c_max - c_min) * T))`; T = 0 picks the minimum
/// (ties at random). The request's `router_temperature_override` replaces T.
pub struct Softmax {
    temperature: f64,
    rng: SmallRng,
    /// Each row's weight, reused from pick to pick.
    weights: Vec<f64>,
}

impl Softmax {
    fn from_params(params: &Params<'_>) -> Result<Self, PolicyError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {
            #[serde(default)]
            temperature: f64,
            seed: Option<u64>,
        }
        let p: P = params.deserialize()?;
        Ok(Softmax {
            temperature: finite_non_negative("temperature", p.temperature)?,
            rng: rng(p.seed),
            weights: Vec::new(),
        })
    }
}

impl WorkerPicker for Softmax {
    fn pick(
        &mut self,
        ctx: &WorkerSelectionContext<'_>,
        c: &WorkerCandidates<'_>,
    ) -> Result<usize, PolicyError> {
        let costs = c.costs().ok_or("costs unavailable")?;
        let temperature = ctx
            .router_temperature_override()
            .unwrap_or(self.temperature);
        let (min, max) = cost_range(costs);
        if temperature <= 0.0 || max <= min {
            return lowest_random_of(costs, min, &mut self.rng)
                .ok_or_else(|| PolicyError::failed("no candidates"));
        }
        let scale = (max - min) * temperature;
        // Each weight once (an exp a row), then the draw walks them.
        self.weights.clear();
        self.weights
            .extend(costs.iter().map(|&cost| (-(cost - min) / scale).exp()));
        let sum: f64 = self.weights.iter().sum();
        let mut draw = self.rng.gen::<f64>() * sum;
        for (row, &weight) in self.weights.iter().enumerate() {
            draw -= weight;
            if draw <= 0.0 {
                return Ok(row);
            }
        }
        Ok(costs.len() - 1)
    }
}

/// Parameters of the `default` policy; every knob has a default.
#[derive(Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DefaultParams {
    pub host_cache_weight: f64,
    pub disk_cache_weight: f64,
    /// Weight of the blocks this worker must prefill against the load booked on it (1:
    /// a block to prefill counts as one queued or decoding). Above 1, a worker holding
    /// the prefix wins against a less busy one more often: the prefill avoided is paid
    /// once, and a cache miss also evicts what another request could reuse.
    pub uncached_weight: f64,
    pub prefill_load_scale: f64,
    pub temperature: f64,
    pub seed: Option<u64>,
    /// Weight of the load engines report that the router did not book
    /// (`engine_signals::OutsideLoad`); 0, the default, reads no engine sample.
    pub engine_load_weight: f64,
}

impl Default for DefaultParams {
    fn default() -> Self {
        let tiers = TierWeights::default();
        DefaultParams {
            host_cache_weight: tiers.host_cache_weight,
            disk_cache_weight: tiers.disk_cache_weight,
            // Swept on the public trace's replay through real routers (docs/BENCHMARKS.md,
            // "Trace replay through the routers"): 1 gave a 41.9 % hit rate, 8 gives
            // 48.8 % with lower TTFT at p50, p90 and p99.
            uncached_weight: 8.0,
            prefill_load_scale: 1.0,
            temperature: 0.0,
            seed: None,
            engine_load_weight: 0.0,
        }
    }
}

impl DefaultParams {
    fn validate(&self) -> Result<(), PolicyError> {
        finite_non_negative("host_cache_weight", self.host_cache_weight)?;
        finite_non_negative("disk_cache_weight", self.disk_cache_weight)?;
        finite_non_negative("uncached_weight", self.uncached_weight)?;
        finite_non_negative("prefill_load_scale", self.prefill_load_scale)?;
        finite_non_negative("temperature", self.temperature)?;
        finite_non_negative("engine_load_weight", self.engine_load_weight)?;
        Ok(())
    }
    fn cost(&self) -> DefaultCost {
        DefaultCost {
            weights: TierWeights {
                host_cache_weight: self.host_cache_weight,
                disk_cache_weight: self.disk_cache_weight,
            },
            uncached_weight: self.uncached_weight,
            prefill_load_scale: self.prefill_load_scale,
        }
    }
}

/// The router's cost-model knobs as factories are handed them (ABI 1.5,
/// `switchyard_params.router`): `worker_selection.builtin_default` with its defaults
/// filled in, and `router.block_size`. Knobs that do not parse read as the defaults
/// (startup refuses them at `builtin_default:` anyway).
pub fn router_settings(
    router: &switchyard_config::RouterSettings,
    builtin_default: &serde_json::Map<String, serde_json::Value>,
) -> RouterSettings {
    let knobs = serde_json::Value::Object(builtin_default.clone());
    let p: DefaultParams = serde_json::from_value(knobs).unwrap_or_default();
    RouterSettings {
        block_size: router.block_size,
        host_cache_weight: p.host_cache_weight,
        disk_cache_weight: p.disk_cache_weight,
        uncached_weight: p.uncached_weight,
        prefill_load_scale: p.prefill_load_scale,
        temperature: p.temperature,
        engine_load_weight: p.engine_load_weight,
    }
}

fn default_policy(params: &Params<'_>) -> Result<Box<BuildFn>, PolicyError> {
    let p: DefaultParams = params.deserialize()?;
    p.validate()?;
    Ok(Box::new(move |_: &Partition<'_>| {
        let mut parts = PolicyParts::new(
            vec![],
            vec![Box::new(p.cost())],
            Box::new(Softmax {
                temperature: p.temperature,
                rng: rng(p.seed),
                weights: Vec::new(),
            }),
        );
        if p.engine_load_weight > 0.0 {
            let outside = super::engine_signals::OutsideLoad {
                max_age_ms: 5_000.0,
            };
            parts
                .scorers
                .push((Box::new(outside), p.engine_load_weight));
        }
        Ok(parts)
    }))
}

/// The reference's `least-busy`, compiled in: the baseline the plugin versions are
/// compared with (decisions in tests, speed in benches).
fn least_busy_policy(params: &Params<'_>) -> Result<Box<BuildFn>, PolicyError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct P {
        #[serde(default)]
        min_device_overlap_blocks: f64,
    }
    let p: P = params.deserialize()?;
    let min_blocks = finite_non_negative("min_device_overlap_blocks", p.min_device_overlap_blocks)?;
    Ok(Box::new(move |_: &Partition<'_>| {
        Ok(PolicyParts::new(
            vec![Box::new(MinDeviceOverlap::at_least(min_blocks))],
            vec![Box::new(ActiveRequests)],
            Box::new(LowestCostByWorkerId),
        ))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cost_range_is_the_plain_fold_at_every_length_and_with_nans() {
        let mut rng = SmallRng::seed_from_u64(7);
        for n in 0..40 {
            let costs: Vec<f64> = (0..n)
                .map(|_| match rng.gen_range(0..5) {
                    0 => f64::NAN,
                    _ => rng.gen_range(-5.0..5.0),
                })
                .collect();
            let fold = costs
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                    (lo.min(x), hi.max(x))
                });
            assert_eq!(cost_range(&costs), fold, "{costs:?}");
        }
    }

    #[test]
    fn ties_are_drawn_uniformly_and_the_minimum_always_wins() {
        let mut rng = SmallRng::seed_from_u64(11);
        let costs = [3.0, 1.0, 2.0, 1.0, f64::NAN, 1.0, 4.0];
        let mut seen = [0u32; 7];
        for _ in 0..3_000 {
            seen[lowest_random(&costs, &mut rng).unwrap()] += 1;
        }
        for row in [1, 3, 5] {
            assert!((800..1_200).contains(&seen[row]), "row {row}: {seen:?}");
        }
        assert_eq!(seen[1] + seen[3] + seen[5], 3_000, "{seen:?}");
        assert_eq!(lowest_random(&[], &mut rng), None);
        assert_eq!(lowest_random(&[f64::NAN, f64::NAN], &mut rng), Some(1));
        assert_eq!(lowest_random(&[5.0, 0.5, 9.0], &mut rng), Some(1));
    }
}
