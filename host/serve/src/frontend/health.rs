//! Health of the engines behind workers with a `url`: each is probed with `GET /health`
//! every `health_interval_ms`. A worker that fails a probe (or refuses a connection while
//! routing) leaves the candidates; it comes back with its first good probe after the
//! cool-down.

use std::sync::Arc;
use std::time::Duration;

use super::Frontend;

/// Probes every worker with a `url` forever (until the runtime shuts down).
pub async fn probe_forever(frontend: Arc<Frontend>) {
    let settings = frontend.settings().clone();
    let mut tick = tokio::time::interval(Duration::from_millis(settings.health_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let targets = frontend.router().worker_urls();
        let probes = targets.into_iter().map(|(worker, url)| {
            let frontend = frontend.clone();
            async move {
                let healthy = frontend
                    .client()
                    .get(format!("{}/health", url.trim_end_matches('/')))
                    .timeout(Duration::from_millis(settings.health_timeout_ms))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                frontend.router().record_probe(worker, healthy);
            }
        });
        futures_util::future::join_all(probes).await;
    }
}
