//! Selection benchmark: the same `least-busy` policy compiled into the router and as Rust,
//! C and C++ plugins, plus the built-in `default` policy, at 8 to 10,000 workers with
//! requests of 64 blocks; then whole select-and-reserve calls through the router.
//!
//! A selection runs as the router's does: over a partition's kept columns, lent, with the
//! request's cache overlaps written per row. The side-by-side table also times the
//! built-in policy over columns filled row by row from scratch (`built-in, rows`: what
//! tools and tests do, and what the router did per request before it kept columns).
//!
//! Last, the compaction pass (what a filter that drops rows costs per column) timed with
//! its output at each place modulo 4 KiB relative to its input, to check it for the 4K
//! aliasing found in the request columns (`columns.rs`, `fill`).
//!
//! Run: `make bench` (builds the plugins, then `cargo bench -p switchyard --bench selection`).
//! After criterion's timings it prints plugin / built-in ratios measured side by side:
//! the variants run in interleaved rounds, so machine noise hits them alike.

mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use rand::{Rng, SeedableRng};
use switchyard::config::ConfigSource;
use switchyard::fleet::router::{RouteRequest, Router};
use switchyard::fleet::workers::WorkerSpec;
use switchyard::plugin::PartitionKey;
use switchyard::plugin::PromptBlocks;
use switchyard::policy::columns::KeepBits;
use switchyard::policy::{CandidatesFrom, RowExtras, Selector};
use switchyard::startup::{start, Startup};
use switchyard_plugin_sdk::{WorkerId, WorkerType};

use common::{fleet, kept, least_busy_plugins, overlaps, repo};

const SIZES: [usize; 4] = [8, 128, 1024, 10_000];
const REQUEST_BLOCKS: u64 = 64;
const VARIANTS: [(&str, &str); 5] = [
    ("built-in", "builtin-least-busy"),
    ("rust-plugin", "rust"),
    ("c-plugin", "c"),
    ("cpp-plugin", "cpp"),
    ("default-policy", "default"),
];

fn startup() -> Startup {
    let [rust, c, cpp] = least_busy_plugins("bench");
    let yaml = format!(
        "plugins:\n  - path: {}\n  - path: {}\n  - path: {}\nworker_selection:\n  builtin_default: {{seed: 1}}\n  instances:\n\
         \x20   - {{name: builtin-least-busy, type: builtin.least-busy, parameters: {{min_device_overlap_blocks: 4}}}}\n\
         \x20   - {{name: rust, type: least-busy, parameters: {{min_device_overlap_blocks: 4}}}}\n\
         \x20   - {{name: c, type: c.least-busy, parameters: {{min_device_overlap_blocks: 4}}}}\n\
         \x20   - {{name: cpp, type: cpp.least-busy, parameters: {{min_device_overlap_blocks: 4}}}}\n",
        rust,
        c,
        cpp,
    );
    let source = ConfigSource::parse(yaml, "<bench>".into(), repo()).unwrap();
    start(source).unwrap_or_else(|e| panic!("{e:?}"))
}

fn selectors(startup: &Startup) -> Vec<(&'static str, Selector)> {
    selectors_of(startup, &VARIANTS)
}

fn selectors_of(
    startup: &Startup,
    variants: &[(&'static str, &str)],
) -> Vec<(&'static str, Selector)> {
    variants
        .iter()
        .map(|(label, instance)| {
            let policy = startup
                .instance(instance)
                .unwrap()
                .build(&PartitionKey::new("bench", WorkerType::Select))
                .unwrap();
            (*label, Selector::new(policy))
        })
        .collect()
}

fn bench_selection(c: &mut Criterion, startup: &Startup) {
    let (request, prompt) = (
        RouteRequest::default(),
        PromptBlocks::new(16, REQUEST_BLOCKS),
    );
    let mut group = c.benchmark_group("selection");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for size in SIZES {
        let rows = fleet(size);
        let (kept, overlaps) = (kept(&rows), overlaps(&rows));
        group.throughput(Throughput::Elements(1));
        for (label, mut selector) in selectors(startup) {
            group.bench_with_input(BenchmarkId::new(label, size), &overlaps, |b, overlaps| {
                b.iter(|| {
                    black_box(
                        selector
                            .select(
                                &request,
                                prompt,
                                CandidatesFrom::Lent(&kept, &mut |out| overlaps.write(out)),
                                None,
                            )
                            .unwrap(),
                    )
                })
            });
        }
    }
    group.finish();
}

fn router_with(size: usize, instance: &str) -> (Router, RouteRequest) {
    let mut startup = startup();
    // What routing reads (a request names no instance).
    startup.role_defaults = switchyard::startup::RoleDefaults::all(instance);
    let router = Router::new(startup).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let chain: Vec<u64> = (0..REQUEST_BLOCKS).map(|i| 1_000 + i).collect();
    for id in 0..size as u64 {
        let spec: WorkerSpec =
            serde_json::from_value(serde_json::json!({"model": "bench", "worker_id": id})).unwrap();
        router.add_worker(spec).unwrap();
        let held = rng.gen_range(0..REQUEST_BLOCKS as usize);
        let event = switchyard::fleet::kv_index::KvEvent::Stored {
            tier: switchyard::fleet::kv_index::Tier::Device,
            parent_hash: None,
            block_hashes: chain[..held].to_vec(),
        };
        router
            .kv_events(
                WorkerId {
                    worker_id: id,
                    dp_rank: 0,
                },
                &[event],
            )
            .unwrap();
    }
    let request = RouteRequest {
        model: "bench".into(),
        block_hashes: Some(chain.into()),
        tracks_prefill_tokens: true,
        ..Default::default()
    };
    (router, request)
}

fn bench_router(c: &mut Criterion) {
    let mut group = c.benchmark_group("select-and-reserve");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for size in SIZES {
        for (label, instance) in [
            ("built-in", "builtin-least-busy"),
            ("rust-plugin", "rust"),
            ("default-policy", "default"),
        ] {
            // Built inside: criterion calls this only for the benchmarks its filter names.
            group.bench_function(BenchmarkId::new(label, size), |b| {
                let (router, mut request) = router_with(size, instance);
                request.request_id = Some("bench".into());
                b.iter(|| {
                    black_box(router.select_and_reserve(&request).unwrap());
                    router.free("bench").unwrap();
                })
            });
        }
    }
    group.finish();
}

/// Median and fastest time per selection of each variant, in interleaved rounds. Noise
/// on a shared machine only ever adds time, so the fastest round is the steadier
/// estimate of the cost itself; the median says what a typical round saw.
fn side_by_side(startup: &Startup, size: usize) -> Vec<(&'static str, f64, f64)> {
    let (request, prompt) = (
        RouteRequest::default(),
        PromptBlocks::new(16, REQUEST_BLOCKS),
    );
    let rows = fleet(size);
    let (kept, overlaps) = (kept(&rows), overlaps(&rows));
    let mut selectors = selectors(startup);
    // The built-in policy again, over columns filled from rows.
    let built_in = selectors_of(startup, &VARIANTS[..1]).remove(0).1;
    selectors.push(("built-in, rows", built_in));
    let per_round = (200_000 / size).clamp(5, 5_000);
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); selectors.len()];
    let from_rows = selectors.len() - 1;
    for _ in 0..41 {
        for (i, (_, selector)) in selectors.iter_mut().enumerate() {
            let start = Instant::now();
            for _ in 0..per_round {
                if i == from_rows {
                    black_box(
                        selector
                            .select(
                                &request,
                                prompt,
                                CandidatesFrom::Rows(&rows, &RowExtras::default()),
                                None,
                            )
                            .unwrap(),
                    );
                } else {
                    black_box(
                        selector
                            .select(
                                &request,
                                prompt,
                                CandidatesFrom::Lent(&kept, &mut |out| overlaps.write(out)),
                                None,
                            )
                            .unwrap(),
                    );
                }
            }
            samples[i].push(start.elapsed().as_secs_f64() / per_round as f64);
        }
    }
    selectors
        .iter()
        .zip(samples)
        .map(|((label, _), mut s)| {
            s.sort_by(f64::total_cmp);
            (*label, s[s.len() / 2], s[0])
        })
        .collect()
}

/// The compaction of 1,024 rows (a mask keeping 94 %, as `fleet`'s filter does), with the
/// input placed at 256-byte steps modulo 4 KiB behind the output, 41 interleaved rounds;
/// per place the fastest round for a column of 8-byte and of 4-byte values.
fn compaction_by_page_offset() {
    const ROWS: usize = 1024;
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let keep: Vec<u8> = (0..ROWS).map(|_| u8::from(rng.gen_bool(0.94))).collect();
    let mut bits = KeepBits::default();
    bits.read(&keep);
    let (mut out8, mut out4) = (
        Vec::<u64>::with_capacity(ROWS),
        Vec::<u32>::with_capacity(ROWS),
    );
    // Room to place the input anywhere within a page, plus the rows.
    let arena8: Vec<u64> = (0..ROWS as u64 + 1024).collect();
    let arena4: Vec<u32> = (0..ROWS as u32 + 2048).collect();
    let at = |arena: usize, out: usize, gap: usize, width: usize| {
        (out.wrapping_sub(gap).wrapping_sub(arena) % 4096) / width
    };
    let gaps: Vec<usize> = (0..4096).step_by(256).collect();
    let mut fastest = vec![[f64::MAX; 2]; gaps.len()];
    for _ in 0..41 {
        for (g, &gap) in gaps.iter().enumerate() {
            let from8 =
                &arena8[at(arena8.as_ptr() as usize, out8.as_ptr() as usize, gap, 8)..][..ROWS];
            let from4 =
                &arena4[at(arena4.as_ptr() as usize, out4.as_ptr() as usize, gap, 4)..][..ROWS];
            let start = Instant::now();
            for _ in 0..200 {
                bits.compact(&mut out8, black_box(from8));
            }
            fastest[g][0] = fastest[g][0].min(start.elapsed().as_secs_f64() / 200.0);
            let start = Instant::now();
            for _ in 0..200 {
                bits.compact(&mut out4, black_box(from4));
            }
            fastest[g][1] = fastest[g][1].min(start.elapsed().as_secs_f64() / 200.0);
        }
    }
    println!("\ncompaction of {ROWS} rows (94 % kept) by where the output starts, modulo 4 KiB, after the input; fastest of 41 interleaved rounds:");
    println!("{:>6} {:>12} {:>12}", "bytes", "8-byte rows", "4-byte rows");
    for (gap, [wide, narrow]) in gaps.iter().zip(&fastest) {
        println!("{gap:>6} {:>9.0} ns {:>9.0} ns", wide * 1e9, narrow * 1e9);
    }
}

fn main() {
    let startup = startup();
    let mut criterion = Criterion::default().configure_from_args();
    bench_selection(&mut criterion, &startup);
    bench_router(&mut criterion);
    criterion.final_summary();

    println!("\nside by side, 41 interleaved rounds; ratio = variant / built-in least-busy:");
    println!(
        "{:>8}  {:<15} {:>13} {:>13} {:>13} {:>10}",
        "workers", "variant", "median", "median ratio", "fastest", "ratio"
    );
    for size in SIZES {
        let results = side_by_side(&startup, size);
        let (median_base, fastest_base) = (results[0].1, results[0].2);
        for (label, median, fastest) in results {
            println!(
                "{size:>8}  {label:<15} {:>10.2} us {:>13.3} {:>10.2} us {:>10.3}",
                median * 1e6,
                median / median_base,
                fastest * 1e6,
                fastest / fastest_base
            );
        }
    }
    compaction_by_page_offset();
}
