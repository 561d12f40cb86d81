//! Shared helpers of the integration tests: where the built plugins are, compiling the
//! broken C fixtures, writing configs, running selections.
#![allow(dead_code)]

pub mod envoy;
mod eventually;
mod nested_cargo;
// Each test file uses some of them.
#[allow(unused_imports)]
pub use eventually::{eventually, eventually_async, eventually_ok, eventually_ok_async};
pub use nested_cargo::nested_cargo;
pub mod kubernetes;
pub mod llama;
pub mod load;
pub mod module_envoy;
pub mod nats;
pub mod pacing;
pub mod real_envoy;
pub mod server;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use switchyard::config::ConfigSource;
use switchyard::plugin::PartitionKey;
use switchyard::plugin::{PromptBlocks, RouteRequest};
use switchyard::policy::{CandidateRow, CandidatesFrom, RowExtras, SelectError, Selector};
use switchyard::startup::{start, Startup, StartupError};
use switchyard_plugin_sdk::{Status, WorkerId, WorkerType};

// Not every test uses each of these.
#[allow(unused_imports)]
pub use real_envoy::{blocks, free_port, repo};
#[allow(unused_imports)]
pub use server::Server;

/// A two-thread tokio runtime, as on the CI machine's two cores.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// An HTTP client for the tests. The router's TLS uses rustls with the ring provider,
/// which the process must choose before reqwest builds a client (the binary does it in
/// `main`).
pub fn http_client() -> reqwest::Client {
    switchyard::engines::tls::install_default_provider();
    reqwest::Client::new()
}

/// `workers:` entries of model `demo` for `engines` (ids from 1), each known by its
/// `address` (as a gateway's workers are) or, without `by_address`, by its `url`.
pub fn demo_workers<'a>(
    engines: impl IntoIterator<Item = &'a Process>,
    by_address: bool,
) -> String {
    engines
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let id = i + 1;
            if by_address {
                let address = e.address.trim_start_matches("http://");
                format!("  - {{model: demo, worker_id: {id}, address: \"{address}\"}}\n")
            } else {
                format!(
                    "  - {{model: demo, worker_id: {id}, url: \"{}\"}}\n",
                    e.address
                )
            }
        })
        .collect()
}

/// A POST of JSON: the status (0 when nothing answered), the `x-engine-name` of the
/// engine that answered, and the body (or the transport error).
pub fn post_json(
    agent: &ureq::Agent,
    url: &str,
    body: &serde_json::Value,
) -> (u16, String, String) {
    match agent.post(url).send_json(body.clone()) {
        Ok(r) => {
            let engine = r.header("x-engine-name").unwrap_or_default().to_owned();
            (r.status(), engine, r.into_string().unwrap_or_default())
        }
        Err(ureq::Error::Status(status, r)) => {
            (status, String::new(), r.into_string().unwrap_or_default())
        }
        Err(e) => (0, String::new(), e.to_string()),
    }
}

/// The JSON answer of `GET url` (panics on a transport or decoding failure).
pub async fn get_json(client: &reqwest::Client, url: &str) -> serde_json::Value {
    let response = client.get(url).send().await.unwrap();
    response.json().await.unwrap()
}

/// `reqwest::get`, with the provider chosen (see `http_client`).
pub async fn get(url: impl reqwest::IntoUrl) -> reqwest::Result<reqwest::Response> {
    http_client().get(url).send().await
}

/// target/debug (or release): where cargo wrote this test binary's crates.
pub fn cargo_out_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_owned()
}

fn must_exist(path: PathBuf, how: &str) -> PathBuf {
    assert!(
        path.exists(),
        "{} is missing: {how} (`make test` does both)",
        path.display()
    );
    path
}

/// A Rust plugin of the workspace (cdylib), built by `cargo build --workspace`.
pub fn rust_plugin(lib: &str) -> PathBuf {
    must_exist(
        cargo_out_dir().join(format!("lib{lib}.so")),
        "run `cargo build --workspace` first",
    )
}

/// A C or C++ example plugin, built by CMake into target/plugins.
pub fn cmake_plugin(lib: &str) -> PathBuf {
    must_exist(
        repo().join("target/plugins").join(format!("lib{lib}.so")),
        "run `cmake -S . -B target/cmake -G Ninja && cmake --build target/cmake` first",
    )
}

/// A loopback address where something accepts TCP connections (and closes them) for as
/// long as the test runs: an engine address that passes the router's connect probe, for
/// tests where nothing is ever proxied to it.
pub fn listening_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for connection in listener.incoming() {
            drop(connection);
        }
    });
    address
}

pub fn switchyard_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchyard"))
}

/// Compiles tests/fixtures/broken_plugin.c with `defines` into `dir/name.so`.
pub fn broken_plugin(dir: &Path, name: &str, defines: &[&str]) -> PathBuf {
    compile_c(
        dir,
        name,
        &repo().join("tests/fixtures/broken_plugin.c"),
        &repo().join("include"),
        defines,
    )
}

/// Compiles the C plugin `source` against the headers in `include` into `dir/name.so`
/// (no optimization flag: the compiler's default, `-O0`).
pub fn compile_c(
    dir: &Path,
    name: &str,
    source: &Path,
    include: &Path,
    defines: &[&str],
) -> PathBuf {
    compile_c_with(dir, name, (source, include), defines, &[])
}

/// `compile_c` with more compiler `flags` (`-O2`).
pub fn compile_c_with(
    dir: &Path,
    name: &str,
    (source, include): (&Path, &Path),
    defines: &[&str],
    flags: &[&str],
) -> PathBuf {
    let out = dir.join(format!("{name}.so"));
    let status = Command::new("cc")
        .args([
            "-std=c11",
            "-shared",
            "-fPIC",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wno-unused-function",
            // The fixtures fill defs positionally; fields a later minor appends are
            // zero, which is what they mean (docs/ABI.md, source compatibility).
            "-Wno-missing-field-initializers",
        ])
        .arg("-I")
        .arg(include)
        .args(defines.iter().map(|d| format!("-D{d}")))
        .args(flags)
        .arg(source)
        .arg("-o")
        .arg(&out)
        .arg("-lm")
        .status()
        .expect("cc runs");
    assert!(
        status.success(),
        "compiling {} as {name} with {defines:?} failed",
        source.display()
    );
    out
}

/// Writes `yaml` as `dir/config.yaml`.
pub fn write_config(dir: &Path, yaml: &str) -> PathBuf {
    let path = dir.join("config.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

/// Starts from a config text written in `dir`; the errors as typed.
pub fn start_typed(dir: &Path, yaml: &str) -> Result<Startup, Vec<StartupError>> {
    let path = write_config(dir, yaml);
    let source = ConfigSource::from_file(&path).map_err(|e| vec![e.into()])?;
    start(source)
}

/// Starts from a config text written in `dir`; the errors as the operator reads them.
pub fn start_yaml(dir: &Path, yaml: &str) -> Result<Startup, Vec<String>> {
    start_typed(dir, yaml).map_err(|errors| errors.iter().map(ToString::to_string).collect())
}

/// The single error of a config that must fail.
pub fn start_error(dir: &Path, yaml: &str) -> String {
    match start_yaml(dir, yaml) {
        Ok(_) => panic!("startup succeeded, but an error was expected for:\n{yaml}"),
        Err(errors) => {
            assert_eq!(errors.len(), 1, "expected one error, got {errors:#?}");
            errors.into_iter().next().unwrap()
        }
    }
}

/// A worker in a test fleet: id, device overlap blocks, active requests.
#[derive(Clone, Copy)]
pub struct W {
    pub id: u64,
    pub device: u32,
    pub active: u32,
}

pub fn rows(workers: &[W]) -> Vec<CandidateRow> {
    workers
        .iter()
        .map(|w| {
            let mut row = CandidateRow::new(WorkerId {
                worker_id: w.id,
                dp_rank: 0,
            });
            row.cache.device_overlap_blocks = w.device;
            row.cache.host_overlap_blocks = w.device;
            row.cache.disk_overlap_blocks = w.device;
            row.load.active_requests = w.active;
            row.load.decode_cost_blocks = u64::from(w.active) * 4;
            row
        })
        .collect()
}

/// A selector for `instance` of a started config, partition `m`/select.
pub fn selector(startup: &Startup, instance: &str) -> Selector {
    let factory = startup
        .instance(instance)
        .unwrap_or_else(|| panic!("no instance {instance}"));
    Selector::new(
        factory
            .build(&PartitionKey::new("m", WorkerType::Select))
            .expect("builds"),
    )
}

/// One selection of a request of `request_blocks` over `workers`; the chosen worker id.
pub fn select(
    selector: &mut Selector,
    request_blocks: u64,
    workers: &[W],
) -> Result<u64, SelectError> {
    selector
        .select(
            &RouteRequest::default(),
            PromptBlocks::new(16, request_blocks),
            CandidatesFrom::Rows(&rows(workers), &RowExtras::default()),
            None,
        )
        .map(|w| w.worker_id)
}

/// The component, status and message of a component failure; panics on anything else.
pub fn component_failure(error: SelectError) -> (String, Status, String) {
    match error {
        SelectError::ComponentFailed {
            component,
            status,
            message,
            ..
        } => (component.to_string(), status, message),
        other => panic!("expected a component failure, got {other}"),
    }
}

/// Runs a command that must succeed; returns its standard output.
pub fn run(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Builds a standalone plugin crate (debug) into target/rebuild-test, shared by the tests
/// that build plugins outside the workspace; returns that target folder's debug/.
pub fn build_plugin_crate(krate: &Path) -> PathBuf {
    let target = repo().join("target/rebuild-test");
    run(nested_cargo()
        .args(["build", "--quiet", "--manifest-path"])
        .arg(krate.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target));
    target.join("debug")
}

/// `switchyard serve` of `config` on a loopback port the system picks, logging at `warn`;
/// killed when dropped.
pub fn serve(config: &Path) -> Process {
    serve_logging(config, "warn")
}

/// `serve`, logging at `level` (`RUST_LOG`).
pub fn serve_logging(config: &Path, level: &str) -> Process {
    Process::start(
        Command::new(switchyard_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .env("RUST_LOG", level),
        "switchyard listening on ",
    )
}

/// A `switchyard engine-sim` of model `demo` named `name` on `listen` (port 0: any), with
/// `extra` arguments; killed when dropped.
pub fn engine_sim(name: &str, listen: &str, extra: &[&str]) -> Process {
    Process::start(
        Command::new(switchyard_bin())
            .args([
                "engine-sim",
                "--model",
                "demo",
                "--name",
                name,
                "--listen",
                listen,
            ])
            .args(extra)
            .env("RUST_LOG", "warn"),
        "engine-sim listening on ",
    )
}

/// A server process a test started: killed by its PID when dropped, so nothing outlives
/// the test.
pub struct Process {
    pub child: Child,
    /// What the process announced it listens on, e.g. `http://127.0.0.1:40123`.
    pub address: String,
}

impl Process {
    /// Starts `command` with stdout piped and waits for its `{announce}ADDRESS` line.
    pub fn start(command: &mut Command, announce: &str) -> Process {
        let child = command
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{command:?}: {e}"));
        Process::announced(child, announce, &format!("{command:?}"))
    }

    /// Waits for the `{announce}ADDRESS` line of `child` (started with stdout piped; `what`
    /// names it in a failure). Several started at once can be awaited in parallel.
    pub fn announced(mut child: Child, announce: &str, what: &str) -> Process {
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let address = loop {
            let Some(line) = lines.next() else {
                let status = child.wait().unwrap();
                panic!("{what} exited ({status}) before announcing `{announce}`");
            };
            if let Some(address) = line.unwrap().strip_prefix(announce) {
                break address.to_owned();
            }
        };
        // Keep draining stdout so the process never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Process { child, address }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Held by each test of a file whose tests kill engines and count on them staying dead:
/// the file's tests then run one at a time. Run side by side, another test's server can
/// bind a killed engine's freed port (tokio's listeners set SO_REUSEADDR), the TCP health
/// probe of an address-only worker then finds it, and the request goes to that server.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits (up to `limit`) until no worker of the router at `base` has a booking; fails
/// with the workers as last read when some remain.
pub fn wait_for_no_bookings(base: &str, limit: std::time::Duration) {
    eventually_ok("no booking left", limit, || {
        let workers: serde_json::Value = ureq::get(&format!("{base}/v1/workers"))
            .call()
            .unwrap()
            .into_json()
            .unwrap();
        let active: u64 = workers
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["load"]["active_requests"].as_u64().unwrap_or(0))
            .sum();
        (active == 0).then_some(()).ok_or(workers)
    });
}

/// Active requests per worker (in id order), as `GET /v1/workers` of `base` counts them.
pub fn active_requests(base: &str) -> Vec<u64> {
    let workers: serde_json::Value = ureq::get(&format!("{base}/v1/workers"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    workers
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["load"]["active_requests"].as_u64().unwrap())
        .collect()
}

/// `switchyard check --config CONFIG` must succeed; its stderr (the warnings).
pub fn check_passes(config: &Path) -> String {
    let output = Command::new(switchyard_bin())
        .args(["check", "--config"])
        .arg(config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "check {}:\n{stderr}",
        config.display()
    );
    stderr
}

/// `switchyard serve` of `config` on a loopback port, with the Envoy endpoint picker on
/// `picker`; stopped (by PID) when dropped.
pub fn serve_with_picker(config: &Path, picker: u16) -> Process {
    Process::start(
        Command::new(switchyard_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--ext-proc"])
            .arg(format!("127.0.0.1:{picker}"))
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "warn"),
        "switchyard listening on ",
    )
}

/// The `/metrics` text of the router or engine at `base`.
pub fn metrics_text(base: &str) -> String {
    let agent = ureq::AgentBuilder::new()
        .timeout(std::time::Duration::from_secs(30))
        .build();
    agent
        .get(&format!("{base}/metrics"))
        .call()
        .unwrap()
        .into_string()
        .unwrap()
}

/// The sum of every series of metric `name` (any labels) in `/metrics` at `base`.
pub fn metric_sum(base: &str, name: &str) -> f64 {
    metrics_text(base)
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The value of the metric line `name` (with its labels, if any) in the `/metrics` of the
/// router or engine at `base`; 0 when absent.
pub fn metric(base: &str, name: &str) -> f64 {
    let text = metrics_text(base);
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Polls `done` every 20 ms; fails naming `what` after 30 s.
pub fn wait_for(what: &str, done: impl FnMut() -> bool) {
    eventually(what, std::time::Duration::from_secs(30), done);
}

/// `POST /v1/reserve` of request `id` (model `m`, two block hashes) in `session` (none: no
/// session); the worker it was booked on.
pub fn reserve_in_session(base: &str, id: &str, session: Option<&str>) -> u64 {
    let mut body = serde_json::json!({"model": "m", "block_hashes": [7, 8], "request_id": id});
    if let Some(session) = session {
        body["session"] = serde_json::json!({"session_id": session});
    }
    let (status, _, text) = post_json(&ureq::Agent::new(), &format!("{base}/v1/reserve"), &body);
    assert_eq!(status, 200, "{text}");
    let decision: serde_json::Value = serde_json::from_str(&text).unwrap();
    decision["worker_id"].as_u64().unwrap()
}
