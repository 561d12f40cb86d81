//! Reload: a new config's generation built beside the serving one and swapped in, the
//! workers it adds, changes and removes applied, bookings and KV state kept.

use super::*;

/// What a reload changed.
#[derive(Clone, Debug, Serialize)]
pub struct ReloadOutcome {
    pub generation: u64,
    pub workers_added: usize,
    pub workers_removed: usize,
    pub workers_updated: usize,
    /// Sections that changed but are read only at startup: they take effect at the next
    /// restart.
    pub needs_restart: Vec<String>,
}

/// Why a reload was refused; the serving generation stays.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("{config}: router.block_size changed from {from} to {to}; bookings and the KV index are counted in blocks of the running size, so it changes only with a restart")]
    BlockSizeChanged { config: String, from: u32, to: u32 },
    #[error("{config}: the new config would remove every worker ({removed} of {live}); nothing was changed. If that is what you want, set `router.reload_may_empty_fleet: true` in it")]
    EmptiesFleet {
        config: String,
        removed: usize,
        live: usize,
    },
    /// A new or changed worker's address is outside `router.worker_networks` or is the
    /// router's own.
    #[error("{config}: worker {worker_id}: {reason}")]
    Destination {
        config: String,
        worker_id: u64,
        reason: switchyard_config::WorkerInvalid,
    },
    #[error(transparent)]
    Partition(#[from] crate::generation::PartitionError),
}

/// A value as JSON, to compare config sections.
fn as_json<T: Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or_default()
}

impl Router {
    /// Serves `startup` (a config that went through the whole startup path: probes,
    /// checks, builds) as the next generation. Its policies are built for every partition
    /// first; only then is it swapped in, so a failure leaves the serving generation
    /// untouched. Selections already running finish on the generation they started with.
    /// Workers, bookings and the KV index carry over, except for workers the new config
    /// no longer lists (removed) or lists differently (updated in place, or moved when
    /// their model or type changed).
    pub fn reload(self: &Arc<Self>, startup: Startup) -> Result<ReloadOutcome, Vec<ReloadError>> {
        let result = self.swap_in(startup);
        self.metrics.record_reload(result.is_ok());
        result
    }

    fn swap_in(self: &Arc<Self>, startup: Startup) -> Result<ReloadOutcome, Vec<ReloadError>> {
        let _changing = self.generations.changing.lock();
        let serving = self.generation();
        let (old, new) = (&serving.startup.config(), &startup.config());
        if old.router.block_size != new.router.block_size {
            return Err(vec![ReloadError::BlockSizeChanged {
                config: startup.source.name.clone(),
                from: old.router.block_size,
                to: new.router.block_size,
            }]);
        }
        let needs_restart = needs_restart(old, new);
        let WorkerChanges {
            before,
            removed,
            changed,
            added,
        } = WorkerChanges::between(old, new);
        let live = self.membership.state.read().workers.len();
        if live > 0
            && added.is_empty()
            && removed.len() >= live
            && !new.router.reload_may_empty_fleet
        {
            return Err(vec![ReloadError::EmptiesFleet {
                config: startup.source.name.clone(),
                removed: removed.len(),
                live,
            }]);
        }
        let networks = startup.source.worker_networks();
        let own = self.membership.own_addresses.read().clone();
        let refused: Vec<ReloadError> = added
            .iter()
            .chain(&changed)
            .filter_map(|w| {
                let reason = w.check_destinations(&networks, &own).err()?;
                Some(ReloadError::Destination {
                    config: startup.source.name.clone(),
                    worker_id: w.worker_id,
                    reason,
                })
            })
            .collect();
        if !refused.is_empty() {
            return Err(refused);
        }
        let next = Generation::new(serving.number + 1, startup);
        let mut partitions: Vec<PartitionKey> = serving.partitions();
        partitions.extend(added.iter().chain(&changed).map(WorkerSpec::partition));
        partitions.sort();
        partitions.dedup();
        for partition in &partitions {
            next.build_partition(partition)
                .map_err(|e| vec![ReloadError::from(e)])?;
        }
        let instances: Vec<String> = next
            .startup
            .instances
            .iter()
            .map(|i| i.name.clone())
            .collect();
        let (number, loaded_at) = (next.number, next.loaded_at);
        // The old generation's plugin state is dropped on the retirement thread once the
        // selections still running on it end, not by whichever of them ends last.
        let retired = std::mem::replace(&mut *self.generations.serving.write(), Arc::new(next));
        self.retirement.retire(Box::new(retired));
        self.metrics
            .add_instances(instances.iter().map(String::as_str));
        self.metrics.record_generation(number, loaded_at);

        self.apply_worker_changes(&before, &removed, &changed, &added);
        Ok(ReloadOutcome {
            generation: number,
            workers_added: added.len(),
            workers_removed: removed.len(),
            workers_updated: changed.len(),
            needs_restart,
        })
    }
    /// Removes, updates and adds workers after the swap; new and changed workers' KV
    /// events are followed.
    fn apply_worker_changes(
        self: &Arc<Self>,
        before: &HashMap<WorkerId, &WorkerSpec>,
        removed: &[WorkerId],
        changed: &[WorkerSpec],
        added: &[WorkerSpec],
    ) {
        for id in removed {
            let _ = self.remove_worker_changing(*id);
        }
        for spec in changed {
            let id = spec.id();
            let same_partition = before[&id].partition() == spec.partition();
            if same_partition {
                // Bookings and cached blocks stay; the spec (capacity, labels, url, ...) is
                // the new one.
                self.change_workers(|workers| {
                    let _ = workers.remove(id);
                    let _ = workers.add(spec.clone());
                });
            } else {
                let _ = self.remove_worker_changing(id);
                let _ = self.change_workers(|workers| workers.add(spec.clone()));
            }
            if before[&id].kv_events != spec.kv_events {
                self.kv.subscriptions.lock().remove(&id);
            }
        }
        for spec in added {
            if let Err(e) = self.change_workers(|workers| workers.add(spec.clone())) {
                tracing::warn!(error = %e, "reload: a new worker was not added");
            }
        }
        let subscribe: Vec<WorkerSpec> = added.iter().chain(changed).cloned().collect();
        if let Err(e) = self.subscribe_kv_events(&subscribe) {
            tracing::warn!(error = %e, "reload: cannot follow a worker's KV events");
        }
    }
}

/// Sections that changed but are read only at startup.
fn needs_restart(old: &switchyard_config::Config, new: &switchyard_config::Config) -> Vec<String> {
    let tokenizers = |c: &switchyard_config::Config| -> Vec<(String, Option<std::path::PathBuf>)> {
        c.models
            .iter()
            .map(|(model, settings)| (model.clone(), settings.tokenizer.clone()))
            .collect()
    };
    let mut needs_restart = Vec::new();
    if as_json(&old.frontend) != as_json(&new.frontend) {
        needs_restart.push("frontend".to_owned());
    }
    let without_tls = |c: &switchyard_config::Config| {
        c.ext_proc.clone().map(|mut e| {
            e.tls = None;
            as_json(&e)
        })
    };
    if without_tls(old) != without_tls(new) {
        needs_restart.push("ext_proc".to_owned());
    }
    if as_json(&old.replicas) != as_json(&new.replicas) {
        needs_restart.push("replicas".to_owned());
    }
    if old.http.without_tls() != new.http.without_tls() {
        needs_restart.push("http (all but http.tls)".to_owned());
    }
    if tokenizers(old) != tokenizers(new) {
        needs_restart.push("models.*.tokenizer".to_owned());
    }
    // The pool's watch starts with the process (switchyard_discovery::start).
    if old.discovery != new.discovery {
        needs_restart.push("discovery".to_owned());
    }
    needs_restart
}

/// How the workers of two configs differ.
struct WorkerChanges<'a> {
    before: HashMap<WorkerId, &'a WorkerSpec>,
    removed: Vec<WorkerId>,
    changed: Vec<WorkerSpec>,
    added: Vec<WorkerSpec>,
}

impl<'a> WorkerChanges<'a> {
    fn between(old: &'a switchyard_config::Config, new: &switchyard_config::Config) -> Self {
        let before: HashMap<WorkerId, &WorkerSpec> =
            old.workers.iter().map(|w| (w.id(), w)).collect();
        let after: HashMap<WorkerId, &WorkerSpec> =
            new.workers.iter().map(|w| (w.id(), w)).collect();
        let removed: Vec<WorkerId> = before
            .keys()
            .filter(|id| !after.contains_key(id))
            .copied()
            .collect();
        let changed: Vec<WorkerSpec> = new
            .workers
            .iter()
            .filter(|w| {
                before
                    .get(&w.id())
                    .is_some_and(|old| as_json(*old) != as_json(*w))
            })
            .cloned()
            .collect();
        let added: Vec<WorkerSpec> = new
            .workers
            .iter()
            .filter(|w| !before.contains_key(&w.id()))
            .cloned()
            .collect();

        Self {
            before,
            removed,
            changed,
            added,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::needs_restart;

    fn config(yaml: &str) -> switchyard_config::Config {
        let source =
            switchyard_config::ConfigSource::parse(yaml.into(), "<test>".into(), ".".into());
        source.unwrap().config
    }

    /// A section read only at startup that a reload changes is named, so the reload's
    /// warning says to restart (a changed `discovery:` was ignored without a word).
    #[test]
    fn sections_read_at_startup_are_named_when_a_reload_changes_them() {
        let pool = |name: &str| {
            config(&format!(
                "discovery:\n  kubernetes: {{pool: {name}, namespace: inference}}\n"
            ))
        };
        assert!(needs_restart(&pool("a"), &pool("a")).is_empty());
        assert_eq!(needs_restart(&pool("a"), &pool("b")), ["discovery"]);
        assert_eq!(needs_restart(&config("{}"), &pool("a")), ["discovery"]);
        let frontend = config("frontend: {max_in_flight: 7}\n");
        assert_eq!(needs_restart(&config("{}"), &frontend), ["frontend"]);
    }
}
