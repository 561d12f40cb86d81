//! What the frontend adds: client -> engine-sim directly vs client -> switchyard ->
//! engine-sim, side by side in one run (rounds interleaved, so machine noise hits both
//! alike). Per concurrency: time to first byte (p50, p99) of streamed chat completions,
//! the difference, the throughput ratio, and the router's CPU per request (its user +
//! system time from /proc over its own rounds, so the figure does not depend on what the
//! client costs on the same cores).
//!
//! Beside the router, the floor: a proxy on the same HTTP stack that relays the stream and
//! does nothing else (`common/relay_floor.rs`), and its CPU per request.
//!
//! `make bench-frontend` (or `cargo bench -p switchyard --bench frontend`). Loopback only;
//! every process it starts is killed when it ends. With `SWITCHYARD_PROFILE_SECS=N` it
//! prints the router's PID and holds 16 streams through it for N seconds instead, for
//! `scripts/flamegraph`.

#[path = "common/process.rs"]
mod process;
#[path = "common/relay_floor.rs"]
mod relay_floor;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

/// One streamed request: time to the first body byte, and to the end.
async fn request(client: &reqwest::Client, url: &str, body: &Arc<String>) -> (Duration, Duration) {
    let started = Instant::now();
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.as_str().to_owned())
        .send()
        .await
        .expect("request sent");
    assert!(response.status().is_success(), "{}", response.status());
    let mut stream = response.bytes_stream();
    let mut first = None;
    while let Some(chunk) = stream.next().await {
        chunk.expect("body chunk");
        first.get_or_insert_with(|| started.elapsed());
    }
    (first.expect("a body"), started.elapsed())
}

/// `requests` requests, `concurrency` at a time; TTFBs and requests per second.
async fn round(
    client: &reqwest::Client,
    url: &str,
    concurrency: usize,
    requests: usize,
) -> (Vec<Duration>, f64) {
    let body = Arc::new(
        r#"{"model":"bench","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"Benchmark the frontend with a short prompt."}]}"#
            .to_owned(),
    );
    let started = Instant::now();
    let per_worker = requests / concurrency;
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, url, body) = (client.clone(), url.to_owned(), body.clone());
            tokio::spawn(async move {
                let mut ttfbs = Vec::with_capacity(per_worker);
                for _ in 0..per_worker {
                    ttfbs.push(request(&client, &url, &body).await.0);
                }
                ttfbs
            })
        })
        .collect();
    let mut ttfbs = Vec::with_capacity(requests);
    for worker in workers {
        ttfbs.extend(worker.await.unwrap());
    }
    let rate = ttfbs.len() as f64 / started.elapsed().as_secs_f64();
    (ttfbs, rate)
}

/// Open loop: `requests` requests started at `rate` per second whatever the answers do
/// (as real traffic arrives); their TTFBs.
async fn paced(client: &reqwest::Client, url: &str, rate: f64, requests: usize) -> Vec<Duration> {
    let body = Arc::new(
        r#"{"model":"bench","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"Benchmark the frontend with a short prompt."}]}"#
            .to_owned(),
    );
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = Vec::with_capacity(requests);
    for _ in 0..requests {
        tick.tick().await;
        let (client, url, body) = (client.clone(), url.to_owned(), body.clone());
        tasks.push(tokio::spawn(async move {
            request(&client, &url, &body).await.0
        }));
    }
    let mut ttfbs = Vec::with_capacity(requests);
    for task in tasks {
        ttfbs.push(task.await.unwrap());
    }
    ttfbs
}

/// `SWITCHYARD_PROFILE_SECS`: instead of the table, hold 16 streams through the router
/// this long, for a profiler.
fn profile_seconds() -> Option<u64> {
    std::env::var("SWITCHYARD_PROFILE_SECS").ok()?.parse().ok()
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3
}

/// The closed-loop table: per concurrency, direct / via the router / via the floor in
/// interleaved rounds; `pids` are the router's and the floor's.
async fn closed_loop(
    client: &reqwest::Client,
    direct: &str,
    routed: &str,
    (floor, pids): (&str, &[String; 2]),
) {
    println!("streamed chat completions, 8 tokens each; 5 interleaved rounds per path");
    println!("| concurrency | direct TTFB p50 / p99 | via switchyard p50 / p99 | added p50 / p99 | direct req/s | via req/s | throughput ratio | router CPU per request | floor CPU per request |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (concurrency, requests) in [(1, 1000), (16, 3200), (64, 6400)] {
        let (mut d, mut v) = (Vec::new(), Vec::new());
        let (mut d_rate, mut v_rate, mut cpu) = (0.0, 0.0, [0.0; 2]);
        for _ in 0..5 {
            let (t, r) = round(client, direct, concurrency, requests / 5).await;
            d.extend(t);
            d_rate += r / 5.0;
            for (i, url) in [routed, floor].into_iter().enumerate() {
                let before = process::cpu_seconds(&pids[i]);
                let (t, r) = round(client, url, concurrency, requests / 5).await;
                cpu[i] += process::cpu_seconds(&pids[i]) - before;
                if i == 0 {
                    v.extend(t);
                    v_rate += r / 5.0;
                }
            }
        }
        let cpu_us = cpu.map(|seconds| seconds / v.len() as f64 * 1e6);
        d.sort();
        v.sort();
        let (d50, d99, v50, v99) = (
            percentile(&d, 0.5),
            percentile(&d, 0.99),
            percentile(&v, 0.5),
            percentile(&v, 0.99),
        );
        println!(
            "| {concurrency} | {d50:.2} / {d99:.2} ms | {v50:.2} / {v99:.2} ms | {:.2} / {:.2} ms | {d_rate:.0} | {v_rate:.0} | {:.2} | {:.0} us | {:.0} us |",
            v50 - d50,
            v99 - d99,
            v_rate / d_rate,
            cpu_us[0],
            cpu_us[1]
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == relay_floor::FLAG) {
        return relay_floor::serve(args[at + 1].clone());
    }
    // `cargo bench` passes --bench; a filter or --list from the test harness is ignored.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let (_engine, engine) = process::bench_engine();
    let dir = tempfile::tempdir().unwrap();
    let (router_process, router) = process::serve_bench(dir.path(), "bench", &engine, "");
    let mut floor_command = std::process::Command::new(std::env::current_exe().unwrap());
    floor_command.args([relay_floor::FLAG, &engine]);
    let (floor_process, floor) = process::start_command(floor_command, relay_floor::ANNOUNCE);
    let pids = [router_process.0.id(), floor_process.0.id()].map(|pid| pid.to_string());
    let pid = &pids[0];
    // Two threads whatever TOKIO_WORKER_THREADS says (it may be set for the router).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        switchyard::engines::tls::install_default_provider();
        let client = reqwest::Client::builder().tcp_nodelay(true).build().unwrap();
        let direct = format!("{engine}/v1/chat/completions");
        let routed = format!("{router}/v1/chat/completions");
        round(&client, &direct, 4, 200).await; // warm both paths' connection pools
        round(&client, &routed, 4, 200).await;
        let floor = format!("{floor}/v1/chat/completions");
        round(&client, &floor, 4, 200).await;
        if let Some(seconds) = profile_seconds() {
            // A steady load for a profiler (scripts/flamegraph) to sample: nothing else.
            println!("router pid {pid}: 16 streams for {seconds} s");
            let until = Instant::now() + Duration::from_secs(seconds);
            while Instant::now() < until {
                round(&client, &routed, 16, 1600).await;
            }
            return;
        }
        closed_loop(&client, &direct, &routed, (&floor, &pids)).await;
        let (mut d, mut v) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            d.extend(paced(&client, &direct, 1000.0, 1000).await);
            v.extend(paced(&client, &routed, 1000.0, 1000).await);
        }
        d.sort();
        v.sort();
        let (d50, d99, v50, v99) = (percentile(&d, 0.5), percentile(&d, 0.99), percentile(&v, 0.5), percentile(&v, 0.99));
        println!(
            "\nopen loop at 1,000 requests/s (3 interleaved rounds of 1,000 per path): TTFB direct {d50:.2} / {d99:.2} ms, via switchyard {v50:.2} / {v99:.2} ms, added p50 {:.2} ms, p99 {:.2} ms",
            v50 - d50,
            v99 - d99
        );
    });
}
