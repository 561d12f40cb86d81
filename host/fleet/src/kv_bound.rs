//! Each worker's KV index bound: how many blocks the index keeps of it per tier, and
//! where that number came from.
//!
//! The bound is a safety net, not a cache size. With KV events the engine says what it
//! stores and what it removes, and the index keeps exactly that; the bound only stops a
//! stream of stores whose removals were lost (or an engine that lies) from growing the
//! index without end. So it is sized from the largest capacity anyone knows the worker
//! to have, with room above it, and never below `router.kv_bound_blocks_per_worker`: a
//! default that cuts what an engine really holds routes silently worse (the index
//! forgets blocks the engine still serves from cache).

use serde::Serialize;
use switchyard_config::{Config, KvTracking};

use super::workers::WorkerSpec;

/// Room above a known capacity: an engine's events run ahead of its removals by up to a
/// batch, and an operator's `total_kv_blocks` may be a little low.
pub const HEADROOM: u64 = 2;

/// Where a worker's device-tier bound came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BoundSource {
    /// `router.kv_bound_blocks_per_worker`: nothing larger is known of the worker.
    Default,
    /// The worker's `total_kv_blocks`, with headroom.
    TotalKvBlocks,
    /// The capacity its engine reports (vLLM's `vllm:cache_config_info`), with headroom.
    Engine,
    /// `kv_tracking: predicted`: the prediction's own size per worker
    /// (`predicted_blocks_per_worker`), which it never exceeds.
    Predicted,
}

/// What the index keeps of one worker, per tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct KvBound {
    /// Blocks (of the router's `block_size`) in the device tier.
    pub device_blocks: u64,
    pub source: BoundSource,
    /// Blocks in each offload tier (host, disk): `router.max_offloaded_blocks_per_worker`.
    pub offloaded_blocks: u64,
}

impl KvBound {
    /// The budget per tier (device, host, disk), as the index takes it.
    pub fn per_tier(&self) -> [u64; 3] {
        [
            self.device_blocks,
            self.offloaded_blocks,
            self.offloaded_blocks,
        ]
    }
}

/// The bound of `spec` under `config`, given the KV cache its engine reports in tokens
/// (`None`: not scraped, or it does not say).
pub fn kv_bound(
    config: &Config,
    spec: &WorkerSpec,
    engine_capacity_tokens: Option<u64>,
) -> KvBound {
    let router = &config.router;
    let offloaded_blocks = router.max_offloaded_blocks_per_worker;
    if let Some(model) = config.models.get(&spec.model) {
        if model.kv_tracking == KvTracking::Predicted {
            return KvBound {
                device_blocks: (model.predicted_blocks_per_worker as u64).max(1),
                source: BoundSource::Predicted,
                offloaded_blocks,
            };
        }
    }
    let block_size = u64::from(router.block_size.max(1));
    let known = [
        (spec.total_kv_blocks, BoundSource::TotalKvBlocks),
        (
            engine_capacity_tokens.map(|tokens| tokens.div_ceil(block_size)),
            BoundSource::Engine,
        ),
    ];
    let floor = (router.kv_bound_blocks_per_worker, BoundSource::Default);
    let (device_blocks, source) = known
        .into_iter()
        .filter_map(|(blocks, source)| Some((blocks?.saturating_mul(HEADROOM), source)))
        .fold(
            floor,
            |best, next| if next.0 > best.0 { next } else { best },
        );
    KvBound {
        device_blocks,
        source,
        offloaded_blocks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::json;

    fn spec(value: serde_json::Value) -> WorkerSpec {
        serde_json::from_value(value).unwrap()
    }

    fn config(value: serde_json::Value) -> Config {
        serde_json::from_value(value).unwrap()
    }

    /// The largest known capacity wins, with headroom; nothing known, the default; a
    /// capacity below the default never lowers the bound under it.
    #[test]
    fn the_bound_is_the_largest_known_capacity_and_never_below_the_default() {
        let config =
            config(json!({"router": {"kv_bound_blocks_per_worker": 100000, "block_size": 16}}));
        let bare = spec(json!({"model": "m", "worker_id": 1}));
        let declared = spec(json!({"model": "m", "worker_id": 1, "total_kv_blocks": 131072}));
        let small = spec(json!({"model": "m", "worker_id": 1, "total_kv_blocks": 16384}));
        let bound = |s: &WorkerSpec, engine| {
            let b = kv_bound(&config, s, engine);
            (b.device_blocks, b.source)
        };
        assert_eq!(bound(&bare, None), (100_000, BoundSource::Default));
        assert_eq!(bound(&small, None), (100_000, BoundSource::Default));
        assert_eq!(
            bound(&declared, None),
            (262_144, BoundSource::TotalKvBlocks)
        );
        // The engine says 131072 blocks of 16 tokens, more than the operator declared.
        assert_eq!(
            bound(&small, Some(131_072 * 16)),
            (262_144, BoundSource::Engine)
        );
        // Engine blocks of 32 tokens count twice in the router's blocks of 16.
        assert_eq!(
            bound(&bare, Some(100_000 * 32)),
            (400_000, BoundSource::Engine)
        );
        assert_eq!(kv_bound(&config, &bare, None).per_tier()[1], 1 << 22);
    }

    #[test]
    fn predicted_models_are_bounded_by_their_prediction() {
        let config = config(json!({
            "router": {"kv_bound_blocks_per_worker": 100000},
            "models": {"m": {"kv_tracking": "predicted", "predicted_blocks_per_worker": 5000}},
        }));
        let bound = kv_bound(
            &config,
            &spec(json!({"model": "m", "worker_id": 1})),
            Some(1 << 30),
        );
        assert_eq!(
            (bound.device_blocks, bound.source),
            (5000, BoundSource::Predicted)
        );
    }
}
