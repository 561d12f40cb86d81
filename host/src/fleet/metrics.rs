//! Prometheus metrics: selections, errors and fallbacks per instance and component,
//! per-component call counts and latency, per-worker load, KV index size.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use switchyard_plugin_sdk::WorkerId;

use super::kv_index::Tier;
use super::load_accounting::WorkerLoad;
use crate::plugin::{ComponentKind, PartitionKey};
use crate::policy::StageStats;

/// One stage of one instance in one partition, with its counters.
pub struct StageMetrics {
    pub instance: String,
    pub partition: PartitionKey,
    pub name: Arc<str>,
    pub kind: ComponentKind,
    pub stats: Arc<StageStats>,
}

/// One instance's counters: bumped on every request, so atomics, not a lock.
#[derive(Default)]
struct InstanceCounters {
    selections: AtomicU64,
    nanos: AtomicU64,
    fallbacks: AtomicU64,
}

pub struct Metrics {
    /// Per configured instance; the map itself is fixed at startup.
    instances: BTreeMap<String, InstanceCounters>,
    /// Reservations released by expiry because nothing freed them.
    expired: AtomicU64,
    /// Frontend: selections repeated after an engine refused the connection.
    upstream_retries: AtomicU64,
    /// Frontend: engine failures answered to clients (connect, timeout, mid-answer).
    upstream_errors: AtomicU64,
    /// (instance, component) -> errors; touched on the failure path only.
    errors: Mutex<BTreeMap<(String, String), u64>>,
}

/// Escapes a Prometheus label value.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    pub fn new<'a>(instances: impl IntoIterator<Item = &'a str>) -> Self {
        Metrics {
            instances: instances
                .into_iter()
                .map(|name| (name.to_owned(), InstanceCounters::default()))
                .collect(),
            errors: Mutex::new(BTreeMap::new()),
            expired: AtomicU64::new(0),
            upstream_retries: AtomicU64::new(0),
            upstream_errors: AtomicU64::new(0),
        }
    }

    pub fn record_expired(&self, n: usize) {
        self.expired.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn record_upstream_retry(&self) {
        self.upstream_retries.fetch_add(1, Ordering::Relaxed);
    }

    pub fn record_upstream_error(&self) {
        self.upstream_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub fn record_selection(&self, instance: &str, elapsed: Duration) {
        if let Some(c) = self.instances.get(instance) {
            c.selections.fetch_add(1, Ordering::Relaxed);
            c.nanos
                .fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
        }
    }

    pub fn record_error(&self, instance: &str, component: &str) {
        *self
            .errors
            .lock()
            .entry((instance.to_owned(), component.to_owned()))
            .or_insert(0) += 1;
    }

    pub fn record_fallback(&self, instance: &str) {
        if let Some(c) = self.instances.get(instance) {
            c.fallbacks.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn fallbacks(&self, instance: &str) -> u64 {
        self.instances
            .get(instance)
            .map_or(0, |c| c.fallbacks.load(Ordering::Relaxed))
    }

    pub fn render(
        &self,
        stages: &[StageMetrics],
        loads: &[(WorkerId, WorkerLoad)],
        kv_blocks: [usize; 3],
    ) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# HELP switchyard_selections_total Selections run, per instance (fallback runs count for `default`).");
        let _ = writeln!(out, "# TYPE switchyard_selections_total counter");
        for (instance, c) in &self.instances {
            let n = c.selections.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "switchyard_selections_total{{instance=\"{}\"}} {n}",
                label(instance)
            );
        }
        let _ = writeln!(
            out,
            "# HELP switchyard_selection_seconds_total Time spent in selections, per instance."
        );
        let _ = writeln!(out, "# TYPE switchyard_selection_seconds_total counter");
        for (instance, c) in &self.instances {
            let s = c.nanos.load(Ordering::Relaxed) as f64 / 1e9;
            let _ = writeln!(
                out,
                "switchyard_selection_seconds_total{{instance=\"{}\"}} {s}",
                label(instance)
            );
        }
        let _ = writeln!(out, "# HELP switchyard_selection_errors_total Failed selections, per instance and component at fault.");
        let _ = writeln!(out, "# TYPE switchyard_selection_errors_total counter");
        for ((instance, component), n) in self.errors.lock().iter() {
            let _ = writeln!(
                out,
                "switchyard_selection_errors_total{{instance=\"{}\",component=\"{}\"}} {n}",
                label(instance),
                label(component)
            );
        }
        let _ = writeln!(out, "# HELP switchyard_fallbacks_total Requests routed by the built-in policy after the instance failed.");
        let _ = writeln!(out, "# TYPE switchyard_fallbacks_total counter");
        for (instance, c) in &self.instances {
            let n = c.fallbacks.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "switchyard_fallbacks_total{{instance=\"{}\"}} {n}",
                label(instance)
            );
        }
        let _ = writeln!(
            out,
            "# HELP switchyard_component_calls_total Calls per component instance."
        );
        let _ = writeln!(out, "# TYPE switchyard_component_calls_total counter");
        let mut latency = String::new();
        let mut errors = String::new();
        for stage in stages {
            let labels = format!(
                "instance=\"{}\",partition=\"{}\",component=\"{}\",kind=\"{}\"",
                label(&stage.instance),
                label(&stage.partition.to_string()),
                label(&stage.name),
                stage.kind.as_str()
            );
            let stats = &stage.stats;
            let _ = writeln!(
                out,
                "switchyard_component_calls_total{{{labels}}} {}",
                stats.calls()
            );
            let _ = writeln!(
                latency,
                "switchyard_component_seconds_total{{{labels}}} {}",
                stats.nanos() as f64 / 1e9
            );
            let _ = writeln!(
                errors,
                "switchyard_component_errors_total{{{labels}}} {}",
                stats.errors()
            );
        }
        let _ = writeln!(
            out,
            "# HELP switchyard_component_seconds_total Time spent in each component instance."
        );
        let _ = writeln!(out, "# TYPE switchyard_component_seconds_total counter");
        out.push_str(&latency);
        let _ = writeln!(
            out,
            "# HELP switchyard_component_errors_total Errors per component instance."
        );
        let _ = writeln!(out, "# TYPE switchyard_component_errors_total counter");
        out.push_str(&errors);
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
            let _ = writeln!(out, "# HELP switchyard_worker_{name} {help}");
            let _ = writeln!(out, "# TYPE switchyard_worker_{name} gauge");
            for (worker, load) in loads {
                let _ = writeln!(
                    out,
                    "switchyard_worker_{name}{{worker_id=\"{}\",dp_rank=\"{}\"}} {}",
                    worker.worker_id,
                    worker.dp_rank,
                    value(load)
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP switchyard_kv_blocks Blocks in the KV index, per tier."
        );
        let _ = writeln!(out, "# TYPE switchyard_kv_blocks gauge");

        for tier in Tier::ALL {
            let _ = writeln!(
                out,
                "switchyard_kv_blocks{{tier=\"{}\"}} {}",
                tier.as_str(),
                kv_blocks[tier as usize]
            );
        }
        for (name, help, counter) in [
            ("reservations_expired_total", "Reservations released by expiry because nothing freed them (the last safety net).", &self.expired),
            ("upstream_retries_total", "Frontend selections repeated after an engine refused the connection.", &self.upstream_retries),
            ("upstream_errors_total", "Frontend requests that ended with an engine failure (connect, timeout, mid-answer).", &self.upstream_errors),
        ] {
            let _ = writeln!(out, "# HELP switchyard_{name} {help}");
            let _ = writeln!(out, "# TYPE switchyard_{name} counter");
            let _ = writeln!(out, "switchyard_{name} {}", counter.load(Ordering::Relaxed));
        }
        out
    }
}
