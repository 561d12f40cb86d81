//! Dynamo policy crates, built unchanged against `compat/dynamo-kv-router` (only their
//! dependency line differs) and exported by one line of their catalog
//! (`tests/fixtures/dynamo-policies`), load as a plugin, pass `plugin test`, and decide
//! in the real router as their own unit tests say: the same rows, the same picks. Two
//! catalogs: the guide's API revision (`catalog`: the guide's policy and three shaped like
//! Dynamo's examples) and Dynamo's current `plugins::worker_selection` shape
//! (`current-catalog`: batch scorers, the `WorkerType` enum).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;
use support::server::Server;
use support::*;

/// The fixture catalog (a workspace member, built by `cargo build --workspace`).
fn catalog() -> PathBuf {
    rust_plugin("dynamo_policy_catalog")
}

/// One instance of each policy type, with the parameters the unit tests use.
fn config(dir: &Path, default: &str) -> PathBuf {
    write_config(
        dir,
        &format!(
            "plugins:\n  - path: {}\nworker_selection:\n  default: {default}\n  instances:\n\
             \x20   - {{name: guide, type: least-busy, parameters: {{min_device_overlap_blocks: 4}}}}\n\
             \x20   - {{name: balanced, type: least-loaded-pick}}\n\
             \x20   - {{name: stacked, type: stacked-cache-load}}\n\
             \x20   - {{name: weightless, type: stacked-cache-load, parameters: {{uncached_block_weight: 0}}}}\n\
             \x20   - {{name: capped, type: capped-role-split, parameters: {{max_active_requests: 3}}}}\n",
            catalog().display()
        ),
    )
}

#[test]
fn every_policy_type_passes_plugin_test() {
    let catalogs = [
        (
            catalog(),
            &[
                ("least-busy", r#"{"min_device_overlap_blocks": 4}"#),
                ("least-loaded-pick", "{}"),
                ("stacked-cache-load", "{}"),
                ("capped-role-split", r#"{"max_active_requests": 8}"#),
            ][..],
        ),
        (
            rust_plugin("dynamo_current_catalog"),
            &[("batch-stacked", r#"{"max_active_requests": 4}"#)],
        ),
    ];
    for (library, types) in catalogs {
        let mut command = Command::new(switchyard_bin());
        command.args(["plugin", "test"]).arg(&library);
        for (policy, parameters) in types {
            command.args(["--params", &format!("{policy}={parameters}")]);
        }
        let report = run(&mut command);
        for (policy, _) in types {
            assert!(
                report.contains(&format!("ok   policy {policy} ")),
                "{policy}:\n{report}"
            );
        }
        let total = format!("{} type(s), 0 failed", types.len());
        assert!(report.contains(&total), "{report}");
    }
}

/// `switchyard select`'s pick of `instance` over `--worker ID:DEVICE:ACTIVE` rows.
fn select(config: &Path, instance: &str, blocks: u64, workers: &[&str]) -> String {
    let mut command = Command::new(switchyard_bin());
    command.args(["select", "--config"]).arg(config).args([
        "--instance",
        instance,
        "--blocks",
        &blocks.to_string(),
    ]);
    for worker in workers {
        command.args(["--worker", worker]);
    }
    run(&mut command)
}

#[test]
fn the_router_picks_what_the_policies_unit_tests_pick() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "guide");
    // (instance, workers as ID:DEVICE_OVERLAP:ACTIVE, the pick, the unit test saying so)
    let cases = [
        (
            "guide",
            &["1:0:0", "2:4:3", "3:8:1"][..],
            3,
            "picks_the_least_busy_worker_with_enough_overlap",
        ),
        (
            "balanced",
            &["1:0:3", "2:0:1", "3:0:2"],
            2,
            "picks_the_fewest_active_requests",
        ),
        (
            "balanced",
            &["9:0:1", "4:0:1", "7:0:2"],
            4,
            "ties_go_to_the_lowest_worker_whatever_the_row_order",
        ),
        (
            "stacked",
            &["3:4:2", "1:0:0", "2:6:4"],
            2,
            "the_cache_and_the_load_add_up_ties_to_the_lowest_worker",
        ),
        (
            "weightless",
            &["3:4:2", "1:0:0", "2:6:4"],
            1,
            "the_weight_scales_the_cache_term",
        ),
        (
            "capped",
            &["1:0:0", "2:8:2", "3:8:3"],
            1,
            "the_cap_filters_and_decode_ranks_by_load",
        ),
    ];
    for (instance, workers, picked, unit_test) in cases {
        assert_eq!(
            select(&config, instance, 8, workers),
            format!("worker {picked} dp_rank 0\n"),
            "{instance} over {workers:?} (unit test {unit_test})"
        );
    }
}

/// The current-shape catalog: `select` is Dynamo's aggregated pool.
#[test]
fn the_router_picks_what_the_current_shape_unit_tests_pick() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            "plugins:\n  - path: {}\nworker_selection:\n  default: batch\n  instances:\n\
             \x20   - {{name: batch, type: batch-stacked, parameters: {{max_active_requests: 4}}}}\n",
            rust_plugin("dynamo_current_catalog").display()
        ),
    );
    // aggregated_adds_the_load_and_ties_go_to_the_lowest_worker, both row orders
    for workers in [&["1:8:3", "2:5:0", "3:8:4"][..], &["2:5:0", "1:8:3"]] {
        assert_eq!(
            select(&config, "batch", 8, workers),
            "worker 1 dp_rank 0\n",
            "{workers:?}"
        );
    }
}

/// The router builds the policy per worker type and the factory's branch on it shows:
/// prefill ranks by cached blocks, decode by load (`capped-role-split`'s unit tests).
#[test]
fn serve_builds_the_policy_per_worker_type() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path(), "capped"));
    for (worker_id, worker_type) in [(1, "prefill"), (2, "prefill"), (3, "decode"), (4, "decode")] {
        server.ok(
            "/v1/workers",
            json!({"model": "demo", "worker_id": worker_id, "worker_type": worker_type}),
        );
    }
    // Workers 2 (prefill) and 4 (decode) hold the prompt's first four blocks.
    for worker_id in [2, 4] {
        server.ok(
            "/v1/kv_events",
            json!({"worker_id": worker_id, "events": [{"type": "stored", "block_hashes": [11, 12, 13, 14]}]}),
        );
    }
    let pick = |worker_type: &str| {
        let decision = server.ok(
            "/v1/select",
            json!({"model": "demo", "worker_type": worker_type, "block_hashes": [11, 12, 13, 14, 15, 16]}),
        );
        (decision["worker_id"].as_u64(), decision["instance"].clone())
    };
    assert_eq!(
        pick("prefill"),
        (Some(2), json!("capped")),
        "prefill ranks by cache"
    );
    assert_eq!(
        pick("decode"),
        (Some(3), json!("capped")),
        "decode ranks by load, ties to the lowest"
    );
}
