//! The processes a benchmark starts (`switchyard serve`, `engine-sim`): killed by their PID
//! when dropped, so nothing outlives the run.
#![allow(dead_code)] // each benchmark uses part of it

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the switchyard binary with `args`; returns it and what follows `announce` in
/// its first line that starts so (its address).
pub fn start(args: &[&str], announce: &str) -> (Process, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_switchyard"));
    command.args(args);
    start_command(command, announce)
}

/// `start` for a command made elsewhere (a switchyard under `taskset`, say).
pub fn start_command(mut command: Command, announce: &str) -> (Process, String) {
    let mut child = command
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()
        .expect("switchyard starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let found = loop {
        let line = lines.next().expect("it announces its address").unwrap();
        if let Some(rest) = line.strip_prefix(announce) {
            break rest.to_owned();
        }
    };
    // Keep draining stdout so the process never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (Process(child), found)
}

/// CPU time (user + system) a process has used, in seconds, from /proc.
pub fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) are space-separated; utime and
    // stime are the 14th and 15th fields overall.
    let after = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields.get(11..13).map_or(0.0, |f| {
        f.iter().filter_map(|v| v.parse::<f64>().ok()).sum()
    });
    ticks / 100.0 // USER_HZ is 100 on Linux
}

/// CPU time (every process's, user + system + interrupts + steal) the whole machine has
/// used, in seconds, from /proc/stat: what a path costs in all, client and engines too.
pub fn machine_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let first = stat.lines().next().unwrap_or_default();
    // cpu user nice system idle iowait irq softirq steal ...: all but idle and iowait.
    let ticks: f64 = first
        .split_whitespace()
        .skip(1)
        .take(8)
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum();
    ticks / 100.0
}

/// Each cell's duration: `SWITCHYARD_BENCH_SECS`, else 2 s.
pub fn cell_seconds() -> f64 {
    std::env::var("SWITCHYARD_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0)
}

/// `n` engine-sims (`e0`, `e1`, ...) whose answers take about a millisecond (prefill
/// effectively free, 100,000 tokens/s decode), so a proxy's cost is not hidden behind
/// the engine; with their `http://` addresses.
pub fn fast_engines(n: usize) -> Vec<(Process, String)> {
    (0..n)
        .map(|i| {
            start(
                &[
                    "engine-sim",
                    "--name",
                    &format!("e{i}"),
                    "--decode-tps",
                    "100000",
                    "--prefill-tps",
                    "100000000",
                ],
                "engine-sim listening on ",
            )
        })
        .collect()
}

/// One engine-sim serving model `bench`: prefill all but free, 4,000 tokens/s decode;
/// its address.
pub fn bench_engine() -> (Process, String) {
    start(
        &[
            "engine-sim",
            "--model",
            "bench",
            "--listen",
            "127.0.0.1:0",
            "--prefill-tps",
            "10000000",
            "--decode-tps",
            "4000",
        ],
        "engine-sim listening on ",
    )
}

/// `switchyard serve` of a config with `bench_engine`'s worker (`url`) and `extra`
/// sections, written as `dir/NAME.yaml`; its address.
pub fn serve_bench(
    dir: &std::path::Path,
    name: &str,
    engine: &str,
    extra: &str,
) -> (Process, String) {
    let config = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &config,
        format!("models:\n  bench: {{kv_tracking: off}}\nworkers:\n  - {{model: bench, worker_id: 1, url: \"{engine}\"}}\n{extra}"),
    )
    .unwrap();
    serve(&config, &[])
}

/// `switchyard serve` of `config` on a loopback port, with `extra` arguments; its
/// address.
pub fn serve(config: &std::path::Path, extra: &[&str]) -> (Process, String) {
    let mut args = vec![
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--config",
        config.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    start(&args, "switchyard listening on ")
}

/// The `workers:` entries of model `demo`, ids from 1, each `key: "value"` (`url` or
/// `address`).
pub fn worker_lines(key: &str, values: &[String]) -> String {
    values
        .iter()
        .enumerate()
        .map(|(i, value)| {
            format!(
                "  - {{model: demo, worker_id: {}, {key}: \"{value}\"}}\n",
                i + 1
            )
        })
        .collect()
}
