//! 20,000 hostile connections against the router's default limits, loopback only, bounded
//! in count and time: half sit idle, half trickle a request head (slowloris), from 40
//! loopback source addresses (127.0.0.2 and up). Meanwhile new clients on 127.0.0.1 probe
//! `/healthz` and `/v1/models` on fresh connections. Every probe must be answered; the
//! router's open descriptors stay under its connection cap. Latencies before and during
//! the flood are printed, not asserted (the machine is shared and noisy), and recorded in
//! docs/BENCHMARKS.md.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// One probe on a fresh connection: the status line's code and how long it took.
fn probe(address: &str, path: &str) -> (Result<u16, String>, Duration) {
    let started = Instant::now();
    let outcome = (|| {
        let mut tcp = TcpStream::connect(address).map_err(|e| format!("connect: {e}"))?;
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            tcp,
            "GET {path} HTTP/1.1\r\nhost: probe\r\nconnection: close\r\n\r\n"
        )
        .map_err(|e| format!("write: {e}"))?;
        let mut answer = Vec::new();
        tcp.read_to_end(&mut answer)
            .map_err(|e| format!("read: {e}"))?;
        let text = String::from_utf8_lossy(&answer);
        text.split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("no status line in {text:?}"))
    })();
    (outcome, started.elapsed())
}

fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

/// Probes both paths until `until`, every `every`; the latencies, sorted.
fn probe_until(
    address: &str,
    until: Instant,
    every: Duration,
    pid: u32,
    max_fds: &mut usize,
) -> Vec<Duration> {
    let mut latencies = Vec::new();
    while Instant::now() < until {
        for path in ["/healthz", "/v1/models"] {
            let (outcome, took) = probe(address, path);
            assert_eq!(
                outcome,
                Ok(200),
                "{path} on a fresh connection was not answered"
            );
            latencies.push(took);
        }
        *max_fds = (*max_fds).max(open_descriptors(pid));
        // The probes are a client's steady trickle.
        pacing::pace(every);
    }
    latencies.sort();
    latencies
}

/// Two attacker processes of 10,000 connections each (a process may hold 20,000
/// descriptors here): 20 source addresses x 500 connections apiece, idle and slowloris.
fn start_floods(host: &str, port: &str) -> Vec<std::process::Child> {
    let script = repo().join("tests/support/flood.py");
    let flood_secs = "14";
    [("idle", 2), ("slowloris", 22)]
        .into_iter()
        .map(|(mode, first)| {
            Command::new("python3")
                .arg(&script)
                .args([
                    host,
                    port,
                    &first.to_string(),
                    "20",
                    "500",
                    flood_secs,
                    mode,
                ])
                .stdout(Stdio::piped())
                .spawn()
                .expect("python3")
        })
        .collect()
}

fn print_probes(phases: &[(&str, &Vec<Duration>)]) {
    for (phase, latencies) in phases {
        println!(
            "probes {phase}: {} answered, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            latencies.len(),
            percentile(latencies, 0.5),
            percentile(latencies, 0.99),
            percentile(latencies, 1.0)
        );
    }
}

#[test]
fn twenty_thousand_idle_and_slowloris_connections_leave_new_clients_answered() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "workers:\n  - {model: demo, worker_id: 1}\n");
    let router = serve(&config);
    let address = router.address.trim_start_matches("http://").to_owned();
    let (host, port) = address.rsplit_once(':').unwrap();
    let pid = router.pid();
    let mut max_fds = 0;

    let baseline = probe_until(
        &address,
        Instant::now() + Duration::from_secs(2),
        Duration::from_millis(20),
        pid,
        &mut max_fds,
    );

    let attackers = start_floods(host, port);
    // Probe once the flood is built up: each attacker says so on its first line.
    let mut attackers: Vec<_> = attackers
        .into_iter()
        .map(|mut attacker| {
            let mut out = BufReader::new(attacker.stdout.take().unwrap());
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            assert!(line.contains("built_up"), "the flood script said {line:?}");
            (attacker, out)
        })
        .collect();
    let during = probe_until(
        &address,
        Instant::now() + Duration::from_secs(9),
        Duration::from_millis(50),
        pid,
        &mut max_fds,
    );
    let reports: Vec<String> = attackers
        .iter_mut()
        .map(|(attacker, out)| {
            let mut report = String::new();
            out.read_to_string(&mut report).unwrap();
            assert!(
                attacker.wait().unwrap().success(),
                "the flood script failed"
            );
            report.trim().to_owned()
        })
        .collect();
    let after = probe_until(
        &address,
        Instant::now() + Duration::from_secs(1),
        Duration::from_millis(20),
        pid,
        &mut max_fds,
    );

    let cap = (20_000u64.min(limit_of_open_files()) - 64) / 2;
    println!("flood: {}", reports.join(" "));
    print_probes(&[
        ("before", &baseline),
        ("during", &during),
        ("after", &after),
    ]);
    println!("router: at most {max_fds} open descriptors (connection cap {cap})");
    let total: u64 = reports
        .iter()
        .map(|r| {
            let report: serde_json::Value = serde_json::from_str(r).unwrap();
            report["opened"].as_u64().unwrap() + report["refused"].as_u64().unwrap()
        })
        .sum();
    assert_eq!(total, 20_000, "every connection was attempted: {reports:?}");
    let slowloris: serde_json::Value = serde_json::from_str(&reports[1]).unwrap();
    assert!(
        slowloris["closed_by_server"].as_u64().unwrap() > 0,
        "trickled heads are cut off: {slowloris}"
    );
    assert!(
        max_fds as u64 <= cap + 256,
        "descriptors stay under the cap: {max_fds} > {cap} + 256"
    );
}

/// The router raises its soft limit to the hard one; the test reads the same hard limit.
fn limit_of_open_files() -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(4))
        .and_then(|hard| hard.parse().ok())
        .unwrap_or(20_000)
}
