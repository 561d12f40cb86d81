//! The watches: the pool by name, and the pods its selector matches. kube's watcher lists
//! first and then watches, and after a disconnect or an API server restart lists again
//! (with backoff); each full list replaces what was known, so nothing is lost or counted
//! twice. Every change recomputes the discovered workers from all pods known and
//! reconciles the router with them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use switchyard_config::KubernetesDiscovery;
use switchyard_fleet::router::Router;
use switchyard_fleet::workers::WorkerSpec;

use crate::inference_pool::InferencePool;
use crate::members::Members;
use crate::pods;

/// What of the pool the pod watch depends on: a change restarts it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PoolView {
    selector: String,
    ports: Vec<u16>,
}

/// Shared by the watches: the settings, the router, and what discovery registered.
#[derive(Clone)]
pub(crate) struct Discovery {
    pub client: Client,
    pub namespace: String,
    pub settings: Arc<KubernetesDiscovery>,
    pub router: Arc<Router>,
    pub members: Arc<Mutex<Members>>,
}

impl Discovery {
    /// Reconciles the router with `desired`, off the executor; returns when done, so
    /// changes apply in the order the events came.
    async fn reconcile(&self, desired: BTreeMap<switchyard_plugin_sdk::WorkerId, WorkerSpec>) {
        let (router, members) = (self.router.clone(), self.members.clone());
        let done = tokio::task::spawn_blocking(move || {
            let mut members = members.lock().unwrap_or_else(|p| p.into_inner());
            let changes = members.reconcile(&router, &desired);
            (changes, members.len())
        })
        .await;
        if let Ok((changes, now)) = done {
            if changes.added + changes.removed > 0 {
                tracing::info!(
                    added = changes.added,
                    removed = changes.removed,
                    workers = now,
                    "discovery: fleet changed"
                );
            }
        }
    }

    /// Watches the pool until the process ends; a pool that changes its selector or ports
    /// restarts the pod watch, a deleted pool takes its workers out.
    pub(crate) async fn run(self) {
        let pools: Api<InferencePool> = Api::namespaced(self.client.clone(), &self.namespace);
        let by_name =
            watcher::Config::default().fields(&format!("metadata.name={}", self.settings.pool));
        let events = watcher::watcher(pools, by_name).default_backoff();
        futures_util::pin_mut!(events);
        let mut current: Option<(PoolView, tokio::task::JoinHandle<()>)> = None;
        let mut listed: Option<InferencePool> = None;
        while let Some(event) = events.next().await {
            let pool = match event {
                Ok(Event::Init) => {
                    listed = None;
                    continue;
                }
                Ok(Event::InitApply(pool)) => {
                    listed = Some(pool);
                    continue;
                }
                Ok(Event::InitDone) => listed.take(),
                Ok(Event::Apply(pool)) => Some(pool),
                Ok(Event::Delete(_)) => None,
                Err(error) => {
                    tracing::warn!(%error, pool = %self.settings.pool, "discovery: watching the InferencePool failed; retrying with backoff");
                    continue;
                }
            };
            self.follow(pool, &mut current).await;
        }
    }

    /// Starts, restarts or stops the pod watch for the pool as it now is.
    async fn follow(
        &self,
        pool: Option<InferencePool>,
        current: &mut Option<(PoolView, tokio::task::JoinHandle<()>)>,
    ) {
        let view = pool.map(|p| PoolView {
            selector: p.label_selector(),
            ports: p.ports(),
        });
        // An absent pool is said again at each relist; a pool unchanged is left alone.
        if view.is_some() && current.as_ref().map(|(v, _)| v) == view.as_ref() {
            return;
        }
        if let Some((_, task)) = current.take() {
            task.abort();
        }
        match view {
            Some(view) if !view.selector.is_empty() && !view.ports.is_empty() => {
                tracing::info!(pool = %self.settings.pool, selector = %view.selector, ports = ?view.ports, "discovery: watching the pool's pods");
                let task = tokio::spawn(self.clone().watch_pods(view.clone()));
                *current = Some((view, task));
            }
            _ => {
                tracing::warn!(pool = %self.settings.pool, namespace = %self.namespace, "discovery: no such InferencePool (or it selects nothing): no discovered workers until it exists");
                self.reconcile(BTreeMap::new()).await;
            }
        }
    }

    /// Watches the pods `view` selects; reconciles after each change and after each full
    /// list.
    async fn watch_pods(self, view: PoolView) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let config = watcher::Config::default().labels(&view.selector);
        let events = watcher::watcher(pods, config).default_backoff();
        futures_util::pin_mut!(events);
        let mut known: BTreeMap<String, Pod> = BTreeMap::new();
        let mut listing: Option<BTreeMap<String, Pod>> = None;
        let mut said = std::collections::BTreeSet::new();
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Init) => listing = Some(BTreeMap::new()),
                Ok(Event::InitApply(pod)) => {
                    if let Some(listing) = listing.as_mut() {
                        listing.insert(key(&pod), pod);
                    }
                    continue;
                }
                Ok(Event::InitDone) => known = listing.take().unwrap_or_default(),
                Ok(Event::Apply(pod)) => {
                    known.insert(key(&pod), pod);
                }
                Ok(Event::Delete(pod)) => {
                    known.remove(&key(&pod));
                }
                Err(error) => {
                    tracing::warn!(%error, "discovery: watching the pool's pods failed; retrying with backoff");
                    continue;
                }
            }
            if listing.is_none() {
                let desired = self.desired(&known, &view.ports, &mut said);
                self.reconcile(desired).await;
            }
        }
    }

    /// The workers every known pod serves; a pod that cannot be a worker is said once.
    fn desired(
        &self,
        known: &BTreeMap<String, Pod>,
        ports: &[u16],
        said: &mut std::collections::BTreeSet<String>,
    ) -> BTreeMap<switchyard_plugin_sdk::WorkerId, WorkerSpec> {
        let mut desired = BTreeMap::new();
        for (key, pod) in known {
            match pods::workers(pod, &self.settings, ports) {
                Ok(workers) => desired.extend(workers.into_iter().map(|w| (w.id(), w))),
                Err(skipped) => {
                    if said.insert(key.clone()) {
                        tracing::warn!(%skipped, "discovery: pod left out");
                    }
                }
            }
        }
        said.retain(|key| known.contains_key(key));
        desired
    }
}

/// A pod's identity: its uid (a pod deleted and created again under its name is another).
fn key(pod: &Pod) -> String {
    pod.metadata
        .uid
        .clone()
        .or_else(|| pod.metadata.name.clone())
        .unwrap_or_default()
}
