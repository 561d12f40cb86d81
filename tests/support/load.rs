//! The load of the long-running tests (tests/soak.rs, tests/chaos.rs): chat clients that
//! stream and hang up, engines killed and restarted, probes, and what they count.

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::pacing::Stop;
use super::Process;

/// Resident memory of process `pid`, in KiB.
pub fn resident_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

pub fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(20))
        .build()
}

/// Status and body of a request; `Err` when no answer came at all.
pub fn call(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    body: Option<&Value>,
) -> Result<(u16, String), String> {
    let request = agent.request(method, url);
    let response = match body {
        Some(body) => request.send_json(body.clone()),
        None => request.call(),
    };
    match response {
        Ok(r) => Ok((r.status(), r.into_string().unwrap_or_default())),
        Err(ureq::Error::Status(status, r)) => Ok((status, r.into_string().unwrap_or_default())),
        Err(e) => Err(e.to_string()),
    }
}

/// Latencies in microseconds: p50, p99, max.
pub fn summary(mut micros: Vec<u64>) -> String {
    if micros.is_empty() {
        return "no samples".to_owned();
    }
    micros.sort_unstable();
    let at = |q: f64| micros[((micros.len() as f64 - 1.0) * q) as usize] as f64 / 1000.0;
    format!(
        "{} samples, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        micros.len(),
        at(0.5),
        at(0.99),
        at(1.0)
    )
}

/// Samples `url` every 10 ms until `stop`; the latencies, and how many were not 200.
pub fn probe(
    url: String,
    body: Option<Value>,
    stop: &Stop,
) -> std::thread::JoinHandle<(Vec<u64>, u64)> {
    stop.spawn(move |stop| {
        let agent = agent();
        let (mut latencies, mut failed) = (Vec::new(), 0);
        loop {
            let started = Instant::now();
            let method = if body.is_some() { "POST" } else { "GET" };
            match call(&agent, method, &url, body.as_ref()) {
                Ok((200, _)) => latencies.push(started.elapsed().as_micros() as u64),
                _ => failed += 1,
            }
            if stop.pause(Duration::from_millis(10)) {
                break;
            }
        }
        (latencies, failed)
    })
}

/// Requests by how they ended.
#[derive(Default)]
pub struct Counts {
    pub answered: AtomicU64,
    pub errors: AtomicU64,
    pub unanswered: AtomicU64,
    pub hung_up: AtomicU64,
}

impl Counts {
    pub fn get(&self) -> [u64; 4] {
        [
            &self.answered,
            &self.errors,
            &self.hung_up,
            &self.unanswered,
        ]
        .map(|c| c.load(Ordering::Relaxed))
    }
}

/// A client of model `demo` until `stop`: streamed and not; one request in four hangs up
/// after its first bytes. Every answer is counted by its kind; an error must be
/// OpenAI-shaped.
pub fn chat_until_stopped(base: &str, client: u64, stop: &Stop, counts: &Counts) {
    let agent = agent();
    let mut n = 0u64;
    while !stop.stopped() {
        n += 1;
        let stream = n.is_multiple_of(2);
        let body = json!({"model": "demo", "stream": stream, "max_tokens": 8,
            "messages": [{"role": "user", "content": format!("conversation {} turn {}", client * 7 + n % 5, n % 3)}]});
        let sent = agent
            .post(&format!("{base}/v1/chat/completions"))
            .send_json(body);
        match sent {
            Ok(response) if n % 4 == 1 => {
                let mut first = [0u8; 16];
                let _ = response.into_reader().read(&mut first);
                counts.hung_up.fetch_add(1, Ordering::Relaxed);
            }
            Ok(response) => {
                // A stream cut by a dying engine ends with an error event: answered.
                let _ = response.into_string();
                counts.answered.fetch_add(1, Ordering::Relaxed);
            }
            Err(ureq::Error::Status(status, response)) => {
                let text = response.into_string().unwrap_or_default();
                let error: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                assert!(
                    error["error"]["message"].is_string(),
                    "{status}: not an OpenAI error: {text}"
                );
                counts.errors.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                eprintln!("unanswered: {e}");
                counts.unanswered.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Kills one engine of `engines` every 3 s, in turn, and restarts it on its port 0.7 s
/// later, until `stop`.
pub fn restart_engines_until_stopped(
    engines: &Mutex<Vec<Process>>,
    start_engine: impl Fn(usize) -> Process,
    stop: &Stop,
) {
    let count = engines.lock().unwrap().len();
    for victim in (0..count).cycle() {
        if stop.pause(Duration::from_secs(3)) {
            break;
        }
        engines.lock().unwrap()[victim].kill();
        // Down 0.7 s, or less when the run ends: restarted either way, so that the
        // run's last checks find every engine up.
        stop.pause(Duration::from_millis(700));
        engines.lock().unwrap()[victim] = start_engine(victim);
    }
}

/// Three `engine-sim`s of model `demo` (fast, 8 tokens by default), each restartable on
/// its own port: the ports and a function that (re)starts engine `i`.
pub fn restartable_engines() -> ([u16; 3], impl Fn(usize) -> Process + Clone + Send + 'static) {
    let ports: [u16; 3] = [super::free_port(), super::free_port(), super::free_port()];
    let start_engine = move |i: usize| {
        super::engine_sim(
            &format!("e{i}"),
            &format!("127.0.0.1:{}", ports[i]),
            &["--decode-tps", "2000", "--default-max-tokens", "8"],
        )
    };
    (ports, start_engine)
}

/// The `/metrics` series (lines that are not comments) of the router at `base`.
pub fn series(base: &str) -> usize {
    series_names(base).len()
}

/// The `/metrics` series of the router at `base`, by name and labels (without values).
pub fn series_names(base: &str) -> std::collections::BTreeSet<String> {
    let (_, text) = call(&agent(), "GET", &format!("{base}/metrics"), None).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            l.rsplit_once(' ')
                .map_or(l, |(series, _)| series)
                .to_owned()
        })
        .collect()
}
