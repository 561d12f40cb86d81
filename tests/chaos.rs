//! Chaos with every example plugin loaded (issue #46): the real router, with the Rust, C
//! and C++ example plugins (some in its process, some `isolation: process`), in front of
//! three `engine-sim` engines, under a mixed load for `SWITCHYARD_CHAOS_SECS` seconds (60
//! by default, as CI runs it; `make soak` runs 600): streamed and plain chat with
//! hang-ups, `/v1/select`, `/v1/reserve` + `DELETE /v1/requests/{id}`, `POST` and
//! `DELETE /v1/workers` (partitions built and dropped: plugin instances created and
//! destroyed), KV-event posts, connection floods; a reload every 3 s that swaps the
//! plugins' versions (two builds at two paths), which of them run isolated, the default
//! instance, and removes or re-adds a worker; an engine killed and restarted every 3 s.
//! Then SIGTERM under load.
//!
//! Asserts: the router never dies (by a signal or otherwise) while serving, every
//! request is answered, no booking is left, `/metrics` series and resident memory are flat
//! after warm-up, and after SIGTERM it exits with status 0.
//!
//! `SWITCHYARD_CHAOS_PLUGIN_DIR` names another folder of C/C++ example plugins (the
//! sanitizer build of CI: `-DSWITCHYARD_SANITIZE=ON`); the router then runs with the ASan
//! runtime preloaded and every sanitizer report aborting it.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use support::load::*;
use support::pacing::Stop;
use support::*;

/// The C and C++ example plugins, by library name.
const CMAKE_PLUGINS: [&str; 7] = [
    "least_busy_c",
    "zone_c",
    "header_match_c",
    "tenant_allowlist_c",
    "least_busy_cpp",
    "session_affinity_cpp",
    "lora_affinity_cpp",
];

/// Where the C/C++ plugins come from, and whether they are the sanitizer build.
fn cmake_plugin_dir() -> (PathBuf, bool) {
    match std::env::var_os("SWITCHYARD_CHAOS_PLUGIN_DIR") {
        Some(dir) => (repo().join(dir), true),
        None => (
            cmake_plugin("least_busy_c").parent().unwrap().to_owned(),
            false,
        ),
    }
}

/// Two copies ("versions") of every example plugin, in `dir/v0` and `dir/v1`: a reload
/// that names the other folder loads another build of each library.
fn plugin_versions(dir: &Path) -> bool {
    let (cmake_dir, sanitized) = cmake_plugin_dir();
    for version in ["v0", "v1"] {
        let to = dir.join(version);
        std::fs::create_dir_all(&to).unwrap();
        std::fs::copy(rust_plugin("least_busy"), to.join("libleast_busy.so")).unwrap();
        for lib in CMAKE_PLUGINS {
            let name = format!("lib{lib}.so");
            let from = cmake_dir.join(&name);
            assert!(from.exists(), "{} is missing", from.display());
            std::fs::copy(from, to.join(name)).unwrap();
        }
    }
    sanitized
}

/// The `plugins:` section of round `round`: version `round % 2`; the C++ least-busy and
/// LoRA scorer and the C tenant allowlist isolated in odd rounds, the C least-busy in
/// even ones. A sanitized build is not probed (the probe's memory limit leaves ASan no
/// room for its shadow memory).
fn plugins_section(dir: &Path, round: u64, sanitized: bool) -> String {
    let version = dir.join(format!("v{}", round % 2));
    let odd = round % 2 == 1;
    let isolated_in = |lib: &str| match lib {
        "least_busy_cpp" | "lora_affinity_cpp" | "tenant_allowlist_c" => odd,
        "least_busy_c" => !odd,
        _ => false,
    };
    let mut section = String::from("plugins:\n");
    for lib in std::iter::once("least_busy").chain(CMAKE_PLUGINS) {
        let path = version.join(format!("lib{lib}.so"));
        section.push_str(&format!("  - path: {}\n", path.display()));
        if isolated_in(lib) {
            section.push_str("    isolation: process\n");
        } else if sanitized {
            section.push_str("    probe: false\n");
        }
    }
    section
}

/// The instances every round configures: each plugin's policy types and components.
const INSTANCES: &str = "    - name: least-busy
      type: least-busy
      parameters: {min_device_overlap_blocks: 0}
    - name: least-busy-c
      type: c.least-busy
      parameters: {min_device_overlap_blocks: 0}
    - name: least-busy-cpp
      type: cpp.least-busy
      parameters: {min_device_overlap_blocks: 0}
    - name: sticky
      type: cpp.session-affinity
      parameters: {affinity_weight: 4}
    - name: zoned
      type: c.zone-least-busy
      parameters: {zone: a}
    - name: composed
      on_error: fallback
      filters:
        - {type: c.min-device-overlap, parameters: {min_blocks: 0}}
        - {type: c.label-equals, parameters: {key: zone, value: a}}
        - {type: c.label-matches-header, parameters: {label: zone, header: x-zone}}
      scorers:
        - {type: cpp.active-requests, weight: 1.0}
        - {type: acme.active-requests, weight: 0.5}
        - {type: cpp.sticky-session, parameters: {miss_cost: 2}}
        - {type: cpp.lora-affinity}
        - {type: builtin.kv-overlap, weight: 2.0}
      picker: {type: acme.lowest-cost}
";

/// Instance names, in the order the rounds make each the default.
const INSTANCE_NAMES: [&str; 6] = [
    "least-busy",
    "least-busy-c",
    "least-busy-cpp",
    "sticky",
    "zoned",
    "composed",
];

/// The config of round `round`: the three engines on `ports` (engine 3 left out in
/// rounds that are 2 mod 3, then re-added), a KV-only worker, and the admitters.
fn chaos_config(dir: &Path, ports: &[u16; 3], round: u64, sanitized: bool) -> String {
    let workers: String = ports
        .iter()
        .enumerate()
        .filter(|(i, _)| *i < 2 || round % 3 != 2)
        .map(|(i, port)| {
            let zone = if i == 0 { "b" } else { "a" };
            format!(
                "  - {{model: demo, worker_id: {}, url: \"http://127.0.0.1:{port}\", labels: {{zone: {zone}}}}}\n",
                i + 1
            )
        })
        .collect();
    let default = INSTANCE_NAMES[(round % INSTANCE_NAMES.len() as u64) as usize];
    format!(
        "{plugins}\
         models:\n  demo: {{kv_tracking: predicted}}\n\
         frontend: {{health_interval_ms: 100, unhealthy_cooldown_ms: 300, connect_timeout_ms: 300, connect_retries: 3, request_timeout_secs: 10}}\n\
         request_attributes: {{headers: [x-zone]}}\n\
         isolation: {{call_deadline_ms: 2000}}\n\
         admission:\n  admitters:\n    - type: acme.shed-when-saturated\n      parameters: {{keep_priority: -1000}}\n\
         worker_selection:\n  default: {default}\n  instances:\n{INSTANCES}\
         workers:\n{workers}  - {{model: kvonly, worker_id: 9, total_kv_blocks: 50000}}\n",
        plugins = plugins_section(dir, round, sanitized),
    )
}

/// The router with the sanitizer runtime when the plugins are the sanitizer build: every
/// report aborts (a death by signal, which the test catches); leaks are not checked (the
/// router keeps some allocations for its lifetime on purpose).
fn serve_chaos(config: &Path, sanitized: bool) -> Process {
    let mut command = Command::new(switchyard_bin());
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(config)
        .env("RUST_LOG", "warn");
    if sanitized {
        let asan = run(Command::new("cc").arg("-print-file-name=libasan.so"));
        command
            .env("LD_PRELOAD", asan.trim())
            .env(
                "ASAN_OPTIONS",
                "detect_leaks=0:abort_on_error=1:halt_on_error=1:handle_segv=0",
            )
            .env(
                "UBSAN_OPTIONS",
                "halt_on_error=1:abort_on_error=1:print_stacktrace=1",
            );
    }
    Process::start(&mut command, "switchyard listening on ")
}

/// What the clients of the HTTP API saw: answers (any status) and requests that got none.
#[derive(Default)]
struct ApiCounts {
    answered: AtomicU64,
    unanswered: AtomicU64,
}

impl ApiCounts {
    /// Counts one call's outcome; a 5xx other than 503 (busy) is a failure to report.
    fn record(&self, what: &str, outcome: Result<(u16, String), String>) -> Option<(u16, String)> {
        match outcome {
            Ok((status, text)) => {
                assert!(status < 500 || status == 503, "{what}: {status} {text}");
                self.answered.fetch_add(1, Ordering::Relaxed);
                Some((status, text))
            }
            Err(e) => {
                eprintln!("{what}: unanswered: {e}");
                self.unanswered.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }
}

/// `/v1/select` over every instance (sessions for the sticky ones, a zone header for the
/// label filters), and `/v1/reserve` + `DELETE /v1/requests/{id}`, until `stop`.
fn select_and_reserve_until_stopped(base: &str, client: u64, stop: &Stop, counts: &ApiCounts) {
    let agent = agent();
    let mut n = 0u64;
    while !stop.stopped() {
        n += 1;
        let instance = INSTANCE_NAMES[(n % INSTANCE_NAMES.len() as u64) as usize];
        let hashes: Vec<u64> = (0..(n % 16)).map(|i| (n % 7) << 32 | i).collect();
        let session =
            json!({"session_id": format!("s{}", n % 11), "session_final": n.is_multiple_of(13)});
        let select = json!({"model": "demo", "instance": instance, "block_hashes": hashes,
            "session": session, "attributes": {"headers": {"x-zone": "a"}}});
        counts.record(
            "select",
            call(&agent, "POST", &format!("{base}/v1/select"), Some(&select)),
        );
        let id = format!("c{client}-{n}");
        let reserve = json!({"model": "demo", "instance": instance, "block_hashes": hashes,
            "request_id": id, "session": session, "wait": false});
        let reserved = counts.record(
            "reserve",
            call(
                &agent,
                "POST",
                &format!("{base}/v1/reserve"),
                Some(&reserve),
            ),
        );
        if matches!(reserved, Some((200, _))) {
            let free = call(&agent, "DELETE", &format!("{base}/v1/requests/{id}"), None);
            counts.record("free", free);
        }
    }
}

/// Workers added and removed through the API (a partition of their own, built and
/// dropped each time), and KV events for the KV-only worker, until `stop`.
fn membership_until_stopped(base: &str, stop: &Stop, counts: &ApiCounts) {
    let agent = agent();
    let mut n = 0u64;
    loop {
        n += 1;
        let id = 100 + n % 4;
        let worker = json!({"model": format!("scratch-{}", n % 3), "worker_id": id});
        counts.record(
            "add worker",
            call(&agent, "POST", &format!("{base}/v1/workers"), Some(&worker)),
        );
        let hashes: Vec<u64> = (0..500).map(|i| n << 20 | i).collect();
        let events = if n.is_multiple_of(10) {
            json!([{"type": "cleared"}])
        } else {
            json!([{"type": "stored", "block_hashes": hashes}])
        };
        let body = json!({"worker_id": 9, "events": events});
        counts.record(
            "kv events",
            call(&agent, "POST", &format!("{base}/v1/kv_events"), Some(&body)),
        );
        let select = json!({"model": format!("scratch-{}", n % 3)});
        counts.record(
            "select scratch",
            call(&agent, "POST", &format!("{base}/v1/select"), Some(&select)),
        );
        let removed = call(&agent, "DELETE", &format!("{base}/v1/workers/{id}"), None);
        counts.record("remove worker", removed);
        if stop.pause(Duration::from_millis(20)) {
            break;
        }
    }
}

/// A reload every 3 s, each with the next round's config, until `stop`; how many.
fn reload_until_stopped(
    base: &str,
    config: &Path,
    yaml: &dyn Fn(u64) -> String,
    stop: &Stop,
) -> u64 {
    let agent = agent();
    let mut round = 0;
    while !stop.pause(Duration::from_secs(3)) {
        round += 1;
        std::fs::write(config, yaml(round)).unwrap();
        let (status, text) = call(&agent, "POST", &format!("{base}/v1/admin/reload"), None)
            .unwrap_or_else(|e| panic!("reload {round}: no answer: {e}"));
        assert_eq!(status, 200, "reload {round}: {text}");
    }
    round
}

/// Connection floods: 600 idle and slowloris connections held for 2 s, every 10 s.
fn flood_until_stopped(base: &str, stop: &Stop) {
    let address = base.trim_start_matches("http://");
    let (host, port) = address.rsplit_once(':').unwrap();
    let script = repo().join("tests/support/flood.py");
    let mut mode = "idle";
    loop {
        let status = Command::new("python3")
            .arg(&script)
            .args([host, port, "1", "1", "600", "2", mode])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("python3 runs");
        assert!(status.success(), "the flood script failed: {status}");
        mode = if mode == "idle" { "slowloris" } else { "idle" };
        if stop.pause(Duration::from_secs(8)) {
            break;
        }
    }
}

/// The router's `/metrics` series but those of the `scratch-*` partitions, which come and
/// go with the workers `membership_until_stopped` adds and removes (hundreds of series
/// each: present or not at the moment of a sample, they are not growth).
fn lasting_series(base: &str) -> BTreeSet<String> {
    let mut series = series_names(base);
    series.retain(|s| !s.contains("scratch-"));
    series
}

/// Fails if the router has exited (it must serve until SIGTERM), saying how.
fn still_running(router: &mut Process, when: &str) {
    if let Some(status) = router.child.try_wait().unwrap() {
        panic!("the router died {when}: {status}");
    }
}

/// `length` of the run: the router must still be serving at its end (checked first: its
/// death is what fails the load), and no load thread may have failed meanwhile.
fn run_phase(stop: &Stop, router: &mut Process, length: Duration, when: &str) {
    let stopped_early = stop.pause(length);
    still_running(router, when);
    assert!(
        !stopped_early,
        "a load thread failed {when} (its panic is printed above)"
    );
}

/// SIGTERM with chat clients still sending; the exit status (at most 60 s later).
fn terminate_under_load(router: &mut Process, base: &str) -> std::process::ExitStatus {
    let stop = Stop::new();
    let counts = Arc::new(Counts::default());
    let clients: Vec<_> = (0..4u64)
        .map(|client| {
            let (base, counts) = (base.to_owned(), counts.clone());
            stop.spawn(move |stop| chat_until_stopped(&base, client, stop, &counts))
        })
        .collect();
    // Under load: SIGTERM lands while the clients keep sending.
    wait_for("the clients' chats to be answered", || {
        counts.answered.load(Ordering::Relaxed) >= 8
    });
    let pid = nix::unistd::Pid::from_raw(router.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = eventually_ok(
        "the router exits after SIGTERM",
        Duration::from_secs(60),
        || router.child.try_wait().unwrap().ok_or("still running"),
    );
    stop.stop();
    for client in clients {
        client.join().unwrap();
    }
    status
}

/// Starts every load thread of the run against `base`; they end at `stop`.
fn start_load(
    base: &str,
    stop: &Stop,
    chats: &Arc<Counts>,
    api: &Arc<ApiCounts>,
) -> Vec<std::thread::JoinHandle<()>> {
    let mut threads = Vec::new();
    for client in 0..4u64 {
        let (base, chats) = (base.to_owned(), chats.clone());
        threads.push(stop.spawn(move |stop| chat_until_stopped(&base, client, stop, &chats)));
    }
    for client in 0..2u64 {
        let (base, api) = (base.to_owned(), api.clone());
        threads.push(
            stop.spawn(move |stop| select_and_reserve_until_stopped(&base, client, stop, &api)),
        );
    }
    let (base_m, api_m) = (base.to_owned(), api.clone());
    threads.push(stop.spawn(move |stop| membership_until_stopped(&base_m, stop, &api_m)));
    let base_f = base.to_owned();
    threads.push(stop.spawn(move |stop| flood_until_stopped(&base_f, stop)));
    threads
}

/// Prints what the run did; asserts every request was answered and the `/metrics`
/// series and resident memory stayed flat after warm-up (the new series are named).
fn report_and_check(
    what: &str,
    (chats, api): (&Counts, &ApiCounts),
    (series_warm, series_end): (&BTreeSet<String>, &BTreeSet<String>),
    (rss_warm, rss_end): (u64, u64),
    sanitized: bool,
) {
    let [answered, errors, hung_up, unanswered] = chats.get();
    let api_answered = api.answered.load(Ordering::Relaxed);
    let api_unanswered = api.unanswered.load(Ordering::Relaxed);
    let (warm, end) = (series_warm.len(), series_end.len());
    eprintln!(
        "{what}: chat {answered} answered, {errors} OpenAI errors, {hung_up} hung up, {unanswered} unanswered; API {api_answered} answered, {api_unanswered} unanswered; /metrics series {warm} after warm-up, {end} at the end; RSS {rss_warm} KiB after warm-up, {rss_end} KiB at the end"
    );
    assert_eq!(
        (unanswered, api_unanswered),
        (0, 0),
        "requests left without an answer"
    );
    assert!(
        answered > 50 && api_answered > 50,
        "too little traffic to mean anything"
    );
    let new: Vec<&String> = series_end.difference(series_warm).take(20).collect();
    assert!(
        end as f64 <= warm as f64 * 1.05,
        "/metrics grew from {warm} to {end} series; new ones include {new:#?}"
    );
    // AddressSanitizer, preloaded for the sanitizer build, holds freed memory in its
    // quarantine (256 MB by default) to catch uses after free: resident memory then says
    // nothing about the router's own.
    assert!(
        sanitized || rss_end as f64 <= rss_warm as f64 * 1.25 + 8_192.0,
        "resident memory grew from {rss_warm} to {rss_end} KiB"
    );
}

#[test]
fn chaos_with_every_example_plugin_never_kills_the_router() {
    let seconds: u64 = std::env::var("SWITCHYARD_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let dir = tempfile::tempdir().unwrap();
    let sanitized = plugin_versions(dir.path());
    let (ports, start_engine) = restartable_engines();
    let engines = Arc::new(Mutex::new((0..3).map(&start_engine).collect::<Vec<_>>()));
    let plugins_dir = dir.path().to_owned();
    let yaml = move |round: u64| chaos_config(&plugins_dir, &ports, round, sanitized);
    let config = write_config(dir.path(), &yaml(0));
    let mut router = serve_chaos(&config, sanitized);
    let base = router.address.clone();
    let stop = Stop::new();
    let (chats, api) = (Arc::new(Counts::default()), Arc::new(ApiCounts::default()));
    let mut threads = start_load(&base, &stop, &chats, &api);
    {
        let engines = engines.clone();
        threads.push(
            stop.spawn(move |stop| restart_engines_until_stopped(&engines, start_engine, stop)),
        );
    }
    let reloads = {
        let (base, config) = (base.clone(), config.clone());
        stop.spawn(move |stop| reload_until_stopped(&base, &config, &yaml, stop))
    };
    let warm_up = Duration::from_secs((seconds / 4).max(10));
    run_phase(&stop, &mut router, warm_up, "during warm-up");
    let (series_warm, rss_warm) = (lasting_series(&base), resident_kib(router.pid()));
    let rest = Duration::from_secs(seconds).saturating_sub(warm_up);
    run_phase(&stop, &mut router, rest, "under the load");
    let (series_end, rss_end) = (lasting_series(&base), resident_kib(router.pid()));
    stop.stop();
    for thread in threads {
        thread.join().unwrap();
    }
    let reloads = reloads.join().unwrap();
    wait_for_no_bookings(&base, Duration::from_secs(30));
    still_running(&mut router, "after the load");
    report_and_check(
        &format!(
            "chaos {seconds} s ({reloads} reloads{})",
            if sanitized { ", sanitized plugins" } else { "" }
        ),
        (&chats, &api),
        (&series_warm, &series_end),
        (rss_warm, rss_end),
        sanitized,
    );
    assert!(reloads >= 2, "too few reloads to mean anything");
    let status = terminate_under_load(&mut router, &base);
    eprintln!("after SIGTERM under load: {status}");
    assert_eq!(
        status.code(),
        Some(0),
        "the router's exit after SIGTERM: {status}"
    );
}

/// The lines `destroyed THREAD` of the lifecycle fixture's log at `log`.
fn destroyed_on(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("destroyed "))
        .map(str::to_owned)
        .collect()
}

/// A partition dropped by `DELETE /v1/workers` and a generation retired by a reload
/// destroy their plugin instances on the retirement thread, not on the thread that let
/// go last (an executor thread, or the reload's).
#[test]
fn plugin_instances_are_destroyed_on_the_retirement_thread() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = compile_c(
        dir.path(),
        "lifecycle",
        &repo().join("tests/fixtures/lifecycle_plugin.c"),
        &repo().join("include"),
        &["LOG_DESTROY"],
    );
    let log = dir.path().join("lifecycle.log");
    let config = write_config(
        dir.path(),
        &format!(
            "plugins:\n  - path: {}\nworker_selection:\n  default: logged\n  instances:\n    - name: logged\n      scorers: [{{type: fixture.lifecycle-log, parameters: {{log: {}}}}}]\n      picker: {{type: builtin.lowest-cost}}\nworkers:\n  - {{model: m, worker_id: 1}}\n",
            plugin.display(),
            log.display()
        ),
    );
    let server = Server::start(&config);
    // Startup and reload validate each instance by building and dropping it (on their
    // own threads); the retirement thread's name, as the kernel keeps it (15 bytes):
    let retired = || {
        destroyed_on(&log)
            .iter()
            .filter(|thread| *thread == "switchyard-reti")
            .count()
    };
    server.ok("/v1/workers", json!({"model": "other", "worker_id": 2}));
    server.delete("/v1/workers/2");
    wait_for(
        "the dropped partition's instance is destroyed on the retirement thread",
        || retired() == 1,
    );
    server.ok("/v1/admin/reload", json!({}));
    wait_for(
        "the retired generation's instance is destroyed on the retirement thread",
        || retired() == 2,
    );
}
