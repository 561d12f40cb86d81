//! The out-of-process probe: before `check` or `serve` loads a plugin into the router's
//! process, it is loaded in an isolated child process (the machinery of `isolation:
//! process`, docs/isolation.md), registered, every configured instance is built for every
//! worker type, and each runs once on a synthetic fleet, under a time limit. A library whose
//! constructors, registration, build or first call crashes, aborts, exits or hangs is
//! refused with the file, what it was doing and how the child ended, instead of taking the
//! router down.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use switchyard_plugin_sdk::{WorkerId, WorkerType};

use super::{assemble, Images};
use crate::{CandidateRow, CandidatesFrom, Registry, RowExtras, Selector};
use switchyard_config::{ConfigSource, IsolationSettings};
use switchyard_plugin_host::plugin::{
    PartitionKey, PluginImage, PluginSpec, PromptBlocks, RouteRequest,
};

/// How long a probe step may take before it counts as hung.
pub const PROBE_TIME_LIMIT: Duration = Duration::from_secs(20);

/// The probe child's data limit (RLIMIT_DATA), applied before it runs any plugin code.
pub const PROBE_MEMORY_LIMIT_MB: u64 = 4096;

/// A plugin the probe refused: what `check` and `serve` print.
#[derive(Debug, thiserror::Error)]
#[error("{config}: {}: the plugin {cause} in a probe process while {phase}. Loaded into the router, it would have taken the router down: fix the plugin, or set `probe: false` on it to skip this check (not recommended)", path.display())]
pub struct ProbeFailure {
    /// `file:line` of the plugin's entry.
    pub config: String,
    pub path: PathBuf,
    pub phase: String,
    pub cause: String,
}

/// Probes every in-process plugin of `source` that does not say `probe: false`; returns
/// one failure per plugin that crashed, exited or hung in its probe.
/// Each plugin is probed from its image in `images` (by entry), the bytes the router
/// then loads.
pub fn probe_all(source: &ConfigSource, images: &Images) -> Vec<ProbeFailure> {
    let mut failures = Vec::new();
    for (index, entry) in source.config.plugins.iter().enumerate() {
        // An isolated plugin needs no probe: it is loaded in its own process anyway.
        if !entry.probe || entry.isolation.process_group(&entry.path).is_some() {
            continue;
        }
        // A file that is no library (a device, a FIFO, a /proc file) has no image: the
        // in-process startup refuses it with the reason; no child needed.
        let Some(image) = images.get(index).and_then(Option::as_ref) else {
            continue;
        };
        if let Some((cause, phase)) = probe_one(source, index, image) {
            let line = source.line_of("path", &entry.path.to_string_lossy(), 0);
            failures.push(ProbeFailure {
                config: match line {
                    Some(line) => format!("{}:{line}", source.name),
                    None => source.name.clone(),
                },
                path: source.resolve(&entry.path),
                phase: if phase.is_empty() {
                    "starting".into()
                } else {
                    phase
                },
                cause,
            });
        }
    }
    failures
}

/// Loads plugin `index` alone in a probe process and exercises it; `Some((cause, phase))`
/// when the process died or hung. A library the loader refuses, or instances that need
/// other plugins' types, are not the probe's to report: the in-process startup does.
fn probe_one(
    source: &ConfigSource,
    index: usize,
    image: &Arc<PluginImage>,
) -> Option<(String, String)> {
    let mut probe = ConfigSource::parse(
        source.text.clone(),
        source.name.clone(),
        source.base_dir.clone(),
    )
    .ok()?;
    let entry = probe.config.plugins.swap_remove(index);
    let spec = PluginSpec {
        path: probe.resolve(&entry.path),
        sha256: entry.sha256.clone(),
        revision: entry.revision,
    };
    probe.config.plugins.clear();
    probe.config.workers.clear();
    let limit = PROBE_TIME_LIMIT.as_millis() as u64;
    let settings = IsolationSettings {
        call_deadline_ms: limit as f64,
        kill_after_ms: 0,
        control_timeout_ms: limit,
        // One life: what it died of is the answer (no restart while the probe reports).
        restart_backoff_ms: 3_600_000,
        // A library that allocates without end at load is stopped there, not by the
        // kernel's OOM killer after it took the machine's memory.
        memory_limit_mb: Some(PROBE_MEMORY_LIMIT_MB),
        ..IsolationSettings::default()
    };
    let mut registry = Registry::with_builtins();
    let loaded = registry.load_plugin_isolated(&spec, Some(image), "probe", &settings);
    // A probe process that cannot even start says nothing about the plugin.
    let process = registry.processes().next().cloned()?;
    if loaded.is_err() {
        return process.death();
    }
    let Ok(startup) = assemble(probe, registry, Vec::new()) else {
        return process.death();
    };
    let rows: Vec<CandidateRow> = (0..8u64)
        .map(|id| {
            let mut row = CandidateRow::new(WorkerId {
                worker_id: id,
                dp_rank: 0,
            });
            row.cache.device_overlap_blocks = (id * 3 % 16) as u32;
            row.load.active_requests = (id % 4) as u32;
            row.load.decode_cost_blocks = id * 2;
            row
        })
        .collect();
    for instance in &startup.instances {
        for worker_type in WorkerType::ALL {
            if let Ok(policy) = instance.build(&PartitionKey::new("probe", worker_type)) {
                let mut selector = Selector::new(policy);
                let _ = selector.select(
                    &RouteRequest::default(),
                    PromptBlocks::new(16, 16),
                    CandidatesFrom::Rows(&rows, &RowExtras::default()),
                    None,
                );
            }
            if let Some(death) = process.death() {
                return Some(death);
            }
        }
    }
    process.death()
}
