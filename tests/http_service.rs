//! End to end over loopback: `switchyard serve` with plugins of all three languages,
//! workers registered and KV events posted over HTTP, requests routed to the expected
//! overlap, load visible in the next decision, free returning counts to zero; and every
//! malformed-input class answered with its status and a message.

#[path = "http_service/malformed.rs"]
mod malformed;
mod support;

use std::process::Command;

use serde_json::{json, Value};
use support::*;

fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let yaml = format!(
        "plugins:\n  - path: {}\n  - path: {}\n  - path: {}\n  - path: {}\n\
         worker_selection:\n  default: least-busy-cpp\n  instances:\n\
         \x20   - {{name: least-busy, type: least-busy}}\n\
         \x20   - {{name: least-busy-c, type: c.least-busy}}\n\
         \x20   - {{name: least-busy-cpp, type: cpp.least-busy}}\n\
         \x20   - {{name: picky, type: c.least-busy, parameters: {{min_device_overlap_blocks: 100}}}}\n\
         \x20   - name: kv\n      scorers: [{{type: builtin.kv-overlap}}]\n      picker: {{type: c.lowest-cost}}\n\
         \x20   - name: fragile\n      scorers: [{{type: cpp.throwing-scorer}}]\n      picker: {{type: cpp.lowest-cost}}\n\
         \x20   - name: resilient\n      on_error: fallback\n      scorers: [{{type: cpp.throwing-scorer}}]\n      picker: {{type: cpp.lowest-cost}}\n",
        rust_plugin("least_busy").display(),
        cmake_plugin("least_busy_c").display(),
        cmake_plugin("least_busy_cpp").display(),
        cmake_plugin("session_affinity_cpp").display()
    );
    write_config(dir, &yaml)
}

fn worker_load(server: &Server, id: u64) -> Value {
    let (_, workers) = server.call("GET", "/v1/workers", None);
    workers
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["worker_id"] == id)
        .unwrap()["load"]
        .clone()
}

/// Device overlap decides (block hashes, and token ids the router hashes); the prompt.
fn routes_by_overlap(server: &Server) -> serde_json::Value {
    // Worker 2 holds the first 4 blocks of the prompt on device; worker 3 the first 2.
    server.ok(
        "/v1/kv_events",
        json!({"worker_id": 2, "events": [{"type": "stored", "block_hashes": [11, 12, 13, 14]}]}),
    );
    server.ok("/v1/kv_events", json!({"worker_id": 3, "events": [{"type": "stored", "tier": "device", "block_hashes": [11, 12]}, {"type": "stored", "tier": "host", "block_hashes": [11, 12, 13]}]}));
    let prompt = json!([11, 12, 13, 14, 15, 16]);
    let decision = server.ok(
        "/v1/select",
        json!({"model": "m", "instance": "kv", "block_hashes": prompt}),
    );
    assert_eq!(
        (
            decision["worker_id"].as_u64(),
            decision["device_overlap_blocks"].as_u64()
        ),
        (Some(2), Some(4)),
        "{decision}"
    );
    assert_eq!(decision["request_blocks"], 6);

    // Token ids are hashed by the router: store a 3-block prompt on worker 3 by its hashes.
    let tokens: Vec<u32> = (0..48).collect();
    let mut hashes = Vec::new();
    switchyard::fleet::kv_index::hash_tokens(&tokens, 16, &mut hashes);
    server.ok(
        "/v1/kv_events",
        json!({"worker_id": 3, "events": [{"type": "stored", "block_hashes": hashes}]}),
    );
    let decision = server.ok(
        "/v1/select",
        json!({"model": "m", "instance": "kv", "token_ids": tokens}),
    );
    assert_eq!(
        (
            decision["worker_id"].as_u64(),
            decision["device_overlap_blocks"].as_u64()
        ),
        (Some(3), Some(3)),
        "{decision}"
    );

    prompt
}

/// Least busy in each language: reservations are visible in the next decision, and
/// prefill-complete and free give the load back.
fn reservations_count_in_the_next_decision(server: &Server) {
    // Least busy in each language: reservations are visible in the next decision.
    let mut chosen = Vec::new();
    for (n, instance) in [
        "least-busy",
        "least-busy-c",
        "least-busy-cpp",
        "least-busy",
        "least-busy-c",
        "least-busy-cpp",
    ]
    .iter()
    .enumerate()
    {
        let d = server.ok("/v1/reserve", json!({"model": "m", "instance": instance, "block_hashes": [1, 2], "request_id": format!("r{n}"), "expected_output_tokens": 32}));
        chosen.push(d["worker_id"].as_u64().unwrap());
    }
    assert_eq!(
        chosen,
        vec![1, 2, 3, 1, 2, 3],
        "each reservation goes to the least busy, ties to the lowest id"
    );
    assert_eq!(
        worker_load(server, 1),
        json!({"active_requests": 2, "active_prefill_tokens": 64, "active_decode_blocks": 8})
    );
    assert!(server
        .metrics()
        .contains("switchyard_worker_active_requests{worker_id=\"1\",dp_rank=\"0\"} 2"));

    server.ok("/v1/requests/r0/prefill_complete", json!({}));
    assert_eq!(worker_load(server, 1)["active_prefill_tokens"], 32);
    for n in 0..6 {
        let path = format!("/v1/requests/r{n}");
        let (status, body) = server.call("DELETE", &path, None);
        assert_eq!(status, 200, "{body}");
    }
    for id in 1..=3 {
        assert_eq!(
            worker_load(server, id),
            json!({"active_requests": 0, "active_prefill_tokens": 0, "active_decode_blocks": 0})
        );
    }
}

#[test]
fn routes_by_overlap_and_load_through_plugins_of_three_languages() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path()));
    assert_eq!(
        server.call("GET", "/readyz", None).0,
        503,
        "not ready without workers"
    );
    for id in 1..=3 {
        server.ok("/v1/workers", json!({"model": "m", "worker_id": id}));
    }
    assert_eq!(server.call("GET", "/readyz", None).0, 200);
    assert_eq!(server.call("GET", "/healthz", None).0, 200);

    let prompt = routes_by_overlap(&server);
    reservations_count_in_the_next_decision(&server);
    let (_, policies) = server.call("GET", "/v1/policies", None);
    assert_eq!(policies["default"], "least-busy-cpp");
    assert_eq!(policies["plugins"].as_array().unwrap().len(), 4);

    // Removing a worker forgets its cache: worker 2 no longer wins the overlap.
    assert_eq!(server.call("DELETE", "/v1/workers/2", None).0, 200);
    let decision = server.ok(
        "/v1/select",
        json!({"model": "m", "instance": "kv", "block_hashes": prompt}),
    );
    assert_eq!(decision["worker_id"], 3);
    let metrics = server.metrics();
    assert!(metrics.contains("switchyard_component_calls_total{instance=\"kv\",partition=\"m/select\",component=\"c.lowest-cost\",kind=\"picker\"} 3"), "{metrics}");
}

#[test]
fn sigterm_shuts_down_gracefully() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(&config(dir.path()));
    let status = Command::new("kill")
        .args(["-TERM", &server.process.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = server.process.child.wait().unwrap();
    assert!(exit.success(), "exit status after SIGTERM: {exit}");
}

#[test]
fn slow_components_do_not_delay_health_metrics_or_other_instances() {
    let dir = tempfile::tempdir().unwrap();
    let (gate, entered) = (dir.path().join("gate"), dir.path().join("entered"));
    std::fs::create_dir(&entered).unwrap();
    let gated = format!(
        "scorers: [{{type: panicky.gated, parameters: {{gate: {}, entered: {}}}}}]\n      picker: {{type: builtin.lowest-cost}}",
        gate.display(),
        entered.display()
    );
    // No probe: its first call would block on the gate like the selections below.
    let yaml = format!(
        "plugins:\n  - path: {}\n    probe: false\nworker_selection:\n  instances:\n\
         \x20   - name: slow-a\n      {gated}\n\
         \x20   - name: slow-b\n      {gated}\n\
         \x20   - {{name: fast, type: builtin.least-busy}}\n\
         router: {{request_expiry_secs: 1}}\n\
         workers:\n  - {{model: demo, worker_id: 1}}\n  - {{model: demo, worker_id: 2}}\n",
        rust_plugin("panicky").display()
    );
    let server = Server::start(&write_config(dir.path(), &yaml));
    let slow: Vec<_> = ["slow-a", "slow-b"]
        .into_iter()
        .map(|instance| {
            let url = format!("{}/v1/select", server.base);
            let body = json!({"model": "demo", "instance": instance, "token_ids": [1, 2, 3]});
            std::thread::spawn(move || {
                ureq::post(&url)
                    .timeout(std::time::Duration::from_secs(60))
                    .send_json(body)
                    .map(|r| r.status())
                    .map_err(|e| e.to_string())
            })
        })
        .collect();
    // Both selections are inside the plugin, blocked on the gate.
    eventually(
        "both slow selections started",
        std::time::Duration::from_secs(30),
        || std::fs::read_dir(&entered).unwrap().count() == 2,
    );
    // The reservation-expiry ticker (every second, a writer of the load lock) releases a
    // reservation while the slow components hold their selectors: no lock a writer needs
    // is held across plugin code, so nothing queues behind them.
    let reserved = ureq::post(&format!("{}/v1/reserve", server.base))
        .timeout(std::time::Duration::from_secs(20))
        .send_json(
            json!({"model": "demo", "instance": "fast", "block_hashes": [1], "request_id": "left"}),
        )
        .unwrap_or_else(|e| panic!("reserving while others are slow: {e}"));
    assert_eq!(reserved.status(), 200);
    eventually(
        "the expiry ticker releases the reservation",
        std::time::Duration::from_secs(20),
        || metric(&server.base, "switchyard_reservations_expired_total") >= 1.0,
    );
    let get = |path: &str| {
        ureq::get(&format!("{}{path}", server.base))
            .timeout(std::time::Duration::from_secs(20))
            .call()
            .unwrap_or_else(|e| panic!("GET {path} while components are slow: {e}"))
            .status()
    };
    assert_eq!(get("/healthz"), 200);
    assert_eq!(get("/metrics"), 200);
    assert_eq!(get("/v1/workers"), 200);
    for instance in ["fast", "default"] {
        let status = ureq::post(&format!("{}/v1/select", server.base))
            .timeout(std::time::Duration::from_secs(20))
            .send_json(json!({"model": "demo", "instance": instance, "token_ids": [1, 2, 3]}))
            .unwrap_or_else(|e| panic!("instance {instance} while others are slow: {e}"))
            .status();
        assert_eq!(status, 200);
    }
    assert!(
        slow.iter().all(|t| !t.is_finished()),
        "the slow selections are still in their plugin"
    );
    std::fs::write(&gate, b"").unwrap();
    for selection in slow {
        assert_eq!(selection.join().unwrap().unwrap(), 200);
    }
}

/// The label value of `name` in a parsed sample.
fn label_of<V>(sample: &openmetrics_parser::Sample<V>, name: &str) -> Option<String>
where
    V: openmetrics_parser::RenderableMetricValue + Clone,
{
    let labels = sample.get_labelset().ok()?;
    let value = labels
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.clone());
    value
}

/// 25 selections by the instance `weird`, 10 by `default`, and a KV event with a
/// timestamp.
fn select_and_post_an_event(server: &Server, weird: &str) {
    for (instance, n) in [(weird, 25), ("default", 10)] {
        for i in 0..n {
            server.ok(
                "/v1/select",
                json!({"model": "demo", "instance": instance, "token_ids": [i, 2, 3]}),
            );
        }
    }
    let sent = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    server.ok(
        "/v1/kv_events",
        json!({"worker_id": 1, "timestamp": sent, "events": [{"type": "stored", "block_hashes": [7]}]}),
    );
}

/// Every `switchyard_*` series the shipped Grafana dashboard queries.
fn dashboard_series() -> Vec<String> {
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("docs/grafana-dashboard.json")).unwrap(),
    )
    .unwrap();
    let mut used = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for (at, _) in expr.match_indices("switchyard_") {
                let name: String = expr[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                used.push(name);
            }
        }
    }
    used
}

/// The selection and component histograms: cumulative buckets, +Inf equal to the count,
/// one observation per selection of the instance `weird`.
fn histograms_are_cumulative(
    exposition: &openmetrics_parser::MetricsExposition<
        openmetrics_parser::PrometheusType,
        openmetrics_parser::PrometheusValue,
    >,
    weird: &str,
) {
    use openmetrics_parser::PrometheusValue;
    let family = |name: &str| {
        exposition
            .families
            .get(name)
            .unwrap_or_else(|| panic!("no family {name}"))
    };
    for name in [
        "switchyard_selection_duration_seconds",
        "switchyard_component_duration_seconds",
    ] {
        let mut seen = 0;
        for sample in family(name).iter_samples() {
            let PrometheusValue::Histogram(h) = &sample.value else {
                panic!("{name} is not a histogram")
            };
            let counts: Vec<f64> = h.buckets.iter().map(|b| b.count.as_f64()).collect();
            assert!(
                counts.windows(2).all(|w| w[0] <= w[1]),
                "{name}: buckets are cumulative: {counts:?}"
            );
            assert_eq!(h.buckets.last().unwrap().upper_bound, f64::INFINITY);
            assert_eq!(
                Some(*counts.last().unwrap() as u64),
                h.count,
                "{name}: +Inf bucket = count"
            );
            if label_of(sample, "instance").as_deref() == Some(weird) {
                seen += 1;
                assert_eq!(h.count, Some(25), "{name}: one observation per selection");
            }
        }
        assert!(seen >= 1, "{name} has series for the weird instance");
    }
}

#[test]
fn metrics_parse_as_prometheus_text_with_cumulative_histograms_and_escaped_labels() {
    use openmetrics_parser::{prometheus::parse_prometheus, PrometheusValue};
    let dir = tempfile::tempdir().unwrap();
    let weird = "quote\"and\nnewline";
    let yaml = "worker_selection:\n  instances:\n    - {name: \"quote\\\"and\\nnewline\", type: builtin.least-busy}\n\
                workers:\n  - {model: demo, worker_id: 1}\n  - {model: demo, worker_id: 2}\n";
    let server = Server::start(&write_config(dir.path(), yaml));
    select_and_post_an_event(&server, weird);
    let text = server.metrics();
    assert!(
        text.contains("switchyard_kv_event_lag_seconds_count 1\n"),
        "{text}"
    );
    let exposition = parse_prometheus(&text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
    let family = |name: &str| {
        exposition
            .families
            .get(name)
            .unwrap_or_else(|| panic!("no family {name} in:\n{text}"))
    };
    let selections: Vec<_> = family("switchyard_selections_total")
        .iter_samples()
        .collect();
    let count_of = |instance: &str| {
        selections
            .iter()
            .find(|s| label_of(s, "instance").as_deref() == Some(instance))
            .map(|s| match &s.value {
                PrometheusValue::Counter(c) => c.value.as_f64(),
                other => panic!("{other:?}"),
            })
    };
    assert_eq!(
        count_of(weird),
        Some(25.0),
        "the label value survives escaping"
    );
    assert_eq!(count_of("default"), Some(10.0));
    histograms_are_cumulative(&exposition, weird);
    let plugins = family("switchyard_plugin_info");
    assert_eq!(
        plugins.iter_samples().count(),
        0,
        "no plugin loaded in this config"
    );

    // Every series the shipped Grafana dashboard queries is one the router exports.
    let used = dashboard_series();
    assert!(
        used.len() >= 10,
        "the dashboard queries switchyard series: {used:?}"
    );
    for name in used {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(&name);
        assert!(
            exposition.families.contains_key(family),
            "the dashboard queries `{name}`, which /metrics does not export"
        );
    }
}

/// Resident memory of a process, in kB.
fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Sends requests `range` (request i asks `i % 10` blocks: 1 fails in the scorer, 2
/// gives NaN costs, 3 makes the picker answer an out-of-range row; the others route
/// normally); every answer that is not what its fault should give.
fn send_with_faults(base: &str, range: std::ops::Range<usize>) -> Vec<String> {
    let agent = ureq::AgentBuilder::new()
        .timeout(std::time::Duration::from_secs(30))
        .build();
    let mut unexpected = Vec::new();
    for i in range {
        let instance = if (i / 10) % 2 == 0 {
            "resilient"
        } else {
            "strict"
        };
        let blocks = i % 10;
        let id = format!("r{i}");
        let body = json!({"model": "demo", "instance": instance, "request_id": id,
                          "token_ids": vec![7u32; blocks * 16]});
        let faulty = (1..=3).contains(&blocks);
        match agent.post(&format!("{base}/v1/reserve")).send_json(body) {
            Ok(r) => {
                let decision: Value = r.into_json().unwrap();
                if decision["fallback"] != json!(faulty) {
                    unexpected.push(format!("{i}: {decision}"));
                }
                agent
                    .post(&format!("{base}/v1/requests/{id}/free"))
                    .call()
                    .unwrap();
            }
            Err(ureq::Error::Status(500, r)) if faulty && instance == "strict" => {
                let error: Value = r.into_json().unwrap();
                let component = if blocks == 3 {
                    "fixture.chaos-picker"
                } else {
                    "fixture.chaos"
                };
                if error["instance"] != "strict" || error["component"] != component {
                    unexpected.push(format!("{i}: {error}"));
                }
            }
            Err(e) => unexpected.push(format!("{i} ({instance}, {blocks} blocks): {e}")),
        }
    }
    unexpected
}

fn faults_counted(metrics: &str) {
    for instance in ["resilient", "strict"] {
        for (component, n) in [("fixture.chaos", 2_000), ("fixture.chaos-picker", 1_000)] {
            let line = format!(
                "switchyard_selection_errors_total{{instance=\"{instance}\",component=\"{component}\"}} {n}\n"
            );
            assert!(
                metrics.contains(&line),
                "missing `{}` in:\n{metrics}",
                line.trim()
            );
        }
    }
    assert!(
        metrics.contains("switchyard_fallbacks_total{instance=\"resilient\"} 3000\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("switchyard_fallbacks_total{instance=\"strict\"} 0\n"),
        "{metrics}"
    );
}

#[test]
fn twenty_thousand_requests_with_injected_faults_are_all_answered_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "chaos", &[]);
    let chaos = "scorers: [{type: fixture.chaos}]\n      picker: {type: fixture.chaos-picker}";
    let yaml = format!(
        "plugins:\n  - path: {}\nworker_selection:\n  instances:\n\
         \x20   - name: resilient\n      on_error: fallback\n      {chaos}\n\
         \x20   - name: strict\n      {chaos}\n\
         workers:\n  - {{model: demo, worker_id: 1}}\n  - {{model: demo, worker_id: 2}}\n  - {{model: demo, worker_id: 3}}\n",
        lib.display()
    );
    // Every injected fault is a logged warning: keep the test's output readable.
    let server = Server::start_logging(&write_config(dir.path(), &yaml), "error");
    const REQUESTS: usize = 20_000;
    const THREADS: usize = 64;
    let run = |from: usize, to: usize| {
        let base = server.base.clone();
        std::thread::spawn(move || send_with_faults(&base, from..to))
    };
    let per_thread = REQUESTS / THREADS + 1;
    let chunks = |start: usize, end: usize| {
        (start..end)
            .step_by(per_thread)
            .map(|from| run(from, (from + per_thread).min(end)))
            .collect::<Vec<_>>()
    };
    // A first quarter warms the server up; memory after it is the baseline.
    let warm: Vec<String> = chunks(0, REQUESTS / 4)
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let baseline = rss_kb(server.process.pid());
    let rest: Vec<String> = chunks(REQUESTS / 4, REQUESTS)
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let unexpected: Vec<_> = warm.into_iter().chain(rest).collect();
    assert!(
        unexpected.is_empty(),
        "{} unexpected answers, e.g. {:?}",
        unexpected.len(),
        &unexpected[..unexpected.len().min(5)]
    );
    let grown = rss_kb(server.process.pid()).saturating_sub(baseline);
    println!("resident memory: {baseline} kB after 5,000 requests, +{grown} kB after 20,000");
    assert!(
        grown < 32 * 1024,
        "resident memory grew by {grown} kB over 15,000 requests"
    );

    // The fault counters equal the faults injected: per instance, 1,000 of each kind.
    faults_counted(&server.metrics());
    for id in 1..=3 {
        let load = worker_load(&server, id);
        assert_eq!(load["active_requests"], 0, "worker {id}: {load}");
    }
    assert_eq!(
        server.call("GET", "/healthz", None).0,
        200,
        "the router is alive"
    );
}

/// 5,000 refused registrations and 1,000 add/delete cycles leave nothing behind: no
/// partition, no policy, no metric series (issue #28: they once grew `/metrics` from
/// 436 KB to 392 MB and resident memory by 65 MB). `/metrics` has its series of before.
#[test]
fn refused_registrations_and_add_delete_cycles_leave_no_partition_behind() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path()));
    server.ok("/v1/workers", json!({"model": "m", "worker_id": 1}));
    server.ok(
        "/v1/select",
        json!({"model": "m", "instance": "kv", "block_hashes": [1, 2]}),
    );
    let before = server.metrics();
    let series = |text: &str| text.lines().filter(|l| !l.starts_with('#')).count();
    let resident = support::load::resident_kib;
    let rss_before = resident(server.process.pid());
    for i in 0..5_000 {
        // Worker 1 again, under a model of its own each time: refused (409).
        let (status, body) = server.post(
            "/v1/workers",
            json!({"model": format!("leak-{i}"), "worker_id": 1}),
        );
        assert_eq!(status, 409, "{body}");
    }
    for i in 0..1_000 {
        let model = format!("cycle-{i}");
        server.ok("/v1/workers", json!({"model": model, "worker_id": 2}));
        server.ok(
            "/v1/select",
            json!({"model": model, "instance": "kv", "block_hashes": [1]}),
        );
        assert_eq!(server.call("DELETE", "/v1/workers/2", None).0, 200);
    }
    let after = server.metrics();
    assert!(
        !after.contains("leak-") && !after.contains("cycle-"),
        "series of refused or removed workers' partitions remain"
    );
    assert_eq!(
        series(&after),
        series(&before),
        "/metrics series: {} before, {} after",
        series(&before),
        series(&after)
    );
    let rss_after = resident(server.process.pid());
    eprintln!(
        "/metrics: {} bytes before, {} after; resident memory {rss_before} KiB before, {rss_after} KiB after",
        before.len(),
        after.len()
    );
    // Allocator arenas and the server's thread pools warm up along the way; a partition
    // per registration (the old leak) was 16 KiB each, 100 MB here.
    assert!(
        rss_after < rss_before + 16 * 1024,
        "resident memory grew from {rss_before} to {rss_after} KiB"
    );
}

/// A worker removed (`DELETE /v1/workers/ID`: an operator, or a pod that left) while
/// answers from it stream: they complete, their bookings went with the worker, and their
/// ends are not logged as lost bookings (a leaving pod's in-flight requests flooded the
/// log with one warning each).
#[test]
fn a_worker_removed_mid_answer_ends_its_requests_quietly() {
    let dir = tempfile::tempdir().unwrap();
    // 12 tokens at 20 tokens/s: each answer takes ~0.6 s, so they are in flight below.
    let engine = engine_sim("slow", "127.0.0.1:0", &["--decode-tps", "20"]);
    let yaml = format!(
        "workers:\n  - {{model: demo, worker_id: 1, url: \"{}\"}}\n",
        engine.address
    );
    let log = dir.path().join("router.log");
    let router = Process::start(
        Command::new(switchyard_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(write_config(dir.path(), &yaml))
            .env("RUST_LOG", "warn")
            .stderr(std::fs::File::create(&log).unwrap()),
        "switchyard listening on ",
    );
    let base = router.address.clone();
    runtime().block_on(async {
        let client = support::http_client();
        let answers: Vec<_> = (0..3)
            .map(|i| {
                let (client, base) = (client.clone(), base.clone());
                tokio::spawn(async move {
                    let response = client
                        .post(format!("{base}/v1/chat/completions"))
                        .json(&json!({"model": "demo", "stream": true, "max_tokens": 12,
                            "messages": [{"role": "user", "content": format!("in flight {i}")}]}))
                        .send()
                        .await
                        .unwrap();
                    (response.status().as_u16(), response.text().await.unwrap())
                })
            })
            .collect();
        let in_flight = || active_requests(&base).iter().sum::<u64>() == 3;
        eventually(
            "three answers in flight",
            std::time::Duration::from_secs(10),
            in_flight,
        );
        let removed = client
            .delete(format!("{base}/v1/workers/1"))
            .send()
            .await
            .unwrap();
        assert_eq!(removed.status().as_u16(), 200);
        for answer in answers {
            let (status, body) = answer.await.unwrap();
            assert_eq!(status, 200, "{body}");
            assert!(body.contains("[DONE]"), "{body}");
        }
    });
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(!log.contains("booking already gone"), "{log}");
}
