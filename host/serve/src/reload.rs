//! Reloading the config under traffic: `SIGHUP`, or `POST /v1/admin/reload`. The config
//! file is read again and goes through the whole startup path (each plugin probed in a
//! child process, loaded, checked, every instance built); only if all of it succeeds is
//! the new generation swapped in (`Router::reload`). Otherwise the serving generation
//! stays, and the errors are returned and logged, as `check` prints them.

use std::sync::Arc;

use switchyard_fleet::router::{ReloadOutcome, Router};

/// Reloads the config `router` was started from; off the async executor (probes wait
/// for child processes, and plugin code runs).
pub async fn reload(router: Arc<Router>) -> Result<ReloadOutcome, Vec<String>> {
    let reloading = router.clone();
    let result = tokio::task::spawn_blocking(move || {
        let path = reloading.generation().startup.source.path.clone();
        match switchyard_policy::startup::load(path.as_deref(), true) {
            Ok(startup) => reloading.reload(startup),
            Err(errors) => {
                reloading.metrics.record_reload(false);
                Err(errors)
            }
        }
    })
    .await
    .unwrap_or_else(|e| Err(vec![format!("the reload did not finish: {e}")]));
    match &result {
        Ok(outcome) => {
            tracing::info!(
                generation = outcome.generation,
                added = outcome.workers_added,
                removed = outcome.workers_removed,
                updated = outcome.workers_updated,
                "config reloaded"
            );
            if !outcome.needs_restart.is_empty() {
                tracing::warn!(sections = ?outcome.needs_restart, "these config sections changed but are read only at startup: restart to apply them");
            }
        }
        Err(errors) => {
            for error in errors {
                tracing::error!(%error, "reload refused; the serving config stays");
            }
        }
    }
    result
}

/// Reloads on every `SIGHUP` until the process ends.
#[cfg(unix)]
pub fn on_hangup(router: Arc<Router>) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading the config");
            let _ = reload(router.clone()).await;
        }
    });
    Ok(())
}

#[cfg(not(unix))]
pub fn on_hangup(_router: Arc<Router>) -> std::io::Result<()> {
    Ok(())
}
