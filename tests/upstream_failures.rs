//! Failures talking to an engine that the engine never saw (issue 50, item 5).
//!
//! Engines close kept-alive connections that sit idle: llama.cpp's server after 5 s, as
//! vLLM's and SGLang's uvicorn do. A request the router writes on such a connection just
//! as the engine closes it gets no answer at all. The engine here is a raw TCP server
//! that does exactly that, every time: it answers the first request on a connection and
//! closes the connection when a second one arrives on it, as an engine whose idle timer
//! fired as the request came in. (The real engine's window is a fraction of a
//! millisecond every 5 s, which a test cannot aim at; the router sees the same bytes.)

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::json;
use support::{metric, post_json, switchyard_bin, write_config, Process};

/// An engine that answers one request per connection and closes the connection, without
/// a word, when the next request arrives on it. Counts the completions it answered
/// (health probes apart).
struct ClosingEngine {
    address: String,
    answered: Arc<AtomicUsize>,
    probes: Arc<AtomicUsize>,
}

impl ClosingEngine {
    fn start() -> ClosingEngine {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let answered = Arc::new(AtomicUsize::new(0));
        let probes = Arc::new(AtomicUsize::new(0));
        let counters = (answered.clone(), probes.clone());
        // The thread ends with the test process; its connections with the router's.
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let counters = counters.clone();
                std::thread::spawn(move || serve_one_request(stream, &counters));
            }
        });
        ClosingEngine {
            address,
            answered,
            probes,
        }
    }
}

/// Reads a request (head and `content-length` body), answers it keeping the connection
/// open, then closes the connection once the next request's first bytes arrive.
fn serve_one_request(stream: TcpStream, (answered, probes): &(Arc<AtomicUsize>, Arc<AtomicUsize>)) {
    let mut reader = BufReader::new(stream);
    let Some(path) = read_request(&mut reader) else {
        return;
    };
    let body = if path == "/health" {
        "{}".to_owned()
    } else {
        json!({"id": "x", "object": "chat.completion", "model": "demo",
               "choices": [{"index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": "hi"}}]})
        .to_string()
    };
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    // Counted before the answer is written: the router may pass the answer on, and the
    // test read the count, before this thread runs again.
    let counter = if path == "/health" { probes } else { answered };
    counter.fetch_add(1, Ordering::Relaxed);
    let mut stream = reader.get_ref();
    if stream.write_all(head.as_bytes()).is_err() || stream.write_all(body.as_bytes()).is_err() {
        return;
    }
    // The next request on this connection is not answered: the connection closes.
    let mut byte = [0u8; 1];
    let _ = reader.read(&mut byte);
}

/// The request's path, its head and body consumed; `None` when the connection ends.
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<String> {
    let mut line = String::new();
    reader.read_line(&mut line).ok().filter(|&n| n > 0)?;
    let path = line.split_whitespace().nth(1)?.to_owned();
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok().filter(|&n| n > 0)?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).ok()?;
    Some(path)
}

/// `switchyard serve` with more `frontend` settings (`, key: value`) in front of `engine`, its log (at `warn`)
/// written to `log`.
fn router(dir: &std::path::Path, engine: &ClosingEngine, frontend: &str) -> Process {
    let yaml = format!(
        "models:\n  demo: {{kv_tracking: predicted}}\n\
         frontend: {{health_interval_ms: 3600000{frontend}}}\n\
         workers:\n  - {{model: demo, worker_id: 1, url: \"{}\"}}\n",
        engine.address
    );
    let config = write_config(dir, &yaml);
    let log = std::fs::File::create(dir.join("router.log")).unwrap();
    Process::start(
        Command::new(switchyard_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .env("RUST_LOG", "warn")
            .stderr(Stdio::from(log)),
        "switchyard listening on ",
    )
}

fn chat() -> serde_json::Value {
    json!({"model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
}

/// Every request on a kept-alive connection the engine closes is sent again on a fresh
/// one: all answered 200, each closed connection logged once (worker, phase, kind) and
/// counted as `closed`.
#[test]
fn a_connection_the_engine_closed_costs_no_request() {
    let dir = tempfile::tempdir().unwrap();
    let engine = ClosingEngine::start();
    let router = router(dir.path(), &engine, "");
    let agent = ureq::AgentBuilder::new()
        .timeout(std::time::Duration::from_secs(30))
        .build();
    let url = format!("{}/v1/chat/completions", router.address);
    for turn in 0..4 {
        let (status, _, body) = post_json(&agent, &url, &chat());
        assert_eq!(status, 200, "request {turn}: {body}");
    }
    assert_eq!(engine.answered.load(Ordering::Relaxed), 4);
    let closed = metric(
        &router.address,
        "switchyard_upstream_failures_total{kind=\"closed\"}",
    );
    // A request that met a closed connection was answered on a connection of its own
    // (not kept), so the next one opens a new connection, and the one after reuses it.
    assert!(closed >= 1.0, "closed connections counted: {closed}");
    assert_eq!(
        metric(&router.address, "switchyard_upstream_errors_total"),
        0.0
    );
    let log = std::fs::read_to_string(dir.path().join("router.log")).unwrap();
    let failures: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("upstream failure"))
        .collect();
    assert_eq!(failures.len() as f64, closed, "{log}");
    for line in failures {
        for field in [
            "worker=1",
            "phase=\"send\"",
            "kind=\"closed\"",
            "fresh connection",
        ] {
            assert!(line.contains(field), "`{field}` missing in: {line}");
        }
    }
}

/// Health probes on kept-alive connections the engine closes: a probe that meets one is
/// asked again on a fresh connection, so the worker stays healthy.
#[test]
fn a_probe_on_a_closed_connection_asks_again() {
    let dir = tempfile::tempdir().unwrap();
    let engine = ClosingEngine::start();
    let yaml = format!(
        "frontend: {{health_interval_ms: 20, unhealthy_cooldown_ms: 600000}}\n\
         workers:\n  - {{model: demo, worker_id: 1, url: \"{}\"}}\n",
        engine.address
    );
    let router = support::serve(&write_config(dir.path(), &yaml));
    // Every other probe meets a connection the engine closed.
    support::wait_for("ten probes answered", || {
        engine.probes.load(Ordering::Relaxed) >= 10
    });
    let workers: serde_json::Value = ureq::get(&format!("{}/v1/workers", router.address))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(workers[0]["healthy"], true, "{workers}");
    let url = format!("{}/v1/chat/completions", router.address);
    let (status, _, body) = post_json(&ureq::Agent::new(), &url, &chat());
    assert_eq!(status, 200, "{body}");
}

/// `frontend.pool_idle_timeout_ms: 0` keeps no connection: the engine never sees a
/// second request on one, so nothing fails.
#[test]
fn with_no_idle_connections_kept_nothing_is_reused() {
    let dir = tempfile::tempdir().unwrap();
    let engine = ClosingEngine::start();
    let router = router(dir.path(), &engine, ", pool_idle_timeout_ms: 0");
    let agent = ureq::Agent::new();
    let url = format!("{}/v1/chat/completions", router.address);
    for turn in 0..3 {
        let (status, _, body) = post_json(&agent, &url, &chat());
        assert_eq!(status, 200, "request {turn}: {body}");
    }
    let closed = metric(
        &router.address,
        "switchyard_upstream_failures_total{kind=\"closed\"}",
    );
    assert_eq!(closed, 0.0);
}
