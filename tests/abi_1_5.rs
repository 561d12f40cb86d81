//! ABI 1.5 with real libraries and the real router: a policy offered the worker a
//! request's session is bound to (`affinity_target`) keeps the session there past the
//! router's own soft threshold, in process and isolated; and a plugin built against the
//! frozen 1.4 header loads and routes unchanged.

mod support;

use std::path::{Path, PathBuf};

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

#[test]
fn a_policy_reading_affinity_target_keeps_the_session_past_the_soft_threshold() {
    let dir = tempfile::tempdir().unwrap();
    let library = fixture(dir.path(), "follow_1_5", &repo().join("include"));
    for isolation in ["none", "process"] {
        let router = serve(&follow_config(dir.path(), &library, isolation));
        let base = &router.address;
        assert_eq!(
            reserve_in_session(base, "r1", Some("s")),
            1,
            "{isolation}: least busy, ties low"
        );
        assert_eq!(
            reserve_in_session(base, "r2", Some("s")),
            1,
            "{isolation}: the router's pin"
        );
        // Worker 1 holds 2 requests: the router no longer narrows to it (the built-in
        // picker would move the session, tests/sessions.rs); the policy, offered the soft
        // binding, keeps it there.
        assert_eq!(
            reserve_in_session(base, "r3", Some("s")),
            1,
            "{isolation}: the policy follows affinity_target"
        );
        assert_eq!(
            reserve_in_session(base, "r4", None),
            2,
            "{isolation}: no session: least busy"
        );
        assert_eq!(
            reserve_in_session(base, "r5", Some("t")),
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
    assert_eq!(reserve_in_session(base, "r1", Some("s")), 1);
    assert_eq!(
        reserve_in_session(base, "r2", Some("s")),
        1,
        "the router's pin"
    );
    // A 1.4 plugin reads no binding: past the threshold it picks by load.
    assert_eq!(
        reserve_in_session(base, "r3", Some("s")),
        2,
        "routed by load"
    );
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
            reserve_in_session(&router.address, "a", None),
            8,
            "{isolation}: defaults"
        );
        drop(router);
        let knobs = "{prefill_load_scale: 1.5, uncached_weight: 2}";
        let router = serve(&knob_config(dir.path(), &library, isolation, knobs));
        assert_eq!(
            reserve_in_session(&router.address, "b", None),
            3,
            "{isolation}: configured"
        );
    }
}

/// `switchyard serve` of `config`, logging at info into the file `log`.
fn serve_into(config: &Path, log: &Path) -> Process {
    let file = std::fs::File::create(log).unwrap();
    Process::start(
        std::process::Command::new(switchyard_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .stderr(file),
        "switchyard listening on ",
    )
}

/// One worker, a 5-lines-a-second budget, the chatty picker (50 lines a pick) as the
/// default and the knob policy beside it.
fn chatty_config(dir: &Path, library: &Path, isolation: &str) -> PathBuf {
    write_config(
        dir,
        &format!(
            "router: {{plugin_log_lines_per_second: 5}}\n\
             plugins:\n  - path: {}\n    isolation: {isolation}\n\
             worker_selection:\n  default: chatty\n  builtin_default: {{prefill_load_scale: 2}}\n\
             \x20 instances:\n\
             \x20   - name: chatty\n\
             \x20     picker: {{type: fixture.chatty, parameters: {{lines_per_pick: 50}}}}\n\
             \x20   - name: knobs\n      type: fixture.knob-policy\n\
             workers:\n  - {{model: m, worker_id: 1}}\n",
            library.display()
        ),
    )
}

#[test]
fn plugin_lines_reach_the_routers_log_named_and_rate_limited() {
    let dir = tempfile::tempdir().unwrap();
    let library = fixture(dir.path(), "chatty_1_5", &repo().join("include"));
    for isolation in ["none", "process"] {
        let log = dir.path().join(format!("{isolation}.log"));
        let router = serve_into(&chatty_config(dir.path(), &library, isolation), &log);
        let text = || std::fs::read_to_string(&log).unwrap_or_default();
        // What factories log at creation, named by plugin and type.
        wait_for("the factories' lines", || {
            let t = text();
            t.contains("abi-1-5-fixture/fixture.chatty")
                && t.contains("created for model m")
                && t.contains("abi-1-5-fixture/fixture.knob-policy")
                && t.contains("validated: prefill_load_scale 2, uncached_weight 8")
        });
        reserve_in_session(&router.address, "r0", None);
        let picks = |t: &str| t.matches("picking among 1 workers").count();
        wait_for("the pick's lines", || picks(&text()) > 0);
        // 50 lines in one call against 5 a second: most are dropped.
        assert!(
            picks(&text()) < 50,
            "{isolation}: not rate-limited:\n{}",
            text()
        );
        // A later line is preceded by one that counts the lines dropped before it.
        let mut turn = 0;
        wait_for("the report of the dropped lines", || {
            turn += 1;
            reserve_in_session(&router.address, &format!("r{turn}"), None);
            text().contains("log lines of this plugin were dropped")
        });
    }
}

/// The Rust fixture's `panicky.traced` scorer (plain `tracing` macros) over two workers.
fn traced_config(dir: &Path, isolation: &str) -> PathBuf {
    write_config(
        dir,
        &format!(
            "plugins:\n  - path: {}\n    isolation: {isolation}\n\
             worker_selection:\n  default: traced\n  instances:\n\
             \x20   - name: traced\n      scorers: [{{type: panicky.traced}}]\n\
             \x20     picker: {{type: builtin.lowest-cost}}\n\
             workers:\n  - {{model: m, worker_id: 1}}\n  - {{model: m, worker_id: 2}}\n",
            rust_plugin("panicky").display()
        ),
    )
}

#[test]
fn a_rust_plugins_tracing_events_reach_the_routers_log() {
    let dir = tempfile::tempdir().unwrap();
    for isolation in ["none", "process"] {
        let log = dir.path().join(format!("traced-{isolation}.log"));
        let router = serve_into(&traced_config(dir.path(), isolation), &log);
        let text = || std::fs::read_to_string(&log).unwrap_or_default();
        wait_for("the creation's line", || {
            text().contains("panicky/panicky.traced") && text().contains("created for model m")
        });
        reserve_in_session(&router.address, "r", None);
        wait_for("the scorer's lines", || {
            let t = text();
            t.contains("scored worker 1 blocks=2") && t.contains("scored worker 2 blocks=2")
        });
        assert!(
            !text().contains("a detail the router's log does not keep"),
            "{isolation}: a trace line passed the router's info level:\n{}",
            text()
        );
    }
}

#[test]
fn the_cpp_layer_reads_the_binding_the_knobs_and_logs() {
    let dir = tempfile::tempdir().unwrap();
    let library = dir.path().join("libabi_1_5_cpp.so");
    run(std::process::Command::new("c++")
        .args([
            "-std=c++17",
            "-shared",
            "-fPIC",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-I",
        ])
        .arg(repo().join("include"))
        .arg(repo().join("tests/fixtures/abi_1_5_plugin.cpp"))
        .arg("-o")
        .arg(&library));
    let config = write_config(
        dir.path(),
        &format!(
            "router: {{session_affinity: {{mode: hard}}}}\n\
             plugins:\n  - path: {}\n\
             worker_selection:\n  default: follow\n  builtin_default: {{prefill_load_scale: 1.5}}\n\
             \x20 instances:\n    - name: follow\n      picker: {{type: cppfix.follow}}\n\
             workers:\n  - {{model: m, worker_id: 1}}\n  - {{model: m, worker_id: 2}}\n",
            library.display()
        ),
    );
    let log = dir.path().join("cpp.log");
    let router = serve_into(&config, &log);
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for("the constructor's line", || {
        text().contains("abi-1-5-cpp/cppfix.follow")
            && text().contains("created for model m: prefill_load_scale 1.500000")
    });
    let first = reserve_in_session(&router.address, "r1", Some("s"));
    assert_eq!(reserve_in_session(&router.address, "r2", Some("s")), first);
    wait_for("the pick's line about the binding", || {
        text().contains(&format!("request bound to worker {first} (hard)"))
    });
}
