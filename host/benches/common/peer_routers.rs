//! The peers the `peers*` benchmarks compare switchyard with: where `make bench-peers`
//! installs them, and starting vllm-router or sglang-router in front of engines.
#![allow(dead_code)] // each benchmark uses part of it

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::Process;
use crate::real_envoy::free_port;

/// Where the peers are: `SWITCHYARD_PEERS_VENV`, or the venv `make bench-peers` fills.
pub fn venv() -> PathBuf {
    std::env::var_os("SWITCHYARD_PEERS_VENV").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/peers-venv"),
        PathBuf::from,
    )
}

/// `router` (`vllm-router` or `sglang-router`) with `--policy policy` over `engines`,
/// listening on loopback: its process and base URL, or why not.
pub fn start_peer(
    router: &str,
    policy: &str,
    engines: &[String],
) -> Result<(Process, String), String> {
    let bin = venv().join("bin").join(router);
    if !bin.exists() {
        return Err(format!(
            "{} is not installed (make bench-peers installs it)",
            bin.display()
        ));
    }
    let (port, metrics) = (free_port(), free_port());
    let mut command = Command::new(&bin);
    if router == "sglang-router" {
        command.arg("launch");
    }
    let child = command
        .arg("--worker-urls")
        .args(engines)
        .args(["--policy", policy, "--host", "127.0.0.1"])
        .args(["--port", &port.to_string()])
        .args(["--prometheus-port", &metrics.to_string()])
        .args(["--log-level", "error"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let process = Process(child);
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if started.elapsed() > Duration::from_secs(60) {
            return Err(format!("{router} did not listen on {port} within 60 s"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((process, format!("http://127.0.0.1:{port}")))
}
