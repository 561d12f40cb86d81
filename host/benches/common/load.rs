//! Closed-loop load for the benchmarks that compare HTTP paths side by side: `concurrency`
//! clients each sending 2-token chat completions one after another, and the latencies of
//! the ones that succeeded.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

/// The Inference Extension's model header (`x-gateway-model-name`).
const MODEL_HEADER: &str = "x-gateway-model-name";

#[derive(Default)]
pub struct Cell {
    pub requests: u64,
    pub failures: u64,
    pub latencies_us: Vec<u64>,
}

/// `concurrency` clients sending requests one after another for `duration`.
pub async fn load(base: &str, stream: bool, concurrency: usize, duration: Duration) -> Cell {
    load_spread(&[base.to_owned()], stream, concurrency, duration).await
}

/// `load`, each request to the next of `bases` in turn (a client's own round robin: the
/// "direct" path to a fleet of engines).
pub async fn load_spread(
    bases: &[String],
    stream: bool,
    concurrency: usize,
    duration: Duration,
) -> Cell {
    switchyard::engines::tls::install_default_provider();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()
        .unwrap();
    let urls: Arc<Vec<String>> = Arc::new(
        bases
            .iter()
            .map(|base| format!("{base}/v1/chat/completions"))
            .collect(),
    );
    let until = Instant::now() + duration;
    let tasks: Vec<_> = (0..concurrency)
        .map(|c| {
            let (client, urls) = (client.clone(), urls.clone());
            tokio::spawn(async move {
                let (mut latencies, mut failures, mut n) = (Vec::new(), 0u64, 0u64);
                while Instant::now() < until {
                    n += 1;
                    let body = json!({"model": "demo", "stream": stream, "max_tokens": 2,
                        "messages": [{"role": "user", "content": format!("client {c} request {n}")}]});
                    let started = Instant::now();
                    let url = &urls[(c + n as usize) % urls.len()];
                    // The model's header too, as a gateway's body-based routing sets it: the
                    // Envoy module deciding at the headers reads it; every other path ignores it.
                    let sent = client.post(url.as_str()).header(MODEL_HEADER, "demo");
                    let ok = match sent.json(&body).send().await {
                        Ok(r) if r.status().is_success() => r.bytes().await.is_ok(),
                        _ => false,
                    };
                    if ok {
                        latencies.push(started.elapsed().as_micros() as u64);
                    } else {
                        failures += 1;
                    }
                }
                (latencies, failures)
            })
        })
        .collect();
    let mut cell = Cell {
        requests: 0,
        failures: 0,
        latencies_us: Vec::new(),
    };
    for task in tasks {
        let (latencies, failures) = task.await.unwrap();
        cell.requests += latencies.len() as u64;
        cell.failures += failures;
        cell.latencies_us.extend(latencies);
    }
    cell
}

pub fn quantile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q) as usize] as f64 / 1000.0
}

/// Sends single requests to `bases` until one succeeds (connections open, the router's
/// first health checks done); panics naming `name` after `limit`.
pub async fn warm_up(bases: &[String], name: &str, limit: Duration) {
    let started = Instant::now();
    while load_spread(bases, false, 1, Duration::from_millis(200))
        .await
        .requests
        == 0
    {
        assert!(started.elapsed() < limit, "{name} never answered");
    }
}
