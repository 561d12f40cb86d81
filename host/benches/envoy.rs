//! A real Envoy in front of four `engine-sim` engines, side by side: Envoy's own round
//! robin, Envoy asking switchyard's endpoint picker (docs/envoy.md's config) for every
//! request, and Envoy running switchyard as its dynamic module (`libswitchyard_envoy.so`,
//! the module config of docs/envoy.md). Per concurrency (1, 8, 32), non-streamed and streamed chat
//! completions of 2 tokens: throughput, latency p50 / p99, the picker's throughput ratio
//! and the latency it adds. Rounds are interleaved (round robin, picker, round robin, ...)
//! so machine noise hits both alike; everything shares the machine's cores, the load
//! generator included, so the ratios mean more than the absolute figures.
//!
//! `make bench-envoy` (Envoy from `scripts/install-test-tools`). Loopback only; every process
//! it starts is killed when it ends. SWITCHYARD_BENCH_SECS sets each cell's duration (2),
//! SWITCHYARD_BENCH_ROUNDS the interleaved rounds (3), and SWITCHYARD_BENCH_PATHS the
//! paths beside round robin (`picker,lean,lean2,module,headers`, all by default; `headers`:
//! the module deciding at the request headers, on a load-only config): on two noisy
//! cores one path against round robin in longer cells and more rounds is the steadier
//! ratio. The ratio column is over all rounds; `rounds` gives the lowest and highest
//! ratio of a single round, the noise the figure carries. Every Envoy runs one worker
//! thread unless `SWITCHYARD_ENVOY_WORKERS` says otherwise.
//! With `SWITCHYARD_PROFILE_SECS=N` it prints the lean picker's router PID and holds 8
//! clients through it for N seconds instead, for `scripts/flamegraph`
//! (`SWITCHYARD_PROFILE_PATH=module`: Envoy with the module, its PID; `round robin`;
//! `SWITCHYARD_PROFILE_CLIENTS=N`: another concurrency).
//! `SWITCHYARD_ENVOY_MODULE_DIR` loads the `libswitchyard_envoy.so` of that folder (a module
//! built otherwise, as with profile-guided optimization) instead of the workspace's.

#[path = "common/load.rs"]
mod load;
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

use load::{load, quantile, warm_up, Cell};
use process::{cell_seconds, cpu_seconds, fast_engines, machine_cpu_seconds, serve, worker_lines};
use real_envoy::{envoy_config, free_port, lean_envoy_config, module_config, module_dir, Envoy};

/// `SWITCHYARD_PROFILE_SECS`: instead of the table, hold 8 clients through the lean
/// picker this long, for a profiler.
fn profile_seconds() -> Option<u64> {
    std::env::var("SWITCHYARD_PROFILE_SECS").ok()?.parse().ok()
}

/// Envoy with a static round-robin cluster of `engines` and nothing else.
fn round_robin_config(port: u16, engines: &[String]) -> String {
    let endpoints: String = engines
        .iter()
        .map(|address| {
            let (host, engine_port) = address.rsplit_once(':').unwrap();
            format!("              - endpoint: {{address: {{socket_address: {{address: {host}, port_value: {engine_port}}}}}}}\n")
        })
        .collect();
    format!(
        "static_resources:
  listeners:
    - name: inference
      address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: inference
                route_config:
                  virtual_hosts:
                    - name: engines
                      domains: [\"*\"]
                      routes:
                        - match: {{prefix: \"/\"}}
                          route: {{cluster: engines, timeout: 0s}}
                http_filters:
                  - name: envoy.filters.http.router
                    typed_config: {{\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}
  clusters:
    - name: engines
      type: STATIC
      lb_policy: ROUND_ROBIN
      connect_timeout: 5s
      circuit_breakers:
        thresholds:
          - {{max_connections: 40000, max_pending_requests: 40000, max_requests: 40000}}
      load_assignment:
        cluster_name: engines
        endpoints:
          - lb_endpoints:
{endpoints}"
    )
}

/// One table row: round robin (`cells[0]`) against one way through the picker (`cells[1]`).
fn print_row(
    path: &str,
    stream: bool,
    concurrency: usize,
    cells: &mut [&mut Cell; 2],
    seconds: f64,
    (cpu, rounds): (Cpu, (f64, f64)),
) {
    for cell in cells.iter_mut() {
        cell.latencies_us.sort_unstable();
    }
    let rate = |c: &Cell| c.requests as f64 / seconds;
    let (rr, picked) = (&*cells[0], &*cells[1]);
    let (p50, p99) = (
        (
            quantile(&rr.latencies_us, 0.5),
            quantile(&picked.latencies_us, 0.5),
        ),
        (
            quantile(&rr.latencies_us, 0.99),
            quantile(&picked.latencies_us, 0.99),
        ),
    );
    println!(
        "| {path} | {stream} | {concurrency} | {:.0} | {:.0} | {:.2} | {:.2}-{:.2} | {:.2} / {:.2} | {:+.2} | {:.2} / {:.2} | {:+.2} | {:.0} | {:.0} / {:.0} | {:.0} / {:.0} | {} / {} |",
        rate(rr),
        rate(picked),
        rate(picked) / rate(rr),
        rounds.0,
        rounds.1,
        p50.0,
        p50.1,
        p50.1 - p50.0,
        p99.0,
        p99.1,
        p99.1 - p99.0,
        cpu.router / picked.requests.max(1) as f64 * 1e6,
        cpu.envoy_round_robin / rr.requests.max(1) as f64 * 1e6,
        cpu.envoy_picked / picked.requests.max(1) as f64 * 1e6,
        cpu.machine_round_robin / rr.requests.max(1) as f64 * 1e6,
        cpu.machine_picked / picked.requests.max(1) as f64 * 1e6,
        rr.failures,
        picked.failures
    );
}

/// CPU seconds over a path's cells: the router's, and each Envoy's (round robin's, the
/// picker's), so that what the picker costs Envoy is seen beside what it costs the router.
#[derive(Clone, Copy, Default)]
struct Cpu {
    router: f64,
    envoy_round_robin: f64,
    envoy_picked: f64,
    machine_round_robin: f64,
    machine_picked: f64,
}

/// Interleaved rounds per cell (`SWITCHYARD_BENCH_ROUNDS`, 3).
fn rounds() -> usize {
    std::env::var("SWITCHYARD_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .filter(|&r| r > 0)
        .unwrap_or(3)
}

/// Whether `SWITCHYARD_BENCH_PATHS` (comma-separated keys; all when unset) asks for `key`.
fn wanted(key: &str) -> bool {
    std::env::var("SWITCHYARD_BENCH_PATHS")
        .map(|paths| paths.split(',').any(|p| p.trim() == key))
        .unwrap_or(true)
}

/// The ways a request can go: Envoy's round robin, then each picker (its name, its
/// Envoy, its router's PID).
struct Paths {
    round_robin: Envoy,
    pickers: Vec<(&'static str, Envoy, String)>,
}

/// A router serving the endpoint picker over `config`, and an Envoy running `envoy`'s
/// config through it.
fn picker(
    dir: &std::path::Path,
    config: &std::path::Path,
    envoy: fn(u16, u16) -> String,
) -> (process::Process, Envoy, String) {
    let picker_port = free_port();
    let picker = format!("127.0.0.1:{picker_port}");
    let (router, _) = serve(config, &["--ext-proc", &picker]);
    let port = free_port();
    let through = Envoy::start_with(dir, port, &envoy(port, picker_port));
    let pid = router.0.id().to_string();
    (router, through, pid)
}

/// One row per picker for `stream` at `concurrency`: the same number of interleaved
/// rounds of every path.
fn run_cells(
    runtime: &tokio::runtime::Runtime,
    paths: &Paths,
    stream: bool,
    concurrency: usize,
    seconds: f64,
) {
    let duration = Duration::from_secs_f64(seconds);
    let mut round_robin = Cell::default();
    let (mut round_robin_cpu, mut round_robin_machine) = (0.0, 0.0);
    let mut picked: Vec<(Cell, Cpu)> = paths.pickers.iter().map(|_| Default::default()).collect();
    // Per picker, its lowest and highest ratio to the same round's round robin.
    let mut spread = vec![(f64::INFINITY, 0.0f64); paths.pickers.len()];
    let rounds = rounds();
    let rr_pid = paths.round_robin.pid();
    let add = |into: &mut Cell, cell: Cell| {
        into.requests += cell.requests;
        into.failures += cell.failures;
        into.latencies_us.extend(cell.latencies_us);
    };
    for _round in 0..rounds {
        let before = (cpu_seconds(&rr_pid), machine_cpu_seconds());
        let cell = runtime.block_on(load(&paths.round_robin.base, stream, concurrency, duration));
        let rr_requests = cell.requests.max(1) as f64;
        round_robin_cpu += cpu_seconds(&rr_pid) - before.0;
        round_robin_machine += machine_cpu_seconds() - before.1;
        add(&mut round_robin, cell);
        let each = paths.pickers.iter().zip(&mut picked).zip(&mut spread);
        for (((_, envoy, pid), (into, cpu)), (low, high)) in each {
            // Each process's CPU during its own cells (it idles during the others').
            let envoy_pid = envoy.pid();
            let before = (
                cpu_seconds(pid),
                cpu_seconds(&envoy_pid),
                machine_cpu_seconds(),
            );
            let cell = runtime.block_on(load(&envoy.base, stream, concurrency, duration));
            cpu.router += cpu_seconds(pid) - before.0;
            cpu.envoy_picked += cpu_seconds(&envoy_pid) - before.1;
            cpu.machine_picked += machine_cpu_seconds() - before.2;
            let ratio = cell.requests as f64 / rr_requests;
            (*low, *high) = (low.min(ratio), high.max(ratio));
            add(into, cell);
        }
    }
    let rows = paths.pickers.iter().zip(&mut picked).zip(spread);
    for (((name, ..), (cell, cpu)), spread) in rows {
        let mut rr = Cell {
            requests: round_robin.requests,
            failures: round_robin.failures,
            latencies_us: round_robin.latencies_us.clone(),
        };
        print_row(
            name,
            stream,
            concurrency,
            &mut [&mut rr, cell],
            seconds * rounds as f64,
            (
                Cpu {
                    envoy_round_robin: round_robin_cpu,
                    machine_round_robin: round_robin_machine,
                    ..*cpu
                },
                spread,
            ),
        );
    }
}

/// An Envoy running switchyard as its dynamic module (docs/envoy.md's config), over
/// `config`, with the engines at `addresses` as its cluster; deciding at the request
/// headers when `headers_only` (docs/envoy.md, "Headers only").
fn module_envoy(
    dir: &std::path::Path,
    config: &std::path::Path,
    addresses: &[String],
    headers_only: bool,
) -> Envoy {
    let modules = module_dir();
    let engines: Vec<std::net::SocketAddr> = addresses.iter().map(|a| a.parse().unwrap()).collect();
    let port = free_port();
    let mut text = module_config(port, config, free_port(), &engines);
    if headers_only {
        text = real_envoy::headers_only(text);
    }
    Envoy::start_with_env(
        dir,
        port,
        &text,
        &[("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", modules.as_os_str())],
    )
}

/// A steady load for a profiler (scripts/flamegraph) to sample, nothing else: the lean
/// picker, or the path `SWITCHYARD_PROFILE_PATH` names (`module`: Envoy's own PID; `round
/// robin`), at `SWITCHYARD_PROFILE_CLIENTS` clients (8); then the requests served and the
/// profiled process's CPU per request.
fn profile(runtime: &tokio::runtime::Runtime, paths: &Paths, seconds: u64) {
    let name = std::env::var("SWITCHYARD_PROFILE_PATH").unwrap_or("picker, lean".into());
    let clients = std::env::var("SWITCHYARD_PROFILE_CLIENTS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(8);
    let rr_pid = paths.round_robin.pid();
    let found = if name == "round robin" {
        Some((&paths.round_robin, &rr_pid))
    } else {
        let picked = paths.pickers.iter().find(|(n, ..)| *n == name);
        picked.map(|(_, envoy, pid)| (envoy, pid))
    };
    let Some((envoy, pid)) = found else {
        panic!("SWITCHYARD_PROFILE_PATH={name}: no such path");
    };
    println!("pid {pid}: {name}, {clients} non-streamed clients for {seconds} s");
    let duration = Duration::from_secs(seconds);
    let before = cpu_seconds(pid);
    let cell = runtime.block_on(load(&envoy.base, false, clients, duration));
    let per_request = (cpu_seconds(pid) - before) * 1e6 / cell.requests.max(1) as f64;
    println!(
        "{} requests ({} failed), {per_request:.0} us of pid {pid}'s CPU per request",
        cell.requests, cell.failures
    );
}

/// An Envoy config through a picker: Envoy's port, then the picker's.
type EnvoyConfig = fn(u16, u16) -> String;

/// The paths `SWITCHYARD_BENCH_PATHS` asks for, each with its Envoy and the PID whose
/// CPU is the router's; with the routers' processes (killed when dropped).
fn start_pickers(
    dir: &std::path::Path,
    (config, two_threads, load_only): (&std::path::Path, &std::path::Path, &std::path::Path),
    addresses: &[String],
) -> (Vec<process::Process>, Vec<(&'static str, Envoy, String)>) {
    let (mut routers, mut pickers) = (Vec::new(), Vec::new());
    let ext_proc: [(&str, &'static str, &std::path::Path, EnvoyConfig); 3] = [
        ("picker", "picker", config, envoy_config),
        ("lean", "picker, lean", config, lean_envoy_config),
        (
            "lean2",
            "picker, lean, 2 threads",
            two_threads,
            lean_envoy_config,
        ),
    ];
    for (key, name, config, envoy) in ext_proc {
        if wanted(key) {
            let (router, through, pid) = picker(dir, config, envoy);
            routers.push(router);
            pickers.push((name, through, pid));
        }
    }
    // The router runs inside Envoy: its CPU is Envoy's.
    if wanted("module") {
        let module = module_envoy(dir, config, addresses, false);
        let pid = module.pid();
        pickers.push(("module", module, pid));
    }
    if wanted("headers") {
        let module = module_envoy(dir, load_only, addresses, true);
        let pid = module.pid();
        pickers.push(("module, headers only", module, pid));
    }
    assert!(
        !pickers.is_empty(),
        "SWITCHYARD_BENCH_PATHS names none of picker, lean, lean2, module, headers"
    );
    (routers, pickers)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("envoy: bench");
        return;
    }
    let seconds = cell_seconds();
    let dir = tempfile::tempdir().unwrap();
    let engines = fast_engines(4);
    let addresses: Vec<String> = engines
        .iter()
        .map(|(_, a)| a.trim_start_matches("http://").to_owned())
        .collect();
    let workers = worker_lines("address", &addresses);
    let config = dir.path().join("switchyard.yaml");
    std::fs::write(
        &config,
        format!("models:\n  demo: {{kv_tracking: predicted}}\nworkers:\n{workers}"),
    )
    .unwrap();
    // The same router with its picker on two threads (`ext_proc.threads`; the listen
    // address is `--ext-proc`'s).
    let two_threads = dir.path().join("switchyard-2.yaml");
    std::fs::write(
        &two_threads,
        format!("models:\n  demo: {{kv_tracking: predicted}}\next_proc: {{listen: \"127.0.0.1:0\", threads: 2}}\nworkers:\n{workers}"),
    )
    .unwrap();
    // Load only, for the module deciding at the headers (which refuses a config that
    // routes on the prompt).
    let load_only = dir.path().join("switchyard-load-only.yaml");
    std::fs::write(
        &load_only,
        format!("models:\n  demo: {{kv_tracking: off}}\nworkers:\n{workers}"),
    )
    .unwrap();
    let (_routers, pickers) =
        start_pickers(dir.path(), (&config, &two_threads, &load_only), &addresses);
    let rr_port = free_port();
    let paths = Paths {
        round_robin: Envoy::start_with(
            dir.path(),
            rr_port,
            &round_robin_config(rr_port, &addresses),
        ),
        pickers,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Warm up every path (connections, the pickers' health checks).
    runtime.block_on(async {
        let bases = std::iter::once(&paths.round_robin.base)
            .chain(paths.pickers.iter().map(|(_, envoy, _)| &envoy.base));
        for base in bases {
            warm_up(std::slice::from_ref(base), base, Duration::from_secs(20)).await;
        }
    });
    if let Some(seconds) = profile_seconds() {
        profile(&runtime, &paths, seconds);
        return;
    }
    println!("\nReal Envoy 1.40: round robin vs. switchyard's endpoint picker (ext_proc; `lean`: the response path's body and trailers not sent, docs/envoy.md; the picker on 1 thread unless said) and switchyard as Envoy's dynamic module (`module`: its router CPU is Envoy's), 4 engine-sim engines, 2-token chat completions, {seconds} s per cell, {} interleaved rounds", rounds());
    println!("| path | streamed | concurrency | round robin req/s | picker req/s | ratio | rounds | p50 rr / picker (ms) | added p50 (ms) | p99 rr / picker (ms) | added p99 (ms) | router CPU per request (us) | Envoy CPU per request rr / picker (us) | machine CPU per request rr / picker (us) | failures |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for stream in [false, true] {
        for concurrency in [1usize, 8, 32] {
            run_cells(&runtime, &paths, stream, concurrency, seconds);
        }
    }
}
