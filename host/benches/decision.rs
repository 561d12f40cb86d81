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
//! `make bench-decision` (or `cargo bench -p switchyard --bench decision`). No network: the workers' addresses are
//! never dialled. With `SWITCHYARD_PROFILE_SECS=N` it makes whole decisions for N seconds
//! instead, for `perf record` of this process.

use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard::fleet::router::Router;
use switchyard::serve::ext_proc::embedded::{self, Asked, Now};
use switchyard::serve::ext_proc::EndpointPicker;
use switchyard::serve::frontend::prompt::Endpoint;
use switchyard::serve::frontend::Frontend;

/// Decisions per timed round.
const BATCH: u64 = 20_000;
/// Interleaved rounds.
const ROUNDS: usize = 15;

/// The Envoy bench's config: four workers of model `demo` with predicted KV tracking.
fn picker(dir: &std::path::Path) -> (tokio::runtime::Runtime, Arc<Frontend>, Arc<EndpointPicker>) {
    let workers: String = (1..=4)
        .map(|i| {
            format!(
                "  - {{model: demo, worker_id: {i}, address: \"127.0.0.1:{}\"}}\n",
                9000 + i
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
        let asked = Asked::new(Endpoint::ChatCompletions, None, None, Vec::new());
        match embedded::decide_now(picker, &caller, &asked, body) {
            Now::Decided(Ok(mut pick)) => pick.answering(),
            Now::Decided(Err(error)) => panic!("the decision failed: {}", error.body()),
            Now::Later => panic!("the decision was not made inline"),
        }
    }
    started.elapsed().as_nanos() as f64 / bodies.len() as f64
}

/// `BATCH` selections and bookings of one request built once, each freed before the
/// next; nanoseconds per selection.
fn selections(router: &Router, request: &switchyard::fleet::router::RouteRequest) -> f64 {
    let started = Instant::now();
    for n in 0..BATCH {
        let id = format!("bench-{n}");
        router
            .reserve_as(request, &id)
            .expect("selected and booked");
        router.free(&id).expect("freed");
    }
    started.elapsed().as_nanos() as f64 / BATCH as f64
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
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
        println!(
            "pid {}: whole decisions for {seconds} s",
            std::process::id()
        );
        let until = Instant::now() + Duration::from_secs(seconds);
        while Instant::now() < until {
            decisions(&picker, &bodies);
        }
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
    let (mut whole, mut alone) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        whole.push(decisions(&picker, &bodies));
        alone.push(selections(router, &request));
    }
    let (whole, alone) = (median(whole), median(alone));
    println!("\nOne request's decision in process (4 workers, predicted KV tracking; median of {ROUNDS} interleaved rounds of {BATCH}):");
    println!("| path | ns per request |");
    println!("|---|---:|");
    println!("| whole decision, as the Envoy module makes it (parse, describe, admit, select, book, predict, free) | {whole:.0} |");
    println!("| selection and booking alone (`reserve_as`, `free`) | {alone:.0} |");
    println!("| ratio, whole / selection | {:.2} |", whole / alone);
    assert_eq!(router.active_bookings(), 0, "every booking was freed");
}
