//! One request's whole decision in process, as the Envoy module makes it on Envoy's worker
//! thread (`serve/src/ext_proc/embedded.rs`: the body parsed, the request described and
//! admitted, selected and booked, its prediction written to the KV index, then prefill
//! completed and the booking freed), beside the selection and booking alone
//! (`Router::select_and_reserve` and `free` on a request built once). Rounds are
//! interleaved, so machine noise hits both alike; the ratio is what the layers around the
//! selection cost on top of it. The bench of `make bench-envoy`'s module path without
//! Envoy, the loopback or the engines, so a change to the per-request path can be
//! measured in seconds.
//!
//! Two more figures, in the same rounds: the decision made on two threads at once (as
//! Envoy's two workers make them: what the router's shared state costs them), and made
//! with the caches cold (as between Envoy's requests: what the decision touches).
//!
//! `make bench-decision` (or `cargo bench -p switchyard --bench decision`). No network: the workers' addresses are
//! never dialled. With `SWITCHYARD_PROFILE_SECS=N` it makes whole decisions for N seconds
//! instead, for `perf record` of this process (`SWITCHYARD_PROFILE_THREADS=2` on two
//! threads, `SWITCHYARD_PROFILE_COLD=1` cold), and prints how many it made.
//! `SWITCHYARD_DECISION_WORKERS=N` sets the fleet's size (4, as in the Envoy bench, unless
//! set).

use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard::fleet::router::{RouteRequest, Router};
use switchyard::serve::caller::Caller;
use switchyard::serve::ext_proc::embedded::{self, Asked, Now};
use switchyard::serve::ext_proc::EndpointPicker;
use switchyard::serve::frontend::prompt::Endpoint;
use switchyard::serve::frontend::Frontend;

/// Decisions per timed round.
const BATCH: u64 = 20_000;
/// What a cold decision's thread reads first: four times this machine's per-core L2
/// cache (2 MiB), so the router's code and data come from memory or the shared L3.
fn eviction_buffer() -> Vec<u64> {
    (0..(8u64 << 20) / 8).collect()
}

/// Cold decisions per timed round (each after its eviction).
const COLD: usize = 2_000;
/// Interleaved rounds.
const ROUNDS: usize = 15;

/// The Envoy bench's config: four workers of model `demo` with predicted KV tracking
/// (`SWITCHYARD_DECISION_WORKERS` of them when set).
fn picker(dir: &std::path::Path) -> (tokio::runtime::Runtime, Arc<Frontend>, Arc<EndpointPicker>) {
    let count: u32 = std::env::var("SWITCHYARD_DECISION_WORKERS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(4);
    let workers: String = (1..=count)
        .map(|i| {
            format!(
                "  - {{model: demo, worker_id: {i}, address: \"127.0.{}.{}:{}\"}}\n",
                i / 250,
                1 + i % 250,
                9000 + i % 50_000
            )
        })
        .collect();
    let config = dir.join("switchyard.yaml");
    std::fs::write(
        &config,
        format!("models:\n  demo: {{kv_tracking: predicted}}\nworkers:\n{workers}"),
    )
    .unwrap();
    let startup = switchyard::startup::load(Some(&config), false).expect("the config loads");
    let ext_proc = switchyard::config::ExtProcSettings::listening(([127, 0, 0, 1], 0).into());
    let router = Arc::new(Router::new(startup).expect("the router starts"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let frontend = runtime
        .block_on(async { Frontend::new(router) })
        .expect("the frontend starts");
    let picker = Arc::new(EndpointPicker::new(frontend.clone(), &ext_proc));
    (runtime, frontend, picker)
}

/// The bench's request body: what `make bench-envoy`'s clients send.
fn body(n: u64) -> Vec<u8> {
    serde_json::to_vec(
        &serde_json::json!({"model": "demo", "stream": false, "max_tokens": 2,
        "messages": [{"role": "user", "content": format!("client 3 request {n}")}]}),
    )
    .unwrap()
}

/// `BATCH` whole decisions, each freed before the next; nanoseconds per decision.
fn decisions(picker: &EndpointPicker, bodies: &[Vec<u8>]) -> f64 {
    let caller = picker.proxy_caller();
    let started = Instant::now();
    for body in bodies {
        decision(picker, &caller, body);
    }
    started.elapsed().as_nanos() as f64 / bodies.len() as f64
}

/// `BATCH` selections and bookings of one request built once, each freed before the
/// next; nanoseconds per selection.
fn selections(router: &Router, request: &RouteRequest) -> f64 {
    let started = Instant::now();
    for n in 0..BATCH {
        selection(router, request, &format!("bench-{n}"));
    }
    started.elapsed().as_nanos() as f64 / BATCH as f64
}

/// `COLD` runs of `work` with the caches cold, as in a proxy whose own work between two
/// decisions evicts the router's code and data: before each run the thread reads `evict`
/// (`eviction_buffer`, one word per cache line), untimed; nanoseconds per run. In Envoy
/// the decision costs about this (docs/BENCHMARKS.md), not the warm loop's figure: what
/// it touches counts as much as what it computes.
fn cold(evict: &[u64], mut work: impl FnMut(usize)) -> f64 {
    let mut took = Duration::ZERO;
    let mut sum = 0u64;
    for n in 0..COLD {
        for line in evict.iter().step_by(8) {
            sum = sum.wrapping_add(*line);
        }
        let started = Instant::now();
        work(n);
        took += started.elapsed();
    }
    std::hint::black_box(sum);
    took.as_nanos() as f64 / COLD as f64
}

/// One whole decision of `body`, freed before it returns.
fn decision(picker: &EndpointPicker, caller: &Caller, body: &[u8]) {
    let asked = Asked::new(Endpoint::ChatCompletions, None, None, Vec::new());
    match embedded::decide_now(picker, caller, &asked, body) {
        Now::Decided(Ok(mut pick)) => pick.answering(),
        Now::Decided(Err(error)) => panic!("the decision failed: {}", error.body()),
        Now::Later => panic!("the decision was not made inline"),
    }
}

/// One selection and booking of `request` under `id`, freed before it returns.
fn selection(router: &Router, request: &RouteRequest, id: &str) {
    router.reserve_as(request, id).expect("selected and booked");
    router.free(id).expect("freed");
}

/// `decisions` on two threads at once, as Envoy's two workers make them on this 2-core
/// machine: nanoseconds per decision on each thread (the mean of the two). Above the one
/// thread's figure by what the threads' shared state (locks, counters, maps) costs them.
fn decisions_on_two_threads(picker: &EndpointPicker, bodies: &[Vec<u8>]) -> f64 {
    let start = std::sync::Barrier::new(2);
    let (first, second) = std::thread::scope(|scope| {
        let run = || {
            start.wait();
            decisions(picker, bodies)
        };
        let first = scope.spawn(run);
        let second = scope.spawn(run);
        (first.join().unwrap(), second.join().unwrap())
    });
    (first + second) / 2.0
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// `SWITCHYARD_PROFILE_SECS`: whole decisions for `seconds`, for a profiler; then how
/// many were made.
fn profile(picker: &EndpointPicker, bodies: &[Vec<u8>], seconds: u64) {
    println!(
        "pid {}: whole decisions for {seconds} s",
        std::process::id()
    );
    let until = Instant::now() + Duration::from_secs(seconds);
    // `SWITCHYARD_PROFILE_THREADS=2`: two threads deciding at once.
    let two = std::env::var("SWITCHYARD_PROFILE_THREADS").is_ok_and(|t| t == "2");
    let cold = std::env::var("SWITCHYARD_PROFILE_COLD").is_ok();
    let evict = eviction_buffer();
    let mut made = 0;
    while Instant::now() < until {
        made += if cold {
            let caller = picker.proxy_caller();
            self::cold(&evict, |n| decision(picker, &caller, &bodies[n]));
            COLD
        } else if two {
            decisions_on_two_threads(picker, bodies);
            2 * bodies.len()
        } else {
            decisions(picker, bodies);
            bodies.len()
        };
    }
    // Per-decision counts (`perf stat` of allocations, cache misses) divide by this.
    println!("{made} whole decisions made");
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("decision: bench");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_runtime, frontend, picker) = picker(dir.path());
    let bodies: Vec<Vec<u8>> = (0..BATCH).map(body).collect();
    if let Some(seconds) = std::env::var("SWITCHYARD_PROFILE_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        profile(&picker, &bodies, seconds);
        return;
    }
    let router = picker.router();
    let prompt = switchyard::serve::frontend::prompt::parse(
        Endpoint::ChatCompletions,
        &bodies[0],
        router.block_size(),
        |_| None,
    )
    .unwrap();
    let described = switchyard::serve::request_attributes::describe(
        &router.generation().config().request_attributes,
        Vec::new(),
        None,
        &prompt.model,
        None,
        "bench",
    )
    .unwrap();
    let request = frontend.route_request(&prompt, &described, None);
    decisions(&picker, &bodies); // warm: buffers grown, the KV index holding its blocks
    let (mut whole, mut alone, mut two) = (Vec::new(), Vec::new(), Vec::new());
    let evict = eviction_buffer();
    let (mut cold_whole, mut cold_alone) = (Vec::new(), Vec::new());
    let caller = picker.proxy_caller();
    let ids: Vec<String> = (0..COLD).map(|n| format!("bench-{n}")).collect();
    for _ in 0..ROUNDS {
        cold_whole.push(cold(&evict, |n| decision(&picker, &caller, &bodies[n])));
        cold_alone.push(cold(&evict, |n| selection(router, &request, &ids[n])));
        whole.push(decisions(&picker, &bodies));
        alone.push(selections(router, &request));
        two.push(decisions_on_two_threads(&picker, &bodies));
    }
    let (whole, alone, two) = (median(whole), median(alone), median(two));
    let (cold_whole, cold_alone) = (median(cold_whole), median(cold_alone));
    println!("\nOne request's decision in process (4 workers, predicted KV tracking; median of {ROUNDS} interleaved rounds of {BATCH}):");
    println!("| path | ns per request |");
    println!("|---|---:|");
    println!("| whole decision, as the Envoy module makes it (parse, describe, admit, select, book, predict, free) | {whole:.0} |");
    println!("| selection and booking alone (`reserve_as`, `free`) | {alone:.0} |");
    println!("| ratio, whole / selection | {:.2} |", whole / alone);
    println!("| whole decision, two threads deciding at once (each thread's time) | {two:.0} |");
    println!("| ratio, two threads / one | {:.2} |", two / whole);
    println!("| whole decision, caches cold (8 MiB read before each, untimed) | {cold_whole:.0} |");
    println!("| selection and booking alone, caches cold | {cold_alone:.0} |");
    println!(
        "| ratio, whole decision cold / warm | {:.2} |",
        cold_whole / whole
    );
    assert_eq!(router.active_bookings(), 0, "every booking was freed");
}
