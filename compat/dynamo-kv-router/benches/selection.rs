//! Selection through the compatibility adapters against the same policy written against
//! the SDK directly, at 1,024 workers, in one run: the guide's `least-busy` (a
//! device-overlap filter at 4 blocks, active requests as the cost, the first lowest cost)
//! as Dynamo code behind the adapters (the guide's API, and Dynamo's current batch-scorer
//! shape), and the same logic on the SDK: in its batch forms over the columns
//! (`sdk-batch`, the like-for-like baseline: same comparisons, same pick), on its
//! per-candidate traits as the Dynamo code is written (`sdk`), and the SDK's built-ins
//! (`sdk-builtins`: a vectorized threshold, ties to the lowest worker) for reference.
//!
//! Each selection runs filter, scorer and picker through the SDK calls the router makes
//! (`dynamo_kv_router::testing::Selection`, over columns it owns: the router's own
//! column handling is not timed, which makes the ratio stricter than a whole selection's).
//!
//! Run: `cargo bench -p switchyard-dynamo-kv-router --bench selection`. After criterion's
//! timings it prints, side by side, each variant's time and each compat variant's ratio
//! to the SDK ones, measured in interleaved rounds and paired per round (so machine noise
//! hits the variants alike). `--profile-time` (for `perf`) skips that table.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use dynamo_kv_router::testing::{Row, Selection};
use dynamo_kv_router::{KvRouterConfig, WorkerSelectionPolicy};
use switchyard_plugin_sdk::builtins::{ActiveRequests, LowestCostByWorkerId, MinDeviceOverlap};
use switchyard_plugin_sdk::PolicyParts;

const WORKERS: usize = 1_024;
const REQUEST_BLOCKS: u64 = 64;
const MIN_BLOCKS: f64 = 4.0;

/// The guide's policy, as Dynamo code.
mod dynamo_side {
    use dynamo_kv_router::{
        WorkerCandidate, WorkerFilter, WorkerInputView, WorkerInputs, WorkerPicker, WorkerScorer,
        WorkerSelectionContext, WorkerSelectionPolicyError,
    };

    pub struct MinimumDeviceOverlapFilter {
        pub minimum_blocks: f64,
    }

    impl WorkerFilter for MinimumDeviceOverlapFilter {
        fn required_worker_inputs(&self) -> WorkerInputs {
            WorkerInputs::CACHE
        }
        fn keep(
            &mut self,
            _context: &WorkerSelectionContext<'_>,
            candidate: &WorkerCandidate,
        ) -> Result<bool, WorkerSelectionPolicyError> {
            let cache = candidate
                .cache()
                .ok_or_else(|| WorkerSelectionPolicyError::failed("cache input unavailable"))?;
            Ok(cache.device_overlap_blocks() >= self.minimum_blocks)
        }
    }

    pub struct ActiveRequestsScorer;

    impl WorkerScorer for ActiveRequestsScorer {
        fn required_worker_inputs(&self) -> WorkerInputs {
            WorkerInputs::LOAD
        }
        fn score(
            &mut self,
            _context: &WorkerSelectionContext<'_>,
            candidate: &WorkerCandidate,
        ) -> Result<f64, WorkerSelectionPolicyError> {
            let load = candidate
                .load()
                .ok_or_else(|| WorkerSelectionPolicyError::failed("load input unavailable"))?;
            Ok(load.active_requests() as f64)
        }
    }

    pub struct LowestCostPicker;

    impl WorkerPicker for LowestCostPicker {
        fn pick(
            &mut self,
            _context: &WorkerSelectionContext<'_>,
            input: WorkerInputView<'_>,
        ) -> Result<usize, WorkerSelectionPolicyError> {
            input
                .candidates()
                .iter()
                .enumerate()
                .min_by(|(_, left), (_, right)| left.cost().total_cmp(&right.cost()))
                .map(|(row, _)| row)
                .ok_or_else(|| WorkerSelectionPolicyError::failed("no eligible worker"))
        }
    }
}

/// The same policy in Dynamo's current shape (`plugins::worker_selection`: the scorer
/// scores the batch).
mod current_side {
    use dynamo_kv_router::plugins::worker_selection::{
        WorkerCandidate, WorkerCandidates, WorkerFilter, WorkerInputView, WorkerInputs,
        WorkerPicker, WorkerScorer, WorkerSelectionContext, WorkerSelectionPolicyError,
    };

    pub struct MinimumDeviceOverlapFilter {
        pub minimum_blocks: f64,
    }

    impl WorkerFilter for MinimumDeviceOverlapFilter {
        fn required_worker_inputs(&self) -> WorkerInputs {
            WorkerInputs::CACHE
        }
        fn keep(
            &mut self,
            _context: &WorkerSelectionContext<'_>,
            candidate: WorkerCandidate<'_>,
        ) -> Result<bool, WorkerSelectionPolicyError> {
            let cache = candidate
                .cache()
                .ok_or_else(|| WorkerSelectionPolicyError::failed("cache input unavailable"))?;
            Ok(cache.device_overlap_blocks() >= self.minimum_blocks)
        }
    }

    pub struct ActiveRequestsScorer;

    impl WorkerScorer for ActiveRequestsScorer {
        fn required_worker_inputs(&self) -> WorkerInputs {
            WorkerInputs::LOAD
        }
        fn score(
            &mut self,
            _context: &WorkerSelectionContext<'_>,
            candidates: WorkerCandidates<'_>,
            costs: &mut [f64],
        ) -> Result<(), WorkerSelectionPolicyError> {
            for (cost, candidate) in costs.iter_mut().zip(candidates.iter()) {
                let load = candidate
                    .load()
                    .ok_or_else(|| WorkerSelectionPolicyError::failed("load input unavailable"))?;
                *cost = load.active_requests() as f64;
            }
            Ok(())
        }
    }

    pub struct LowestCostPicker;

    impl WorkerPicker for LowestCostPicker {
        fn pick(
            &mut self,
            _context: &WorkerSelectionContext<'_>,
            input: WorkerInputView<'_>,
        ) -> Result<usize, WorkerSelectionPolicyError> {
            input
                .candidates()
                .iter()
                .enumerate()
                .min_by(|(_, left), (_, right)| left.cost().total_cmp(&right.cost()))
                .map(|(row, _)| row)
                .ok_or_else(|| WorkerSelectionPolicyError::failed("no eligible worker"))
        }
    }
}

/// The same policy on the SDK's traits, per candidate as the Dynamo code is written.
mod sdk_side {
    use switchyard_plugin_sdk::{
        PolicyError, WorkerCandidate, WorkerCandidates, WorkerFilter, WorkerInputs, WorkerPicker,
        WorkerScorer, WorkerSelectionContext,
    };

    pub struct MinimumDeviceOverlapFilter {
        pub minimum_blocks: f64,
    }

    impl WorkerFilter for MinimumDeviceOverlapFilter {
        fn required_worker_inputs(&self) -> WorkerInputs {
            WorkerInputs::CACHE
        }
        fn keep(
            &mut self,
            _context: &WorkerSelectionContext<'_>,
            candidate: &WorkerCandidate<'_>,
        ) -> Result<bool, PolicyError> {
            let cache = candidate.cache().ok_or("cache input unavailable")?;
            Ok(f64::from(cache.device_overlap_blocks) >= self.minimum_blocks)
        }
    }

    pub struct ActiveRequestsScorer;

    impl WorkerScorer for ActiveRequestsScorer {
        fn required_worker_inputs(&self) -> WorkerInputs {
            WorkerInputs::LOAD
        }
        fn score(
            &mut self,
            _context: &WorkerSelectionContext<'_>,
            candidate: &WorkerCandidate<'_>,
        ) -> Result<f64, PolicyError> {
            let load = candidate.load().ok_or("load input unavailable")?;
            Ok(f64::from(load.active_requests))
        }
    }

    pub struct LowestCostPicker;

    impl WorkerPicker for LowestCostPicker {
        fn pick(
            &mut self,
            _context: &WorkerSelectionContext<'_>,
            candidates: &WorkerCandidates<'_>,
        ) -> Result<usize, PolicyError> {
            candidates
                .costs()
                .ok_or("no costs")?
                .iter()
                .enumerate()
                .min_by(|(_, left), (_, right)| left.total_cmp(right))
                .map(|(row, _)| row)
                .ok_or_else(|| PolicyError::failed("no eligible worker"))
        }
    }
}

/// The same policy on the SDK's batch forms, over its columns (what a switchyard author
/// writes for speed): the same comparisons, the same first-lowest pick.
mod sdk_batch_side {
    use switchyard_plugin_sdk::{
        PolicyError, WorkerCandidate, WorkerCandidates, WorkerFilter, WorkerInputs, WorkerScorer,
        WorkerSelectionContext,
    };

    pub struct MinimumDeviceOverlapFilter {
        pub minimum_blocks: f64,
    }

    impl WorkerFilter for MinimumDeviceOverlapFilter {
        fn required_worker_inputs(&self) -> WorkerInputs {
            WorkerInputs::CACHE
        }
        fn keep(
            &mut self,
            _context: &WorkerSelectionContext<'_>,
            _candidate: &WorkerCandidate<'_>,
        ) -> Result<bool, PolicyError> {
            Err(PolicyError::failed("the router calls keep_batch"))
        }
        fn keep_batch(
            &mut self,
            _context: &WorkerSelectionContext<'_>,
            candidates: &WorkerCandidates<'_>,
            keep: &mut [bool],
        ) -> Result<(), PolicyError> {
            let cache = candidates.cache().ok_or("cache input unavailable")?;
            for (slot, &device) in keep.iter_mut().zip(cache.device_overlap_blocks) {
                *slot = f64::from(device) >= self.minimum_blocks;
            }
            Ok(())
        }
    }

    pub struct ActiveRequestsScorer;

    impl WorkerScorer for ActiveRequestsScorer {
        fn required_worker_inputs(&self) -> WorkerInputs {
            WorkerInputs::LOAD
        }
        fn score(
            &mut self,
            _context: &WorkerSelectionContext<'_>,
            _candidate: &WorkerCandidate<'_>,
        ) -> Result<f64, PolicyError> {
            Err(PolicyError::failed("the router calls score_batch"))
        }
        fn score_batch(
            &mut self,
            _context: &WorkerSelectionContext<'_>,
            candidates: &WorkerCandidates<'_>,
            costs: &mut [f64],
        ) -> Result<(), PolicyError> {
            let load = candidates.load().ok_or("load input unavailable")?;
            for (cost, &active) in costs.iter_mut().zip(load.active_requests) {
                *cost = f64::from(active);
            }
            Ok(())
        }
    }

    pub use super::sdk_side::LowestCostPicker;
}

fn compat() -> PolicyParts {
    WorkerSelectionPolicy::new_with_filters(
        KvRouterConfig::default(),
        "select",
        vec![Box::new(dynamo_side::MinimumDeviceOverlapFilter {
            minimum_blocks: MIN_BLOCKS,
        })],
        vec![Box::new(dynamo_side::ActiveRequestsScorer)],
        Box::new(dynamo_side::LowestCostPicker),
    )
    .into_parts()
}

fn compat_current() -> PolicyParts {
    dynamo_kv_router::plugins::worker_selection::WorkerSelectionPolicy::new_with_filters(
        KvRouterConfig::default(),
        "aggregated",
        vec![Box::new(current_side::MinimumDeviceOverlapFilter {
            minimum_blocks: MIN_BLOCKS,
        })],
        vec![Box::new(current_side::ActiveRequestsScorer)],
        Box::new(current_side::LowestCostPicker),
    )
    .into_parts()
}

fn sdk() -> PolicyParts {
    PolicyParts::new(
        vec![Box::new(sdk_side::MinimumDeviceOverlapFilter {
            minimum_blocks: MIN_BLOCKS,
        })],
        vec![Box::new(sdk_side::ActiveRequestsScorer)],
        Box::new(sdk_side::LowestCostPicker),
    )
}

fn sdk_batch() -> PolicyParts {
    PolicyParts::new(
        vec![Box::new(sdk_batch_side::MinimumDeviceOverlapFilter {
            minimum_blocks: MIN_BLOCKS,
        })],
        vec![Box::new(sdk_batch_side::ActiveRequestsScorer)],
        Box::new(sdk_batch_side::LowestCostPicker),
    )
}

fn sdk_builtins() -> PolicyParts {
    PolicyParts::new(
        vec![Box::new(MinDeviceOverlap::at_least(MIN_BLOCKS))],
        vec![Box::new(ActiveRequests)],
        Box::new(LowestCostByWorkerId),
    )
}

/// `WORKERS` rows, the same every run: overlaps 0-15 blocks (about three in four pass
/// the filter), 0-31 active requests.
fn fleet() -> Vec<Row> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (1..=WORKERS as u64)
        .map(|worker_id| Row {
            device_overlap_blocks: (next() % 16) as u32,
            active_requests: (next() % 32) as u32,
            ..Row::worker(worker_id)
        })
        .collect()
}

type Variant = (&'static str, fn() -> PolicyParts);
/// The compat variants first, then the SDK ones they are compared with.
const VARIANTS: [Variant; 5] = [
    ("compat", compat),
    ("compat-current", compat_current),
    ("sdk-batch", sdk_batch),
    ("sdk", sdk),
    ("sdk-builtins", sdk_builtins),
];
const COMPAT_VARIANTS: usize = 2;
const ROUNDS: usize = 201;
const PER_ROUND: u32 = 400;

fn bench_selection(c: &mut Criterion) {
    let rows = fleet();
    let mut group = c.benchmark_group("dynamo_compat");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for (label, parts) in VARIANTS {
        let (mut parts, mut selection) = (parts(), Selection::new(&rows));
        group.bench_function(BenchmarkId::new(label, WORKERS), |b| {
            b.iter(|| black_box(selection.select(&mut parts, REQUEST_BLOCKS).unwrap()))
        });
    }
    group.finish();
}

/// Microseconds per selection of each variant (`[variant][round]`) over interleaved
/// rounds, the order rotated each round so no variant always runs after the same one.
fn interleaved(rounds: usize, per_round: u32) -> Vec<Vec<f64>> {
    let rows = fleet();
    let mut variants: Vec<_> = VARIANTS
        .iter()
        .map(|(_, parts)| (parts(), Selection::new(&rows)))
        .collect();
    let mut times = vec![Vec::with_capacity(rounds); variants.len()];
    for round in 0..rounds {
        for step in 0..variants.len() {
            let index = (round + step) % variants.len();
            let (parts, selection) = &mut variants[index];
            let start = Instant::now();
            for _ in 0..per_round {
                black_box(selection.select(parts, REQUEST_BLOCKS).unwrap());
            }
            times[index].push(start.elapsed().as_secs_f64() * 1e6 / f64::from(per_round));
        }
    }
    times
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The median over rounds of `times`' ratio to `base` in the same round (paired, so a
/// noisy round moves both).
fn paired_ratio(times: &[f64], base: &[f64]) -> f64 {
    median(times.iter().zip(base).map(|(t, b)| t / b).collect())
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    bench_selection(&mut criterion);
    criterion.final_summary();
    if std::env::args().any(|arg| arg == "--profile-time") {
        return;
    }
    // The variants pick the same worker (ties aside, the built-in picker's order).
    let rows = fleet();
    let picks: Vec<_> = VARIANTS
        .iter()
        .map(|(_, parts)| Selection::new(&rows).select(&mut parts(), REQUEST_BLOCKS))
        .collect();
    println!("picks: {picks:?}");
    let times = interleaved(ROUNDS, PER_ROUND);
    println!(
        "{WORKERS} workers, median of {ROUNDS} interleaved rounds of {PER_ROUND} selections; \
         ratios are medians of per-round ratios (target: compat within 1.1x of sdk-batch)"
    );
    println!(
        "{:>14} {:>10} {:>11} {:>8} {:>14}",
        "variant", "us/select", "/sdk-batch", "/sdk", "/sdk-builtins"
    );
    for (index, (label, _)) in VARIANTS.iter().enumerate() {
        let us = median(times[index].clone());
        if index < COMPAT_VARIANTS {
            println!(
                "{label:>14} {us:>10.3} {:>10.3}x {:>7.3}x {:>13.3}x",
                paired_ratio(&times[index], &times[2]),
                paired_ratio(&times[index], &times[3]),
                paired_ratio(&times[index], &times[4]),
            );
        } else {
            println!("{label:>14} {us:>10.3}");
        }
    }
}
