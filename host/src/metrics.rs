//! Prometheus metrics: selections, errors and fallbacks per instance and component,
//! per-component call counts and latency, per-worker load, KV index size.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use switchyard_plugin_sdk::WorkerId;

use crate::kv_index::Tier;
use crate::load_accounting::WorkerLoad;
use crate::pipeline::Selector;
use crate::registry::PartitionKey;

#[derive(Default)]
struct Counters {
    /// instance -> (selections, seconds)
    selections: BTreeMap<String, (u64, f64)>,
    /// (instance, component) -> errors
    errors: BTreeMap<(String, String), u64>,
    /// instance -> fallbacks to the built-in policy
    fallbacks: BTreeMap<String, u64>,
}

#[derive(Default)]
pub struct Metrics {
    counters: Mutex<Counters>,
}

fn bump<K: Ord + Clone>(map: &mut BTreeMap<K, u64>, key: &K) {
    match map.get_mut(key) {
        Some(n) => *n += 1,
        None => {
            map.insert(key.clone(), 1);
        }
    }
}

/// Escapes a Prometheus label value.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    pub fn record_selection(&self, instance: &str, elapsed: Duration) {
        let mut c = self.counters.lock();
        match c.selections.get_mut(instance) {
            Some((n, s)) => {
                *n += 1;
                *s += elapsed.as_secs_f64();
            }
            None => {
                c.selections
                    .insert(instance.to_owned(), (1, elapsed.as_secs_f64()));
            }
        }
    }

    pub fn record_error(&self, instance: &str, component: &str) {
        bump(
            &mut self.counters.lock().errors,
            &(instance.to_owned(), component.to_owned()),
        );
    }

    pub fn record_fallback(&self, instance: &str) {
        bump(&mut self.counters.lock().fallbacks, &instance.to_owned());
    }

    pub fn fallbacks(&self, instance: &str) -> u64 {
        self.counters
            .lock()
            .fallbacks
            .get(instance)
            .copied()
            .unwrap_or(0)
    }

    pub fn render<'a>(
        &self,
        selectors: impl Iterator<Item = (&'a PartitionKey, &'a str, &'a Arc<Mutex<Selector>>)>,
        loads: &[(WorkerId, WorkerLoad)],
        kv_blocks: [usize; 3],
    ) -> String {
        let mut out = String::new();
        let c = self.counters.lock();
        let _ = writeln!(out, "# HELP switchyard_selections_total Selections run, per instance (fallback runs count for `default`).");
        let _ = writeln!(out, "# TYPE switchyard_selections_total counter");
        for (instance, (n, _)) in &c.selections {
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
        for (instance, (_, s)) in &c.selections {
            let _ = writeln!(
                out,
                "switchyard_selection_seconds_total{{instance=\"{}\"}} {s}",
                label(instance)
            );
        }
        let _ = writeln!(out, "# HELP switchyard_selection_errors_total Failed selections, per instance and component at fault.");
        let _ = writeln!(out, "# TYPE switchyard_selection_errors_total counter");
        for ((instance, component), n) in &c.errors {
            let _ = writeln!(
                out,
                "switchyard_selection_errors_total{{instance=\"{}\",component=\"{}\"}} {n}",
                label(instance),
                label(component)
            );
        }
        let _ = writeln!(out, "# HELP switchyard_fallbacks_total Requests routed by the built-in policy after the instance failed.");
        let _ = writeln!(out, "# TYPE switchyard_fallbacks_total counter");
        for (instance, n) in &c.fallbacks {
            let _ = writeln!(
                out,
                "switchyard_fallbacks_total{{instance=\"{}\"}} {n}",
                label(instance)
            );
        }
        drop(c);
        let _ = writeln!(
            out,
            "# HELP switchyard_component_calls_total Calls per component instance."
        );
        let _ = writeln!(out, "# TYPE switchyard_component_calls_total counter");
        let mut latency = String::new();
        let mut errors = String::new();
        for (partition, instance, selector) in selectors {
            let selector = selector.lock();
            for stage in selector.policy.stages() {
                let labels = format!(
                    "instance=\"{}\",partition=\"{}\",component=\"{}\",kind=\"{}\"",
                    label(instance),
                    label(&partition.to_string()),
                    label(&stage.name),
                    stage.kind.as_str()
                );
                let _ = writeln!(
                    out,
                    "switchyard_component_calls_total{{{labels}}} {}",
                    stage.stats.calls
                );
                let _ = writeln!(
                    latency,
                    "switchyard_component_seconds_total{{{labels}}} {}",
                    stage.stats.nanos as f64 / 1e9
                );
                let _ = writeln!(
                    errors,
                    "switchyard_component_errors_total{{{labels}}} {}",
                    stage.stats.errors
                );
            }
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
        out
    }
}
