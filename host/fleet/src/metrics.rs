//! Prometheus metrics: selections, errors and fallbacks per instance and component,
//! per-component calls and latency histograms, per-worker load, KV index size, plugin
//! identity, the frontend's time to first byte. Recording is lock-free atomics on the
//! request path; a scrape reads them into the Prometheus project's client
//! (`prometheus-client`), which writes the text format (escaping included).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use switchyard_plugin_sdk::WorkerId;

use super::kv_events::{KvSourceCounters, CLEAR_REASONS};
use super::kv_index::Tier;
use super::load_accounting::WorkerLoad;
use switchyard_plugin_host::isolation::ProcessSnapshot;
use switchyard_plugin_host::plugin::{ComponentKind, LoadedPlugin, PartitionKey};
use switchyard_policy::histogram::{HistogramSnapshot, LatencyHistogram};
use switchyard_policy::{CallBudget, StageStats};

/// The content type of what [`Metrics::render`] writes.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

mod render;
mod snapshot;
use snapshot::{Row, Snapshot, Value};

/// What went wrong talking to an engine: the `kind` label of
/// `switchyard_upstream_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamFailure {
    /// The connection was refused (or failed otherwise) before anything was sent.
    Refused,
    /// Connecting took longer than `frontend.connect_timeout_ms`.
    ConnectTimeout,
    /// The connection closed before the answer's head: a kept-alive connection the
    /// engine had just closed as idle, or an engine that went away.
    Closed,
    /// No answer within `frontend.request_timeout_secs`.
    Timeout,
    /// The answer broke off after its head (the engine died or reset mid-answer).
    MidAnswer,
    /// Anything else the HTTP client reports (TLS, a malformed answer).
    Other,
}

impl UpstreamFailure {
    pub const ALL: [UpstreamFailure; 6] = [
        UpstreamFailure::Refused,
        UpstreamFailure::ConnectTimeout,
        UpstreamFailure::Closed,
        UpstreamFailure::Timeout,
        UpstreamFailure::MidAnswer,
        UpstreamFailure::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamFailure::Refused => "refused",
            UpstreamFailure::ConnectTimeout => "connect_timeout",
            UpstreamFailure::Closed => "closed",
            UpstreamFailure::Timeout => "timeout",
            UpstreamFailure::MidAnswer => "mid_answer",
            UpstreamFailure::Other => "other",
        }
    }
}

/// One stage of one instance in one partition, with its counters.
pub struct StageMetrics {
    pub instance: String,
    pub partition: PartitionKey,
    pub name: Arc<str>,
    pub kind: ComponentKind,
    pub stats: Arc<StageStats>,
}

/// One instance's counters: bumped on every request from any thread, so atomics.
#[derive(Default)]
struct InstanceCounters {
    /// Selection latency; its count is the number of selections.
    latency: LatencyHistogram,
    fallbacks: AtomicU64,
    /// Selections over the instance's `call_budget_ms`.
    over_budget: AtomicU64,
    /// Over-budget selections in a row (reset by one within budget).
    over_budget_in_a_row: AtomicU64,
    /// Nanoseconds since `Metrics::epoch` until which the instance is tripped; 0: never.
    tripped_until: AtomicU64,
}

pub struct Metrics {
    /// Per KV-event publisher, in subscription order.
    kv_sources: Mutex<Vec<Arc<KvSourceCounters>>>,
    /// Per configured instance; the map itself is fixed at startup.
    /// Instances of every generation loaded (a reload adds the new ones; counters of a
    /// name carry over).
    instances: RwLock<BTreeMap<String, InstanceCounters>>,
    /// The zero of `tripped_until`.
    epoch: std::time::Instant,
    /// Reservations released by expiry because nothing freed them.
    expired: AtomicU64,
    kv_evicted: AtomicU64,
    /// Frontend: selections repeated after an engine refused the connection.
    upstream_retries: AtomicU64,
    engine_scrapes: AtomicU64,
    engine_scrape_failures: AtomicU64,
    /// Frontend: engine failures answered to clients (connect, timeout, mid-answer).
    upstream_errors: AtomicU64,
    /// Frontend: every failure talking to an engine, retried or not, by
    /// [`UpstreamFailure`].
    upstream_failures: [AtomicU64; UpstreamFailure::ALL.len()],
    /// Frontend: requests answered 429 because `max_in_flight` were being proxied.
    shed: AtomicU64,
    /// Frontend: from a request's arrival to the first byte of its answer.
    ttfb: LatencyHistogram,
    /// The config generation serving, and when it was loaded (Unix seconds, f64 bits).
    generation: AtomicU64,
    generation_loaded_at: AtomicU64,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
    /// Envoy endpoint picker: endpoints picked.
    ext_proc_picks: AtomicU64,
    /// Envoy endpoint picker: requests answered with an immediate response (an error).
    ext_proc_refusals: AtomicU64,
    /// Envoy endpoint picker: bookings moved to the endpoint that actually served.
    ext_proc_rebooks: AtomicU64,
    /// Envoy endpoint picker: from the end of the request body to the pick sent.
    ext_proc_decision: LatencyHistogram,
    /// Now minus the publisher's timestamp of applied KV event batches that carry one.
    kv_event_lag: LatencyHistogram,
    /// (instance, component) -> errors; touched on the failure path only.
    errors: Mutex<BTreeMap<(String, String), u64>>,
    /// Sharing load with other replicas (`replicas:`).
    pub replicas: ReplicaCounters,
    /// The admission queue's counts (`admission:`), shared with the queue.
    pub admission: std::sync::Arc<crate::admission::QueueCounters>,
}

/// What the bus between replicas did (all zero when `replicas:` is not configured).
#[derive(Debug, Default)]
pub struct ReplicaCounters {
    /// 1 while connected to the bus.
    pub bus_up: AtomicU64,
    /// Replicas heard from within `replicas.peer_ttl_ms`.
    pub peers: AtomicU64,
    pub sent: AtomicU64,
    pub received: AtomicU64,
    /// Messages that did not decode.
    pub malformed: AtomicU64,
    /// Changes dropped because a queue was full (`replicas::QUEUE`).
    pub dropped: AtomicU64,
    /// Replicas that went silent (their bookings dropped).
    pub peers_lost: AtomicU64,
    /// Other replicas' bookings counted now.
    pub remote_bookings: AtomicU64,
}

impl Metrics {
    pub fn new<'a>(instances: impl IntoIterator<Item = &'a str>) -> Self {
        Metrics {
            instances: RwLock::new(
                instances
                    .into_iter()
                    .map(|name| (name.to_owned(), InstanceCounters::default()))
                    .collect(),
            ),
            errors: Mutex::new(BTreeMap::new()),
            kv_sources: Mutex::new(Vec::new()),
            epoch: std::time::Instant::now(),
            expired: AtomicU64::new(0),
            kv_evicted: AtomicU64::new(0),
            upstream_retries: AtomicU64::new(0),
            engine_scrapes: AtomicU64::new(0),
            engine_scrape_failures: AtomicU64::new(0),
            upstream_errors: AtomicU64::new(0),
            upstream_failures: Default::default(),
            shed: AtomicU64::new(0),
            ttfb: LatencyHistogram::default(),
            generation: AtomicU64::new(0),
            generation_loaded_at: AtomicU64::new(0),
            reloads_ok: AtomicU64::new(0),
            reloads_failed: AtomicU64::new(0),
            ext_proc_picks: AtomicU64::new(0),
            ext_proc_refusals: AtomicU64::new(0),
            ext_proc_rebooks: AtomicU64::new(0),
            ext_proc_decision: LatencyHistogram::default(),
            kv_event_lag: LatencyHistogram::default(),
            replicas: ReplicaCounters::default(),
            admission: Default::default(),
        }
    }

    /// The counters of the publisher at `endpoint` for `worker_id` (kept across
    /// resubscriptions).
    pub fn kv_source(&self, endpoint: &str, worker_id: u64) -> Arc<KvSourceCounters> {
        let mut sources = self.kv_sources.lock();
        if let Some(c) = sources
            .iter()
            .find(|c| c.endpoint == endpoint && c.worker_id == worker_id)
        {
            return c.clone();
        }
        let counters = Arc::new(KvSourceCounters {
            worker_id,
            endpoint: endpoint.to_owned(),
            ..Default::default()
        });
        sources.push(counters.clone());
        counters
    }

    pub fn record_kv_evicted(&self, n: u64) {
        self.kv_evicted.fetch_add(n, Ordering::Relaxed);
    }

    pub fn record_expired(&self, n: usize) {
        self.expired.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// One engine's metrics were scraped (`engine_metrics:`), successfully or not.
    pub fn record_engine_scrape(&self, ok: bool) {
        self.engine_scrapes.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.engine_scrape_failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn record_upstream_retry(&self) {
        self.upstream_retries.fetch_add(1, Ordering::Relaxed);
    }

    /// The generation now serving.
    pub fn record_generation(&self, number: u64, loaded_at: std::time::SystemTime) {
        let at = loaded_at
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        self.generation_loaded_at
            .store(at.to_bits(), Ordering::Relaxed);
        self.generation.store(number, Ordering::Relaxed);
    }

    pub fn record_reload(&self, ok: bool) {
        let counter = if ok {
            &self.reloads_ok
        } else {
            &self.reloads_failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn record_ext_proc_pick(&self, decision: Duration) {
        self.ext_proc_picks.fetch_add(1, Ordering::Relaxed);
        self.ext_proc_decision.record(decision.as_nanos() as u64);
    }

    pub fn record_ext_proc_refusal(&self) {
        self.ext_proc_refusals.fetch_add(1, Ordering::Relaxed);
    }

    pub fn record_ext_proc_rebook(&self) {
        self.ext_proc_rebooks.fetch_add(1, Ordering::Relaxed);
    }

    pub fn record_shed(&self) {
        self.shed.fetch_add(1, Ordering::Relaxed);
    }

    pub fn record_upstream_error(&self) {
        self.upstream_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// One failure talking to an engine (`switchyard_upstream_failures_total{kind}`),
    /// whether the request was then retried or answered with an error.
    pub fn record_upstream_failure(&self, kind: UpstreamFailure) {
        self.upstream_failures[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Adds counters for instances not seen before (a reload's new instances).
    pub fn add_instances<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        let mut instances = self.instances.write();
        for name in names {
            instances.entry(name.to_owned()).or_default();
        }
    }

    pub fn record_selection(&self, instance: &str, elapsed: Duration) {
        if let Some(c) = self.instances.read().get(instance) {
            c.latency.record(elapsed.as_nanos() as u64);
        }
    }

    /// Counts a selection of `instance` against its budget; returns true when this one
    /// trips the instance (its `trip_after`-th over-budget selection in a row).
    pub fn record_budget(&self, instance: &str, elapsed: Duration, budget: &CallBudget) -> bool {
        let instances = self.instances.read();
        let Some(c) = instances.get(instance) else {
            return false;
        };
        if elapsed <= budget.limit {
            c.over_budget_in_a_row.store(0, Ordering::Relaxed);
            return false;
        }
        c.over_budget.fetch_add(1, Ordering::Relaxed);
        let in_a_row = c.over_budget_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        if in_a_row < u64::from(budget.trip_after) {
            return false;
        }
        c.over_budget_in_a_row.store(0, Ordering::Relaxed);
        let until = self.epoch.elapsed() + budget.cooldown;
        c.tripped_until
            .store(until.as_nanos() as u64, Ordering::Relaxed);
        true
    }

    /// Whether `instance` is tripped (its cool-down not over).
    pub fn is_tripped(&self, instance: &str) -> bool {
        self.instances
            .read()
            .get(instance)
            .is_some_and(|c| self.tripped(c))
    }

    fn tripped(&self, c: &InstanceCounters) -> bool {
        let until = c.tripped_until.load(Ordering::Relaxed);
        until > 0 && (self.epoch.elapsed().as_nanos() as u64) < until
    }

    pub fn record_ttfb(&self, elapsed: Duration) {
        self.ttfb.record(elapsed.as_nanos() as u64);
    }

    pub fn record_kv_event_lag(&self, lag: Duration) {
        self.kv_event_lag.record(lag.as_nanos() as u64);
    }

    pub fn record_error(&self, instance: &str, component: &str) {
        *self
            .errors
            .lock()
            .entry((instance.to_owned(), component.to_owned()))
            .or_insert(0) += 1;
    }

    pub fn record_fallback(&self, instance: &str) {
        if let Some(c) = self.instances.read().get(instance) {
            c.fallbacks.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn fallbacks(&self, instance: &str) -> u64 {
        self.instances
            .read()
            .get(instance)
            .map_or(0, |c| c.fallbacks.load(Ordering::Relaxed))
    }
}
