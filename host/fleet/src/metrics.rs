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

mod snapshot;
use snapshot::{Row, Snapshot, Value};

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

    /// The Prometheus text of every series.
    pub fn render(
        &self,
        stages: &[StageMetrics],
        loads: &[(WorkerId, WorkerLoad)],
        kv_blocks: [usize; 3],
        plugins: &[LoadedPlugin],
        processes: &[ProcessSnapshot],
        waiting_by_priority: &[(i32, usize)],
    ) -> String {
        let mut snapshot = Snapshot::default();
        let counter = MetricType::Counter;
        let gauge = MetricType::Gauge;
        let histogram = MetricType::Histogram;
        let instance = |name: &str| vec![("instance".to_owned(), name.to_owned())];
        let instances = self.instances.read();
        let per_instance = |value: &dyn Fn(&InstanceCounters) -> Value| -> Vec<Row> {
            instances
                .iter()
                .map(|(name, c)| (instance(name), value(c)))
                .collect()
        };
        snapshot.family(
            "switchyard_selections",
            "Selections run, per instance (fallback runs count for `default`).",
            counter,
            per_instance(&|c| Value::Count(c.latency.count())),
        );
        snapshot.family(
            "switchyard_selection_seconds",
            "Time spent in selections, per instance.",
            counter,
            per_instance(&|c| Value::Seconds(c.latency.sum_seconds())),
        );
        snapshot.family(
            "switchyard_selection_duration_seconds",
            "Selection latency, per instance.",
            histogram,
            per_instance(&|c| Value::Histogram(c.latency.snapshot())),
        );
        snapshot.family(
            "switchyard_over_budget_selections",
            "Selections slower than the instance's call_budget_ms.",
            counter,
            per_instance(&|c| Value::Count(c.over_budget.load(Ordering::Relaxed))),
        );
        let tripped: Vec<Row> = instances
            .iter()
            .map(|(name, c)| {
                (
                    instance(name),
                    Value::Gauge(if self.tripped(c) { 1.0 } else { 0.0 }),
                )
            })
            .collect();
        snapshot.family(
            "switchyard_instance_tripped",
            "1 while the instance is tripped to the built-in policy after too many over-budget selections.",
            gauge,
            tripped,
        );
        let errors = self
            .errors
            .lock()
            .iter()
            .map(|((instance, component), n)| {
                (
                    vec![
                        ("instance".to_owned(), instance.clone()),
                        ("component".to_owned(), component.clone()),
                    ],
                    Value::Count(*n),
                )
            })
            .collect();
        snapshot.family(
            "switchyard_selection_errors",
            "Failed selections, per instance and component at fault.",
            counter,
            errors,
        );
        snapshot.family(
            "switchyard_fallbacks",
            "Requests routed by the built-in policy after the instance failed.",
            counter,
            per_instance(&|c| Value::Count(c.fallbacks.load(Ordering::Relaxed))),
        );
        let stage_labels = |s: &StageMetrics| {
            vec![
                ("instance".to_owned(), s.instance.clone()),
                ("partition".to_owned(), s.partition.to_string()),
                ("component".to_owned(), s.name.to_string()),
                ("kind".to_owned(), s.kind.as_str().to_owned()),
            ]
        };
        let per_stage = |value: &dyn Fn(&StageStats) -> Value| -> Vec<Row> {
            stages
                .iter()
                .map(|s| (stage_labels(s), value(&s.stats)))
                .collect()
        };
        snapshot.family(
            "switchyard_component_calls",
            "Calls per component instance.",
            counter,
            per_stage(&|s| Value::Count(s.calls())),
        );
        snapshot.family(
            "switchyard_component_seconds",
            "Time spent in each component instance.",
            counter,
            per_stage(&|s| Value::Seconds(s.latency.sum_seconds())),
        );
        snapshot.family(
            "switchyard_component_errors",
            "Errors per component instance.",
            counter,
            per_stage(&|s| Value::Count(s.errors())),
        );
        snapshot.family(
            "switchyard_component_duration_seconds",
            "Call latency per component instance.",
            histogram,
            per_stage(&|s| Value::Histogram(s.latency.snapshot())),
        );
        let mut poisoned: BTreeMap<&str, u64> = instances.keys().map(|i| (i.as_str(), 0)).collect();
        for stage in stages.iter().filter(|s| s.stats.poisoned()) {
            *poisoned.entry(&stage.instance).or_default() += 1;
        }
        snapshot.family(
            "switchyard_poisoned_components",
            "Component instances that panicked or threw and refuse every call, per instance.",
            gauge,
            poisoned
                .into_iter()
                .map(|(i, n)| (instance(i), Value::Gauge(n as f64)))
                .collect(),
        );
        for (name, help, value) in [
            (
                "active_requests",
                "Requests booked on the worker.",
                (|l: &WorkerLoad| u64::from(l.active_requests)) as fn(&WorkerLoad) -> u64,
            ),
            (
                "active_prefill_tokens",
                "Prefill tokens booked on the worker.",
                |l| l.active_prefill_tokens,
            ),
            (
                "active_decode_blocks",
                "Decode blocks booked on the worker.",
                |l| l.active_decode_blocks,
            ),
        ] {
            let rows = loads
                .iter()
                .map(|(worker, load)| {
                    (
                        vec![
                            ("worker_id".to_owned(), worker.worker_id.to_string()),
                            ("dp_rank".to_owned(), worker.dp_rank.to_string()),
                        ],
                        Value::Gauge(value(load) as f64),
                    )
                })
                .collect();
            snapshot.family(&format!("switchyard_worker_{name}"), help, gauge, rows);
        }
        snapshot.family(
            "switchyard_kv_blocks",
            "Blocks in the KV index, per tier.",
            gauge,
            Tier::ALL
                .iter()
                .map(|t| {
                    (
                        vec![("tier".to_owned(), t.as_str().to_owned())],
                        Value::Gauge(kv_blocks[*t as usize] as f64),
                    )
                })
                .collect(),
        );
        let no_labels = |value: Value| vec![(Vec::new(), value)];
        for (name, help, counter_value) in [
            ("switchyard_reservations_expired", "Reservations released by expiry because nothing freed them (the last safety net).", &self.expired),
            ("switchyard_kv_blocks_evicted", "Blocks the KV index evicted (a worker's oldest) because the worker's events stored more than its budget (`total_kv_blocks`, or `router.max_offloaded_blocks_per_worker` for offload tiers).", &self.kv_evicted),
            ("switchyard_upstream_retries", "Frontend selections repeated after an engine refused the connection.", &self.upstream_retries),
            ("switchyard_engine_scrapes", "Scrapes of engines' own metrics (engine_metrics:), each engine once per interval.", &self.engine_scrapes),
            ("switchyard_engine_scrape_failures", "Engine scrapes that failed (GET /v1/workers shows each worker's engine_error); policies see the last sample as stale.", &self.engine_scrape_failures),
            ("switchyard_upstream_errors", "Frontend requests that ended with an engine failure (connect, timeout, mid-answer).", &self.upstream_errors),
            ("switchyard_frontend_shed", "Frontend requests answered 429 because frontend.max_in_flight requests were being proxied.", &self.shed),
            ("switchyard_ext_proc_picks", "Envoy endpoint picker: endpoints picked.", &self.ext_proc_picks),
            ("switchyard_ext_proc_refusals", "Envoy endpoint picker: requests answered with an immediate (error) response.", &self.ext_proc_refusals),
            ("switchyard_ext_proc_rebooks", "Envoy endpoint picker: bookings moved to the endpoint that actually served (after the gateway's retries).", &self.ext_proc_rebooks),
        ] {
            snapshot.family(name, help, counter, no_labels(Value::Count(counter_value.load(Ordering::Relaxed))));
        }
        let queue = &self.admission;
        for (name, help, counter_value) in [
            ("switchyard_admission_queued", "Requests that waited in the admission queue because every worker was busy (admission:).", &queue.queued),
            ("switchyard_admission_admitted", "Queued requests that got a worker.", &queue.admitted),
            ("switchyard_admission_refused_full", "Requests answered 429 because admission.queue.max_queued wait already.", &queue.refused_full),
            ("switchyard_admission_timed_out", "Queued requests answered 503 after admission.queue.max_wait_ms.", &queue.timed_out),
            ("switchyard_admission_evicted", "Queued requests answered 429 because a request of higher priority took their place in the full queue.", &queue.evicted),
            ("switchyard_admission_rate_limited", "Requests answered 429 because their tenant was over its admission.rate_limits.", &queue.rate_limited),
            ("switchyard_admission_rejected", "Requests an admitter (admission.admitters) rejected; switchyard_component_errors counts those that failed.", &queue.rejected),
            ("switchyard_admission_left", "Queued requests whose client went away (or that failed otherwise) before a worker freed.", &queue.left),
        ] {
            snapshot.family(name, help, counter, no_labels(Value::Count(counter_value.load(Ordering::Relaxed))));
        }
        snapshot.family(
            "switchyard_admission_waiting",
            "Requests waiting in the admission queue now.",
            gauge,
            no_labels(Value::Gauge(queue.waiting.load(Ordering::Relaxed) as f64)),
        );
        snapshot.family(
            "switchyard_admission_waiting_by_priority",
            "Requests waiting in the admission queue now, per priority (series only for priorities with waiters).",
            gauge,
            waiting_by_priority
                .iter()
                .map(|(priority, n)| (vec![("priority".to_owned(), priority.to_string())], Value::Gauge(*n as f64)))
                .collect(),
        );
        snapshot.family(
            "switchyard_admission_wait_seconds",
            "How long queued requests waited, until a worker took them or max_wait_ms ended the wait.",
            histogram,
            no_labels(Value::Histogram(queue.wait.snapshot())),
        );
        let replicas = &self.replicas;
        for (name, help, value) in [
            ("switchyard_replica_bus_up", "1 while this replica is connected to the NATS bus it shares load over (replicas:).", &replicas.bus_up),
            ("switchyard_replica_peers", "Other replicas heard from within replicas.peer_ttl_ms.", &replicas.peers),
            ("switchyard_replica_remote_bookings", "Other replicas' bookings counted in the workers' load.", &replicas.remote_bookings),
        ] {
            snapshot.family(name, help, gauge, no_labels(Value::Gauge(value.load(Ordering::Relaxed) as f64)));
        }
        snapshot.family(
            "switchyard_replica_messages",
            "Booking messages on the replicas' bus, by direction (malformed: received and not decoded; dropped: a full queue, replicas::QUEUE).",
            counter,
            [("sent", &replicas.sent), ("received", &replicas.received), ("malformed", &replicas.malformed), ("dropped", &replicas.dropped)]
                .into_iter()
                .map(|(direction, c)| (vec![("direction".to_owned(), direction.to_owned())], Value::Count(c.load(Ordering::Relaxed))))
                .collect(),
        );
        snapshot.family(
            "switchyard_replica_peers_lost",
            "Replicas that went silent for replicas.peer_ttl_ms; their bookings were dropped.",
            counter,
            no_labels(Value::Count(replicas.peers_lost.load(Ordering::Relaxed))),
        );
        snapshot.family(
            "switchyard_frontend_ttfb_seconds",
            "Frontend: from a request's arrival to the first byte of its answer.",
            histogram,
            no_labels(Value::Histogram(self.ttfb.snapshot())),
        );
        snapshot.family(
            "switchyard_config_generation",
            "The config generation serving: 1 at startup, one more per successful reload.",
            gauge,
            no_labels(Value::Gauge(self.generation.load(Ordering::Relaxed) as f64)),
        );
        snapshot.family(
            "switchyard_config_loaded_timestamp_seconds",
            "When the serving generation was loaded (Unix time).",
            gauge,
            no_labels(Value::Gauge(f64::from_bits(
                self.generation_loaded_at.load(Ordering::Relaxed),
            ))),
        );
        snapshot.family(
            "switchyard_config_reloads",
            "Config reloads, by result (a failed one leaves the serving generation in place).",
            counter,
            [("ok", &self.reloads_ok), ("failed", &self.reloads_failed)]
                .into_iter()
                .map(|(result, c)| {
                    (
                        vec![("result".to_owned(), result.to_owned())],
                        Value::Count(c.load(Ordering::Relaxed)),
                    )
                })
                .collect(),
        );
        snapshot.family(
            "switchyard_ext_proc_decision_seconds",
            "Envoy endpoint picker: from the end of a request body to its pick.",
            histogram,
            no_labels(Value::Histogram(self.ext_proc_decision.snapshot())),
        );
        snapshot.family(
            "switchyard_kv_event_lag_seconds",
            "Now minus the publisher's timestamp, per applied KV event batch that carries one.",
            histogram,
            no_labels(Value::Histogram(self.kv_event_lag.snapshot())),
        );
        self.render_kv_sources(&mut snapshot);
        let plugin_rows = plugins
            .iter()
            .map(|p| {
                (
                    vec![
                        ("name".to_owned(), p.info.name.clone()),
                        ("version".to_owned(), p.info.version.clone()),
                        ("vendor".to_owned(), p.info.vendor.clone()),
                        ("abi_minor".to_owned(), p.info.abi_minor.to_string()),
                        ("sdk_revision".to_owned(), p.info.sdk_revision.clone()),
                        ("sha256".to_owned(), p.sha256.clone()),
                        ("path".to_owned(), p.path.display().to_string()),
                    ],
                    Value::Gauge(1.0),
                )
            })
            .collect();
        snapshot.family(
            "switchyard_plugin_info",
            "One series per loaded plugin library, always 1: its identity in labels.",
            gauge,
            plugin_rows,
        );

        render_isolation(&mut snapshot, processes);

        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(snapshot));
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
        out
    }
}

/// The isolated plugin processes' series (`isolation: process`).
fn render_isolation(snapshot: &mut Snapshot, processes: &[ProcessSnapshot]) {
    let process = |p: &ProcessSnapshot| vec![("process".to_owned(), p.name.clone())];
    let each = |value: &dyn Fn(&ProcessSnapshot) -> Value| -> Vec<Row> {
        processes.iter().map(|p| (process(p), value(p))).collect()
    };
    snapshot.family(
        "switchyard_isolated_process_up",
        "1 while the isolated plugin process runs and serves calls, 0 while it is restarted.",
        MetricType::Gauge,
        each(&|p| Value::Gauge(if p.up { 1.0 } else { 0.0 })),
    );
    snapshot.family(
        "switchyard_isolated_process_restarts",
        "Restarts of the isolated plugin process after it died or was killed.",
        MetricType::Counter,
        each(&|p| Value::Count(p.restarts)),
    );
    let exits = processes
        .iter()
        .flat_map(|p| {
            p.exits.iter().map(move |(cause, n)| {
                let mut labels = process(p);
                labels.push(("cause".to_owned(), cause.clone()));
                (labels, Value::Count(*n))
            })
        })
        .collect();
    snapshot.family(
        "switchyard_isolated_process_exits",
        "Deaths of the isolated plugin process by cause: signal:NAME, exit:CODE, killed:deadline, killed:control timeout.",
        MetricType::Counter,
        exits,
    );
    snapshot.family(
        "switchyard_isolated_calls",
        "Component calls sent to the isolated plugin process.",
        MetricType::Counter,
        each(&|p| Value::Count(p.calls)),
    );
    snapshot.family(
        "switchyard_isolated_deadline_misses",
        "Isolated component calls that missed isolation.call_deadline_ms (answered through on_error).",
        MetricType::Counter,
        each(&|p| Value::Count(p.deadline_misses)),
    );
    snapshot.family(
        "switchyard_isolated_refused_calls",
        "Isolated component calls refused at once: the process was down, restarting, or still busy with a late call.",
        MetricType::Counter,
        each(&|p| Value::Count(p.refused_calls)),
    );
}

impl Metrics {
    fn render_kv_sources(&self, snapshot: &mut Snapshot) {
        let sources = self.kv_sources.lock().clone();
        let labels = |c: &KvSourceCounters| {
            vec![
                ("worker_id".to_owned(), c.worker_id.to_string()),
                ("endpoint".to_owned(), c.endpoint.clone()),
            ]
        };
        let count = |read: &dyn Fn(&KvSourceCounters) -> u64| -> Vec<Row> {
            sources
                .iter()
                .map(|c| (labels(c), Value::Count(read(c))))
                .collect()
        };
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let families: [(&str, &str, Vec<Row>); 9] = [
            (
                "switchyard_kv_event_batches",
                "KV event batches received from engines (live and replayed), per publisher.",
                count(&|c| load(&c.batches)),
            ),
            (
                "switchyard_kv_events_applied",
                "Engine KV events applied to the KV index, per publisher.",
                count(&|c| load(&c.events_applied)),
            ),
            (
                "switchyard_kv_event_decode_errors",
                "KV event batches that could not be decoded, per publisher.",
                count(&|c| load(&c.decode_errors)),
            ),
            (
                "switchyard_kv_event_malformed",
                "KV events skipped inside decodable batches, per publisher.",
                count(&|c| load(&c.malformed_events)),
            ),
            (
                "switchyard_kv_event_gaps",
                "Gaps in a publisher's sequence numbers.",
                count(&|c| load(&c.gaps)),
            ),
            (
                "switchyard_kv_event_replays",
                "Replays received from a publisher's replay socket.",
                count(&|c| load(&c.replays)),
            ),
            (
                "switchyard_kv_event_replays_failed",
                "Gaps that replay could not fill (the worker's blocks were cleared).",
                count(&|c| load(&c.replays_failed)),
            ),
            (
                "switchyard_kv_event_duplicates",
                "Replayed batches skipped because they were already applied.",
                count(&|c| load(&c.duplicates)),
            ),
            (
                "switchyard_kv_event_unknown_worker",
                "Batches naming a worker (id, dp_rank) the router does not know.",
                count(&|c| load(&c.unknown_worker)),
            ),
        ];
        for (name, help, rows) in families {
            snapshot.family(name, help, MetricType::Counter, rows);
        }
        let by = |key: &str,
                  names: &[&str],
                  values: &dyn Fn(&KvSourceCounters, usize) -> u64|
         -> Vec<Row> {
            sources
                .iter()
                .flat_map(|c| {
                    names.iter().enumerate().map(move |(i, name)| {
                        let mut l = labels(c);
                        l.push((key.to_owned(), (*name).to_owned()));
                        (l, Value::Count(values(c, i)))
                    })
                })
                .collect()
        };
        snapshot.family(
            "switchyard_kv_event_clears",
            "A worker's blocks cleared because of its KV events, by reason: restart (sequence back to 0), gap (not replayable), engine (AllBlocksCleared).",
            MetricType::Counter,
            by("reason", &CLEAR_REASONS, &|c, i| c.clears[i].load(Ordering::Relaxed)),
        );
        snapshot.family(
            "switchyard_kv_events_ignored",
            "Engine KV events not applied, by reason.",
            MetricType::Counter,
            by(
                "reason",
                &[
                    "block_size",
                    "unknown_parent",
                    "token_count",
                    "unknown_medium",
                    "other_group",
                ],
                &|c, i| c.ignored[i].load(Ordering::Relaxed),
            ),
        );
        snapshot.family(
            "switchyard_kv_event_lag_last_seconds",
            "Now minus the publisher's timestamp, for its last batch that carried one.",
            MetricType::Gauge,
            sources
                .iter()
                .map(|c| {
                    (
                        labels(c),
                        Value::Gauge(c.last_lag_nanos.load(Ordering::Relaxed) as f64 / 1e9),
                    )
                })
                .collect(),
        );
    }
}
