//! Health of the engines behind workers: each with a `url` is probed with `GET /health`
//! every `health_interval_ms`, each known only by `address` (the form a gateway routes
//! to) by opening a TCP connection to it. A worker that fails a probe (or refuses a connection while
//! routing) leaves the candidates; it comes back with its first good probe after the
//! cool-down.

use std::sync::Arc;
use std::time::Duration;

use switchyard_fleet::router::{HealthFailure, Router};

use crate::client::EngineClients;

/// Probes every worker of `router` forever (until the runtime shuts down), at the
/// `frontend.health_interval_ms` the router started with.
pub async fn probe_forever(router: Arc<Router>, clients: EngineClients) {
    let settings = router.generation().config().frontend.clone();
    let mut tick = tokio::time::interval(Duration::from_millis(settings.health_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let targets = router.worker_urls();
        let probes = targets.into_iter().map(|(worker, url)| {
            let (router, clients) = (&router, &clients);
            async move {
                let health = format!("{}/health", url.trim_end_matches('/'));
                let timeout = Duration::from_millis(settings.health_timeout_ms);
                let mut answer = clients.pooled.get(&health).timeout(timeout).send().await;
                // A kept-alive connection the engine closed as idle says nothing of its
                // health: asked again on a connection of its own.
                if answer
                    .as_ref()
                    .is_err_and(crate::upstream::closed_before_answer)
                {
                    answer = clients.fresh.get(&health).timeout(timeout).send().await;
                }
                let outcome = match answer {
                    Ok(r) if r.status().is_success() => Ok(()),
                    Ok(r) => Err(HealthFailure::Status(r.status().as_u16())),
                    Err(e) => Err(HealthFailure::NoAnswer(crate::upstream::describe(&e))),
                };
                router.record_probe(worker, outcome);
            }
        });
        let timeout = Duration::from_millis(settings.health_timeout_ms);
        let connects = router
            .worker_addresses()
            .into_iter()
            .map(|(worker, address)| {
                let router = &router;
                async move {
                    let connected =
                        tokio::time::timeout(timeout, tokio::net::TcpStream::connect(address))
                            .await;
                    let outcome = match connected {
                        Ok(Ok(_)) => Ok(()),
                        Ok(Err(e)) => Err(HealthFailure::Connect {
                            address: address.to_string(),
                            error: e.to_string(),
                        }),
                        Err(_) => Err(HealthFailure::ConnectTimedOut(address.to_string())),
                    };
                    router.record_probe(worker, outcome);
                }
            });
        futures_util::future::join(
            futures_util::future::join_all(probes),
            futures_util::future::join_all(connects),
        )
        .await;
    }
}
