//! The KV index against a simple reference model: random sequences of stored / removed /
//! cleared events and queries, same answers.

use std::collections::{HashMap, HashSet};

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use switchyard_fleet::kv_index::{
    BoundPassed, IndexShape, KvEvent, KvIndex, QueryScratch, SlotRows, Tier,
};
use switchyard_plugin_sdk::WorkerId;

/// The obvious model: per worker and tier, the set of hashes held.
#[derive(Default)]
struct Reference {
    held: HashMap<(WorkerId, Tier), HashSet<u64>>,
}

impl Reference {
    fn apply(&mut self, worker: WorkerId, event: &KvEvent) {
        match event {
            KvEvent::Stored {
                tier, block_hashes, ..
            } => self
                .held
                .entry((worker, *tier))
                .or_default()
                .extend(block_hashes),
            KvEvent::Removed { tier, block_hashes } => {
                if let Some(set) = self.held.get_mut(&(worker, *tier)) {
                    for h in block_hashes {
                        set.remove(h);
                    }
                }
            }
            KvEvent::Cleared { tier } => self
                .held
                .retain(|(w, t), _| !(*w == worker && tier.is_none_or(|x| x == *t))),
        }
    }

    fn prefix(&self, worker: WorkerId, tier: Tier, hashes: &[u64]) -> u32 {
        let Some(set) = self.held.get(&(worker, tier)) else {
            return 0;
        };
        hashes.iter().take_while(|h| set.contains(h)).count() as u32
    }
}

#[test]
fn index_matches_the_reference_model_on_random_events() {
    for lazy_runs in [0, 4, usize::MAX] {
        random_walk(6, 3000, 4096, 2, lazy_runs, 42);
    }
}

/// Enough workers that holder sets become lists and bitsets, shared prefixes stored by
/// many workers in one event (shared sets, copied on write), and a low sweep floor so
/// departed workers are swept often.
#[test]
fn index_matches_the_reference_model_with_a_wide_fleet_and_frequent_sweeps() {
    let mut seen = IndexShape::default();
    for seed in 0..3 {
        let lazy_runs = [0, 4, usize::MAX][seed as usize];
        let shape = random_walk(300, 4000, 16, 6, lazy_runs, seed);
        seen.lists += shape.lists;
        seen.bitsets += shape.bitsets;
        seen.sweeps += shape.sweeps;
    }
    assert!(
        seen.lists > 0 && seen.bitsets > 0 && seen.sweeps > 0,
        "every representation and the sweep were exercised: {seen:?}"
    );
}

/// A random event for `chain` in `tier`: of 20, `clears` clear a worker (the tier or all
/// of it), most of the rest store part of the chain, the others remove some of it.
fn random_event(rng: &mut rand::rngs::StdRng, tier: Tier, chain: &[u64], clears: u32) -> KvEvent {
    let roll = rng.gen_range(0..20);
    match roll {
        _ if roll < clears => KvEvent::Cleared {
            tier: if rng.gen_bool(0.5) { Some(tier) } else { None },
        },
        _ if roll < 14 => {
            let start = if rng.gen_bool(0.7) {
                0
            } else {
                rng.gen_range(0..chain.len())
            };
            let end = rng.gen_range(start..=chain.len());
            KvEvent::Stored {
                tier,
                parent_hash: start.checked_sub(1).map(|p| chain[p]),
                block_hashes: chain[start..end].to_vec(),
            }
        }
        _ => {
            let n = rng.gen_range(0..4);
            KvEvent::Removed {
                tier,
                block_hashes: (0..n)
                    .map(|_| chain[rng.gen_range(0..chain.len())])
                    .collect(),
            }
        }
    }
}

/// `query_rows` answers as `query` does, in a partition's row order: some of the workers,
/// shuffled, and one the index has never seen.
fn same_in_row_order(
    index: &KvIndex,
    reference: &Reference,
    workers: &[WorkerId],
    query: &[u64],
    fleet: u32,
    rng: &mut rand::rngs::StdRng,
) {
    let mut scratch = QueryScratch::default();
    let mut rows = SlotRows::default();
    let mut columns: [Vec<u32>; 3] = Default::default();
    let mut members: Vec<WorkerId> = workers
        .iter()
        .copied()
        .filter(|_| rng.gen_bool(0.7))
        .collect();
    members.shuffle(rng);
    members.push(WorkerId {
        worker_id: u64::MAX,
        dp_rank: 0,
    });
    rows.set(members.iter().map(|&w| index.slot_of(w)));
    for column in &mut columns {
        column.clear();
        column.resize(members.len(), u32::MAX);
    }
    let [device, host, disk] = &mut columns;
    let fleet_of_rows = index.query_rows(query, &mut scratch, &rows, [device, host, disk]);
    assert_eq!(fleet_of_rows, fleet, "query {query:?}");
    for (row, &w) in members.iter().enumerate() {
        for t in Tier::ALL {
            assert_eq!(
                columns[t as usize][row],
                reference.prefix(w, t, query),
                "row {row} worker {w:?} tier {t:?} query {query:?}"
            );
        }
    }
}

/// `clears`: out of 20 events, how many clear a worker (one tier or all of it).
fn random_walk(
    fleet: u64,
    steps: usize,
    sweep_floor: u64,
    clears: u32,
    lazy_runs: usize,
    seed: u64,
) -> IndexShape {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let workers: Vec<WorkerId> = (0..fleet)
        .map(|i| WorkerId {
            worker_id: i / 2,
            dp_rank: (i % 2) as u32,
        })
        .collect();
    // A few "conversations": each is a chain of block hashes; requests share prefixes.
    let chains: Vec<Vec<u64>> = (0..5)
        .map(|c| (0..20).map(|i| (c as u64) << 32 | i).collect())
        .collect();
    let mut index = KvIndex::with_sweep_floor(sweep_floor);
    // Per-read run tests, or one dense result per query: both must be exact.
    index.set_lazy_runs(lazy_runs);
    let mut reference = Reference::default();
    let mut scratch = QueryScratch::default();
    let tiers = Tier::ALL;
    let mut nonzero = 0;
    for step in 0..steps {
        let worker = workers[rng.gen_range(0..workers.len())];
        let tier = tiers[rng.gen_range(0..3)];
        let chain = &chains[rng.gen_range(0..chains.len())];
        let event = random_event(&mut rng, tier, chain, clears);
        index.apply(worker, &event);
        reference.apply(worker, &event);

        if step % 3 == 0 {
            let query_chain = &chains[rng.gen_range(0..chains.len())];
            let len = rng.gen_range(0..=query_chain.len());
            let query = &query_chain[..len];
            let result = index.query(query, &mut scratch);
            let mut fleet = 0;
            for t in tiers {
                let pairs: usize = workers
                    .iter()
                    .map(|&w| reference.held.get(&(w, t)).map_or(0, HashSet::len))
                    .sum();
                assert_eq!(
                    index.blocks()[t as usize],
                    pairs,
                    "step {step}: pairs in {t:?}"
                );
            }
            for &w in &workers {
                for t in tiers {
                    let expected = reference.prefix(w, t, query);
                    assert_eq!(
                        result.overlap(w).tier(t),
                        expected,
                        "step {step}: worker {w:?} tier {t:?} query {query:?}"
                    );
                    fleet = fleet.max(expected);
                    nonzero += usize::from(expected > 0);
                }
            }
            assert_eq!(result.fleet_prefix, fleet, "step {step}");
            // The same answer in a partition's row order.
            same_in_row_order(&index, &reference, &workers, query, fleet, &mut rng);
        }
    }
    assert!(
        nonzero > 1000,
        "the random walk must exercise real overlaps, got {nonzero}"
    );
    index.shape()
}

/// Of 20 events, 1 clears the tier, 15 store up to 10 blocks of `chain`, 4 remove 3.
fn store_mostly(rng: &mut rand::rngs::StdRng, tier: Tier, chain: &[u64]) -> KvEvent {
    match rng.gen_range(0..20) {
        0 => KvEvent::Cleared { tier: Some(tier) },
        1..=15 => {
            let start = rng.gen_range(0..chain.len());
            let end = rng.gen_range(start..=chain.len().min(start + 10));
            KvEvent::Stored {
                tier,
                parent_hash: None,
                block_hashes: chain[start..end].to_vec(),
            }
        }
        _ => KvEvent::Removed {
            tier,
            block_hashes: (0..3).map(|_| chain[rng.gen_range(0..20)]).collect(),
        },
    }
}

/// Whether `worker` holds `hash` in `tier`.
fn holds(index: &KvIndex, worker: WorkerId, tier: Tier, hash: u64) -> bool {
    let mut scratch = QueryScratch::default();
    index
        .query(&[hash], &mut scratch)
        .overlap(worker)
        .tier(tier)
        > 0
}

/// No worker holds more than its budget in any tier.
fn within_budgets(
    index: &KvIndex,
    workers: &[WorkerId],
    budgets: &HashMap<WorkerId, [u64; 3]>,
    step: usize,
) {
    for &w in workers {
        for t in Tier::ALL {
            assert!(
                index.held(w, t) <= budgets[&w][t as usize],
                "step {step}: {w:?} holds {} in {t:?}, budget {}",
                index.held(w, t),
                budgets[&w][t as usize]
            );
        }
    }
}

/// No worker holds, along `query`, what was never stored or was removed.
fn nothing_unstored(
    index: &KvIndex,
    reference: &Reference,
    workers: &[WorkerId],
    query: &[u64],
    step: usize,
) {
    let mut scratch = QueryScratch::default();
    let result = index.query(query, &mut scratch);
    for &w in workers {
        for t in Tier::ALL {
            assert!(
                result.overlap(w).tier(t) <= reference.prefix(w, t, query),
                "step {step}: {w:?} holds in {t:?} what was never stored or was removed"
            );
        }
    }
}

/// Workers whose events store far more than their budget (lost removals, a lying
/// engine): after every event each holds no more than its budget per tier, the index
/// holds nothing the reference (unbounded) model does not, the blocks of the latest store
/// are held (up to the budget: a worker past it is forgotten in that tier and keeps that
/// store's prefix), and every pair the index dropped is counted and reported. Budgets are
/// set before a worker's first event and lowered mid-run.
#[test]
fn budgets_bound_what_each_worker_holds_keeping_its_latest_store() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(28);
    let (workers, chains) = fleet_and_chains(4, 12);
    let mut index = KvIndex::with_sweep_floor(64);
    let mut reference = Reference::default();
    let mut budgets: HashMap<WorkerId, [u64; 3]> = HashMap::new();
    for &w in &workers {
        let budget = [30 + w.worker_id * 10, 25, u64::MAX];
        index.set_budget(w, budget);
        budgets.insert(w, budget);
    }
    let mut reported = 0;
    for step in 0..20_000 {
        let worker = workers[rng.gen_range(0..workers.len())];
        let tier = Tier::ALL[rng.gen_range(0..2)];
        let chain = &chains[rng.gen_range(0..chains.len())];
        if step == 10_000 {
            let budget = [12, 12, u64::MAX];
            index.set_budget(worker, budget);
            budgets.insert(worker, budget);
            reported += forgotten_pairs(&mut index, worker, BoundPassed::Worker);
        }
        let event = store_mostly(&mut rng, tier, chain);
        let evicted_before = index.evicted();
        index.apply(worker, &event);
        reference.apply(worker, &event);
        assert!(
            index.evicted() == evicted_before || matches!(event, KvEvent::Stored { .. }),
            "step {step}: only stores evict"
        );
        reported += forgotten_pairs(&mut index, worker, BoundPassed::Worker);
        within_budgets(&index, &workers, &budgets, step);
        if let KvEvent::Stored { block_hashes, .. } = &event {
            let kept = block_hashes
                .len()
                .min(budgets[&worker][tier as usize] as usize);
            for &hash in &block_hashes[..kept] {
                assert!(
                    holds(&index, worker, tier, hash),
                    "step {step}: block {hash:x}, just stored, was dropped"
                );
            }
        }
        let query = &chains[rng.gen_range(0..chains.len())];
        nothing_unstored(&index, &reference, &workers, query, step);
    }
    assert!(index.evicted() > 1_000, "evicted only {}", index.evicted());
    assert_eq!(
        reported,
        index.evicted(),
        "every forgotten pair is reported"
    );
    // Every pair stored and never removed by an event is either held or counted evicted.
    let held: u64 = index.blocks().iter().map(|&b| b as u64).sum();
    let reference_pairs: u64 = reference.held.values().map(|s| s.len() as u64).sum();
    assert!(held <= reference_pairs);
    assert!(
        held + index.evicted() >= reference_pairs,
        "{held} held + {} evicted < {reference_pairs}",
        index.evicted()
    );
}

/// `workers` workers and `chains` chains of 20 blocks each, no block in two chains.
fn fleet_and_chains(workers: u64, chains: u64) -> (Vec<WorkerId>, Vec<Vec<u64>>) {
    let workers = (0..workers)
        .map(|i| WorkerId {
            worker_id: i,
            dp_rank: 0,
        })
        .collect();
    let chains = (0..chains)
        .map(|c| (0..20).map(|i| (c + 1) << 32 | i).collect())
        .collect();
    (workers, chains)
}

/// The pairs reported forgotten since the last call; each report names `worker` (the
/// only one whose event ran) and `bound`.
fn forgotten_pairs(index: &mut KvIndex, worker: WorkerId, bound: BoundPassed) -> u64 {
    let mut pairs = 0;
    for gone in index.take_forgotten() {
        assert_eq!((gone.worker, gone.bound), (worker, bound), "{gone:?}");
        pairs += gone.pairs;
    }
    pairs
}

/// The fleet's bound: no tier ever holds more pairs than `max_pairs`, the worker
/// forgotten is the one holding the most, and what any worker holds is still true.
#[test]
fn the_fleets_bound_caps_every_tier_forgetting_the_largest_holder() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(46);
    let (workers, chains) = fleet_and_chains(6, 40);
    let mut index = KvIndex::with_sweep_floor(64);
    index.set_max_pairs(150);
    let mut reference = Reference::default();
    let mut forgotten = 0;
    for step in 0..5_000 {
        // Worker 0 stores most: it is the largest holder when the cap is reached.
        let worker = workers[if rng.gen_bool(0.5) {
            0
        } else {
            rng.gen_range(1..6)
        }];
        let tier = Tier::ALL[rng.gen_range(0..2)];
        let chain = &chains[rng.gen_range(0..chains.len())];
        let event = store_mostly(&mut rng, tier, chain);
        let largest = workers.iter().map(|&w| index.held(w, tier)).max();
        index.apply(worker, &event);
        reference.apply(worker, &event);
        for gone in index.take_forgotten() {
            assert_eq!(gone.bound, BoundPassed::Fleet);
            assert!(
                Some(gone.pairs) >= largest,
                "step {step}: {gone:?} was not the largest"
            );
            forgotten += 1;
        }
        for t in Tier::ALL {
            let held: u64 = workers.iter().map(|&w| index.held(w, t)).sum();
            assert!(held <= 150, "step {step}: {t:?} holds {held} pairs");
        }
        let query = &chains[rng.gen_range(0..chains.len())];
        nothing_unstored(&index, &reference, &workers, query, step);
    }
    assert!(forgotten > 10, "the cap was reached only {forgotten} times");
}
