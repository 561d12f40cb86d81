//! Isolation for untrusted plugins (`isolation: process`), with real libraries built for
//! each fault: a scorer that aborts, exits, dies of SIGSEGV, writes far past its costs
//! array, sleeps 5 seconds, or throws out of its C callback, each while a flag file
//! exists. Under `serve` with `on_error: fallback` the router stays up, every request is
//! answered, the child is restarted, the counters say what happened, and once the flag is
//! gone routing goes through the plugin again. The same abort in process kills the router
//! (so the test would fail without isolation). And decisions through isolated plugins
//! equal the in-process ones.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

/// The faulty fixture built with `-DFAULT_{fault}` (as C++ for `THROW`).
fn faulty_library(dir: &Path, fault: &str) -> PathBuf {
    let source = repo().join("tests/fixtures/faulty_plugin.c");
    if fault != "THROW" {
        return compile_c(
            dir,
            &format!("faulty_{fault}"),
            &source,
            &repo().join("include"),
            &[&format!("FAULT_{fault}")],
        );
    }
    let out = dir.join("faulty_THROW.so");
    let status = Command::new("c++")
        .args([
            "-std=c++17",
            "-x",
            "c++",
            "-shared",
            "-fPIC",
            "-Wall",
            "-Werror",
        ])
        .arg("-I")
        .arg(repo().join("include"))
        .args(["-DFAULT_THROW"])
        .arg(&source)
        .arg("-o")
        .arg(&out)
        .status()
        .expect("c++ runs");
    assert!(status.success(), "compiling the C++ faulty fixture failed");
    out
}

fn config(library: &Path, flag: &Path, isolation: &str) -> String {
    config_limited(library, flag, isolation, "")
}

/// `config`, with more `isolation:` settings (`, key: value` each).
fn config_limited(library: &Path, flag: &Path, isolation: &str, settings: &str) -> String {
    format!(
        "plugins:\n  - path: {}\n    isolation: {isolation}\n\
         isolation: {{call_deadline_ms: 300, kill_after_ms: 2000, restart_backoff_ms: 50{settings}}}\n\
         worker_selection:\n  default: faulty\n  instances:\n\
         \x20   - name: faulty\n      on_error: fallback\n\
         \x20     scorers: [{{type: fixture.faulty, parameters: {{flag: {}}}}}]\n\
         \x20     picker: {{type: builtin.lowest-cost}}\n\
         workers:\n  - {{model: demo, worker_id: 1}}\n  - {{model: demo, worker_id: 2}}\n",
        library.display(),
        flag.display()
    )
}

fn select(base: &str) -> Result<Value, String> {
    ureq::post(&format!("{base}/v1/select"))
        .timeout(Duration::from_secs(20))
        .send_json(json!({"model": "demo", "token_ids": [1, 2, 3, 4]}))
        .map_err(|e| e.to_string())?
        .into_json()
        .map_err(|e| e.to_string())
}

fn metrics(base: &str) -> String {
    ureq::get(&format!("{base}/metrics"))
        .call()
        .unwrap()
        .into_string()
        .unwrap()
}

/// The value of the series whose line starts with `prefix` (0 when absent).
fn series(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// How long isolation's waits may take (a restart backs off; the machine is shared).
const ISOLATION_WAIT: Duration = Duration::from_secs(15);

#[test]
fn every_fault_is_contained_answered_by_fallback_counted_and_recovered_from() {
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("misbehave");
    // The cause label each fault's death is counted under.
    let faults = [
        ("ABORT", "signal:SIGABRT"),
        ("EXIT", "exit:0"),
        ("SEGV", "signal:SIGSEGV"),
        ("OVERRUN", "signal:SIG"),
        ("SLEEP", "killed:deadline"),
        ("THROW", "signal:SIGABRT"),
        // Past `memory_limit_mb: 256`: malloc fails in the child, not the router.
        ("HOG", "signal:SIGSEGV"),
    ];
    for (fault, cause) in faults {
        let library = faulty_library(dir.path(), fault);
        let settings = if fault == "HOG" {
            ", memory_limit_mb: 256"
        } else {
            ""
        };
        let config_path = write_config(
            dir.path(),
            &config_limited(&library, &flag, "process", settings),
        );
        std::fs::write(&flag, "").unwrap();
        let server = serve(&config_path);
        let base = server.address.clone();
        let process = format!("{{process=\"{}\"", library.display());

        // While the library misbehaves: every request is answered, by the fallback.
        for _ in 0..4 {
            let decision = select(&base).unwrap_or_else(|e| panic!("{fault}: {e}"));
            assert_eq!(decision["fallback"], true, "{fault}: {decision}");
        }
        let exits = format!("switchyard_isolated_process_exits_total{process},cause=\"{cause}");
        eventually(
            &format!("{fault}: a death counted as {cause}"),
            ISOLATION_WAIT,
            || series(&metrics(&base), &exits) >= 1.0,
        );
        assert!(
            ureq::get(&format!("{base}/healthz")).call().is_ok(),
            "{fault}: the router answers /healthz"
        );

        // Once it behaves, the restarted child routes again: through the plugin.
        std::fs::remove_file(&flag).unwrap();
        eventually(
            &format!("{fault}: routing through the plugin again"),
            ISOLATION_WAIT,
            || select(&base).is_ok_and(|d| d["fallback"] == false),
        );
        let text = metrics(&base);
        assert!(
            series(
                &text,
                &format!("switchyard_isolated_process_restarts_total{process}")
            ) >= 1.0,
            "{fault}: restarted\n{text}"
        );
        assert_eq!(
            series(&text, &format!("switchyard_isolated_process_up{process}")),
            1.0,
            "{fault}"
        );
        assert!(
            series(&text, "switchyard_fallbacks_total{instance=\"faulty\"}") >= 4.0,
            "{fault}: fallbacks counted\n{text}"
        );
        if fault == "SLEEP" {
            assert!(
                series(
                    &text,
                    &format!("switchyard_isolated_deadline_misses_total{process}")
                ) >= 1.0,
                "{fault}: the missed deadline is counted\n{text}"
            );
        }
        drop(server);
    }
}

#[test]
fn a_seccomp_filtered_child_that_starts_a_program_is_killed_and_an_unfiltered_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("misbehave");
    let library = faulty_library(dir.path(), "EXEC");
    std::fs::write(&flag, "").unwrap();
    for seccomp in [false, true] {
        let config_path = write_config(
            dir.path(),
            // Starting a program may be slow on a loaded machine: a generous deadline.
            &config_limited(&library, &flag, "process", &format!(", seccomp: {seccomp}"))
                .replace("call_deadline_ms: 300,", "call_deadline_ms: 30000,"),
        );
        let server = serve(&config_path);
        let base = server.address.clone();
        let decision = select(&base).unwrap();
        let exits = format!(
            "switchyard_isolated_process_exits_total{{process=\"{}\",cause=\"signal:SIGSYS\"}}",
            library.display()
        );
        if seccomp {
            assert_eq!(decision["fallback"], true, "{decision}");
            eventually(
                "the filtered child's death counted as SIGSYS",
                ISOLATION_WAIT,
                || series(&metrics(&base), &exits) >= 1.0,
            );
        } else {
            assert_eq!(
                decision["fallback"], false,
                "without the filter it may: {decision}"
            );
            assert_eq!(series(&metrics(&base), &exits), 0.0);
        }
    }
}

#[test]
fn without_isolation_the_same_abort_takes_the_router_down() {
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("misbehave");
    let library = faulty_library(dir.path(), "ABORT");
    let config_path = write_config(dir.path(), &config(&library, &flag, "none"));
    let mut server = serve(&config_path);
    let base = server.address.clone();
    assert_eq!(select(&base).unwrap()["fallback"], false);
    std::fs::write(&flag, "").unwrap();
    assert!(select(&base).is_err(), "the request dies with the router");
    let status = server.child.wait().unwrap();
    assert!(!status.success(), "the router died: {status}");
}

/// A fleet for the decision comparison, from a seed.
fn fleet(seed: u64, size: usize) -> Vec<W> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move |modulo: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % modulo
    };
    (0..size)
        .map(|i| W {
            id: i as u64 + 1,
            device: next(20) as u32,
            active: next(8) as u32,
        })
        .collect()
}

#[test]
fn decisions_through_isolated_plugins_equal_the_in_process_ones() {
    std::env::set_var("SWITCHYARD_EXE", switchyard_bin());
    let dir = tempfile::tempdir().unwrap();
    let yaml = |rust: &str, c: &str, cpp: &str| {
        format!(
            "plugins:\n  - path: {}\n    isolation: {rust}\n  - path: {}\n    isolation: {c}\n  - path: {}\n    isolation: {cpp}\n\
             isolation: {{call_deadline_ms: 30000}}\n\
             worker_selection:\n  instances:\n\
             \x20   - {{name: rust, type: least-busy, parameters: {{min_device_overlap_blocks: 3}}}}\n\
             \x20   - {{name: c, type: c.least-busy, parameters: {{min_device_overlap_blocks: 3}}}}\n\
             \x20   - {{name: cpp, type: cpp.least-busy, parameters: {{min_device_overlap_blocks: 3}}}}\n\
             \x20   - name: mixed\n      filters: [{{type: c.min-device-overlap, parameters: {{min_blocks: 2}}}}]\n\
             \x20     scorers: [{{type: cpp.active-requests, weight: 1.0}}, {{type: builtin.kv-overlap, weight: 0.5}}, {{type: acme.active-requests, weight: 2.0}}]\n\
             \x20     picker: {{type: c.lowest-cost}}\n",
            rust_plugin("least_busy").display(),
            cmake_plugin("least_busy_c").display(),
            cmake_plugin("least_busy_cpp").display(),
        )
    };
    let isolated_dir = dir.path().join("isolated");
    std::fs::create_dir_all(&isolated_dir).unwrap();
    let isolated = start_yaml(
        &isolated_dir,
        &yaml("process", "{process: vendor}", "{process: vendor}"),
    )
    .expect("isolated config starts");
    let in_process = start_yaml(dir.path(), &yaml("none", "none", "none")).expect("starts");
    assert_eq!(
        isolated.registry.processes().count(),
        2,
        "the Rust library alone, C and C++ together"
    );
    let mut compared = 0;
    for instance in ["rust", "c", "cpp", "mixed"] {
        let mut a = selector(&isolated, instance);
        let mut b = selector(&in_process, instance);
        for seed in 0..150u64 {
            let size = match seed % 10 {
                0 => 1024,
                n => 1 + (seed as usize * 7 + n as usize) % 64,
            };
            let workers = fleet(seed, size);
            let blocks = 8 + seed % 16;
            let (x, y) = (
                support::select(&mut a, blocks, &workers),
                support::select(&mut b, blocks, &workers),
            );
            match (&x, &y) {
                (Ok(x), Ok(y)) => assert_eq!(x, y, "{instance}, fleet {seed}"),
                (Err(x), Err(y)) => assert_eq!(x.to_string(), y.to_string(), "{instance}"),
                _ => panic!("{instance}, fleet {seed}: isolated {x:?}, in process {y:?}"),
            }
            compared += 1;
        }
    }
    assert_eq!(compared, 600);
}

#[test]
fn an_unknown_isolation_mode_is_refused_with_what_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let error = start_error(
        dir.path(),
        &format!(
            "plugins:\n  - path: {}\n    isolation: sandbox\n",
            rust_plugin("least_busy").display()
        ),
    );
    assert!(
        error.contains("config.yaml:2")
            && error.contains("expected `none`, `process`")
            && error.contains("{process: NAME}")
            && error.contains("sandbox"),
        "{error}"
    );
}

#[test]
fn labels_cross_to_an_isolated_policy_that_composes_the_routers_built_ins() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = dir.path().join("fleet.yaml");
    std::fs::write(
        &fleet,
        "- {worker_id: 1, labels: {zone: b}}\n- {worker_id: 2, active_requests: 4, labels: {zone: a, gpu: h100}}\n- {worker_id: 3, active_requests: 1, labels: {zone: a}}\n- {worker_id: 4, labels: {zone: a}, active_requests: 3}\n",
    )
    .unwrap();
    let explain = |isolation: &str| {
        let sub = dir.path().join(isolation);
        std::fs::create_dir_all(&sub).unwrap();
        let config = write_config(
            &sub,
            &format!(
                "plugins:\n  - path: {}\n    isolation: {isolation}\nisolation: {{call_deadline_ms: 30000}}\n\
                 worker_selection:\n  instances:\n\
                 \x20   - {{name: zone-policy, type: c.zone-least-busy, parameters: {{zone: a}}}}\n\
                 \x20   - name: zone-filter\n      filters: [{{type: c.label-equals, parameters: {{key: zone, value: a}}}}]\n\
                 \x20     scorers: [{{type: builtin.active-requests}}]\n      picker: {{type: builtin.lowest-cost}}\n",
                cmake_plugin("zone_c").display()
            ),
        );
        ["zone-policy", "zone-filter"].map(|instance| {
            run(Command::new(switchyard_bin())
                .args(["select", "--explain", "--instance", instance, "--config"])
                .arg(&config)
                .arg("--fleet")
                .arg(&fleet))
        })
    };
    let (isolated, in_process) = (explain("process"), explain("none"));
    assert_eq!(isolated, in_process);
    assert!(
        isolated[0].contains("filter c.label-equals")
            && isolated[0].contains("builtin.active-requests")
            && isolated[0].ends_with("worker 3 dp_rank 0\n"),
        "the plugin's label filter (in its process), then the router's scorer and picker:\n{}",
        isolated[0]
    );
}

#[test]
fn check_reports_an_isolated_library_that_crashes_or_hangs_loading_or_creating() {
    let dir = tempfile::tempdir().unwrap();
    for (define, phase, cause) in [
        (
            "CTOR_ABORT",
            "loading (constructors) and registering",
            "SIGABRT",
        ),
        (
            "CTOR_HANG",
            "loading (constructors) and registering",
            "killed by the router: it did not answer within 500 ms",
        ),
        (
            "REGISTER_SEGV",
            "loading (constructors) and registering",
            "SIGSEGV",
        ),
        (
            "CREATE_SEGV",
            "creating an instance of `fixture.keep-all`",
            "SIGSEGV",
        ),
    ] {
        let lib = broken_plugin(dir.path(), &format!("crash_{define}"), &[define]);
        let config = write_config(
            dir.path(),
            &format!(
                "plugins:\n  - path: {}\n    isolation: process\nisolation: {{control_timeout_ms: 500}}\nworker_selection:\n  instances:\n    - name: c\n      filters: [{{type: fixture.keep-all}}]\n      picker: {{type: builtin.lowest-cost}}\n",
                lib.display()
            ),
        );
        let output = Command::new(switchyard_bin())
            .args(["check", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{define}: {stderr}");
        for expected in [&lib.display().to_string(), phase, cause] {
            assert!(
                stderr.contains(expected),
                "{define}: `{expected}` in {stderr}"
            );
        }
    }
}

#[test]
fn the_documented_isolation_configs_parse_to_what_they_say() {
    use switchyard::config::{ConfigSource, Isolation, IsolationMode, IsolationSettings};
    let parse = |doc: &str| {
        let text = std::fs::read_to_string(repo().join(doc)).unwrap();
        let first = blocks(&text, "yaml")
            .into_iter()
            .next()
            .expect("a YAML block");
        ConfigSource::parse(first, doc.into(), repo()).unwrap_or_else(|e| panic!("{doc}: {e}"))
    };
    let guide = parse("docs/isolation.md");
    let modes: Vec<&Isolation> = guide.config.plugins.iter().map(|p| &p.isolation).collect();
    assert_eq!(
        modes,
        [
            &Isolation::Mode(IsolationMode::Process),
            &Isolation::Group {
                process: "vendor".into()
            },
            &Isolation::Group {
                process: "vendor".into()
            },
            &Isolation::Mode(IsolationMode::None),
        ]
    );
    let settings = &guide.config.isolation;
    assert_eq!(
        (
            settings.call_deadline_ms,
            settings.memory_limit_mb,
            settings.cpu_time_limit_secs,
            settings.seccomp
        ),
        (50.0, Some(4096), Some(86_400), true)
    );
    // The configuration reference shows the defaults.
    let reference = parse("docs/configuration.md");
    assert_eq!(reference.config.isolation, IsolationSettings::default());
}

#[test]
fn isolated_policies_serve_many_threads_at_once() {
    std::env::set_var("SWITCHYARD_EXE", switchyard_bin());
    let dir = tempfile::tempdir().unwrap();
    let startup = start_yaml(
        dir.path(),
        &format!(
            "plugins:\n  - {{path: {}, isolation: {{process: vendor}}}}\n  - {{path: {}, isolation: {{process: vendor}}}}\n\
             isolation: {{call_deadline_ms: 30000}}\n\
             worker_selection:\n  instances:\n\
             \x20   - {{name: c, type: c.least-busy}}\n\
             \x20   - {{name: cpp, type: cpp.least-busy}}\n",
            cmake_plugin("least_busy_c").display(),
            cmake_plugin("least_busy_cpp").display(),
        ),
    )
    .expect("starts");
    // Four policies (two instances, two partitions each) in one child, each behind its
    // own lock as the router holds them, called from eight threads at once.
    let selectors: Vec<std::sync::Mutex<switchyard::policy::Selector>> = ["c", "cpp"]
        .into_iter()
        .flat_map(|instance| {
            let factory = startup.instance(instance).unwrap();
            ["m1", "m2"].map(|model| {
                std::sync::Mutex::new(switchyard::policy::Selector::new(
                    factory
                        .build(&switchyard::plugin::PartitionKey::new(
                            model,
                            switchyard_plugin_sdk::WorkerType::Select,
                        ))
                        .unwrap(),
                ))
            })
        })
        .collect();
    let selectors = &selectors;
    std::thread::scope(|scope| {
        for thread in 0..8u64 {
            scope.spawn(move || {
                for round in 0..250u64 {
                    let workers = fleet(thread * 1000 + round, 1 + (round as usize % 40));
                    // The least busy worker among those the filter keeps (overlap >= 0).
                    let least = workers.iter().map(|w| w.active).min().unwrap();
                    let mut selector = selectors[(thread + round) as usize % 4].lock().unwrap();
                    let chosen = support::select(&mut selector, 8, &workers)
                        .unwrap_or_else(|e| panic!("thread {thread}, round {round}: {e}"));
                    let active = workers.iter().find(|w| w.id == chosen).unwrap().active;
                    assert_eq!(active, least, "thread {thread}, round {round}");
                }
            });
        }
    });
    let process = startup.registry.processes().next().unwrap().snapshot();
    assert!(process.calls >= 2000 * 3, "{process:?}");
    assert!(
        process.exits.is_empty() && process.deadline_misses == 0,
        "{process:?}"
    );
}

/// The probe child of a `check` killed with SIGKILL (no chance to clean up) ends with
/// it: a library whose constructor hangs holds the probe for 20 s otherwise.
#[test]
fn a_probe_child_does_not_outlive_a_killed_check() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "hang_CTOR_HANG", &["CTOR_HANG"]);
    let config = write_config(
        dir.path(),
        &format!(
            "plugins:\n  - path: {}\nworker_selection:\n  default: default\n",
            lib.display()
        ),
    );
    let mut check = Command::new(switchyard_bin())
        .args(["check", "--config"])
        .arg(&config)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let children_of = |parent: u32| -> Vec<u32> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // `pid (comm) state ppid ...`: comm may hold spaces, so read after the `)`.
            let after = &stat[stat.rfind(')').unwrap_or(0) + 1..];
            if after.split_whitespace().nth(1) == Some(&parent.to_string()) {
                found.push(pid);
            }
        }
        found
    };
    let mut probe = Vec::new();
    eventually("the probe child starts", ISOLATION_WAIT, || {
        probe = children_of(check.id());
        !probe.is_empty()
    });
    check.kill().unwrap();
    check.wait().unwrap();
    let alive = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            !stat[stat.rfind(')').unwrap_or(0) + 1..]
                .trim_start()
                .starts_with('Z')
        })
    };
    eventually(
        "the probe child ends with its killed parent",
        ISOLATION_WAIT,
        || probe.iter().all(|&pid| !alive(pid)),
    );
}
