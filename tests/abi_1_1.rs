//! ABI 1.1, the first minor, exercised with real libraries: a plugin built against the
//! frozen 1.0 header loads and decides exactly as the same source built against 1.1; a C
//! filter reads worker labels; a C policy type composes the router's built-in components;
//! a standalone C++ scorer learns from `on_selected`; and the lifecycle notifications
//! arrive once each, in order, off the selection path.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::json;
use support::*;

/// Server calls of these tests.
trait Reserve {
    fn reserve(&self, instance: &str, id: &str, session: Option<&str>) -> u64;
}

impl Reserve for Server {
    /// The worker `/v1/reserve` books request `id` on.
    fn reserve(&self, instance: &str, id: &str, session: Option<&str>) -> u64 {
        let mut body =
            json!({"model": "m", "instance": instance, "block_hashes": [1, 2], "request_id": id});
        if let Some(session) = session {
            body["session"] = json!({ "session_id": session });
        }
        self.ok("/v1/reserve", body)["worker_id"]
            .as_u64()
            .expect("a decision")
    }
}

fn least_busy_c(dir: &Path, name: &str, include: &Path) -> PathBuf {
    compile_c(
        dir,
        name,
        &repo().join("plugins/c/least-busy/least_busy.c"),
        include,
        &[],
    )
}

#[test]
fn a_plugin_built_against_the_frozen_1_0_header_loads_and_decides_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let frozen = repo().join("tests/fixtures/abi-1.0");
    let header = std::fs::read_to_string(frozen.join("switchyard/plugin.h")).unwrap();
    assert!(
        header.contains("#define SWITCHYARD_ABI_MINOR 0"),
        "the frozen header is 1.0"
    );
    let old = least_busy_c(dir.path(), "least_busy_1_0", &frozen);
    let new = least_busy_c(dir.path(), "least_busy_1_1", &repo().join("include"));
    let start = |lib: &Path, sub: &str| {
        let sub = dir.path().join(sub);
        std::fs::create_dir_all(&sub).unwrap();
        let yaml = format!(
            "plugins:\n  - path: {}\nworker_selection:\n  default: lb\n  instances:\n    - {{name: lb, type: c.least-busy, parameters: {{min_device_overlap_blocks: 2}}}}\n    - name: parts\n      filters: [{{type: c.min-device-overlap, parameters: {{min_blocks: 1}}}}]\n      scorers: [{{type: c.active-requests}}, {{type: builtin.kv-overlap, weight: 0.5}}]\n      picker: {{type: c.lowest-cost}}\n",
            lib.display()
        );
        start_yaml(&sub, &yaml).unwrap_or_else(|e| panic!("{}: {e:#?}", lib.display()))
    };
    let (old, new) = (start(&old, "old"), start(&new, "new"));
    let minor = |s: &switchyard::startup::Startup| s.registry.plugins()[0].info.abi_minor;
    assert_eq!(minor(&old), 0, "the frozen build declares ABI 1.0");
    assert_eq!(minor(&new), switchyard::plugin::HOST_ABI_MINOR);

    // The same fleets, decided by both builds: every decision (or refusal) identical.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |bound: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % bound
    };
    for instance in ["lb", "parts"] {
        let (mut a, mut b) = (selector(&old, instance), selector(&new, instance));
        let mut decided = 0;
        for round in 0..500 {
            let size = 1 + next(if round % 50 == 0 { 1024 } else { 12 }) as usize;
            let fleet: Vec<W> = (0..size)
                .map(|i| W {
                    id: i as u64 * 7 + next(5),
                    device: next(8) as u32,
                    active: next(6) as u32,
                })
                .collect();
            let blocks = 1 + next(16);
            let (x, y) = (
                select(&mut a, blocks, &fleet),
                select(&mut b, blocks, &fleet),
            );
            assert_eq!(
                x.as_ref().map_err(ToString::to_string),
                y.as_ref().map_err(ToString::to_string),
                "instance {instance}, round {round}"
            );
            decided += usize::from(x.is_ok());
        }
        assert!(
            decided > 250,
            "{instance}: too few fleets had a pick ({decided})"
        );
    }
}

/// A config serving model `m` on three workers: 1 in zone b (the least loaded, and the
/// lowest id, so it wins every tie it is in), 2 and 3 in zone a.
fn zoned_config(dir: &Path, instances: &str) -> PathBuf {
    let yaml = format!(
        "plugins:\n  - path: {}\n  - path: {}\nworkers:\n  - {{model: m, worker_id: 1, labels: {{zone: b, gpu: h100}}}}\n  - {{model: m, worker_id: 2, labels: {{zone: a, gpu: a100}}}}\n  - {{model: m, worker_id: 3, labels: {{zone: a}}}}\nworker_selection:\n  default: zone-filter\n  instances:\n{instances}",
        cmake_plugin("zone_c").display(),
        cmake_plugin("session_affinity_cpp").display(),
    );
    write_config(dir, &yaml)
}

const ZONE_INSTANCES: &str = "    - name: zone-filter\n      filters: [{type: c.label-equals, parameters: {key: zone, value: a}}]\n      scorers: [{type: builtin.active-requests}]\n      picker: {type: builtin.lowest-cost, parameters: {tie_break: worker-id}}\n    - {name: zone-policy, type: c.zone-least-busy, parameters: {zone: a}}\n    - name: anywhere\n      scorers: [{type: builtin.active-requests}]\n      picker: {type: builtin.lowest-cost, parameters: {tie_break: worker-id}}\n";

#[test]
fn a_c_filter_reads_labels_and_keeps_zone_a_through_select_and_serve() {
    let dir = tempfile::tempdir().unwrap();
    let config = zoned_config(dir.path(), ZONE_INSTANCES);
    let fleet = dir.path().join("fleet.yaml");
    std::fs::write(
        &fleet,
        "- {worker_id: 1, labels: {zone: b}}\n- {worker_id: 2, active_requests: 4, labels: {zone: a}}\n- {worker_id: 3, active_requests: 1, labels: {zone: a, gpu: h100}}\n- {worker_id: 4}\n",
    )
    .unwrap();
    let select = |instance: &str| {
        run(Command::new(switchyard_bin())
            .args(["select", "--explain", "--instance", instance, "--config"])
            .arg(&config)
            .arg("--fleet")
            .arg(&fleet))
    };
    let out = select("zone-filter");
    assert!(out.ends_with("worker 3 dp_rank 0\n"), "{out}");
    assert!(
        out.contains("DROP") && out.lines().filter(|l| l.contains("DROP")).count() == 2,
        "workers 1 and 4 (zone b, no labels) are dropped:\n{out}"
    );
    assert!(select("anywhere").ends_with("worker 1 dp_rank 0\n"));

    let server = Server::start(&config);
    let picks: Vec<u64> = (0..6)
        .map(|n| server.reserve("zone-filter", &format!("z{n}"), None))
        .collect();
    assert!(
        picks.iter().all(|w| *w == 2 || *w == 3),
        "zone a only: {picks:?}"
    );
    assert_eq!(
        picks.iter().filter(|w| **w == 2).count(),
        3,
        "load spreads over zone a: {picks:?}"
    );
    assert_eq!(
        server.reserve("anywhere", "free-for-all", None),
        1,
        "without the filter, zone b's idle worker wins"
    );
}

#[test]
fn a_c_policy_type_composes_builtin_components_through_the_builder() {
    let dir = tempfile::tempdir().unwrap();
    let config = zoned_config(dir.path(), ZONE_INSTANCES);
    let fleet = dir.path().join("fleet.yaml");
    std::fs::write(
        &fleet,
        "- {worker_id: 1, labels: {zone: b}}\n- {worker_id: 2, active_requests: 4, labels: {zone: a}}\n- {worker_id: 3, active_requests: 1, labels: {zone: a}}\n",
    )
    .unwrap();
    let out = run(Command::new(switchyard_bin())
        .args([
            "select",
            "--explain",
            "--instance",
            "zone-policy",
            "--config",
        ])
        .arg(&config)
        .arg("--fleet")
        .arg(&fleet));
    assert!(
        out.contains("filter c.label-equals")
            && out.contains("builtin.active-requests")
            && out.contains("picked by builtin.lowest-cost"),
        "the plugin's filter, then the router's scorer and picker:\n{out}"
    );
    assert!(out.ends_with("worker 3 dp_rank 0\n"), "{out}");

    let server = Server::start(&config);
    let picks: Vec<u64> = (0..4)
        .map(|n| server.reserve("zone-policy", &format!("p{n}"), None))
        .collect();
    assert_eq!(
        picks,
        [2, 3, 2, 3],
        "zone a, least busy first, ties to the lowest id"
    );

    // A policy asking for a type nobody registered fails its build, naming the type.
    let bad = zoned_config(
        dir.path(),
        "    - {name: zone-filter, type: c.zone-least-busy, parameters: {zone: ''}}\n",
    );
    let error = run_failing(
        Command::new(switchyard_bin())
            .args(["check", "--config"])
            .arg(&bad),
    );
    assert!(
        error.contains("`zone` must be a non-empty string"),
        "{error}"
    );
}

/// Runs a command that must fail; its stderr.
fn run_failing(command: &mut Command) -> String {
    let output = command.output().unwrap();
    assert!(!output.status.success(), "{command:?} succeeded");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_standalone_cpp_scorer_keeps_a_session_on_the_worker_on_selected_reported() {
    let dir = tempfile::tempdir().unwrap();
    let config = zoned_config(
        dir.path(),
        "    - name: zone-filter\n      scorers: [{type: cpp.sticky-session, parameters: {miss_cost: 100}}, {type: builtin.active-requests}]\n      picker: {type: builtin.lowest-cost, parameters: {tie_break: worker-id}}\n",
    );
    let server = Server::start(&config);
    let i = "zone-filter";
    assert_eq!(
        server.reserve(i, "s1-a", Some("s1")),
        1,
        "all idle: lowest id"
    );
    assert_eq!(server.reserve(i, "x", None), 2);
    assert_eq!(server.reserve(i, "y", None), 3);
    // Every worker has one request; s1 goes back to worker 1, whose load grows ...
    assert_eq!(server.reserve(i, "s1-b", Some("s1")), 1);
    assert_eq!(server.reserve(i, "s2-a", Some("s2")), 2);
    // ... and keeps going back while a new session goes to the least busy.
    assert_eq!(server.reserve(i, "s1-c", Some("s1")), 1);
    assert_eq!(server.reserve(i, "s3-a", Some("s3")), 3);
    assert_eq!(server.reserve(i, "s2-b", Some("s2")), 2);
}

#[test]
fn a_rust_scorer_learns_from_on_selected_through_the_sdk_lifecycle() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "plugins:\n  - path: {}\nworkers:\n  - {{model: m, worker_id: 1}}\n  - {{model: m, worker_id: 2}}\n  - {{model: m, worker_id: 3}}\nworker_selection:\n  default: zone-filter\n  instances:\n    - name: zone-filter\n      scorers: [{{type: panicky.sticky, parameters: {{miss_cost: 100}}}}, {{type: builtin.active-requests}}]\n      picker: {{type: builtin.lowest-cost, parameters: {{tie_break: worker-id}}}}\n",
        rust_plugin("panicky").display()
    );
    let server = Server::start(&write_config(dir.path(), &yaml));
    let i = "zone-filter";
    assert_eq!(server.reserve(i, "s1-a", Some("s1")), 1);
    assert_eq!(server.reserve(i, "x", None), 2);
    assert_eq!(server.reserve(i, "y", None), 3);
    assert_eq!(
        server.reserve(i, "s1-b", Some("s1")),
        1,
        "back to its worker"
    );
    assert_eq!(server.reserve(i, "s2-a", Some("s2")), 2);
    assert_eq!(
        server.reserve(i, "s1-c", Some("s1")),
        1,
        "even as the busiest"
    );

    // Asking for notifications the registration did not declare is refused at creation.
    let undeclared = format!(
        "plugins:\n  - path: {}\nworker_selection:\n  instances:\n    - name: u\n      scorers: [{{type: panicky.sticky-undeclared}}]\n      picker: {{type: builtin.lowest-cost}}\n",
        rust_plugin("panicky").display()
    );
    let sub = dir.path().join("undeclared");
    std::fs::create_dir_all(&sub).unwrap();
    let error = start_error(&sub, &undeclared);
    assert!(
        error.contains("asks for lifecycle notifications") && error.contains("notified_scorer"),
        "{error}"
    );
}

/// The lines of the fixture's notification log once `ready` accepts them.
fn wait_for_log(path: &Path, ready: impl Fn(&[String]) -> bool) -> Vec<String> {
    eventually_ok("the notification log", Duration::from_secs(10), || {
        let lines: Vec<String> = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect();
        if ready(&lines) {
            Ok(lines)
        } else {
            Err(lines.join("\n"))
        }
    })
}

#[test]
fn lifecycle_notifications_arrive_once_each_and_in_order() {
    lifecycle_notifications("none");
}

#[test]
fn lifecycle_notifications_reach_an_isolated_plugin_alike() {
    lifecycle_notifications("process");
}

/// Routes two requests through a scorer that logs its notifications (in the router's
/// process, or `isolation: process`); checks what it heard, and in what order.
fn lifecycle_notifications(isolation: &str) {
    let dir = tempfile::tempdir().unwrap();
    let lib = compile_c(
        dir.path(),
        "lifecycle",
        &repo().join("tests/fixtures/lifecycle_plugin.c"),
        &repo().join("include"),
        &[],
    );
    let log = dir.path().join("notifications.log");
    let yaml = format!(
        "plugins:\n  - path: {}\n    isolation: {isolation}\nisolation: {{call_deadline_ms: 30000}}\nworkers:\n  - {{model: m, worker_id: 1}}\n  - {{model: m, worker_id: 2}}\nworker_selection:\n  default: logged\n  instances:\n    - name: logged\n      scorers: [{{type: fixture.lifecycle-log, parameters: {{log: \"{}\"}}}}, {{type: builtin.active-requests}}]\n      picker: {{type: builtin.lowest-cost, parameters: {{tie_break: worker-id}}}}\n",
        lib.display(),
        log.display()
    );
    let server = Server::start(&write_config(dir.path(), &yaml));
    // A dry-run select routes nothing: no notification.
    server.ok(
        "/v1/select",
        json!({"model": "m", "block_hashes": [1], "request_id": "dry"}),
    );
    assert_eq!(server.reserve("logged", "r1", Some("chat-7")), 1);
    server.ok("/v1/requests/r1/prefill_complete", json!({}));
    server.ok("/v1/requests/r1/free", json!({}));
    // Prefill-complete and finished are delivered off the request path, so another
    // request's `on_selected` may overtake them; the order checked below is per request.
    wait_for_log(&log, |l| l.iter().any(|l| l.starts_with("finished 1 ")));
    assert_eq!(server.reserve("logged", "r2", None), 1);
    // Its worker leaves: the booking goes, and with it the request.
    server.delete("/v1/workers/1");
    let lines = wait_for_log(&log, |l| {
        l.iter().filter(|l| l.starts_with("finished")).count() == 2
    });
    assert_eq!(lines.len(), 5, "{lines:#?}");
    assert_eq!(lines[0], "selected 1 1 chat-7", "{lines:#?}");
    let fields = |line: &str| line.split(' ').map(str::to_owned).collect::<Vec<_>>();
    let prefill = fields(&lines[1]);
    assert_eq!(&prefill[..3], ["prefill", "1", "1"], "{lines:#?}");
    let finished = fields(&lines[2]);
    assert_eq!(&finished[..3], ["finished", "1", "1"], "{lines:#?}");
    let (to_prefill, to_finish): (f64, f64) =
        (finished[3].parse().unwrap(), finished[4].parse().unwrap());
    assert!(to_prefill >= 0.0 && to_finish >= to_prefill, "{lines:#?}");
    assert_eq!(lines[3], "selected 2 1 -", "{lines:#?}");
    let second = fields(&lines[4]);
    assert_eq!(&second[..4], ["finished", "2", "1", "nan"], "{lines:#?}");
}
