//! What the guards cost on the request paths: the same engine behind three routers run at
//! once, open, with a client key required (`auth.clients`, the client sending
//! `Authorization: Bearer`), and with the key over HTTPS (`http.tls`, connections kept
//! alive). Rounds interleaved, so machine noise hits all three alike. Per path and
//! concurrency: p50 / p99 latency (time to first byte for streamed chat completions) and
//! throughput, each relative to the open router.
//!
//! `make bench-security` (or `cargo bench -p switchyard --bench security`). Loopback only;
//! every process it starts is killed when it ends.

#[path = "common/process.rs"]
mod process;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

const KEY: &str = "bench-client-key-0123456789abcdef";

/// One request: time to the first body byte.
async fn request(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: &Arc<String>,
) -> Duration {
    let started = Instant::now();
    let mut request = client.post(url).header("content-type", "application/json");
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request
        .body(body.as_str().to_owned())
        .send()
        .await
        .expect("request sent");
    assert!(
        response.status().is_success(),
        "{url}: {}",
        response.status()
    );
    let mut stream = response.bytes_stream();
    let mut first = None;
    while let Some(chunk) = stream.next().await {
        chunk.expect("body chunk");
        first.get_or_insert_with(|| started.elapsed());
    }
    first.expect("a body")
}

/// `requests` requests, `concurrency` at a time: the latencies and requests per second.
async fn round(
    client: &reqwest::Client,
    url: &str,
    key: Option<&'static str>,
    body: &Arc<String>,
    concurrency: usize,
    requests: usize,
) -> (Vec<Duration>, f64) {
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, url, body) = (client.clone(), url.to_owned(), body.clone());
            tokio::spawn(async move {
                let mut out = Vec::new();
                for _ in 0..requests / concurrency {
                    out.push(request(&client, &url, key, &body).await);
                }
                out
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    (latencies, requests as f64 / started.elapsed().as_secs_f64())
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3
}

/// One table: `path` through each router, 5 interleaved rounds per concurrency.
async fn table(
    client: &reqwest::Client,
    path: &str,
    body: &Arc<String>,
    routers: &[(&str, &str, Option<&'static str>); 3],
) {
    for (_, base, key) in routers {
        round(client, &format!("{base}{path}"), *key, body, 4, 400).await; // warm the pools
    }
    println!("\n{path}: 5 interleaved rounds per router; ratios to the open router");
    println!("| concurrency | open p50 / p99 | key p50 / p99 | key + TLS p50 / p99 | open req/s | key req/s (ratio) | key + TLS req/s (ratio) |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for (concurrency, requests) in [(1, 500), (16, 4000)] {
        let mut latencies = vec![Vec::new(); 3];
        let mut rates = [0.0; 3];
        for _ in 0..5 {
            for (i, (_, base, key)) in routers.iter().enumerate() {
                let (l, r) = round(
                    client,
                    &format!("{base}{path}"),
                    *key,
                    body,
                    concurrency,
                    requests / 5,
                )
                .await;
                latencies[i].extend(l);
                rates[i] += r / 5.0;
            }
        }
        let cells: Vec<String> = latencies
            .iter_mut()
            .map(|l| {
                l.sort();
                format!("{:.3} / {:.3} ms", percentile(l, 0.5), percentile(l, 0.99))
            })
            .collect();
        println!(
            "| {concurrency} | {} | {} | {} | {:.0} | {:.0} ({:.2}) | {:.0} ({:.2}) |",
            cells[0],
            cells[1],
            cells[2],
            rates[0],
            rates[1],
            rates[1] / rates[0],
            rates[2],
            rates[2] / rates[0]
        );
    }
}

/// A test CA and the router's certificate and key from it (in `d`); the CA's PEM.
fn write_certificates(d: &std::path::Path) -> String {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "bench CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    std::fs::write(d.join("router.crt"), leaf.pem()).unwrap();
    std::fs::write(d.join("router.key"), leaf_key.serialize_pem()).unwrap();
    ca.pem()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca_pem = write_certificates(d);
    std::fs::write(d.join("clients.keys"), format!("{KEY}\n")).unwrap();

    let (_engine, engine) = process::bench_engine();
    let router = |name: &str, extra: &str| process::serve_bench(d, name, &engine, extra);
    let keys = "auth:\n  clients: [{name: bench, key_file: clients.keys}]\n";
    let (_open, open) = router("open", "");
    let (_keyed, keyed) = router("keyed", keys);
    let (_tls, tls) = router(
        "tls",
        &format!("{keys}http:\n  tls: {{cert: router.crt, key: router.key}}\n"),
    );
    let tls = tls.replace("127.0.0.1", "localhost");

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        switchyard::engines::tls::install_default_provider();
        let client = reqwest::Client::builder()
            .tcp_nodelay(true)
            .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
            .build()
            .unwrap();
        let chat = Arc::new(r#"{"model":"bench","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"Benchmark the guards with a short prompt."}]}"#.to_owned());
        let select = Arc::new(r#"{"model":"bench","block_hashes":[1,2,3,4]}"#.to_owned());
        let routers: [(&str, &str, Option<&'static str>); 3] = [("open", &open, None), ("key", &keyed, Some(KEY)), ("key + TLS", &tls, Some(KEY))];
        for (path, body) in [("/v1/select", &select), ("/v1/chat/completions", &chat)] {
            table(&client, path, body, &routers).await;
        }
    });
}
