//! Rendering `/metrics`: every series, read from the counters into a snapshot that
//! the Prometheus project's client writes as text.

use super::snapshot::Labels;
use super::*;

impl Metrics {
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
        let instances = self.instances.read();
        self.render_selections(&mut snapshot, &instances);
        render_stages(&mut snapshot, stages, &instances);
        render_workers(&mut snapshot, loads, kv_blocks);
        self.render_counters(&mut snapshot);
        self.render_admission(&mut snapshot, waiting_by_priority);
        self.render_replicas(&mut snapshot);
        self.render_latency_and_config(&mut snapshot);
        self.render_kv_sources(&mut snapshot);
        render_plugins(&mut snapshot, plugins);
        render_isolation(&mut snapshot, processes);

        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(snapshot));
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
        out
    }

    /// Selections per policy instance: counts, time, errors, fallbacks, trips.
    fn render_selections(
        &self,
        snapshot: &mut Snapshot,
        instances: &BTreeMap<String, InstanceCounters>,
    ) {
        let instance = |name: &str| vec![("instance".to_owned(), name.to_owned())];
        let per_instance = |value: &dyn Fn(&InstanceCounters) -> Value| -> Vec<Row> {
            instances
                .iter()
                .map(|(name, c)| (instance(name), value(c)))
                .collect()
        };
        let counter = MetricType::Counter;
        let gauge = MetricType::Gauge;
        let histogram = MetricType::Histogram;
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
    }

    /// Counters: expiry, eviction, the frontend's (upstream failures by kind) and the
    /// picker's.
    fn render_counters(&self, snapshot: &mut Snapshot) {
        let counter = MetricType::Counter;
        let no_labels = |value: Value| vec![(Vec::new(), value)];
        for (name, help, counter_value) in [
            ("switchyard_reservations_expired", "Reservations released by expiry because nothing freed them (the last safety net).", &self.expired),
            ("switchyard_kv_blocks_evicted", "Blocks the KV index forgot because a worker's events stored more than its bound (see GET /v1/workers `kv_index`), or the index passed `router.max_kv_index_pairs`.", &self.kv_evicted),
            ("switchyard_upstream_retries", "Frontend requests sent again: selected again after an engine refused the connection, or sent on a fresh connection after one closed before the answer's head.", &self.upstream_retries),
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
        let failures = UpstreamFailure::ALL
            .iter()
            .map(|&kind| {
                let count = self.upstream_failures[kind as usize].load(Ordering::Relaxed);
                (
                    vec![("kind".to_owned(), kind.as_str().to_owned())],
                    Value::Count(count),
                )
            })
            .collect();
        snapshot.family(
            "switchyard_upstream_failures",
            "Failures talking to an engine, retried or not, by kind: refused, connect_timeout, closed (the connection closed before the answer's head: an idle kept-alive connection the engine closed, or an engine gone), timeout, mid_answer, other. Each is also logged once, with the worker and the phase.",
            counter,
            failures,
        );
    }

    /// The admission queue (`admission:`).
    fn render_admission(&self, snapshot: &mut Snapshot, waiting_by_priority: &[(i32, usize)]) {
        let (counter, gauge, histogram) = (
            MetricType::Counter,
            MetricType::Gauge,
            MetricType::Histogram,
        );
        let no_labels = |value: Value| vec![(Vec::new(), value)];
        let queue = &self.admission;
        for (name, help, counter_value) in [
            ("switchyard_admission_queued", "Requests that waited in the admission queue because every worker was busy (admission:).", &queue.queued),
            ("switchyard_admission_admitted", "Queued requests that got a worker.", &queue.admitted),
            ("switchyard_admission_refused_full", "Requests answered 429 because admission.queue.max_queued wait already.", &queue.refused_full),
            ("switchyard_admission_timed_out", "Queued requests answered 503 after admission.queue.max_wait_ms.", &queue.timed_out),
            ("switchyard_admission_evicted", "Queued requests answered 429 because a request of higher priority, or of a tenant holding fewer places (admission.queue.fair_share), took their place in the full queue.", &queue.evicted),
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
    }

    /// The replicas' bus (`replicas:`).
    fn render_replicas(&self, snapshot: &mut Snapshot) {
        let (counter, gauge) = (MetricType::Counter, MetricType::Gauge);
        let no_labels = |value: Value| vec![(Vec::new(), value)];
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
    }

    /// Latency histograms of the frontend, the picker and KV events; the config generation.
    fn render_latency_and_config(&self, snapshot: &mut Snapshot) {
        let (counter, gauge, histogram) = (
            MetricType::Counter,
            MetricType::Gauge,
            MetricType::Histogram,
        );
        let no_labels = |value: Value| vec![(Vec::new(), value)];
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
    }
}

/// Per component instance of every pipeline stage: calls, time, errors, poisoning.
fn render_stages(
    snapshot: &mut Snapshot,
    stages: &[StageMetrics],
    instances: &BTreeMap<String, InstanceCounters>,
) {
    let (counter, gauge, histogram) = (
        MetricType::Counter,
        MetricType::Gauge,
        MetricType::Histogram,
    );
    let instance = |name: &str| vec![("instance".to_owned(), name.to_owned())];
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
}

/// Each worker's booked load and the KV index's size per tier.
fn render_workers(
    snapshot: &mut Snapshot,
    loads: &[(WorkerId, WorkerLoad)],
    kv_blocks: [usize; 3],
) {
    let gauge = MetricType::Gauge;
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
}

/// One series per loaded plugin library.
fn render_plugins(snapshot: &mut Snapshot, plugins: &[LoadedPlugin]) {
    let gauge = MetricType::Gauge;
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
        let labels = kv_source_labels;
        let count = |read: &dyn Fn(&KvSourceCounters) -> u64| -> Vec<Row> {
            sources
                .iter()
                .map(|c| (labels(c), Value::Count(read(c))))
                .collect()
        };
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let families: [(&str, &str, Vec<Row>); 11] = [
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
            (
                "switchyard_kv_event_oversized",
                "Messages over router.kv_events.max_frame_bytes, dropped unread, per publisher.",
                count(&|c| load(&c.oversized)),
            ),
            (
                "switchyard_kv_event_replays_oversized",
                "Replays given up at router.kv_events.max_replay_bytes (the worker's blocks were cleared).",
                count(&|c| load(&c.replays_oversized)),
            ),
        ];
        for (name, help, rows) in families {
            snapshot.family(name, help, MetricType::Counter, rows);
        }
        render_kv_reasons(snapshot, &sources);
    }
}

fn kv_source_labels(c: &KvSourceCounters) -> Labels {
    vec![
        ("worker_id".to_owned(), c.worker_id.to_string()),
        ("endpoint".to_owned(), c.endpoint.clone()),
    ]
}

/// Per publisher: clears and ignored events by reason, and the last batch's lag.
fn render_kv_reasons(snapshot: &mut Snapshot, sources: &[Arc<KvSourceCounters>]) {
    let labels = kv_source_labels;
    let by =
        |key: &str, names: &[&str], values: &dyn Fn(&KvSourceCounters, usize) -> u64| -> Vec<Row> {
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
