//! The policy layer on its own, through its public API: a config started (built-in
//! components only, no plugin and no server), an instance built for a partition, and
//! selections over candidate rows; a startup error names the config line.

use std::path::PathBuf;

use switchyard_config::ConfigSource;
use switchyard_plugin_host::plugin::{PartitionKey, PromptBlocks, RouteRequest};
use switchyard_plugin_sdk::{WorkerId, WorkerType};
use switchyard_policy::startup::{start, Startup};
use switchyard_policy::{CandidateRow, CandidatesFrom, RowExtras, Selector};

const INSTANCES: &str = "worker_selection:
  instances:
    - {name: least-busy, type: builtin.least-busy}
    - name: kv-overlap
      scorers: [{type: builtin.kv-overlap}]
      picker: {type: builtin.lowest-cost, parameters: {seed: 1}}
";

/// Starts `yaml` as the file `config.yaml`; the errors as the operator reads them.
fn started(yaml: &str) -> Result<Startup, Vec<String>> {
    let source = ConfigSource::parse(yaml.to_owned(), "config.yaml".to_owned(), PathBuf::new())
        .map_err(|e| vec![e.to_string()])?;
    start(source).map_err(|errors| errors.iter().map(ToString::to_string).collect())
}

/// A worker: id, blocks of the prompt it caches, requests it runs.
fn row(id: u64, cached: u32, active: u32) -> CandidateRow {
    let mut row = CandidateRow::new(WorkerId {
        worker_id: id,
        dp_rank: 0,
    });
    row.cache.device_overlap_blocks = cached;
    row.load.active_requests = active;
    row.load.decode_cost_blocks = u64::from(active) * 4;
    row
}

/// The worker `instance` picks for a prompt of 8 blocks over `rows`.
fn pick(startup: &Startup, instance: &str, rows: &[CandidateRow]) -> u64 {
    let component = startup
        .instance(instance)
        .unwrap_or_else(|| panic!("no instance {instance}"))
        .build(&PartitionKey::new("m", WorkerType::Select))
        .expect("builds");
    Selector::new(component)
        .select(
            &RouteRequest::default(),
            PromptBlocks::new(16, 8),
            CandidatesFrom::Rows(rows, &RowExtras::default()),
            None,
        )
        .expect("selects")
        .worker_id
}

#[test]
fn built_in_instances_select_by_load_and_by_cache() {
    let startup = started(INSTANCES).unwrap_or_else(|e| panic!("{e:#?}"));
    let rows = [row(1, 0, 3), row(2, 8, 2), row(3, 0, 0)];
    assert_eq!(pick(&startup, "least-busy", &rows), 3, "the idle worker");
    assert_eq!(
        pick(&startup, "kv-overlap", &rows),
        2,
        "the worker with the prefix"
    );
}

#[test]
fn an_unknown_component_type_is_refused_naming_its_line() {
    let yaml = INSTANCES.replace("builtin.kv-overlap", "builtin.kv-overlapp");
    let errors = started(&yaml).err().expect("an unknown type is refused");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(errors[0].starts_with("config.yaml:5"), "{errors:#?}");
    assert!(errors[0].contains("builtin.kv-overlapp"), "{errors:#?}");
}
