//! The `switchyard` binary: `check` on good and broken configs, `plugin inspect`, the
//! policy override from the environment.

mod support;

use std::process::{Command, Output};

use support::*;

fn switchyard(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(switchyard_bin());
    command
        .args(args)
        .env_remove("SWITCHYARD_WORKER_SELECTION_POLICY")
        .env("RUST_LOG", "warn");
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The example config, with every example plugin, from `make test`'s target/plugins.
fn example_config() -> String {
    for lib in ["least_busy_c", "least_busy_cpp", "session_affinity_cpp"] {
        cmake_plugin(lib);
    }
    let rust = repo().join("target/plugins/libleast_busy.so");
    assert!(
        rust.exists(),
        "{} is missing: `make test` copies it there",
        rust.display()
    );
    repo()
        .join("examples/switchyard.yaml")
        .display()
        .to_string()
}

#[test]
fn check_on_the_example_config_prints_the_summary() {
    let config = example_config();
    let output = switchyard(&["check", "--config", &config], &[]);
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", text(&output.stderr));
    for expected in [
        "acme-least-busy 0.1.0",
        "acme-least-busy-c 0.1.0",
        "acme-least-busy-cpp 0.1.0",
        "ABI:      1.5, SDK revision 0.6.0",
        "policy  least-busy",
        "filter  acme.min-device-overlap  reads: CACHE",
        "scorer  cpp.active-requests  reads: LOAD",
        "instances (4), default: least-busy",
        "filter  c.min-device-overlap  reads: CACHE",
        "scorer  builtin.kv-overlap x2  reads: CACHE",
        "ok: 4 plugin(s)",
    ] {
        assert!(
            stdout.contains(expected),
            "missing `{expected}` in:\n{stdout}"
        );
    }
}

#[test]
fn check_on_broken_configs_exits_non_zero_with_every_error() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "worker_selection:\n  defualt: x\n",
            "config.yaml:2: worker_selection: unknown field `defualt`",
        ),
        ("plugins:\n  - path: missing.so\n", "config.yaml:2: "),
        (
            "worker_selection:\n  instances:\n    - name: a\n      type: nope\n",
            "unknown policy type `nope`",
        ),
    ];
    for (yaml, expected) in cases {
        let config = write_config(dir.path(), yaml);
        let output = switchyard(&["check", "--config", config.to_str().unwrap()], &[]);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{yaml}: {stderr}");
        assert!(stderr.contains(expected), "`{expected}` not in:\n{stderr}");
        assert!(output.stdout.is_empty(), "no summary on failure");
    }
    let output = switchyard(&["check", "--config", "/nonexistent/switchyard.yaml"], &[]);
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output.stderr).contains("/nonexistent/switchyard.yaml: cannot read the config"));
}

#[test]
fn policy_override_from_the_environment() {
    let config = example_config();
    let env = [("SWITCHYARD_WORKER_SELECTION_POLICY", "sticky")];
    let output = switchyard(&["check", "--config", &config], &env);
    assert!(
        text(&output.stdout).contains("default: sticky"),
        "{}",
        text(&output.stdout)
    );

    let output = switchyard(
        &["check", "--config", &config],
        &[("SWITCHYARD_WORKER_SELECTION_POLICY", "nope")],
    );
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("SWITCHYARD_WORKER_SELECTION_POLICY=nope names no instance; set it to one of: default, least-busy, sticky, composed"), "{stderr}");

    // `default` selects the built-in policy.
    let output = switchyard(
        &["check", "--config", &config],
        &[("SWITCHYARD_WORKER_SELECTION_POLICY", "default")],
    );
    assert!(text(&output.stdout).contains("default: default"));
}

#[test]
fn inspect_load_prints_descriptor_and_registered_types_as_json() {
    let lib = rust_plugin("least_busy");
    let output = switchyard(
        &[
            "plugin",
            "inspect",
            "--load",
            lib.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["name"], "acme-least-busy");
    assert_eq!(json["abi_major"], 1);
    assert_eq!(json["sdk_revision"], env!("CARGO_PKG_VERSION"));
    let registered = json["registered"].as_array().unwrap();
    assert_eq!(registered.len(), 5);
    assert_eq!(registered[1]["name"], "acme.min-device-overlap");
    assert_eq!(registered[1]["kind"], "filter");
    assert_eq!(registered[1]["inputs"], serde_json::json!(["CACHE"]));
    assert_eq!(registered[4]["kind"], "admitter");
    assert_eq!(json["manifest"]["types"].as_array().unwrap().len(), 5);

    let dir = tempfile::tempdir().unwrap();
    let broken = broken_plugin(dir.path(), "major", &["DESC_MAJOR=3"]);
    let output = switchyard(
        &["plugin", "inspect", "--load", broken.to_str().unwrap()],
        &[],
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("ABI major mismatch"),
        "{}",
        text(&output.stderr)
    );
}

/// The manifests the three languages' export macros write, read without loading.
#[test]
fn inspect_reads_the_manifest_of_every_language_without_loading() {
    // The Rust example also registers an admitter.
    let cases = [
        (
            rust_plugin("least_busy"),
            "acme-least-busy",
            "acme.min-device-overlap",
            5,
        ),
        (
            cmake_plugin("least_busy_c"),
            "acme-least-busy-c",
            "c.min-device-overlap",
            4,
        ),
        (
            cmake_plugin("least_busy_cpp"),
            "acme-least-busy-cpp",
            "cpp.min-device-overlap",
            4,
        ),
    ];
    for (lib, name, filter, count) in cases {
        let output = switchyard(&["plugin", "inspect", lib.to_str().unwrap(), "--json"], &[]);
        assert!(output.status.success(), "{}", text(&output.stderr));
        let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let manifest = &json["manifest"];
        assert_eq!(manifest["name"], name, "{json}");
        assert_eq!(manifest["abi_major"], 1);
        assert_eq!(manifest["sdk_revision"], env!("CARGO_PKG_VERSION"));
        let types = manifest["types"].as_array().unwrap();
        assert_eq!(types.len(), count, "{json}");
        let declared = types.iter().find(|t| t["name"] == filter).expect(filter);
        assert_eq!(declared["kind"], "filter");
        assert_eq!(declared["inputs"], serde_json::json!(["CACHE"]));
        let sha256 = json["sha256"].as_str().unwrap();
        assert_eq!(sha256.len(), 64);
    }
}

/// `plugin inspect` runs no code of the library: a constructor that leaves a marker file
/// leaves none; `--load` (which does run it) does.
#[test]
fn inspect_without_load_runs_no_library_code() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "marker", &["CTOR_MARKER", "MANIFEST"]);
    let marker = dir.path().join("constructor-ran");
    let marker_env = [("SWITCHYARD_FIXTURE_MARKER", marker.to_str().unwrap())];
    let output = switchyard(&["plugin", "inspect", lib.to_str().unwrap()], &marker_env);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let shown = text(&output.stdout);
    assert!(
        shown.contains("broken-fixture 0.0.0 (switchyard tests)"),
        "{shown}"
    );
    assert!(shown.contains("the library was not loaded"), "{shown}");
    assert!(
        shown.contains("filter  fixture.keep-all  reads: -"),
        "{shown}"
    );
    assert!(!marker.exists(), "inspect ran the library's constructor");

    let output = switchyard(
        &["plugin", "inspect", "--load", lib.to_str().unwrap()],
        &marker_env,
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        marker.exists(),
        "the fixture's constructor did not run under --load"
    );
}

#[test]
fn a_library_without_a_manifest_is_loadable_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "plain", &[]);
    let output = switchyard(&["plugin", "inspect", lib.to_str().unwrap()], &[]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let shown = text(&output.stdout);
    assert!(shown.contains("(no manifest)"), "{shown}");
    assert!(
        shown.contains("`plugin inspect --load` loads it"),
        "{shown}"
    );
    let output = switchyard(&["plugin", "inspect", "--load", lib.to_str().unwrap()], &[]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let shown = text(&output.stdout);
    assert!(
        shown.contains("manifest: none (a hand-written descriptor)"),
        "{shown}"
    );
    assert!(shown.contains("fixture.keep-all"), "{shown}");
}

/// `check` and the loader refuse a library whose registration or descriptor differs from
/// its manifest, naming what differs.
#[test]
fn manifest_and_registration_must_agree() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[&str], &str); 4] = [
        ("agrees", &["MANIFEST"], ""),
        (
            "ghost",
            &["MANIFEST", "MANIFEST_GHOST"],
            "differ in its registered types: the manifest says declares but does not register: scorer `fixture.ghost` (reads LOAD), the library registers but does not declare: nothing",
        ),
        (
            "version",
            &["MANIFEST", "MANIFEST_VERSION=\"9.9.9\""],
            "differ in its version: the manifest says 9.9.9, the library 0.0.0",
        ),
        (
            "inputs",
            &["MANIFEST", "INPUTS=SWITCHYARD_INPUT_CACHE"],
            "",
        ),
    ];
    for (name, defines, expected) in cases {
        let lib = broken_plugin(dir.path(), name, defines);
        let config = write_config(
            dir.path(),
            &format!(
                "plugins:\n  - path: {}\n    probe: false\nworker_selection:\n  instances:\n    - name: c\n      filters: [{{type: fixture.keep-all}}]\n      picker: {{type: builtin.lowest-cost}}\n",
                lib.display()
            ),
        );
        let output = switchyard(&["check", "--config", config.to_str().unwrap()], &[]);
        let stderr = text(&output.stderr);
        if expected.is_empty() {
            assert!(output.status.success(), "{name}: {stderr}");
            assert!(
                text(&output.stdout).contains("manifest: matches the library and its registration"),
                "{name}: {}",
                text(&output.stdout)
            );
        } else {
            assert_eq!(output.status.code(), Some(1), "{name}: {stderr}");
            assert!(stderr.contains(expected), "{name}: {stderr}");
            assert!(
                stderr.contains(&lib.display().to_string()),
                "{name}: {stderr}"
            );
        }
    }
}

/// Starts `serve` on a config whose one worker's engine is down (so the health probe
/// logs a warning), waits for that warning, and returns everything it wrote to stderr.
fn serve_logs(dir: &std::path::Path, format: &str) -> String {
    use std::io::{BufRead, BufReader};
    let port = free_port();
    let config = write_config(
        dir,
        &format!(
            "frontend: {{health_interval_ms: 50}}\nworkers:\n  - {{model: m, worker_id: 7, url: \"http://127.0.0.1:{port}\"}}\n"
        ),
    );
    let mut child = Command::new(switchyard_bin())
        .args([
            "--log-format",
            format,
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--config",
        ])
        .arg(&config)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (line_sender, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line_sender.send(line).is_err() {
                break;
            }
        }
    });
    // Read until the warning (or 30 s: the caller's assertion then shows what came).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut all = String::new();
    while let Ok(line) =
        lines.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
    {
        all.push_str(&line);
        all.push('\n');
        if line.contains("worker failed its health probe") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    all
}

#[test]
fn logs_are_plain_text_off_a_terminal_and_json_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let plain = serve_logs(dir.path(), "text");
    assert!(plain.contains("worker failed its health probe"), "{plain}");
    assert!(
        !plain.contains('\u{1b}'),
        "no colour escape codes when stderr is a pipe: {plain:?}"
    );
    let json = serve_logs(dir.path(), "json");
    let line = json
        .lines()
        .find(|l| l.contains("worker failed its health probe"))
        .unwrap_or_else(|| panic!("{json}"));
    let value: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(value["level"], "WARN");
    assert_eq!(value["fields"]["worker"], 7, "{value}");
}

#[test]
fn check_and_serve_refuse_a_plugin_that_crashes_in_its_probe_and_survive() {
    let dir = tempfile::tempdir().unwrap();
    for (define, phase, cause) in [
        (
            "CTOR_ABORT",
            "loading (constructors) and registering",
            "killed by signal 6 (SIGABRT)",
        ),
        (
            "REGISTER_SEGV",
            "loading (constructors) and registering",
            "killed by signal 11 (SIGSEGV)",
        ),
        (
            "CREATE_SEGV",
            "creating an instance of `fixture.keep-all`",
            "killed by signal 11 (SIGSEGV)",
        ),
        (
            "FILTER_SEGV",
            "running on_filter of `fixture.keep-all`",
            "killed by signal 11 (SIGSEGV)",
        ),
    ] {
        let lib = broken_plugin(dir.path(), &format!("crash_{define}"), &[define]);
        let config = write_config(
            dir.path(),
            &format!(
                "plugins:\n  - path: {}\nworker_selection:\n  instances:\n    - name: c\n      filters: [{{type: fixture.keep-all}}]\n      picker: {{type: builtin.lowest-cost}}\n",
                lib.display()
            ),
        );
        for command in ["check", "serve"] {
            let output = switchyard(
                &[
                    command,
                    "--config",
                    config.to_str().unwrap(),
                    "--listen",
                    "127.0.0.1:0",
                ][..if command == "check" { 3 } else { 5 }],
                &[],
            );
            let stderr = text(&output.stderr);
            assert_eq!(
                output.status.code(),
                Some(1),
                "{define} {command}: {stderr}"
            );
            assert!(
                stderr.contains(&lib.display().to_string()),
                "{define}: {stderr}"
            );
            assert!(stderr.contains(phase), "{define} names the phase: {stderr}");
            assert!(stderr.contains(cause), "{define} names the cause: {stderr}");
        }
    }
    // `probe: false` skips it (here, on a healthy library, to stay alive).
    let lib = broken_plugin(dir.path(), "healthy", &[]);
    let config = write_config(
        dir.path(),
        &format!("plugins:\n  - path: {}\n    probe: false\n", lib.display()),
    );
    let output = switchyard(&["check", "--config", config.to_str().unwrap()], &[]);
    assert!(output.status.success(), "{}", text(&output.stderr));
}

fn a_bad_fleet_file_names_its_line(config: &std::path::Path, fleet: &std::path::Path) {
    std::fs::write(
        fleet,
        "- {worker_id: 1}\n- {worker_id: 2, actve_requests: 1}\n",
    )
    .unwrap();
    let output = switchyard(
        &[
            "select",
            "--config",
            config.to_str().unwrap(),
            "--fleet",
            fleet.to_str().unwrap(),
        ],
        &[],
    );
    let error = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        error.contains("fleet.yaml:2: not a fleet:")
            && error.contains("unknown field `actve_requests`, expected one of `worker_id`"),
        "{error}"
    );
    let output = switchyard(&["select", "--config", config.to_str().unwrap()], &[]);
    assert!(text(&output.stderr).contains("give the candidates with --worker"));
}

#[test]
fn select_explains_each_stage_per_worker_over_a_fleet_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            "plugins:\n  - path: {}\nworker_selection:\n  instances:\n    - name: x\n      filters: [{{type: c.min-device-overlap, parameters: {{min_blocks: 2}}}}]\n      scorers: [{{type: c.active-requests, weight: 1.0}}, {{type: builtin.kv-overlap, weight: 2.0}}]\n      picker: {{type: builtin.lowest-cost}}\n",
            cmake_plugin("least_busy_c").display()
        ),
    );
    let fleet = dir.path().join("fleet.yaml");
    std::fs::write(
        &fleet,
        "- {worker_id: 1, device_overlap_blocks: 4, active_requests: 3}\n- {worker_id: 2, active_requests: 0}\n- {worker_id: 3, dp_rank: 1, device_overlap_blocks: 8, active_requests: 1, preferred_taint_multiplier: 1.5}\n",
    )
    .unwrap();
    let output = switchyard(
        &[
            "select",
            "--config",
            config.to_str().unwrap(),
            "--instance",
            "x",
            "--fleet",
            fleet.to_str().unwrap(),
            "--explain",
            "--blocks",
            "16",
        ],
        &[],
    );
    let out = text(&output.stdout);
    assert!(output.status.success(), "{out}{}", text(&output.stderr));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "worker",
            "dp",
            "filter",
            "c.min-device-overlap",
            "c.active-requests",
            "x1",
            "builtin.kv-overlap",
            "x2",
            "total"
        ],
        "{out}"
    );
    // Worker 2 caches nothing: dropped, never scored. Worker 3: 1 active request, and
    // kv-overlap's cost for 8 of 16 blocks cached; it has the lowest total.
    let row = |i: usize| lines[i].split_whitespace().collect::<Vec<_>>();
    assert_eq!(row(2), ["2", "0", "DROP", "-", "-", "-"], "{out}");
    assert_eq!(&row(1)[..3], ["1", "0", "keep"], "{out}");
    assert_eq!(&row(3)[..3], ["3", "1", "keep"], "{out}");
    assert!(
        lines[3].ends_with("<- picked by builtin.lowest-cost"),
        "{out}"
    );
    assert_eq!(lines[4], "worker 3 dp_rank 1", "{out}");
    let total = |i: usize| row(i)[5].parse::<f64>().unwrap();
    let cost = |i: usize, c: usize| row(i)[c].parse::<f64>().unwrap();
    assert_eq!(total(1), cost(1, 3) + 2.0 * cost(1, 4), "{out}");
    assert!(total(3) < total(1), "{out}");

    // A fleet file with a typo: the file, the line, and what a fleet is.
    a_bad_fleet_file_names_its_line(&config, &fleet);
}

/// `plugin inspect` judges what the manifest declares: a library built for an ABI this
/// router does not speak is shown with the reason, and the exit status is a failure.
#[test]
fn inspect_says_when_this_router_would_refuse_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("future.c");
    std::fs::write(
        &source,
        "__attribute__((used, section(\".switchyard_manifest\"), aligned(1)))\n\
         static const char manifest[] = \"switchyard-manifest 1\\nabi 2.1\\nfingerprint 1\\nsdk 9.0.0\\nname future\\nversion 1.0.0\\nvendor tests\\n\";\n\
         const void *switchyard_plugin_entry_v1(void) { return manifest; }\n",
    )
    .unwrap();
    let lib = compile_c(dir.path(), "future", &source, &repo().join("include"), &[]);
    let output = switchyard(&["plugin", "inspect", lib.to_str().unwrap()], &[]);
    let shown = text(&output.stdout);
    assert!(!output.status.success(), "{shown}");
    assert!(shown.contains("ABI:      2.1"), "{shown}");
    assert!(
        shown.contains("REFUSED by this router (ABI 1.5): it is built for ABI 2.x"),
        "{shown}"
    );
    let good = cmake_plugin("least_busy_c");
    let output = switchyard(&["plugin", "inspect", good.to_str().unwrap()], &[]);
    assert!(output.status.success());
    assert!(text(&output.stdout).contains("verdict:  this router (ABI 1.5) accepts"));
}

/// `select` asks the config's admitters and busy thresholds as the router does: the C
/// allow-list's verdict and priority, the workers at a threshold (the prefill one per
/// request: the worker caching the prompt has room, an equally loaded one without does
/// not), and the refusal when the admitter says no or every worker is busy.
#[test]
fn select_shows_admission_and_busy_workers() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = dir.path().join("fleet.yaml");
    std::fs::write(
        &fleet,
        "- {worker_id: 1, active_requests: 8}\n\
         - {worker_id: 2, active_prefill_tokens: 100, device_overlap_blocks: 4}\n\
         - {worker_id: 3, active_prefill_tokens: 100}\n",
    )
    .unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            "plugins:\n  - path: {}\nadmission:\n  busy: {{max_active_requests: 8, max_active_prefill_tokens: 160}}\n  admitters:\n    - type: c.tenant-allowlist\n      parameters: {{tenants: [{{name: gold, priority: 10}}]}}\n",
            cmake_plugin("tenant_allowlist_c").display()
        ),
    );
    let (config, fleet) = (config.to_str().unwrap(), fleet.to_str().unwrap());
    let select = |blocks: &str, tenant: &str| {
        let args = [
            "select",
            "--config",
            config,
            "--fleet",
            fleet,
            "--blocks",
            blocks,
            "--tenant",
            tenant,
            "--explain",
        ];
        switchyard(&args, &[])
    };
    let output = select("5", "gold");
    let shown = text(&output.stdout);
    assert!(output.status.success(), "{shown}{}", text(&output.stderr));
    assert!(
        shown.contains("admission: admitted by c.tenant-allowlist (priority 10)"),
        "{shown}"
    );
    assert!(
        shown.contains("busy (admission.busy), not candidates: worker 1, 3"),
        "{shown}"
    );
    assert!(shown.ends_with("worker 2 dp_rank 0\n"), "{shown}");
    let output = select("5", "bronze");
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains(
            "refused by admitter `c.tenant-allowlist`: 403 tenant `bronze` is not served"
        ),
        "{}",
        text(&output.stderr)
    );
    let output = select("12", "gold");
    assert!(
        text(&output.stdout).contains("no pick: every worker is busy (admission.busy)"),
        "{}",
        text(&output.stdout)
    );
}

/// `check --envoy-filter-config` reads the Envoy module's filter_config as the module does
/// (docs/envoy.md): the switchyard config it names is checked; an HTTP API listening off
/// loopback, or a key the module does not know, is refused, saying what the module takes.
#[test]
fn check_reads_the_envoy_modules_filter_config() {
    let config = example_config();
    let good = format!("{{\"config\": \"{config}\", \"listen\": \"127.0.0.1:9090\"}}");
    let output = switchyard(&["check", "--envoy-filter-config", &good], &[]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let out = text(&output.stdout);
    assert!(out.starts_with("envoy filter config: ok"), "{out}");
    assert!(
        out.contains("instances ("),
        "the switchyard config is checked too: {out}"
    );
    for (bad, said) in [
        (
            format!("{{\"config\": \"{config}\", \"listen\": \"0.0.0.0:9090\"}}"),
            "is not a loopback address",
        ),
        (
            format!("{{\"config\": \"{config}\", \"port\": 9090}}"),
            "unknown field `port`",
        ),
        (
            "{\"config\": \"/nonexistent/switchyard.yaml\"}".to_owned(),
            "/nonexistent/switchyard.yaml",
        ),
    ] {
        let output = switchyard(&["check", "--envoy-filter-config", &bad], &[]);
        assert_eq!(output.status.code(), Some(1), "{bad}");
        assert!(
            text(&output.stderr).contains(said),
            "{}",
            text(&output.stderr)
        );
    }
}
