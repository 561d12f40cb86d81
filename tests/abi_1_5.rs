//! ABI 1.5 with real libraries and the real router: a policy offered the worker a
//! request's session is bound to (`affinity_target`) keeps the session there past the
//! router's own soft threshold, in process and isolated; and a plugin built against the
//! frozen 1.4 header loads and routes unchanged.

mod support;

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use support::*;

/// tests/fixtures/abi_1_5_plugin.c built against the headers in `include`.
fn fixture(dir: &Path, name: &str, include: &Path) -> PathBuf {
    compile_c(
        dir,
        name,
        &repo().join("tests/fixtures/abi_1_5_plugin.c"),
        include,
        &[],
    )
}

/// Two workers, soft session affinity (kept while under 2 active requests), and the
/// fixture's `fixture.follow-session` picker as the default instance.
fn follow_config(dir: &Path, library: &Path, isolation: &str) -> PathBuf {
    write_config(
        dir,
        &format!(
            "router: {{session_affinity: {{mode: soft, soft_max_active_requests: 2}}}}\n\
             plugins:\n  - path: {}\n    isolation: {isolation}\n\
             worker_selection:\n  default: follow\n  instances:\n\
             \x20   - name: follow\n      picker: {{type: fixture.follow-session}}\n\
             workers:\n  - {{model: m, worker_id: 1}}\n  - {{model: m, worker_id: 2}}\n",
            library.display()
        ),
    )
}

/// Reserves request `id` (of `session` when given); the worker it was booked on.
fn reserve(base: &str, id: &str, session: Option<&str>) -> u64 {
    let mut body = json!({"model": "m", "block_hashes": [7, 8], "request_id": id});
    if let Some(session) = session {
        body["session"] = json!({"session_id": session});
    }
    let (status, _, text) = post_json(&ureq::Agent::new(), &format!("{base}/v1/reserve"), &body);
    assert_eq!(status, 200, "{text}");
    let decision: Value = serde_json::from_str(&text).unwrap();
    decision["worker_id"].as_u64().unwrap()
}

#[test]
fn a_policy_reading_affinity_target_keeps_the_session_past_the_soft_threshold() {
    let dir = tempfile::tempdir().unwrap();
    let library = fixture(dir.path(), "follow_1_5", &repo().join("include"));
    for isolation in ["none", "process"] {
        let router = serve(&follow_config(dir.path(), &library, isolation));
        let base = &router.address;
        assert_eq!(
            reserve(base, "r1", Some("s")),
            1,
            "{isolation}: least busy, ties low"
        );
        assert_eq!(
            reserve(base, "r2", Some("s")),
            1,
            "{isolation}: the router's pin"
        );
        // Worker 1 holds 2 requests: the router no longer narrows to it (the built-in
        // picker would move the session, tests/sessions.rs); the policy, offered the soft
        // binding, keeps it there.
        assert_eq!(
            reserve(base, "r3", Some("s")),
            1,
            "{isolation}: the policy follows affinity_target"
        );
        assert_eq!(
            reserve(base, "r4", None),
            2,
            "{isolation}: no session: least busy"
        );
        assert_eq!(
            reserve(base, "r5", Some("t")),
            2,
            "{isolation}: a new session"
        );
    }
}

#[test]
fn a_plugin_built_against_the_frozen_1_4_header_loads_and_routes_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let frozen = repo().join("tests/fixtures/abi-1.4");
    let header = std::fs::read_to_string(frozen.join("switchyard/plugin.h")).unwrap();
    assert!(
        header.contains("#define SWITCHYARD_ABI_MINOR 4"),
        "the frozen header is 1.4"
    );
    assert!(!header.contains("affinity_worker_id"));
    let library = fixture(dir.path(), "follow_1_4", &frozen);
    let config = follow_config(dir.path(), &library, "none");
    let summary = run(std::process::Command::new(switchyard_bin())
        .args(["check", "--config"])
        .arg(&config));
    assert!(
        summary.contains("ABI:      1.4, SDK revision 0.5.0"),
        "{summary}"
    );
    let router = serve(&config);
    let base = &router.address;
    assert_eq!(reserve(base, "r1", Some("s")), 1);
    assert_eq!(reserve(base, "r2", Some("s")), 1, "the router's pin");
    // A 1.4 plugin reads no binding: past the threshold it picks by load.
    assert_eq!(reserve(base, "r3", Some("s")), 2, "routed by load");
}

/// Workers 1, 3 and 8, the router's cost knobs `knobs` (`builtin_default`), and the
/// fixture's `fixture.knob-policy` as the default instance.
fn knob_config(dir: &Path, library: &Path, isolation: &str, knobs: &str) -> PathBuf {
    write_config(
        dir,
        &format!(
            "plugins:\n  - path: {}\n    isolation: {isolation}\n\
             worker_selection:\n  default: knobs\n  builtin_default: {knobs}\n  instances:\n\
             \x20   - name: knobs\n      type: fixture.knob-policy\n\
             workers:\n  - {{model: m, worker_id: 1}}\n  - {{model: m, worker_id: 3}}\n\
             \x20 - {{model: m, worker_id: 8}}\n",
            library.display()
        ),
    )
}

#[test]
fn a_factory_is_handed_the_routers_cost_knobs() {
    let dir = tempfile::tempdir().unwrap();
    let library = fixture(dir.path(), "knobs_1_5", &repo().join("include"));
    for isolation in ["none", "process"] {
        // The defaults: prefill_load_scale 1 x uncached_weight 8.
        let router = serve(&knob_config(dir.path(), &library, isolation, "{}"));
        assert_eq!(
            reserve(&router.address, "a", None),
            8,
            "{isolation}: defaults"
        );
        drop(router);
        let knobs = "{prefill_load_scale: 1.5, uncached_weight: 2}";
        let router = serve(&knob_config(dir.path(), &library, isolation, knobs));
        assert_eq!(
            reserve(&router.address, "b", None),
            3,
            "{isolation}: configured"
        );
    }
}
