//! A generation: one loaded config's plugins and policy instances, and their policies per
//! partition. The router serves from its current generation; a reload builds the next one
//! beside it and swaps it in, while a selection keeps the generation it started with until
//! it ends. Workers, bookings and the KV index are the router's, not a generation's: they
//! outlive reloads.

use rustc_hash::FxHashMap;
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::{Mutex, RwLock};
use switchyard_plugin_sdk::WorkerInputs;

use super::metrics::StageMetrics;
use super::retire::Retiring;
use switchyard_plugin_host::plugin::PartitionKey;
use switchyard_policy::startup::Startup;
use switchyard_policy::{Admitters, InstanceFactory, Selector};

/// The instance label of the admitters' stage metrics.
pub const ADMISSION: &str = "admission";

/// One instance's policy for one partition, behind its own lock (an instance is called
/// by one thread at a time), with the input groups it reads known without that lock.
pub struct SelectorSlot {
    pub inputs: WorkerInputs,
    pub selector: Mutex<Selector>,
}

/// Per-partition policies: one selector per instance. (Its keys, and the partitions',
/// come from the config and the fleet, and every request looks one up: the fast hash
/// `kept_columns` uses for the same keys, not SipHash.)
type Selectors = FxHashMap<String, Arc<SelectorSlot>>;

/// Fields drop in declaration order: a partition's policies and admitters (`on_destroy`)
/// before the instance factories of `startup` that built them (`on_destroy_factory`), and
/// before the isolated processes they call.
pub struct Generation {
    /// 1 at startup, then one more per successful reload.
    pub number: u64,
    pub loaded_at: SystemTime,
    partitions: RwLock<FxHashMap<PartitionKey, Selectors>>,
    /// Per partition, its `admission.admitters` (absent when the config lists none).
    admitters: RwLock<FxHashMap<PartitionKey, Arc<Mutex<Admitters>>>>,
    /// Every stage of every selector, for metrics to read without their locks.
    stages: RwLock<Vec<StageMetrics>>,
    pub startup: Startup,
}

/// A partition's policies or admitters that could not be built: plugin code refused.
#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    #[error("instance `{instance}` cannot be built for partition {partition}: {error}")]
    Instance {
        instance: String,
        partition: PartitionKey,
        error: switchyard_policy::BuildError,
    },
    #[error(
        "the admitters (admission.admitters) cannot be built for partition {partition}: {error}"
    )]
    Admitters {
        partition: PartitionKey,
        error: switchyard_policy::BuildError,
    },
}

impl Generation {
    pub fn new(number: u64, startup: Startup) -> Self {
        Generation {
            number,
            loaded_at: SystemTime::now(),
            startup,
            partitions: RwLock::new(FxHashMap::default()),
            admitters: RwLock::new(FxHashMap::default()),
            stages: RwLock::new(Vec::new()),
        }
    }

    /// The config this generation was loaded from: every setting is read here.
    pub fn config(&self) -> &switchyard_config::Config {
        self.startup.config()
    }

    pub fn instance(&self, name: &str) -> Option<&Arc<InstanceFactory>> {
        self.startup.instance(name)
    }

    /// The configured instance names, in the config's order (for messages).
    pub fn instance_names(&self) -> Vec<String> {
        self.startup
            .instances
            .iter()
            .map(|i| i.name.clone())
            .collect()
    }

    pub fn has_partition(&self, partition: &PartitionKey) -> bool {
        self.partitions.read().contains_key(partition)
    }

    /// Instance `name`'s policy for `partition`, once the partition is built.
    pub fn selector(&self, partition: &PartitionKey, name: &str) -> Option<Arc<SelectorSlot>> {
        self.partitions.read().get(partition)?.get(name).cloned()
    }

    /// `partition`'s admitters, when the config lists any and the partition is built.
    pub fn admitters(&self, partition: &PartitionKey) -> Option<Arc<Mutex<Admitters>>> {
        self.admitters.read().get(partition).cloned()
    }

    /// Builds one policy per instance for `partition` (plugin code runs: no lock is held)
    /// and adds them.
    pub fn build_partition(&self, partition: &PartitionKey) -> Result<(), PartitionError> {
        let mut selectors = Selectors::default();
        let mut stages = Vec::new();
        for instance in &self.startup.instances {
            if !instance.serves(partition.worker_type) {
                continue;
            }
            let policy = instance
                .build(partition)
                .map_err(|error| PartitionError::Instance {
                    instance: instance.name.clone(),
                    partition: partition.clone(),
                    error,
                })?;
            stages.extend(policy.stages().map(|stage| StageMetrics {
                instance: instance.name.clone(),
                partition: partition.clone(),
                name: stage.name.clone(),
                kind: stage.kind,
                stats: stage.stats.clone(),
            }));
            selectors.insert(
                instance.name.clone(),
                Arc::new(SelectorSlot {
                    inputs: policy.inputs(),
                    selector: Mutex::new(Selector::new(policy)),
                }),
            );
        }
        if !self.startup.admitters.is_empty() {
            let admitters =
                Admitters::build(&self.startup.admitters, partition).map_err(|error| {
                    PartitionError::Admitters {
                        partition: partition.clone(),
                        error,
                    }
                })?;
            stages.extend(admitters.stages().map(|stage| StageMetrics {
                instance: ADMISSION.to_owned(),
                partition: partition.clone(),
                name: stage.name.clone(),
                kind: stage.kind,
                stats: stage.stats.clone(),
            }));
            self.admitters
                .write()
                .insert(partition.clone(), Arc::new(Mutex::new(admitters)));
        }
        self.partitions.write().insert(partition.clone(), selectors);
        self.stages.write().extend(stages);
        Ok(())
    }

    /// Removes `partition`'s policies and their metric series (its last worker left, or
    /// the worker it was built for was refused). The policies and admitters are returned,
    /// not dropped: dropping them runs plugin code (`on_destroy`), which the caller hands
    /// to the retirement thread.
    #[must_use = "retire the partition's policies (Retirement::retire); never drop them here"]
    pub fn drop_partition(&self, partition: &PartitionKey) -> Vec<Box<dyn Retiring>> {
        let mut retired: Vec<Box<dyn Retiring>> = Vec::new();
        if let Some(selectors) = self.partitions.write().remove(partition) {
            retired.extend(
                selectors
                    .into_values()
                    .map(|slot| Box::new(slot) as Box<dyn Retiring>),
            );
        }
        if let Some(admitters) = self.admitters.write().remove(partition) {
            retired.push(Box::new(admitters));
        }
        self.stages
            .write()
            .retain(|stage| &stage.partition != partition);
        retired
    }

    pub fn partitions(&self) -> Vec<PartitionKey> {
        self.partitions.read().keys().cloned().collect()
    }

    pub fn stages(&self) -> parking_lot::RwLockReadGuard<'_, Vec<StageMetrics>> {
        self.stages.read()
    }
}
