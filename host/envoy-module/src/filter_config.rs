//! One filter config: the router `switchyard serve` would run for the same YAML config,
//! shared by all of Envoy's worker threads, and the module's own threads beside it
//! (engine health, engine metrics, KV events, reservation expiry, replicas, the optional
//! HTTP API listener). They start when Envoy loads the filter config and stop when it
//! destroys it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use switchyard_fleet::router::Router;
use switchyard_serve::ext_proc::EndpointPicker;
use switchyard_serve::frontend::Frontend;

use crate::stats::EnvoyStats;

/// Why a filter config was refused; Envoy logs it and rejects the config.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Settings(#[from] switchyard_config::envoy_module::EnvoyModuleError),
    #[error("{config}: {errors}; nothing was started")]
    Startup { config: String, errors: String },
    #[error("{config}: in `workers:`: {error}")]
    Workers { config: String, error: String },
    #[error("the switchyard module cannot start its threads: {0}")]
    Threads(std::io::Error),
}

/// The module's state for one filter config.
pub struct FilterConfig {
    pub picker: Arc<EndpointPicker>,
    /// `headers_only`: the request header naming the model (decided at the headers).
    pub model_header: Option<String>,
    /// The module's own threads; dropped (stopped) first when the config goes.
    pub runtime: Option<tokio::runtime::Runtime>,
    /// The module's decisions in Envoy's stats (`None` if Envoy refused to define them).
    pub stats: Option<EnvoyStats>,
}

impl FilterConfig {
    /// Loads switchyard's config as `serve` does and starts the module's threads.
    pub fn load(filter_config: &[u8]) -> Result<FilterConfig, ConfigError> {
        // The filter's `filter_config` (a JSON object; Envoy hands over a
        // `google.protobuf.StringValue`'s text, or a `Struct` as JSON).
        let settings = switchyard_config::envoy_module::EnvoyModuleSettings::parse(filter_config)?;
        let name = settings.config.display().to_string();
        let startup = switchyard_policy::startup::load(Some(&settings.config), settings.probe)
            .map_err(|errors| ConfigError::Startup {
                config: name.clone(),
                errors: errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            })?;
        settings.check_config(&startup.source)?;
        let ext_proc = startup.config().ext_proc.clone().unwrap_or_else(|| {
            switchyard_config::ExtProcSettings::listening(SocketAddr::from(([127, 0, 0, 1], 0)))
        });
        let router = Router::new(startup).map_err(|e| ConfigError::Workers {
            config: name.clone(),
            error: e.to_string(),
        })?;
        let router = Arc::new(router);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("switchyard-envoy")
            .enable_all()
            .build()
            .map_err(ConfigError::Threads)?;
        let frontend = runtime.block_on(async { Frontend::new(router.clone()) });
        let frontend = frontend.map_err(|e| ConfigError::Workers {
            config: name,
            error: e.to_string(),
        })?;
        runtime
            .block_on(start_background(&router, &frontend, settings.listen))
            .map_err(ConfigError::Threads)?;
        let picker = Arc::new(EndpointPicker::new(frontend, &ext_proc));
        Ok(FilterConfig {
            picker,
            model_header: settings.model_header().map(str::to_owned),
            runtime: Some(runtime),
            stats: None,
        })
    }

    pub fn router(&self) -> &Arc<Router> {
        self.picker.router()
    }
}

/// What `serve` runs beside its listeners, on the module's runtime: engine health and
/// metrics, KV-event subscriptions, reservation expiry, replicas, and the HTTP API when
/// asked for (no signal handlers: the signals are Envoy's).
async fn start_background(
    router: &Arc<Router>,
    frontend: &Arc<Frontend>,
    listen: Option<SocketAddr>,
) -> std::io::Result<()> {
    tokio::spawn(switchyard_engines::health::probe_forever(
        router.clone(),
        frontend.clients().clone(),
    ));
    let client = switchyard_engines::client::engine_client(&router.generation().startup.source)
        .map_err(std::io::Error::other)?;
    tokio::spawn(switchyard_engines::engine_metrics::scrape_forever(
        router.clone(),
        client,
    ));
    router.subscribe_kv_events(&router.workers())?;
    tokio::spawn(switchyard_serve::http_service::expire_forever(
        router.clone(),
    ));
    if let Some((id, nats)) = switchyard_serve::http_service::start_replicas(router).await? {
        tracing::info!(%id, %nats, "switchyard (Envoy module): replica sharing load");
    }
    if let Some(listen) = listen {
        serve_api(router, frontend, listen).await?;
    }
    Ok(())
}

/// switchyard's HTTP API on `listen`, as `serve` routes it (without TLS or the listener
/// limits: meant for loopback, the operator's own).
async fn serve_api(
    router: &Arc<Router>,
    frontend: &Arc<Frontend>,
    listen: SocketAddr,
) -> std::io::Result<()> {
    let config = router.generation().config().http.clone();
    let limits = switchyard_serve::guards::BodyLimits {
        max_bytes: config.max_body_bytes,
        read_timeout: Duration::from_secs(config.body_read_timeout_secs),
    };
    let app = switchyard_serve::http_service::app(router.clone(), frontend.clone(), limits);
    let tcp =
        switchyard_serve::http_service::bind(listen, "the switchyard module's HTTP API", "listen")
            .await?;
    println!(
        "switchyard (Envoy module) API listening on http://{}",
        tcp.local_addr()?
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(tcp, app).await {
            tracing::error!(error = %e, "switchyard (Envoy module): the HTTP API stopped");
        }
    });
    Ok(())
}

/// How long the config's end waits for retired plugin state and queued notifications.
const PLUGIN_THREADS_FINISH: Duration = Duration::from_secs(5);

impl Drop for FilterConfig {
    /// Envoy destroys a filter config after its last stream: the module's threads stop,
    /// the KV-event subscribers are let go (each holds the router), and the plugin threads
    /// deliver what is queued and stop, so no plugin code runs after this.
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_secs(5));
        }
        let router = self.router().clone();
        for worker in router.workers() {
            if worker.kv_events.is_some() {
                let _ = router.remove_worker(worker.id());
            }
        }
        router.finish_plugin_threads(PLUGIN_THREADS_FINISH);
    }
}
