//! The engines' own load, for policies that read the ENGINE input group: every engine with
//! a `url` is scraped at `engine_metrics.interval_ms` (`GET {url}/metrics`, Prometheus
//! text), and what it says goes to the worker's shared report, where the next selection
//! reads it.
//!
//! The scraper runs on a thread of its own with its own single-threaded runtime, so
//! parsing a thousand scrapes never takes a turn of the serving executor. Every scrape is
//! bounded: `timeout_ms` for the whole exchange, `max_bytes` of body, `concurrency` in
//! flight. A failed scrape keeps the last values, marked stale, and is logged when an
//! engine goes from answering to failing (not on every tick).

pub mod parse;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use switchyard_config::EngineMetricsSettings;
use switchyard_fleet::router::Router;
use switchyard_plugin_host::plugin::EngineReport;
use switchyard_plugin_sdk::WorkerId;

/// Starts the scraper thread; it runs as long as the process. Its HTTP client is its own,
/// made on its runtime (a client's connections belong to the runtime that made them).
pub fn start(router: Arc<Router>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("engine-metrics".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    tracing::error!(error = %e, "engine metrics: no runtime; engines are not scraped");
                    return;
                }
            };
            let client = match crate::client::engine_client(&router.generation().startup.source) {
                Ok(client) => client,
                Err(e) => {
                    tracing::error!(error = %e, "engine metrics: no HTTP client; engines are not scraped");
                    return;
                }
            };
            runtime.block_on(scrape_forever(router, client));
        })
        .map(drop)
}

/// Scrapes every engine each `engine_metrics.interval_ms` until its runtime shuts down
/// (a host that stops it with its own runtime calls this instead of `start`).
pub async fn scrape_forever(router: Arc<Router>, client: reqwest::Client) {
    let mut failing: HashSet<WorkerId> = HashSet::new();
    loop {
        let settings = router.generation().config().engine_metrics.clone();
        if settings.interval_ms == 0 {
            // Off; a reload may turn it on.
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        let started = Instant::now();
        let round = scrape_all(&client, router.engine_reports(), &settings).await;
        for (worker, outcome) in round {
            router.metrics.record_engine_scrape(outcome.is_ok());
            match outcome {
                Ok(()) => {
                    if failing.remove(&worker) {
                        tracing::info!(
                            worker = worker.worker_id,
                            "engine metrics: scrapes succeed again"
                        );
                    }
                }
                Err(error) => {
                    if failing.insert(worker) {
                        tracing::warn!(worker = worker.worker_id, %error, "engine metrics: scrape failed; policies see its last sample as stale");
                    }
                }
            }
        }
        let interval = Duration::from_millis(settings.interval_ms);
        tokio::time::sleep(interval.saturating_sub(started.elapsed())).await;
    }
}

/// One round: every engine once, at most `concurrency` at a time. Engines sharing a URL
/// (data-parallel ranks behind one server) are scraped once.
pub async fn scrape_all(
    client: &reqwest::Client,
    engines: Vec<(WorkerId, String, Arc<EngineReport>)>,
    settings: &EngineMetricsSettings,
) -> Vec<(WorkerId, Result<(), ScrapeError>)> {
    let mut by_url: std::collections::BTreeMap<String, Vec<(WorkerId, Arc<EngineReport>)>> =
        Default::default();
    for (worker, url, report) in engines {
        by_url.entry(url).or_default().push((worker, report));
    }
    futures_util::stream::iter(by_url)
        .map(|(url, reports)| async move {
            let outcome = scrape(client, &url, settings).await;
            let taken = Instant::now();
            reports
                .into_iter()
                .map(|(worker, report)| {
                    match &outcome {
                        Ok(sample) => report.record(sample.clone(), taken),
                        Err(why) => report.mark_failed(&why.to_string()),
                    }
                    (worker, outcome.as_ref().map(drop).map_err(Clone::clone))
                })
                .collect::<Vec<_>>()
        })
        .buffer_unordered(settings.concurrency.max(1))
        .flat_map(futures_util::stream::iter)
        .collect()
        .await
}

/// Why one engine's scrape failed; `target` is the URL scraped.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ScrapeError {
    #[error("GET {target}: {reason}")]
    Request { target: String, reason: String },
    #[error("GET {target} answered {status}")]
    Status {
        target: String,
        status: reqwest::StatusCode,
    },
    #[error("GET {target}: the body is over engine_metrics.max_bytes ({max_bytes})")]
    TooLarge { target: String, max_bytes: usize },
    #[error("GET {target} took longer than engine_metrics.timeout_ms ({timeout_ms} ms)")]
    Timeout { target: String, timeout_ms: u64 },
    #[error("GET {target}: the body is not UTF-8 text")]
    NotText { target: String },
    #[error("GET {target}: {error}")]
    Unreadable {
        target: String,
        error: parse::MetricsError,
    },
}

/// One engine's scrape, bounded in time and size.
async fn scrape(
    client: &reqwest::Client,
    url: &str,
    settings: &EngineMetricsSettings,
) -> Result<switchyard_plugin_host::plugin::EngineSample, ScrapeError> {
    let target = format!("{}/metrics", url.trim_end_matches('/'));
    let budget = Duration::from_millis(settings.timeout_ms);
    let fetch = async {
        let response = client
            .get(&target)
            .send()
            .await
            .map_err(|e| ScrapeError::Request {
                target: target.clone(),
                reason: crate::upstream::describe(&e),
            })?;
        if !response.status().is_success() {
            return Err(ScrapeError::Status {
                target: target.clone(),
                status: response.status(),
            });
        }
        let mut body = Vec::new();
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| ScrapeError::Request {
                target: target.clone(),
                reason: e.to_string(),
            })?;
            if body.len() + chunk.len() > settings.max_bytes {
                return Err(ScrapeError::TooLarge {
                    target: target.clone(),
                    max_bytes: settings.max_bytes,
                });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    };
    let body = tokio::time::timeout(budget, fetch)
        .await
        .map_err(|_| ScrapeError::Timeout {
            target: target.clone(),
            timeout_ms: settings.timeout_ms,
        })??;
    let Ok(text) = std::str::from_utf8(&body) else {
        return Err(ScrapeError::NotText { target });
    };
    parse::parse(text).map_err(|error| ScrapeError::Unreadable { target, error })
}
