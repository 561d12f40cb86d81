//! switchyard against the routers an operator would pick instead, as an OpenAI proxy in
//! front of the same four `engine-sim` engines: direct (the client's own round robin over
//! the engines), switchyard's frontend (its default policy), vllm-router and
//! sglang-router, each with its cache-aware and its round-robin policy. Per concurrency
//! (1, 16, 64), non-streamed and streamed 2-token chat completions: throughput, its ratio
//! to direct, latency p50 / p99, and each router's CPU per request (from /proc, so the
//! figure does not depend on the client sharing the cores). Rounds are interleaved (every
//! path once, then again) so machine noise hits all alike.
//!
//! `make bench-peers` installs the peers (pinned, from PyPI) into `target/peers-venv`
//! and runs this; a peer that is not installed is skipped, saying so. Loopback only;
//! every process it starts is killed when it ends. SWITCHYARD_BENCH_SECS sets each cell's
//! duration (2), SWITCHYARD_BENCH_CONCURRENCY the concurrencies (`1,16,64`).

#[path = "common/load.rs"]
mod load;
#[path = "common/peer_routers.rs"]
mod peer_routers;
#[path = "common/process.rs"]
mod process;
#[path = "../../tests/support/real_envoy.rs"]
mod real_envoy;
// Its waits, as the tests' support module gives them to it.
#[path = "../../tests/support/eventually.rs"]
mod eventually;
// The cargo it builds the Envoy module with.
#[path = "../../tests/support/nested_cargo.rs"]
mod nested_cargo;

use std::time::Duration;

use load::{load_spread, quantile, warm_up, Cell};
use peer_routers::start_peer;
use process::{cell_seconds, cpu_seconds, fast_engines, serve, worker_lines, Process};

/// One way to reach the engines.
struct Path {
    name: String,
    bases: Vec<String>,
    /// The router's process (none for direct).
    pid: Option<String>,
    _process: Option<Process>,
}

/// A peer router over `engines`, or why not.
fn peer(router: &str, policy: &str, engines: &[String]) -> Result<Path, String> {
    let (process, base) = start_peer(router, policy, engines)?;
    Ok(Path {
        name: format!("{router} {policy}"),
        bases: vec![base],
        pid: Some(process.0.id().to_string()),
        _process: Some(process),
    })
}

/// Direct to the engines, through switchyard, and through each peer that installed.
fn paths(urls: &[String], router: Process, address: String) -> Vec<Path> {
    let mut paths = vec![
        Path {
            name: "direct".into(),
            bases: urls.to_vec(),
            pid: None,
            _process: None,
        },
        Path {
            name: "switchyard default".into(),
            bases: vec![address],
            pid: Some(router.0.id().to_string()),
            _process: Some(router),
        },
    ];
    for (router, policy) in [
        ("vllm-router", "cache_aware"),
        ("vllm-router", "round_robin"),
        ("sglang-router", "cache_aware"),
        ("sglang-router", "round_robin"),
    ] {
        match peer(router, policy, urls) {
            Ok(path) => paths.push(path),
            Err(why) => println!("skipped {router} {policy}: {why}"),
        }
    }
    paths
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("peers: bench");
        return;
    }
    let seconds = cell_seconds();
    let concurrencies: Vec<usize> = std::env::var("SWITCHYARD_BENCH_CONCURRENCY")
        .unwrap_or_else(|_| "1,16,64".into())
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    let duration = Duration::from_secs_f64(seconds);
    let dir = tempfile::tempdir().unwrap();
    let engines = fast_engines(4);
    let urls: Vec<String> = engines.iter().map(|(_, a)| a.clone()).collect();
    let workers = worker_lines("url", &urls);
    let config = dir.path().join("switchyard.yaml");
    std::fs::write(&config, format!("workers:\n{workers}")).unwrap();
    let (router, address) = serve(&config, &[]);
    let paths = paths(&urls, router, address);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Warm up every path (connections, the routers' first health checks).
    runtime.block_on(async {
        for path in &paths {
            warm_up(&path.bases, &path.name, Duration::from_secs(30)).await;
        }
    });
    println!(
        "\nOpenAI proxy in front of 4 engine-sim engines, 2-token chat completions, {seconds} s per cell, 3 interleaved rounds"
    );
    println!("| streamed | concurrency | path | req/s | ratio to direct | p50 (ms) | p99 (ms) | router CPU per request (us) | failures |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|");
    for stream in [false, true] {
        for &concurrency in &concurrencies {
            let mut cells: Vec<(Cell, f64)> = paths.iter().map(|_| Default::default()).collect();
            for _round in 0..3 {
                for (path, (cell, cpu)) in paths.iter().zip(cells.iter_mut()) {
                    let before = path.pid.as_deref().map_or(0.0, cpu_seconds);
                    let got =
                        runtime.block_on(load_spread(&path.bases, stream, concurrency, duration));
                    *cpu += path.pid.as_deref().map_or(0.0, cpu_seconds) - before;
                    cell.requests += got.requests;
                    cell.failures += got.failures;
                    cell.latencies_us.extend(got.latencies_us);
                }
            }
            let rate = |c: &Cell| c.requests as f64 / (3.0 * seconds);
            let direct = rate(&cells[0].0);
            for (path, (cell, cpu)) in paths.iter().zip(cells.iter_mut()) {
                cell.latencies_us.sort_unstable();
                let cpu = if path.pid.is_some() {
                    format!("{:.0}", *cpu / cell.requests.max(1) as f64 * 1e6)
                } else {
                    "-".into()
                };
                println!(
                    "| {stream} | {concurrency} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {cpu} | {} |",
                    path.name,
                    rate(cell),
                    rate(cell) / direct,
                    quantile(&cell.latencies_us, 0.5),
                    quantile(&cell.latencies_us, 0.99),
                    cell.failures
                );
            }
        }
    }
}
