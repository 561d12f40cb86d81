//! The KV index at fleet scale: bytes per (block, worker) pair, store rate, and the time of
//! a 64-block query, for the index the router uses and, side by side in the same run, the
//! per-block-bitset index it replaced (kept below as `bitset_baseline`).
//!
//! Each case is W workers each holding B blocks: a 32-block system prompt every worker
//! shares (stored with its first conversation, as an engine publishes it) and its own
//! conversation prefixes, stored 16 blocks per event. The query is the system prompt plus
//! 32 blocks of one worker's conversation: every worker overlaps 32 blocks, one 64.
//!
//! Memory and store rate are measured per case in a child process (resident memory before
//! and after building, so allocator overhead counts); query times by criterion.
//!
//! `make bench-kv-index` (or `cargo bench -p switchyard --bench kv_index`). The largest case
//! (10,000 x 5,000 = 50 M pairs) needs about 2 GB and a minute; SWITCHYARD_KV_BENCH_QUICK=1
//! skips it.

use std::hint::black_box;
use std::process::Command;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use switchyard::fleet::kv_index::{KvEvent, KvIndex, QueryScratch, Tier};
use switchyard_plugin_sdk::WorkerId;

const CASES: [(u64, u64); 5] = [
    (100, 2_000),
    (1_000, 2_000),
    (1_000, 10_000),
    (10_000, 200),
    (10_000, 5_000),
];
const SYSTEM_PROMPT: u64 = 32;
const CHUNK: u64 = 16;
const CHILD: &str = "SWITCHYARD_KV_BENCH_CHILD";

fn cases() -> Vec<(u64, u64)> {
    let quick = std::env::var_os("SWITCHYARD_KV_BENCH_QUICK").is_some();
    CASES
        .into_iter()
        .filter(|&(w, b)| !quick || w * b < 20_000_000)
        .collect()
}

fn worker(w: u64) -> WorkerId {
    WorkerId {
        worker_id: w,
        dp_rank: 0,
    }
}

/// Block `i` of worker `w`'s chain: the shared system prompt, then its own blocks.
fn block(w: u64, i: u64) -> u64 {
    if i < SYSTEM_PROMPT {
        0x5157_0000_0000 + i + 1
    } else {
        (w + 1) << 32 | i
    }
}

/// The events that load worker `w` with `blocks` blocks.
fn events(w: u64, blocks: u64) -> impl Iterator<Item = KvEvent> {
    let first = (SYSTEM_PROMPT + CHUNK).min(blocks);
    let starts = std::iter::once(0).chain((first..blocks).step_by(CHUNK as usize));
    starts.map(move |start| {
        let end = if start == 0 {
            first
        } else {
            (start + CHUNK).min(blocks)
        };
        KvEvent::Stored {
            tier: Tier::Device,
            parent_hash: start.checked_sub(1).map(|p| block(w, p)),
            block_hashes: (start..end).map(|i| block(w, i)).collect(),
        }
    })
}

fn query_hashes(blocks: u64) -> Vec<u64> {
    (0..64.min(blocks)).map(|i| block(0, i)).collect()
}

/// The two indexes behind one interface.
trait Index: Default {
    fn apply(&mut self, worker: WorkerId, event: &KvEvent);
    /// Queries `hashes` and reads every worker's device overlap, as a selection does.
    fn query_all(&self, hashes: &[u64], workers: u64, scratch: &mut Scratch) -> u64;
    /// Queries only (what the index does before the router asks about candidates).
    fn query(&self, hashes: &[u64], scratch: &mut Scratch) -> u32;
}

#[derive(Default)]
struct Scratch {
    new: QueryScratch,
    old: bitset_baseline::QueryScratch,
}

impl Index for KvIndex {
    fn apply(&mut self, worker: WorkerId, event: &KvEvent) {
        KvIndex::apply(self, worker, event)
    }
    fn query_all(&self, hashes: &[u64], workers: u64, scratch: &mut Scratch) -> u64 {
        let result = KvIndex::query(self, hashes, &mut scratch.new);
        (0..workers)
            .map(|w| u64::from(result.overlap(worker(w)).tier(Tier::Device)))
            .sum()
    }
    fn query(&self, hashes: &[u64], scratch: &mut Scratch) -> u32 {
        KvIndex::query(self, hashes, &mut scratch.new).fleet_prefix
    }
}

impl Index for bitset_baseline::KvIndex {
    fn apply(&mut self, worker: WorkerId, event: &KvEvent) {
        bitset_baseline::KvIndex::apply(self, worker, event)
    }
    fn query_all(&self, hashes: &[u64], workers: u64, scratch: &mut Scratch) -> u64 {
        let result = self.query(hashes, &mut scratch.old);
        (0..workers)
            .map(|w| u64::from(result.device_overlap(worker(w))))
            .sum()
    }
    fn query(&self, hashes: &[u64], scratch: &mut Scratch) -> u32 {
        bitset_baseline::KvIndex::query(self, hashes, &mut scratch.old).fleet_prefix
    }
}

fn build<I: Index>(workers: u64, blocks: u64) -> I {
    let mut index = I::default();
    for w in 0..workers {
        for event in events(w, blocks) {
            index.apply(worker(w), &event);
        }
    }
    index
}

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// In the child: builds one index, prints resident bytes added and seconds to build.
fn child(spec: &str) {
    let parts: Vec<&str> = spec.split(',').collect();
    let (which, workers, blocks): (&str, u64, u64) = (
        parts[0],
        parts[1].parse().unwrap(),
        parts[2].parse().unwrap(),
    );
    let before = resident_bytes();
    let started = Instant::now();
    let (heap, check) = if which == "new" {
        let index: KvIndex = build(workers, blocks);
        let seconds = started.elapsed().as_secs_f64();
        let check = index.query_all(&query_hashes(blocks), workers, &mut Scratch::default());
        println!(
            "{} {seconds} {}",
            resident_bytes() - before,
            index.heap_bytes()
        );
        (index.heap_bytes(), check)
    } else {
        let index: bitset_baseline::KvIndex = build(workers, blocks);
        let seconds = started.elapsed().as_secs_f64();
        let check = Index::query_all(
            &index,
            &query_hashes(blocks),
            workers,
            &mut Scratch::default(),
        );
        println!("{} {seconds} 0", resident_bytes() - before);
        (0, check)
    };
    // Both indexes must agree on the overlaps they are timed on.
    let expected =
        workers * SYSTEM_PROMPT.min(blocks) + (64.min(blocks) - SYSTEM_PROMPT.min(blocks));
    assert_eq!(check, expected, "{which}: overlaps");
    let _ = heap;
}

/// Memory and store rate of both indexes per case, each built in its own process.
fn memory_table() {
    println!("\nKV index memory and store rate (each built in a fresh process)");
    println!(
        "| workers | blocks/worker | pairs | bytes/pair (resident) | bytes/pair (allocated) | store M pairs/s | baseline bytes/pair | baseline M pairs/s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (workers, blocks) in cases() {
        let pairs = workers * blocks;
        let run = |which: &str| -> (f64, f64, f64) {
            let out = Command::new(std::env::current_exe().unwrap())
                .env(CHILD, format!("{which},{workers},{blocks}"))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8_lossy(&out.stdout);
            let fields: Vec<f64> = text
                .split_whitespace()
                .filter_map(|f| f.parse().ok())
                .collect();
            (fields[0], fields[1], fields[2])
        };
        let (rss, seconds, heap) = run("new");
        let baseline = if workers * blocks <= 10_000_000 {
            let (rss, seconds, _) = run("old");
            format!(
                "{:.0} | {:.1}",
                rss / pairs as f64,
                pairs as f64 / seconds / 1e6
            )
        } else {
            "(not run: too large) | -".into()
        };
        println!(
            "| {workers} | {blocks} | {:.1} M | {:.1} | {:.1} | {:.1} | {baseline} |",
            pairs as f64 / 1e6,
            rss / pairs as f64,
            heap / pairs as f64,
            pairs as f64 / seconds / 1e6,
        );
    }
    println!();
}

/// Clearing a worker's tier and removing workers, against storing the same blocks, per
/// block: 3 workers of 100k and 1M blocks each (issue #28: a clear was quadratic).
/// Removing one worker of three only marks its slot dead; the second removal sweeps
/// both (dead pairs then outnumber the live ones).
fn clear_table() {
    println!("\nKV clean-up, per removed block, 3 workers (one run each)");
    println!("| blocks/worker | store ns/block | clear tier ns/block | clear ms | remove 2 workers ns/block | remove ms |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for blocks in [100_000u64, 1_000_000] {
        let started = Instant::now();
        let mut index: KvIndex = build(3, blocks);
        let store = started.elapsed().as_secs_f64() / (3 * blocks) as f64;
        let started = Instant::now();
        index.apply(
            worker(0),
            &KvEvent::Cleared {
                tier: Some(Tier::Device),
            },
        );
        let clear = started.elapsed().as_secs_f64();
        assert_eq!(index.blocks()[0] as u64, 2 * blocks);
        let started = Instant::now();
        index.remove_worker(worker(1));
        index.remove_worker(worker(2));
        let remove = started.elapsed().as_secs_f64();
        assert_eq!(index.blocks()[0], 0);
        println!(
            "| {blocks} | {:.0} | {:.0} | {:.1} | {:.0} | {:.1} |",
            store * 1e9,
            clear / blocks as f64 * 1e9,
            clear * 1e3,
            remove / (2 * blocks) as f64 * 1e9,
            remove * 1e3,
        );
    }
    println!();
}

/// Every worker holds a different prefix of one 64-block chain (a popular prompt cached
/// to different depths): 64 distinct holder sets along the request, the case the
/// router's select-and-reserve benchmark builds.
fn prefixes(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    for workers in [1_024u64, 10_000] {
        let chain: Vec<u64> = (0..64).map(|i| 1_000 + i).collect();
        let held = |w: u64| ((w * 7919) % 65) as usize;
        let load = |index: &mut dyn FnMut(WorkerId, &KvEvent)| {
            for w in 0..workers {
                let event = KvEvent::Stored {
                    tier: Tier::Device,
                    parent_hash: None,
                    block_hashes: chain[..held(w)].to_vec(),
                };
                index(worker(w), &event);
            }
        };
        let mut new = KvIndex::default();
        load(&mut |w, e| new.apply(w, e));
        let mut old = bitset_baseline::KvIndex::default();
        load(&mut |w, e| old.apply(w, e));
        let mut scratch = Scratch::default();
        let case = format!("{workers} prefixes");
        group.bench_function(BenchmarkId::new("query64", &case), |b| {
            b.iter(|| black_box(Index::query(&new, &chain, &mut scratch)))
        });
        group.bench_function(BenchmarkId::new("baseline query64", &case), |b| {
            b.iter(|| black_box(Index::query(&old, &chain, &mut scratch)))
        });
        group.bench_function(BenchmarkId::new("query64+overlap-all", &case), |b| {
            b.iter(|| black_box(new.query_all(&chain, workers, &mut scratch)))
        });
        group.bench_function(
            BenchmarkId::new("baseline query64+overlap-all", &case),
            |b| b.iter(|| black_box(old.query_all(&chain, workers, &mut scratch))),
        );
    }
}

fn bench(c: &mut Criterion) {
    if let Ok(spec) = std::env::var(CHILD) {
        child(&spec);
        std::process::exit(0);
    }
    memory_table();
    clear_table();
    let mut group = c.benchmark_group("kv_index");
    for (workers, blocks) in cases() {
        if workers * blocks > 10_000_000 {
            continue; // the memory table covers it; in-process it would crowd the others
        }
        let hashes = query_hashes(blocks);
        let case = format!("{workers}x{blocks}");
        let mut scratch = Scratch::default();
        let index: KvIndex = build(workers, blocks);
        group.bench_with_input(BenchmarkId::new("query64", &case), &hashes, |b, h| {
            b.iter(|| black_box(Index::query(&index, h, &mut scratch)))
        });
        group.bench_with_input(
            BenchmarkId::new("query64+overlap-all", &case),
            &hashes,
            |b, h| b.iter(|| black_box(index.query_all(h, workers, &mut scratch))),
        );
        // Churn at steady state: one worker evicts a 16-block chunk and stores it again.
        let mut index = index;
        let w = worker(workers / 2);
        let chunk: Vec<u64> = (SYSTEM_PROMPT..SYSTEM_PROMPT + CHUNK)
            .map(|i| block(workers / 2, i))
            .collect();
        let removed = KvEvent::Removed {
            tier: Tier::Device,
            block_hashes: chunk.clone(),
        };
        let stored = KvEvent::Stored {
            tier: Tier::Device,
            parent_hash: Some(block(workers / 2, SYSTEM_PROMPT - 1)),
            block_hashes: chunk,
        };
        group.bench_function(BenchmarkId::new("evict+store 32 pairs", &case), |b| {
            b.iter(|| {
                index.apply(w, &removed);
                index.apply(w, &stored);
            })
        });
        drop(index);
        let baseline: bitset_baseline::KvIndex = build(workers, blocks);
        group.bench_with_input(
            BenchmarkId::new("baseline query64", &case),
            &hashes,
            |b, h| b.iter(|| black_box(Index::query(&baseline, h, &mut scratch))),
        );
        group.bench_with_input(
            BenchmarkId::new("baseline query64+overlap-all", &case),
            &hashes,
            |b, h| b.iter(|| black_box(baseline.query_all(h, workers, &mut scratch))),
        );
    }
    prefixes(&mut group);
    group.finish();
}

/// The index this replaced: per block a bitset over every worker slot, per worker the
/// set of hashes it holds, and a dense per-slot result cleared on every query. Kept only
/// to measure against.
mod bitset_baseline {
    use rustc_hash::{FxHashMap, FxHashSet};
    use switchyard::fleet::kv_index::KvEvent;
    use switchyard_plugin_sdk::WorkerId;

    #[derive(Default)]
    pub struct KvIndex {
        by_worker: FxHashMap<WorkerId, u32>,
        count: u32,
        holders: FxHashMap<u64, Vec<u64>>,
        held: FxHashMap<u32, FxHashSet<u64>>,
    }

    #[derive(Default)]
    pub struct QueryScratch {
        prefix: Vec<[u32; 3]>,
        active: Vec<u64>,
    }

    pub struct QueryResult<'a> {
        index: &'a KvIndex,
        prefix: &'a [[u32; 3]],
        pub fleet_prefix: u32,
    }

    impl QueryResult<'_> {
        pub fn device_overlap(&self, worker: WorkerId) -> u32 {
            self.index
                .by_worker
                .get(&worker)
                .and_then(|&s| self.prefix.get(s as usize))
                .map_or(0, |tiers| tiers[0])
        }
    }

    impl KvIndex {
        pub fn apply(&mut self, worker: WorkerId, event: &KvEvent) {
            let KvEvent::Stored { block_hashes, .. } = event else {
                unimplemented!("the baseline is only built and queried");
            };
            let count = &mut self.count;
            let slot = *self.by_worker.entry(worker).or_insert_with(|| {
                *count += 1;
                *count - 1
            });
            let held = self.held.entry(slot).or_default();
            for &hash in block_hashes {
                if held.insert(hash) {
                    let bits = self.holders.entry(hash).or_default();
                    let word = (slot / 64) as usize;
                    if bits.len() <= word {
                        bits.resize(word + 1, 0);
                    }
                    bits[word] |= 1 << (slot % 64);
                }
            }
        }

        pub fn query<'a>(
            &'a self,
            hashes: &[u64],
            scratch: &'a mut QueryScratch,
        ) -> QueryResult<'a> {
            // As the original: one [device, host, disk] entry per slot, cleared per query
            // (this baseline holds the device tier only; the others stay empty).
            scratch.prefix.clear();
            scratch.prefix.resize(self.count as usize, [0; 3]);
            scratch.active.clear();
            let mut depth = 0u32;
            if let Some(first) = hashes.first().and_then(|h| self.holders.get(h)) {
                scratch.active.extend_from_slice(first);
                let prefix = &mut scratch.prefix;
                let mut record = |word: usize, mut bits: u64, depth: u32| {
                    while bits != 0 {
                        prefix[word * 64 + bits.trailing_zeros() as usize][0] = depth;
                        bits &= bits - 1;
                    }
                };
                depth = 1;
                let mut done = false;
                for hash in &hashes[1..] {
                    let next = self.holders.get(hash).map_or(&[][..], Vec::as_slice);
                    let mut any = false;
                    for (word, bits) in scratch.active.iter_mut().enumerate() {
                        let kept = *bits & next.get(word).copied().unwrap_or(0);
                        record(word, *bits & !kept, depth);
                        *bits = kept;
                        any |= kept != 0;
                    }
                    if !any {
                        done = true;
                        break;
                    }
                    depth += 1;
                }
                if !done {
                    for (word, &bits) in scratch.active.iter().enumerate() {
                        record(word, bits, depth);
                    }
                }
            }
            QueryResult {
                index: self,
                prefix: &scratch.prefix,
                fleet_prefix: depth,
            }
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
