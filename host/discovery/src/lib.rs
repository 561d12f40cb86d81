//! Workers found on Kubernetes (`discovery.kubernetes`): the pods a Gateway API Inference
//! Extension `InferencePool` selects join the fleet while they are Ready and leave it
//! when they stop being Ready, change address or are deleted, through the router's own
//! add and remove paths (those of `POST` and `DELETE /v1/workers`). Health probes and
//! engine scrapes cover them as they cover configured workers (docs/kubernetes.md).

use std::sync::{Arc, Mutex};

use kube::config::{KubeConfigOptions, Kubeconfig};
use switchyard_fleet::router::Router;

pub mod inference_pool;
pub mod members;
pub mod pods;
mod watch;

pub use inference_pool::InferencePool;

/// Why discovery could not start; the message names the config and what to do.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("{config}: discovery.kubernetes.kubeconfig `{path}`: {error}; fix the file, or leave the setting out to use the pod's service account")]
    Kubeconfig {
        config: String,
        path: std::path::PathBuf,
        error: String,
    },
    #[error("{config}: discovery.kubernetes: no Kubernetes API server to talk to ({error}); run the router in a pod with a service account, or set discovery.kubernetes.kubeconfig (or KUBECONFIG)")]
    NoCluster { config: String, error: String },
    #[error("{config}: discovery.kubernetes: cannot build the Kubernetes client: {error}")]
    Client { config: String, error: String },
}

/// Starts discovery when the config has a `discovery:` section (true), on the current
/// tokio runtime, for as long as the process runs. The client is built first, so a
/// kubeconfig that cannot be read fails `serve` at start; the API server being away does
/// not (the watches retry with backoff).
pub async fn start(router: Arc<Router>) -> Result<bool, DiscoveryError> {
    let generation = router.generation();
    let Some(discovery) = generation.config().discovery.clone() else {
        return Ok(false);
    };
    let settings = discovery.kubernetes;
    let source = &generation.startup.source;
    let config = match &settings.kubeconfig {
        Some(path) => {
            let path = source.resolve(path);
            let failed = |error: String| DiscoveryError::Kubeconfig {
                config: source.name.clone(),
                path: path.clone(),
                error,
            };
            let kubeconfig = Kubeconfig::read_from(&path).map_err(|e| failed(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| failed(e.to_string()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| DiscoveryError::NoCluster {
                config: source.name.clone(),
                error: e.to_string(),
            })?,
    };
    let namespace = settings
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = kube::Client::try_from(config).map_err(|e| DiscoveryError::Client {
        config: source.name.clone(),
        error: e.to_string(),
    })?;
    drop(generation);
    let discovery = watch::Discovery {
        client,
        namespace,
        settings: Arc::new(settings),
        router,
        members: Arc::new(Mutex::new(members::Members::default())),
    };
    tokio::spawn(discovery.run());
    Ok(true)
}
