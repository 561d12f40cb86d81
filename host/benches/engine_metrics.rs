//! The cost of reading engines' own load (`engine_metrics:`): 1,000 engines on loopback,
//! each serving the golden vLLM scrape (`tests/fixtures/engine_metrics/vllm.txt`), scraped
//! in rounds by the router's own `scrape_all` on one thread of its own, as the router
//! runs it. Reports the scraper thread's CPU time per round (from the thread's CPU clock,
//! so the engines' side, on other threads, is not counted) and what share of one core
//! that is at intervals of 1 s, 250 ms and 50 ms; and, side by side, parsing alone.
//!
//! `make bench-engine-metrics` (or `cargo bench -p switchyard --bench engine_metrics`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::get;
use switchyard::config::{ConfigSource, EngineMetricsSettings};
use switchyard::engines::engine_metrics::{parse::parse, scrape_all};
use switchyard::plugin::EngineReport;
use switchyard_plugin_sdk::WorkerId;

const ENGINES: usize = 1_000;
const ROUNDS: usize = 10;

fn thread_cpu() -> Duration {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .expect("the thread CPU clock");
    Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32)
}

fn main() {
    switchyard::engines::tls::install_default_provider();
    let text: &'static str = include_str!("../../tests/fixtures/engine_metrics/vllm.txt");
    // The engines: one server runtime (two threads), 1,000 listeners.
    let engines = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let urls: Vec<String> = engines.block_on(async {
        let mut urls = Vec::new();
        for _ in 0..ENGINES {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            urls.push(format!("http://{}", listener.local_addr().unwrap()));
            let app = axum::Router::new().route("/metrics", get(move || async move { text }));
            tokio::spawn(async move { axum::serve(listener, app).await });
        }
        urls
    });
    let reports: Vec<(WorkerId, String, Arc<EngineReport>)> = urls
        .iter()
        .enumerate()
        .map(|(i, url)| {
            let id = WorkerId {
                worker_id: i as u64,
                dp_rank: 0,
            };
            (id, url.clone(), EngineReport::new())
        })
        .collect();
    let source =
        ConfigSource::parse("{}".into(), "<bench>".into(), std::path::PathBuf::new()).unwrap();
    let settings = EngineMetricsSettings {
        interval_ms: 1_000,
        ..Default::default()
    };
    // The scraper: this thread, a current-thread runtime, as `engine_metrics::start` runs.
    let scraper = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client =
        scraper.block_on(async { switchyard::engines::client::engine_client(&source).unwrap() });
    let mut per_round = Vec::new();
    for round in 0..=ROUNDS {
        let (cpu, wall) = (thread_cpu(), Instant::now());
        let outcomes = scraper.block_on(scrape_all(&client, reports.clone(), &settings));
        let failed = outcomes.iter().filter(|(_, o)| o.is_err()).count();
        assert_eq!(failed, 0, "every engine answers");
        if round > 0 {
            // Round 0 opens the connections; the others reuse them, as the router does.
            per_round.push((thread_cpu() - cpu, wall.elapsed()));
        }
    }
    let (_, _, sample) = &reports[0];
    assert_eq!(sample.read().unwrap().sample.running_requests, 3.0);
    per_round.sort();
    let (cpu, wall) = per_round[per_round.len() / 2];
    let parse_cpu = {
        let start = thread_cpu();
        for _ in 0..ENGINES {
            std::hint::black_box(parse(std::hint::black_box(text)).unwrap());
        }
        thread_cpu() - start
    };
    println!(
        "scraping {ENGINES} engines ({} bytes each), median of {ROUNDS} rounds on one thread:",
        text.len()
    );
    println!(
        "  CPU per round {:.1} ms (wall {:.1} ms); parsing alone {:.2} ms ({:.0}% of it)",
        cpu.as_secs_f64() * 1e3,
        wall.as_secs_f64() * 1e3,
        parse_cpu.as_secs_f64() * 1e3,
        parse_cpu.as_secs_f64() / cpu.as_secs_f64() * 100.0
    );
    for interval_ms in [1_000.0, 250.0, 50.0] {
        println!(
            "  at interval_ms {interval_ms:>5}: {:.1}% of one core",
            cpu.as_secs_f64() * 1e3 / interval_ms * 100.0
        );
    }
}
