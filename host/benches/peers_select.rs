//! The decision API against NVIDIA Dynamo's select service (`python -m
//! dynamo.select_service`, Dynamo 1.6.1): the same workers, the same KV state and the
//! same 512-token prompts, both KV-aware, each server pinned to one core.
//!
//! Every worker is a ZeroMQ publisher in this process, speaking vLLM's KV-event format;
//! both servers subscribe to every worker's socket and so learn the same cache contents:
//! worker `w` holds the first 24 blocks (of 32) of prompt `w`. A query for prompt `w`
//! should go to worker `w`; the table says how often it did ("to the holder"), so a
//! server that ignored the cache could not look fast. Per fleet size (64 and 1,000
//! workers: Dynamo's ZeroMQ context holds at most 1,023 sockets), in interleaved rounds (every cell once, then again):
//! - `select`: switchyard `POST /v1/select`, Dynamo `POST /select` (`token_ids`);
//! - `reserve + free`: switchyard `POST /v1/reserve` then `DELETE /v1/requests/{id}`,
//!   Dynamo `POST /select_and_reserve` then `DELETE /reservations/{id}`: one decision
//!   that books load, and its release, as an engine's request lifecycle has them.
//!
//! Decisions per second, latency p50 / p99 (a decision's calls together), and each
//! server's CPU per decision from /proc. The client runs on the other core.
//!
//! `make bench-peers` installs Dynamo (pinned, from PyPI) into `target/peers-venv` and
//! runs this after the proxy comparison; without it only switchyard is measured, saying
//! so. Loopback only; the servers are killed when it ends. SWITCHYARD_BENCH_SECS sets a
//! cell's duration (2), SWITCHYARD_BENCH_WORKERS the fleet sizes (`64,1000`).

#[path = "common/http_floor.rs"]
mod floor;
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

use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use process::{cell_seconds, cpu_seconds, start_command, Process};
use real_envoy::free_port;
use serde_json::{json, Value};
use switchyard::fleet::kv_events::publisher::{self, Publisher, PublisherSettings};
use switchyard::fleet::kv_events::wire::{EngineEvent, EventForm, HashForm, StoredBlocks};

const BLOCK_SIZE: usize = 16;
const PROMPT_BLOCKS: usize = 32;
const CACHED_BLOCKS: usize = 24;
/// Closed-loop clients per cell.
const CONCURRENCY: usize = 16;

/// Block `b` of prompt `p`: unique per (p, b), so only worker `p` holds it.
fn block(p: usize, b: usize) -> impl Iterator<Item = u32> {
    [p as u32 + 1, b as u32 + 1]
        .into_iter()
        .chain(std::iter::repeat_n(7, BLOCK_SIZE - 2))
}

fn prompt(p: usize) -> Vec<u32> {
    (0..PROMPT_BLOCKS).flat_map(|b| block(p, b)).collect()
}

/// What worker `p` caches: prompt `p`'s first blocks, one engine step.
fn stored(p: usize) -> EngineEvent {
    EngineEvent::Stored(StoredBlocks {
        block_hashes: (0..CACHED_BLOCKS)
            .map(|b| ((p as u64) << 16 | b as u64) + 1)
            .collect(),
        parent_block_hash: None,
        token_ids: (0..CACHED_BLOCKS).flat_map(|b| block(p, b)).collect(),
        block_size: BLOCK_SIZE as u32,
        medium: Some("GPU".into()),
        ..Default::default()
    })
}

/// The two servers, behind one interface.
#[derive(Clone, Copy, PartialEq)]
enum Server {
    Switchyard,
    Dynamo,
    /// The HTTP stack alone (`common/http_floor.rs`): select rows only.
    Floor,
}

impl Server {
    fn name(self) -> &'static str {
        match self {
            Server::Switchyard => "switchyard",
            Server::Dynamo => "Dynamo select_service",
            Server::Floor => "floor: axum, no decision",
        }
    }

    /// The body of a query for prompt `p`.
    fn query(self, p: usize) -> Bytes {
        let tokens = prompt(p);
        let body = match self {
            Server::Switchyard | Server::Floor => json!({"model": "demo", "token_ids": tokens}),
            Server::Dynamo => json!({"model_name": "demo", "token_ids": tokens}),
        };
        Bytes::from(serde_json::to_vec(&body).unwrap())
    }
}

/// A running server: its process (killed on drop), base URL and PID.
struct Running {
    server: Server,
    base: String,
    pid: String,
    _process: Process,
}

/// `command` pinned to CPU 1 (when `taskset` exists), stdout and stderr discarded.
fn pinned(program: &Path) -> Command {
    if Path::new("/usr/bin/taskset").exists() {
        let mut command = Command::new("/usr/bin/taskset");
        command.args(["-c", "1"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn wait_listening(port: u16, what: &str) {
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{what} did not listen on {port} within 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn start_switchyard(dir: &Path, publishers: &[Publisher]) -> Running {
    let workers: String = publishers
        .iter()
        .enumerate()
        .map(|(w, p)| {
            format!(
                "  - {{model: demo, worker_id: {w}, kv_events: {{endpoint: \"{}\", replay_endpoint: \"{}\"}}}}\n",
                p.endpoint,
                p.replay_endpoint.as_deref().unwrap()
            )
        })
        .collect();
    let config = dir.join(format!("switchyard-{}.yaml", publishers.len()));
    std::fs::write(&config, format!("workers:\n{workers}")).unwrap();
    let mut command = pinned(Path::new(env!("CARGO_BIN_EXE_switchyard")));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config);
    let (process, address) = start_command(command, "switchyard listening on ");
    Running {
        server: Server::Switchyard,
        base: address,
        pid: process.0.id().to_string(),
        _process: process,
    }
}

/// Dynamo's select service from the peers' venv, with every worker registered; or why not.
async fn start_dynamo(
    client: &reqwest::Client,
    publishers: &[Publisher],
) -> Result<Running, String> {
    let venv = peer_routers::venv();
    let python = venv.join("bin/python");
    let installed = Command::new(&python)
        .args(["-c", "import dynamo.select_service"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !installed {
        return Err(format!(
            "dynamo.select_service is not installed in {} (make bench-peers installs it)",
            venv.display()
        ));
    }
    let port = free_port();
    let child = pinned(&python)
        .args(["-m", "dynamo.select_service", "--port", &port.to_string()])
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", python.display()))?;
    let running = Running {
        server: Server::Dynamo,
        base: format!("http://127.0.0.1:{port}"),
        pid: child.id().to_string(),
        _process: Process(child),
    };
    wait_listening(port, "Dynamo's select service");
    for (w, p) in publishers.iter().enumerate() {
        let worker = json!({
            "worker_id": w, "model_name": "demo", "block_size": BLOCK_SIZE,
            "endpoint": format!("http://127.0.0.1:{}", 10_000 + w),
            // No replay endpoint: libzmq's default limit is 1,023 sockets per context,
            // and with a replay socket per worker about a tenth of a 1,024-worker fleet's
            // subscriptions never delivered.
            "kv_events_endpoints": {"0": p.endpoint},
        });
        let answer = client
            .post(format!("{}/workers", running.base))
            .json(&worker)
            .send()
            .await
            .map_err(|e| format!("Dynamo: POST /workers: {e}"))?;
        if !answer.status().is_success() {
            return Err(format!(
                "Dynamo: POST /workers answered {}: {}",
                answer.status(),
                answer.text().await.unwrap_or_default()
            ));
        }
    }
    Ok(running)
}

/// The worker a select answer names.
fn chosen(answer: &Value) -> Option<u64> {
    answer["worker_id"].as_u64()
}

/// Publishes every worker's cache until each server sends every prompt to its holder
/// (a SUB socket misses what was sent before it connected); panics after two minutes.
async fn converge(client: &reqwest::Client, servers: &[&Running], publishers: &[Publisher]) {
    let started = Instant::now();
    let mut pending: Vec<usize> = (0..publishers.len()).collect();
    while !pending.is_empty() {
        for &w in &pending {
            publishers[w].publish(vec![stored(w)]);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut still = Vec::new();
        for &w in &pending {
            for server in servers {
                let path = match server.server {
                    Server::Switchyard | Server::Floor => "/v1/select",
                    Server::Dynamo => "/select",
                };
                let answer: Option<Value> = async {
                    let r = client
                        .post(format!("{}{path}", server.base))
                        .header("content-type", "application/json")
                        .body(server.server.query(w))
                        .send()
                        .await
                        .ok()?;
                    r.json().await.ok()
                }
                .await;
                if answer.as_ref().and_then(chosen) != Some(w as u64) {
                    still.push(w);
                    break;
                }
            }
        }
        pending = still;
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{} workers' KV events never reached both servers",
            pending.len()
        );
    }
}

struct Cell {
    decisions: u64,
    to_holder: u64,
    failures: u64,
    latencies_us: Vec<u64>,
    cpu_seconds: f64,
}

/// `{"FIELD":"bID", ...body}`.
fn with_id(body: &Bytes, field: &str, id: u64) -> Bytes {
    let mut spliced = format!("{{\"{field}\":\"b{id}\",").into_bytes();
    spliced.extend_from_slice(&body[1..]);
    Bytes::from(spliced)
}

/// One decision for prompt `p` (and, with `reserve`, its release, booked under `id`):
/// whether it went to the holder, or None when a call failed.
async fn decide(
    client: &reqwest::Client,
    server: &Running,
    body: &Bytes,
    p: usize,
    reserve: bool,
    id: u64,
) -> Option<bool> {
    // Both book under a caller-chosen id, spliced in front of the prepared body.
    let (path, body) = match (server.server, reserve) {
        (Server::Switchyard | Server::Floor, false) => ("/v1/select", body.clone()),
        (Server::Dynamo, false) => ("/select", body.clone()),
        (Server::Switchyard | Server::Floor, true) => {
            ("/v1/reserve", with_id(body, "request_id", id))
        }
        (Server::Dynamo, true) => ("/select_and_reserve", with_id(body, "selection_id", id)),
    };
    let answer = client
        .post(format!("{}{path}", server.base))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .ok()?;
    if !answer.status().is_success() {
        return None;
    }
    let answer: Value = answer.json().await.ok()?;
    if reserve {
        let free = match server.server {
            Server::Switchyard | Server::Floor => format!("{}/v1/requests/b{id}", server.base),
            Server::Dynamo => format!("{}/reservations/b{id}", server.base),
        };
        if !client.delete(free).send().await.ok()?.status().is_success() {
            return None;
        }
    }
    Some(chosen(&answer)? == p as u64)
}

/// `CONCURRENCY` clients deciding one after another for `duration`, prompts in turn.
async fn cell(
    client: &reqwest::Client,
    server: Arc<Running>,
    bodies: Arc<Vec<Bytes>>,
    reserve: bool,
    duration: Duration,
) -> Cell {
    let before = cpu_seconds(&server.pid);
    let until = Instant::now() + duration;
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|c| {
            let (client, server, bodies) = (client.clone(), server.clone(), bodies.clone());
            tokio::spawn(async move {
                let (mut latencies, mut to_holder, mut failures) = (Vec::new(), 0, 0);
                let mut n = c;
                while Instant::now() < until {
                    let p = n % bodies.len();
                    let id = (c as u64) << 40 | n as u64;
                    n += CONCURRENCY;
                    let started = Instant::now();
                    match decide(&client, &server, &bodies[p], p, reserve, id).await {
                        Some(holder) => {
                            latencies.push(started.elapsed().as_micros() as u64);
                            to_holder += u64::from(holder);
                        }
                        None => failures += 1,
                    }
                }
                (latencies, to_holder, failures)
            })
        })
        .collect();
    let mut cell = Cell {
        decisions: 0,
        to_holder: 0,
        failures: 0,
        latencies_us: Vec::new(),
        cpu_seconds: 0.0,
    };
    for task in tasks {
        let (latencies, to_holder, failures) = task.await.unwrap();
        cell.decisions += latencies.len() as u64;
        cell.to_holder += to_holder;
        cell.failures += failures;
        cell.latencies_us.extend(latencies);
    }
    cell.cpu_seconds = cpu_seconds(&server.pid) - before;
    cell
}

fn quantile_ms(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q) as usize] as f64 / 1000.0
}

/// One publisher per worker, on loopback ports the system chooses.
async fn publishers(workers: usize) -> Vec<Publisher> {
    let mut publishers = Vec::with_capacity(workers);
    for _ in 0..workers {
        publishers.push(
            publisher::start(PublisherSettings {
                endpoint: "tcp://127.0.0.1:0".into(),
                replay_endpoint: Some("tcp://127.0.0.1:0".into()),
                topic: String::new(),
                form: EventForm::Array,
                hash_form: HashForm::Int,
                data_parallel_rank: 0,
                buffer_steps: 64,
                drop_sequences: Vec::new(),
            })
            .await
            .expect("a worker's publisher binds on loopback"),
        );
    }
    publishers
}

/// A row per server: its cells of the three rounds summed.
fn print_rows(
    workers: usize,
    reserve: bool,
    servers: &[Arc<Running>],
    cells: &[Vec<Cell>],
    seconds: f64,
) {
    let mut rates = Vec::new();
    for (server, cells) in servers.iter().zip(cells) {
        let decisions: u64 = cells.iter().map(|c| c.decisions).sum();
        let cpu: f64 = cells.iter().map(|c| c.cpu_seconds).sum();
        let mut latencies: Vec<u64> = cells
            .iter()
            .flat_map(|c| c.latencies_us.iter().copied())
            .collect();
        latencies.sort_unstable();
        let rate = decisions as f64 / (3.0 * seconds);
        rates.push(rate);
        println!(
            "| {workers} | {} | {} | {rate:.0} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} % | {} |",
            if reserve { "reserve + free" } else { "select" },
            server.server.name(),
            rate / rates[0],
            quantile_ms(&latencies, 0.5),
            quantile_ms(&latencies, 0.99),
            cpu / decisions.max(1) as f64 * 1e6,
            100.0 * cells.iter().map(|c| c.to_holder).sum::<u64>() as f64 / decisions.max(1) as f64,
            cells.iter().map(|c| c.failures).sum::<u64>(),
        );
    }
}

/// `SWITCHYARD_PROFILE_SECS`: instead of the table, send `/v1/select` to switchyard alone
/// this long (the first fleet of `SWITCHYARD_BENCH_WORKERS`), for a profiler.
fn profile_seconds() -> Option<u64> {
    std::env::var("SWITCHYARD_PROFILE_SECS").ok()?.parse().ok()
}

/// Sends `/v1/select` to `server` for `seconds`, for a profiler (scripts/flamegraph) to
/// sample: nothing else.
fn hold_for_profiler(
    runtime: &tokio::runtime::Runtime,
    client: &reqwest::Client,
    server: &Arc<Running>,
    bodies: &Arc<Vec<Bytes>>,
    seconds: u64,
) {
    println!(
        "switchyard pid {}: /v1/select at {} workers for {seconds} s",
        server.pid,
        bodies.len()
    );
    let duration = Duration::from_secs(seconds);
    runtime.block_on(cell(
        client,
        server.clone(),
        bodies.clone(),
        false,
        duration,
    ));
}

/// The HTTP floor, pinned as the servers are.
fn start_floor() -> Running {
    let mut command = pinned(&std::env::current_exe().unwrap());
    command.arg(floor::FLAG);
    let (process, address) = start_command(command, floor::ANNOUNCE);
    Running {
        server: Server::Floor,
        base: address,
        pid: process.0.id().to_string(),
        _process: process,
    }
}

fn main() {
    if std::env::args().any(|a| a == floor::FLAG) {
        return floor::serve();
    }
    if std::env::args().any(|a| a == "--list") {
        println!("peers_select: bench");
        return;
    }
    let seconds = cell_seconds();
    let duration = Duration::from_secs_f64(seconds);
    let fleets: Vec<usize> = std::env::var("SWITCHYARD_BENCH_WORKERS")
        .unwrap_or_else(|_| "64,1000".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    // The client and the publishers on CPU 0 (threads inherit it), the servers on CPU 1.
    let _ = Command::new("/usr/bin/taskset")
        .args(["-p", "-c", "0", &std::process::id().to_string()])
        .stdout(Stdio::null())
        .status();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    switchyard::engines::tls::install_default_provider();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CONCURRENCY)
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    println!(
        "\nDecision API, {} of {PROMPT_BLOCKS} blocks of each {}-token prompt cached on its worker, {CONCURRENCY} clients, {seconds} s per cell, 3 interleaved rounds",
        CACHED_BLOCKS,
        PROMPT_BLOCKS * BLOCK_SIZE
    );
    println!("| workers | call | server | decisions/s | ratio to switchyard | p50 (ms) | p99 (ms) | server CPU per decision (us) | to the holder | failures |");
    println!("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for &workers in &fleets {
        let publishers = runtime.block_on(publishers(workers));
        let mut servers = vec![Arc::new(start_switchyard(dir.path(), &publishers))];
        match runtime.block_on(start_dynamo(&client, &publishers)) {
            Ok(dynamo) => servers.push(Arc::new(dynamo)),
            Err(why) => println!("skipped Dynamo at {workers} workers: {why}"),
        }
        {
            let all: Vec<&Running> = servers.iter().map(|s| s.as_ref()).collect();
            runtime.block_on(converge(&client, &all, &publishers));
        }
        servers.push(Arc::new(start_floor()));
        let bodies: Vec<Arc<Vec<Bytes>>> = servers
            .iter()
            .map(|s| Arc::new((0..workers).map(|p| s.server.query(p)).collect()))
            .collect();
        if let Some(seconds) = profile_seconds() {
            return hold_for_profiler(&runtime, &client, &servers[0], &bodies[0], seconds);
        }
        for reserve in [false, true] {
            // The floor books nothing: select rows only.
            let servers: Vec<Arc<Running>> = servers
                .iter()
                .filter(|s| !(reserve && s.server == Server::Floor))
                .cloned()
                .collect();
            let mut cells: Vec<Vec<Cell>> = servers.iter().map(|_| Vec::new()).collect();
            for _round in 0..3 {
                for (s, server) in servers.iter().enumerate() {
                    let got = runtime.block_on(cell(
                        &client,
                        server.clone(),
                        bodies[s].clone(),
                        reserve,
                        duration,
                    ));
                    cells[s].push(got);
                }
            }
            print_rows(workers, reserve, &servers, &cells, seconds);
        }
        // Servers stop before their publishers close.
        drop(servers);
        drop(publishers);
    }
}
