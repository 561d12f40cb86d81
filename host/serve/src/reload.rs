//! Reloading the config under traffic: `SIGHUP`, or `POST /v1/admin/reload`. The config
//! file is read again and goes through the whole startup path (each plugin probed in a
//! child process, loaded, checked, every instance built); only if all of it succeeds is
//! the new generation swapped in (`Router::reload`). Otherwise the serving generation
//! stays, and the errors are returned and logged, as `check` prints them. The listeners'
//! certificates are read again too (`http.tls`, `ext_proc.tls`); one that does not load
//! refuses the reload like any other error. API keys come with the new generation.

use std::sync::Arc;

use switchyard_config::ConfigSource;
use switchyard_engines::tls::{
    server_config, CertificateError, ListenerTls, ServerTls, GRPC_ALPN, HTTP_ALPN,
};
use switchyard_fleet::router::{ReloadError, ReloadOutcome, Router};
use switchyard_policy::startup::{Startup, StartupError};

/// Why a reload was refused; the serving generation stays.
#[derive(Debug)]
pub enum ReloadFailure {
    /// The config did not go through startup (read, probes, loading, checks).
    Startup(Vec<StartupError>),
    /// A listener's new certificate does not load.
    Certificates(Vec<CertificateError>),
    /// The router refused the new generation.
    Swap(Vec<ReloadError>),
    /// The reload's thread ended before it did.
    Interrupted(String),
}

impl ReloadFailure {
    /// Every error, one line each, as `check` prints them.
    pub fn messages(&self) -> Vec<String> {
        fn lines<E: std::fmt::Display>(errors: &[E]) -> Vec<String> {
            errors.iter().map(ToString::to_string).collect()
        }
        match self {
            ReloadFailure::Startup(errors) => lines(errors),
            ReloadFailure::Certificates(errors) => lines(errors),
            ReloadFailure::Swap(errors) => lines(errors),
            ReloadFailure::Interrupted(why) => vec![format!("the reload did not finish: {why}")],
        }
    }
}

type Reloaded = Vec<(Arc<ServerTls>, Arc<rustls::ServerConfig>)>;

/// The new certificates of every TLS listener, from `source`; Err names what does not load.
fn new_certificates(
    tls: &ListenerTls,
    source: &ConfigSource,
) -> Result<Reloaded, Vec<CertificateError>> {
    let config = &source.config;
    let ext_proc = config.ext_proc.as_ref().and_then(|e| e.tls.as_ref());
    let listeners = [
        ("http.tls", &tls.http, config.http.tls.as_ref(), HTTP_ALPN),
        ("ext_proc.tls", &tls.ext_proc, ext_proc, GRPC_ALPN),
    ];
    let mut reloaded = Vec::new();
    let mut errors = Vec::new();
    for (section, serving, settings, alpn) in listeners {
        match (serving, settings) {
            (Some(serving), Some(settings)) => match server_config(section, settings, source, alpn)
            {
                Ok(config) => reloaded.push((serving.clone(), config)),
                Err(error) => errors.push(CertificateError::unloadable(source, error)),
            },
            (Some(_), None) => errors.push(CertificateError::Removed {
                config: source.name.clone(),
                section,
            }),
            (None, _) => {}
        }
    }
    if errors.is_empty() {
        Ok(reloaded)
    } else {
        Err(errors)
    }
}

/// Reloads the config `router` was started from; off the async executor (probes wait
/// for child processes, and plugin code runs).
pub async fn reload(
    router: Arc<Router>,
    tls: &ListenerTls,
) -> Result<ReloadOutcome, ReloadFailure> {
    let reloading = router.clone();
    let tls = tls.clone();
    let result = tokio::task::spawn_blocking(move || {
        let path = reloading.generation().startup.source.path.clone();
        let loaded = switchyard_policy::startup::load(path.as_deref(), true)
            .map_err(ReloadFailure::Startup)
            .and_then(|startup: Startup| {
                let certificates =
                    new_certificates(&tls, &startup.source).map_err(ReloadFailure::Certificates)?;
                Ok((startup, certificates))
            });
        match loaded {
            Ok((startup, certificates)) => {
                let outcome = reloading.reload(startup).map_err(ReloadFailure::Swap)?;
                for (serving, config) in certificates {
                    serving.replace(config);
                }
                Ok(outcome)
            }
            Err(failure) => {
                reloading.metrics.record_reload(false);
                Err(failure)
            }
        }
    })
    .await
    .unwrap_or_else(|e| Err(ReloadFailure::Interrupted(e.to_string())));
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
        Err(failure) => {
            for error in failure.messages() {
                tracing::error!(%error, "reload refused; the serving config stays");
            }
        }
    }
    result
}

/// Reloads on every `SIGHUP` until the process ends.
#[cfg(unix)]
pub fn on_hangup(router: Arc<Router>, tls: ListenerTls) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading the config");
            let _ = reload(router.clone(), &tls).await;
        }
    });
    Ok(())
}

#[cfg(not(unix))]
pub fn on_hangup(_router: Arc<Router>, _tls: ListenerTls) -> std::io::Result<()> {
    Ok(())
}
