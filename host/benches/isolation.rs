//! Isolation benchmark: the three languages' `least-busy` plugins in the router's process
//! and each in an isolated child process (`isolation: process`), at 8 to 10,000 workers
//! with requests of 64 blocks. Variants run in interleaved rounds, so machine noise hits
//! them alike; it prints, per language and fleet size, the time per selection, the ratio
//! isolated / in-process and the time isolation adds.
//!
//! Run: `make bench-isolation`.

mod common;

use std::hint::black_box;
use std::time::Instant;

use switchyard::config::ConfigSource;
use switchyard::plugin::{PartitionKey, PromptBlocks, RouteRequest};
use switchyard::policy::{CandidatesFrom, Selector};
use switchyard::startup::{start, Startup};
use switchyard_plugin_sdk::WorkerType;

use common::{fleet, kept, least_busy_plugins, overlaps, repo};

const SIZES: [usize; 4] = [8, 128, 1024, 10_000];
const REQUEST_BLOCKS: u64 = 64;
/// The instances of `startup`'s config, one per plugin language.
const LANGUAGES: [&str; 3] = ["rust", "c", "cpp"];

fn startup(isolation: &str) -> Startup {
    let [rust, c, cpp] = least_busy_plugins("bench-isolation");
    let yaml = format!(
        "plugins:\n  - {{path: {}, isolation: {isolation}}}\n  - {{path: {}, isolation: {isolation}}}\n  - {{path: {}, isolation: {isolation}}}\n\
         worker_selection:\n  instances:\n\
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

fn selector(startup: &Startup, instance: &str) -> Selector {
    let policy = startup
        .instance(instance)
        .unwrap()
        .build(&PartitionKey::new("bench", WorkerType::Select))
        .unwrap();
    Selector::new(policy)
}

/// Median and fastest seconds per selection, in-process then isolated, over 41
/// interleaved rounds.
fn side_by_side(
    in_process: &mut Selector,
    isolated: &mut Selector,
    size: usize,
) -> [(f64, f64); 2] {
    let (request, prompt) = (
        RouteRequest::default(),
        PromptBlocks::new(16, REQUEST_BLOCKS),
    );
    let rows = fleet(size);
    let (kept, overlaps) = (kept(&rows), overlaps(&rows));
    let per_round = (100_000 / size).clamp(5, 2_000);
    let mut samples = [Vec::new(), Vec::new()];
    for _ in 0..41 {
        for (i, selector) in [&mut *in_process, &mut *isolated].into_iter().enumerate() {
            let start = Instant::now();
            for _ in 0..per_round {
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
            samples[i].push(start.elapsed().as_secs_f64() / per_round as f64);
        }
    }
    samples.map(|mut s| {
        s.sort_by(f64::total_cmp);
        (s[s.len() / 2], s[0])
    })
}

fn main() {
    // Isolated processes are this build's `switchyard` binary.
    std::env::set_var("SWITCHYARD_EXE", env!("CARGO_BIN_EXE_switchyard"));
    let in_process = startup("none");
    let isolated = startup("process");
    println!("isolated vs in-process selection, 41 interleaved rounds (median, fastest):");
    println!(
        "{:>8}  {:<5} {:>12} {:>12} {:>8} {:>11} {:>12} {:>12} {:>8}",
        "workers",
        "lang",
        "in-process",
        "isolated",
        "ratio",
        "added",
        "in (fast)",
        "iso (fast)",
        "ratio"
    );
    for size in SIZES {
        for language in LANGUAGES {
            let mut a = selector(&in_process, language);
            let mut b = selector(&isolated, language);
            let [(a_med, a_fast), (b_med, b_fast)] = side_by_side(&mut a, &mut b, size);
            println!(
                "{size:>8}  {language:<5} {:>9.2} us {:>9.2} us {:>8.2} {:>8.2} us {:>9.2} us {:>9.2} us {:>8.2}",
                a_med * 1e6,
                b_med * 1e6,
                b_med / a_med,
                (b_med - a_med) * 1e6,
                a_fast * 1e6,
                b_fast * 1e6,
                b_fast / a_fast
            );
        }
    }
}
