//! Config checks: unknown keys and types, duplicate names, invalid parameters. Each error
//! names the file and line and says what to do.

mod support;

use support::*;

fn with_rust_plugin(rest: &str) -> String {
    format!(
        "plugins:\n  - path: {}\n{rest}",
        rust_plugin("least_busy").display()
    )
}

#[test]
fn unknown_key_names_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let error = start_error(
        dir.path(),
        "worker_selection:\n  default: default\n  instancez: []\n",
    );
    assert!(error.contains("config.yaml:3:"), "{error}");
    assert!(error.contains("unknown field `instancez`"), "{error}");
}

#[test]
fn malformed_yaml_names_line() {
    let dir = tempfile::tempdir().unwrap();
    let error = start_error(dir.path(), "plugins:\n  - path: [unclosed\n");
    assert!(error.contains("config.yaml:"), "{error}");
}

#[test]
fn unknown_policy_type_lists_registered_types() {
    let dir = tempfile::tempdir().unwrap();
    let config = with_rust_plugin(
        "worker_selection:\n  instances:\n    - name: a\n      type: least-bussy\n",
    );
    let error = start_error(dir.path(), &config);
    assert!(error.contains("config.yaml:6:"), "{error}");
    assert!(
        error.contains("unknown policy type `least-bussy`"),
        "{error}"
    );
    assert!(
        error.contains("Registered policy types: builtin.least-busy, default, least-busy"),
        "{error}"
    );
}

#[test]
fn unknown_component_type_lists_registered_components_of_that_kind() {
    let dir = tempfile::tempdir().unwrap();
    let config = with_rust_plugin(
        "worker_selection:\n  instances:\n    - name: c\n      scorers: [{type: acme.nope}]\n      picker: {type: builtin.lowest-cost}\n",
    );
    let error = start_error(dir.path(), &config);
    assert!(error.contains("config.yaml:6:"), "{error}");
    assert!(error.contains("unknown scorer type `acme.nope`"), "{error}");
    assert!(error.contains("acme.active-requests"), "{error}");
    assert!(
        !error.contains("acme.lowest-cost"),
        "pickers are not scorers: {error}"
    );
}

#[test]
fn component_in_the_wrong_section() {
    let dir = tempfile::tempdir().unwrap();
    let config = with_rust_plugin(
        "worker_selection:\n  instances:\n    - name: c\n      filters: [{type: acme.active-requests}]\n      picker: {type: builtin.lowest-cost}\n",
    );
    let error = start_error(dir.path(), &config);
    assert!(
        error.contains("`acme.active-requests` is a scorer, but it is listed as a filter"),
        "{error}"
    );
}

#[test]
fn duplicate_instance_names_point_at_the_second() {
    let dir = tempfile::tempdir().unwrap();
    let error = start_error(
        dir.path(),
        "worker_selection:\n  instances:\n    - name: twin\n      type: default\n    - name: twin\n      type: default\n",
    );
    assert!(error.contains("config.yaml:5:"), "{error}");
    assert!(error.contains("duplicate instance name `twin`"), "{error}");
}

#[test]
fn invalid_policy_parameters_carry_the_plugins_message() {
    let dir = tempfile::tempdir().unwrap();
    let config = with_rust_plugin(
        "worker_selection:\n  instances:\n    - name: lb\n      type: least-busy\n      parameters: {min_device_overlap_blocks: -1}\n",
    );
    let error = start_error(dir.path(), &config);
    assert!(error.contains("config.yaml:6:"), "{error}");
    assert!(
        error.contains("invalid parameters for policy type `least-busy`"),
        "{error}"
    );
    assert!(
        error.contains("`min_device_overlap_blocks` must be a finite number >= 0, got -1"),
        "{error}"
    );
}

#[test]
fn unknown_parameter_of_a_plugin_component() {
    let dir = tempfile::tempdir().unwrap();
    let config = with_rust_plugin(
        "worker_selection:\n  instances:\n    - name: c\n      filters: [{type: acme.min-device-overlap, parameters: {min_blokcs: 2}}]\n      scorers: [{type: acme.active-requests}]\n      picker: {type: acme.lowest-cost}\n",
    );
    let error = start_error(dir.path(), &config);
    assert!(error.contains("instance `c` cannot be built"), "{error}");
    assert!(error.contains("unknown field `min_blokcs`"), "{error}");
}

#[test]
fn invalid_builtin_default_knob() {
    let dir = tempfile::tempdir().unwrap();
    let error = start_error(
        dir.path(),
        "worker_selection:\n  builtin_default: {temperature: -2}\n",
    );
    assert!(error.contains("config.yaml:2:"), "{error}");
    assert!(
        error.contains("`temperature` must be a finite number >= 0, got -2"),
        "{error}"
    );
}

#[test]
fn default_names_an_instance_or_the_builtin() {
    let dir = tempfile::tempdir().unwrap();
    let error = start_error(dir.path(), "worker_selection:\n  default: missing\n");
    assert!(error.contains("config.yaml:2:"), "{error}");
    assert!(
        error
            .contains("`worker_selection.default: missing` names no instance; use one of: default"),
        "{error}"
    );
    let startup = start_yaml(dir.path(), "worker_selection:\n  default: default\n").unwrap();
    assert_eq!(startup.default_instance(), "default");
}

#[test]
fn default_is_reserved() {
    let dir = tempfile::tempdir().unwrap();
    let error = start_error(
        dir.path(),
        "worker_selection:\n  instances:\n    - name: default\n      type: default\n",
    );
    assert!(
        error.contains("instance name `default` is reserved"),
        "{error}"
    );
}

#[test]
fn every_error_is_reported_not_just_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let errors = match start_yaml(
        dir.path(),
        "plugins:\n  - path: a.so\n  - path: b.so\nworker_selection:\n  default: nope\n",
    ) {
        Ok(_) => panic!("must fail"),
        Err(errors) => errors,
    };
    assert_eq!(errors.len(), 3, "{errors:#?}");
}

#[test]
fn router_knobs_must_be_positive() {
    let dir = tempfile::tempdir().unwrap();
    let error = start_error(dir.path(), "router:\n  block_size: 0\n");
    assert_eq!(
        error
            .split(": ")
            .next()
            .map(|f| f.ends_with("config.yaml:2")),
        Some(true),
        "{error}"
    );
    assert!(
        error.contains("`router.block_size` must be at least 1"),
        "{error}"
    );
}

#[test]
fn the_same_mistake_in_several_instances_is_reported_at_each_ones_line() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "worker_selection:\n  instances:\n\
                \x20   - name: a\n      type: nope\n\
                \x20   - name: b\n      type: nope\n\
                \x20   - name: c\n      scorers: [{type: missing}]\n      picker: {type: builtin.lowest-cost}\n\
                \x20   - name: d\n      scorers: [{type: missing}]\n      picker: {type: builtin.lowest-cost}\n";
    let errors = match start_yaml(dir.path(), yaml) {
        Ok(_) => panic!("must fail"),
        Err(errors) => errors,
    };
    let lines: Vec<&str> = errors
        .iter()
        .map(|e| e.split(": ").next().unwrap().rsplit(':').next().unwrap())
        .collect();
    assert_eq!(lines, ["4", "6", "8", "11"], "{errors:#?}");
}

#[test]
fn a_plugin_that_fails_to_load_is_one_root_error_not_a_cascade() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "plugins:\n  - path: missing.so\nworker_selection:\n  instances:\n\
                \x20   - {name: a, type: acme.policy}\n\
                \x20   - name: b\n      scorers: [{type: acme.scorer}]\n      picker: {type: builtin.lowest-cost}\n";
    let errors = match start_yaml(dir.path(), yaml) {
        Ok(_) => panic!("must fail"),
        Err(errors) => errors,
    };
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(
        errors[0].contains("missing.so: plugin file not found"),
        "{errors:#?}"
    );
    assert!(
        errors[1].contains("instance(s) `a`, `b` not checked") && !errors[1].contains("unknown"),
        "{errors:#?}"
    );
    // Without a failed plugin, an unknown type is reported as such, at its line.
    let error = start_error(
        dir.path(),
        "worker_selection:\n  instances:\n    - {name: a, type: acme.policy}\n",
    );
    assert!(
        error.contains("config.yaml:3: instance `a`: unknown policy type `acme.policy`"),
        "{error}"
    );
}

/// Text that would make the YAML parser slow (flow collections nested deep: its time grew
/// with the square of the depth) or that holds no document is refused before parsing,
/// with the file and line.
#[test]
fn deep_nesting_and_empty_files_are_refused_before_parsing() {
    let dir = tempfile::tempdir().unwrap();
    let deep = format!(
        "worker_selection:\n  default: default\nworkers: {}{}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let error = start_error(dir.path(), &deep);
    assert!(error.contains("config.yaml:3:"), "{error}");
    assert!(error.contains("nested more than 64 deep"), "{error}");
    // Brackets inside quotes and comments are not nesting.
    let quoted = format!(
        "# {}\nworker_selection: {{default: \"{}\"}}\n",
        "[".repeat(100),
        "[".repeat(100)
    );
    let error = start_error(dir.path(), &quoted);
    assert!(!error.contains("nested"), "{error}");
    for empty in ["", "\n\n", "# nothing here\n", "---\n"] {
        let error = start_error(dir.path(), empty);
        assert!(error.contains("the config is empty"), "{empty:?}: {error}");
    }
    let error = start_error(dir.path(), "plugins: []\n---\nplugins: []\n");
    assert!(error.contains("more than one document"), "{error}");
}

#[test]
fn the_pickers_threads_are_bounded_and_named_at_their_line() {
    let dir = tempfile::tempdir().unwrap();
    for threads in ["0", "257"] {
        let error = start_error(
            dir.path(),
            &format!("ext_proc:\n  listen: 127.0.0.1:0\n  threads: {threads}\n"),
        );
        assert!(error.contains("config.yaml:3"), "{error}");
        assert!(
            error.contains(&format!("threads is from 1 to 256 (got {threads})")),
            "{error}"
        );
    }
}

#[test]
fn stream_and_kv_event_limits_are_bounded_and_named_at_their_line() {
    let dir = tempfile::tempdir().unwrap();
    for (setting, value, says) in [
        (
            "max_streams_per_connection",
            "0",
            "is from 1 to 65536 (got 0)",
        ),
        (
            "request_headers_timeout_ms",
            "0",
            "is from 1 to 600000 (got 0)",
        ),
        (
            "max_message_bytes",
            "100",
            "is from 4096 to 67108864 (got 100)",
        ),
        (
            "max_header_bytes",
            "9999999999",
            "is from 1024 to 8388608 (got 9999999999)",
        ),
        (
            "max_buffered_bytes",
            "1000",
            "is from 65536 to 1099511627776 (got 1000)",
        ),
    ] {
        let error = start_error(
            dir.path(),
            &format!("ext_proc:\n  listen: 127.0.0.1:0\n  {setting}: {value}\n"),
        );
        assert!(error.contains("config.yaml:3"), "{error}");
        assert!(error.contains(&format!("{setting} {says}")), "{error}");
    }
    for (setting, value) in [
        ("max_frame_bytes", "10"),
        ("max_replay_bytes", "99999999999"),
    ] {
        let error = start_error(
            dir.path(),
            &format!("router:\n  block_size: 16\n  kv_events:\n    {setting}: {value}\n"),
        );
        assert!(error.contains("config.yaml:4"), "{error}");
        assert!(
            error.contains(&format!("{setting} is from 4096 to")),
            "{error}"
        );
        assert!(error.contains(&format!("(got {value})")), "{error}");
    }
}

/// A configured worker is checked as `POST /v1/workers` checks one, by `check` too, at
/// its line (it passed `check`, and `serve` refused it naming no line).
#[test]
fn an_invalid_worker_is_refused_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    for (worker, says) in [
        (
            "worker_type: prefill, url: \"http://127.0.0.1:8001\", bootstrap_port: 0",
            "worker 2: `bootstrap_port` is 0",
        ),
        (
            "address: \"127.0.0.1:0\"",
            "worker 2: `address` `127.0.0.1:0` has port 0",
        ),
    ] {
        let error = start_error(
            dir.path(),
            &format!("workers:\n  - {{model: demo, worker_id: 1, url: \"http://127.0.0.1:8000\"}}\n  - {{model: demo, worker_id: 2, {worker}}}\n"),
        );
        assert!(error.contains("config.yaml:3"), "{error}");
        assert!(error.contains(says), "{error}");
    }
}
