//! The Envoy endpoint picker's decisions: per concurrency (1, 64, 512 streams at a time),
//! decisions per second and the latency of one decision (from the request headers sent to
//! the pick received, as Envoy sees it: body parse, selection, booking, gRPC both ways),
//! for the built-in `default` policy and the Rust example plugin's `least-busy` side by
//! side (rounds interleaved, so machine noise hits both alike). Every stream is completed
//! as Envoy completes it (response headers, last body chunk, half-close), so bookings are
//! freed and the fleet's load stays flat.
//!
//! Beside them, the floor: a tonic ext_proc server that gives the same answers and decides
//! nothing (`common/ext_proc_floor.rs`), so the router's CPU per stream can be read
//! against what tonic, h2 and the kernel cost for the same exchange.
//!
//! `make bench-ext-proc` (or `make build && cargo bench -p switchyard --bench ext_proc`).
//! Loopback only; the router it starts is killed when it ends.

#[path = "../../tests/support/envoy.rs"]
mod envoy;
// Its waits, as the tests' support module gives them to it.
#[path = "../../tests/support/eventually.rs"]
mod eventually;
#[path = "common/ext_proc_floor.rs"]
mod floor;
#[path = "common/process.rs"]
mod process;

use std::time::{Duration, Instant};

use envoy::{client, Answer, Client, Envoy};
use process::{cpu_seconds, start, Process};

const WORKERS: u64 = 16;

/// The router, and its HTTP address (for /metrics).
fn start_router(dir: &std::path::Path, grpc_port: u16) -> (Process, String) {
    let plugin =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/plugins/libleast_busy.so");
    assert!(
        plugin.exists(),
        "{} is missing: run `make build` first",
        plugin.display()
    );
    // Each address accepts (and closes) connections, so the router's connect probe finds
    // the workers healthy; nothing is ever proxied to them.
    let workers: String = (1..=WORKERS)
        .map(|i| {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let address = listener.local_addr().unwrap();
            std::thread::spawn(move || listener.incoming().for_each(drop));
            format!("  - {{model: bench, worker_id: {i}, address: \"{address}\"}}\n")
        })
        .collect();
    let config = dir.join("switchyard.yaml");
    std::fs::write(
        &config,
        format!(
            "plugins:\n  - path: {}\n# The stand-in Envoy chooses the instance; behind a picker clients are never loopback.\nauth: {{choose_instance: anyone}}\nworker_selection:\n  instances:\n    - {{name: least-busy, type: least-busy}}\nmodels:\n  bench: {{kv_tracking: predicted}}\nworkers:\n{workers}",
            plugin.display()
        ),
    )
    .unwrap();
    start(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--ext-proc",
            &format!("127.0.0.1:{grpc_port}"),
            "--config",
            config.to_str().unwrap(),
        ],
        "switchyard listening on ",
    )
}

/// The router's own mean decision time (end of body -> pick sent), from /metrics.
async fn server_side_mean_ms(base: &str) -> f64 {
    switchyard::engines::tls::install_default_provider();
    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0.0)
    };
    let count = value("switchyard_ext_proc_decision_seconds_count");
    value("switchyard_ext_proc_decision_seconds_sum") / count.max(1.0) * 1e3
}

/// One request through the picker, completed as Envoy completes it; the decision time.
async fn one(client: &mut Client, instance: &str, body: &[u8]) -> Duration {
    let mut envoy = Envoy::open(client, None).await;
    let started = Instant::now();
    let endpoint = match envoy
        .request("/v1/chat/completions", Some(instance), body, 1)
        .await
    {
        Answer::Picked(endpoint) => endpoint,
        Answer::Refused { status, body } => {
            panic!("the picker refused a benchmark request: {status} {body}")
        }
    };
    let decided = started.elapsed();
    envoy.response_headers(Some(&endpoint)).await;
    envoy.response_chunk(b"data: [DONE]\n\n", true).await;
    envoy.half_close();
    decided
}

/// `requests` requests, `concurrency` at a time; decision times and decisions per second.
async fn round(
    clients: &[Client],
    instance: &str,
    concurrency: usize,
    requests: usize,
) -> (Vec<Duration>, f64) {
    let started = Instant::now();
    let per_task = requests / concurrency;
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let mut client = clients[t % clients.len()].clone();
            let instance = instance.to_owned();
            tokio::spawn(async move {
                let mut times = Vec::with_capacity(per_task);
                for i in 0..per_task {
                    // 64 conversations: prompts share prefixes, as chat traffic does.
                    let body = format!(
                        r#"{{"model":"bench","stream":true,"max_tokens":8,"messages":[{{"role":"system","content":"You are a helpful assistant for conversation {}."}},{{"role":"user","content":"Question {i} of task {t}"}}]}}"#,
                        (t + i) % 64
                    );
                    times.push(one(&mut client, &instance, body.as_bytes()).await);
                }
                times
            })
        })
        .collect();
    let mut times = Vec::with_capacity(requests);
    for task in tasks {
        times.extend(task.await.unwrap());
    }
    let rate = times.len() as f64 / started.elapsed().as_secs_f64();
    (times, rate)
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3
}

/// The servers measured side by side: the router's two policies, then the floor.
const TARGETS: [&str; 3] = ["default", "least-busy", "floor"];

/// One cell: `requests` streams per target at `concurrency`, in 3 interleaved rounds;
/// prints each target's rate and latency, and CPU per stream of the router and the floor.
async fn cell(
    servers: &[(&[Client], &str); 3],
    pids: [&str; 2],
    concurrency: usize,
    requests: usize,
) {
    let mut results: Vec<(Vec<Duration>, f64)> = vec![(Vec::new(), 0.0); 3];
    let cpu = |pid: &str| cpu_seconds(pid);
    let before = [cpu(pids[0]), cpu(pids[1]), cpu("self")];
    for _ in 0..3 {
        for (i, (clients, instance)) in servers.iter().enumerate() {
            let (times, rate) = round(clients, instance, concurrency, requests / 3).await;
            results[i].0.extend(times);
            results[i].1 += rate / 3.0;
        }
    }
    let streams = (requests / 3 * 3) as f64;
    let after = [cpu(pids[0]), cpu(pids[1]), cpu("self")];
    for (target, (times, rate)) in TARGETS.iter().zip(&mut results) {
        times.sort();
        println!(
            "{concurrency:>11}  {target:<10} {rate:>12.0} {:>10.3} {:>10.3}",
            percentile(times, 0.50),
            percentile(times, 0.99)
        );
    }
    println!(
        "{:>11}  plugin / built-in decisions per second: {:.2}",
        "",
        results[1].1 / results[0].1
    );
    let per_stream = |i: usize, streams: f64| (after[i] - before[i]) / streams * 1e6;
    println!(
        "{:>11}  CPU per stream: router {:.0} us, floor {:.0} us, Envoy stand-in {:.0} us",
        "",
        per_stream(0, 2.0 * streams),
        per_stream(1, streams),
        per_stream(2, 3.0 * streams)
    );
}

fn main() {
    if std::env::args().any(|a| a == floor::FLAG) {
        return floor::serve();
    }
    // `cargo bench` passes --bench; a filter or --list from the test harness is ignored.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (router, base) = start_router(dir.path(), port);
    let mut floor_command = std::process::Command::new(std::env::current_exe().unwrap());
    floor_command.arg(floor::FLAG);
    let (floor_server, floor_port) = process::start_command(floor_command, floor::ANNOUNCE);
    let pids = [router.0.id().to_string(), floor_server.0.id().to_string()];
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let connect = |port: u16| futures_util::future::join_all((0..8).map(move |_| client(port)));
        let clients: Vec<Client> = connect(port).await;
        let floor_clients: Vec<Client> = connect(floor_port.parse().unwrap()).await;
        let servers = [
            (&clients[..], TARGETS[0]),
            (&clients[..], TARGETS[1]),
            (&floor_clients[..], TARGETS[2]),
        ];
        // Warm up every path (connections, the blocking pool, the plugin's instance).
        for (clients, instance) in servers {
            round(clients, instance, 8, 400).await;
        }
        println!(
            "ext_proc decisions, {WORKERS} workers, 3 interleaved rounds per cell; latency = request headers sent -> pick received\n"
        );
        println!(
            "{:>11}  {:<10} {:>12} {:>10} {:>10}",
            "concurrency", "policy", "decisions/s", "p50 ms", "p99 ms"
        );
        for (concurrency, requests) in [(1usize, 600usize), (64, 3072), (512, 6144)] {
            cell(&servers, [&pids[0], &pids[1]], concurrency, requests).await;
        }
        println!(
            "\nthe router's own time per decision (end of body -> pick sent), mean over the run: {:.3} ms",
            server_side_mean_ms(&base).await
        );
    });
}
