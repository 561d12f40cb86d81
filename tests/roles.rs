//! Roles (issue 51, item 2): an instance serves the worker types its `worker_types`
//! lists and is built only for those; each role's requests get their own default
//! instance (`worker_selection.aggregated` / `prefill` / `decode`, Dynamo's keys), which
//! Dynamo's environment variables override; a request for a role its instance does not
//! serve is refused with 503, naming both; `DYN_ROUTER_*` variables switchyard does not
//! read are named, never ignored in silence.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use support::{compile_c, post_json, repo, switchyard_bin, write_config};

/// The C scorer that refuses aggregated partitions, built into `dir`.
fn role_plugin(dir: &Path) -> PathBuf {
    compile_c(
        dir,
        "role_fixture",
        &repo().join("tests/fixtures/role_plugin.c"),
        &repo().join("include"),
        &[],
    )
}

/// A fleet of two prefill, two decode and one aggregated worker, the disaggregated-only
/// instance `disagg` (its `worker_types` line given), `least` for aggregated requests.
fn config(dir: &Path, worker_types: &str, selection: &str) -> PathBuf {
    let plugin = role_plugin(dir);
    write_config(
        dir,
        &format!(
            "plugins:\n  - path: {}\n\
             worker_selection:\n{selection}\
             \x20 instances:\n\
             \x20   - name: disagg\n{worker_types}\
             \x20     scorers: [{{type: fixture.disaggregated-only}}]\n\
             \x20     picker: {{type: fixture.lowest-cost-then-idle}}\n\
             \x20   - name: least\n\
             \x20     scorers: [{{type: builtin.active-requests}}]\n\
             \x20     picker: {{type: builtin.lowest-cost}}\n\
             workers:\n\
             \x20 - {{model: m, worker_id: 2, worker_type: prefill}}\n\
             \x20 - {{model: m, worker_id: 1, worker_type: prefill}}\n\
             \x20 - {{model: m, worker_id: 4, worker_type: decode}}\n\
             \x20 - {{model: m, worker_id: 3, worker_type: decode}}\n\
             \x20 - {{model: m, worker_id: 5, worker_type: aggregated}}\n",
            plugin.display()
        ),
    )
}

const DISAGG_ROLES: &str = "      worker_types: [prefill, decode]\n";
const PER_ROLE: &str = "  aggregated: least\n  prefill: disagg\n  decode: disagg\n";

fn select(base: &str, worker_type: &str, instance: Option<&str>) -> (u16, Value) {
    let mut body = json!({"model": "m", "worker_type": worker_type, "block_hashes": [1, 2]});
    if let Some(instance) = instance {
        body["instance"] = json!(instance);
    }
    let (status, _, text) = post_json(&ureq::Agent::new(), &format!("{base}/v1/select"), &body);
    (
        status,
        serde_json::from_str(&text).unwrap_or(json!({"text": text})),
    )
}

fn check(config: &Path, env: &[(&str, &str)]) -> (bool, String) {
    let out = Command::new(switchyard_bin())
        .args(["check", "--config"])
        .arg(config)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A policy that refuses the aggregated role loads when its instance lists the roles it
/// serves, and serves prefill and decode (Dynamo's per-role YAML keys choose it); an
/// aggregated request asking for it is refused with 503 naming what it serves.
#[test]
fn a_role_specific_policy_loads_and_serves_prefill_and_decode() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, said) = check(&config(dir.path(), DISAGG_ROLES, PER_ROLE), &[]);
    assert!(ok, "{said}");
    assert!(
        said.contains("disagg (") && said.contains("serves prefill, decode"),
        "{said}"
    );
    let router = support::serve(&config(dir.path(), DISAGG_ROLES, PER_ROLE));
    for (role, worker) in [("prefill", 1), ("decode", 3)] {
        let (status, decision) = select(&router.address, role, None);
        assert_eq!(status, 200, "{decision}");
        assert_eq!(decision["instance"], "disagg", "{decision}");
        assert_eq!(decision["worker_id"], worker, "the lowest id: {decision}");
    }
    for worker_type in ["aggregated", "select"] {
        let (status, decision) = select(&router.address, worker_type, None);
        assert_eq!(status, 200, "{decision}");
        assert_eq!(decision["instance"], "least", "{decision}");
        assert_eq!(decision["worker_id"], 5, "{decision}");
    }
    let (status, refused) = select(&router.address, "aggregated", Some("disagg"));
    assert_eq!(status, 503, "{refused}");
    let text = refused.to_string();
    assert!(text.contains("serves prefill, decode"), "{text}");
    assert!(text.contains("worker_selection.aggregated"), "{text}");
    let policies: Value = ureq::get(&format!("{}/v1/policies", router.address))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(policies["defaults"]["prefill"], "disagg", "{policies}");
    assert_eq!(policies["defaults"]["aggregated"], "least", "{policies}");
}

/// Without `worker_types`, the refusal stops startup at the instance's line, saying to
/// list the roles it serves; a per-role key naming an instance that does not serve the
/// role is refused at that key's line.
#[test]
fn a_role_the_policy_refuses_is_named_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, said) = check(&config(dir.path(), "", PER_ROLE), &[]);
    assert!(!ok, "{said}");
    for part in [
        "instance `disagg` cannot be built for worker type aggregated",
        "serves prefill and decode workers only",
        "worker_types: [prefill, decode]",
        "config.yaml:",
    ] {
        assert!(said.contains(part), "`{part}` missing: {said}");
    }
    let wrong = "  aggregated: disagg\n  prefill: disagg\n";
    let (ok, said) = check(&config(dir.path(), DISAGG_ROLES, wrong), &[]);
    assert!(!ok, "{said}");
    assert!(
        said.contains("config.yaml:4") && said.contains("`worker_selection.aggregated: disagg`"),
        "{said}"
    );
    assert!(said.contains("does not serve aggregated workers"), "{said}");
}

/// Dynamo's variables: a stage variable overrides its role's key, the global one every
/// role's; one naming no instance is an error naming the variable; other `DYN_ROUTER_*`
/// variables are named in a warning.
#[test]
fn dynamos_environment_is_honoured_or_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), DISAGG_ROLES, PER_ROLE);
    let (ok, said) = check(
        &config,
        &[
            ("DYN_ROUTER_DECODE_POLICY", "least"),
            ("DYN_ROUTER_POLICY_CONFIG", "/etc/policy.yaml"),
        ],
    );
    assert!(ok, "{said}");
    assert!(said.contains("decode: least"), "{said}");
    assert!(
        said.contains("DYN_ROUTER_POLICY_CONFIG is set") && said.contains("does not read it"),
        "{said}"
    );
    let (ok, said) = check(&config, &[("DYN_ROUTER_PREFILL_POLICY", "nope")]);
    assert!(!ok, "{said}");
    assert!(
        said.contains("DYN_ROUTER_PREFILL_POLICY=nope names no instance; set it to one of"),
        "{said}"
    );
    let (ok, said) = check(
        &config,
        &[
            ("DYN_ROUTER_WORKER_SELECTION_POLICY", "least"),
            ("SWITCHYARD_WORKER_SELECTION_POLICY", "disagg"),
        ],
    );
    assert!(!ok, "{said}");
    assert!(said.contains("disagree"), "{said}");
}

/// `switchyard select` routes as a request of the role it is given (`--worker-type`,
/// with the role's default instance), with a session and its input trigger; `--explain`
/// says what the picker read besides the costs.
#[test]
fn select_dry_runs_a_role_and_a_session() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), DISAGG_ROLES, PER_ROLE);
    let dry_run = |role: &str| {
        let out = Command::new(switchyard_bin())
            .args(["select", "--config"])
            .arg(&config)
            .args(["--worker", "2:0:0", "--worker", "1:0:5", "--explain"])
            .args(["--worker-type", role, "--session", "s-1"])
            .args(["--input-trigger", "tool_result"])
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{said}");
        said
    };
    let prefill = dry_run("prefill");
    assert!(prefill.contains("fixture.disaggregated-only"), "{prefill}");
    assert!(
        prefill.contains("picker fixture.lowest-cost-then-idle read LOAD besides the costs")
            && prefill.contains("worker 1 dp 0: 5 active requests"),
        "{prefill}"
    );
    assert!(
        prefill.ends_with("worker 1 dp_rank 0\n"),
        "the lowest id: {prefill}"
    );
    let aggregated = dry_run("aggregated");
    assert!(
        aggregated.contains("builtin.active-requests"),
        "{aggregated}"
    );
    assert!(
        aggregated.ends_with("worker 2 dp_rank 0\n"),
        "the least busy: {aggregated}"
    );
    assert!(
        !aggregated.contains("besides the costs"),
        "it reads none: {aggregated}"
    );
}
