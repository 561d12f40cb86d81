//! Operating switchyard as an Envoy dynamic module (issue #49, items 3 and 4): a real
//! Envoy 1.40 loading `libswitchyard_envoy.so` with docs/envoy.md's config, in front of
//! `engine-sim` engines (tests/support/module_envoy.rs). Covered: the example policy
//! plugins of each language (Rust, C, C++) routing inside Envoy, with their selections in
//! the module's metrics and its decisions in Envoy's own stats; a reload under load
//! (`POST /v1/admin/reload` on the module's API) that fails no request and whose new
//! generation routes; two Envoys, each with the module, sharing bookings over NATS; a
//! headers-only filter booking a request before its body is sent. Every test ends with no
//! booking left.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use support::module_envoy::*;
use support::nats::Nats;
use support::*;

/// The example least-busy policy of each language, one instance each, chosen per
/// request by `x-switchyard-instance` (Envoy's clients may choose: `auth.choose_instance`).
fn plugins_of_each_language() -> String {
    format!(
        "plugins:\n  - path: {}\n  - path: {}\n  - path: {}\n\
         auth: {{choose_instance: anyone}}\n\
         worker_selection:\n  default: rust\n  instances:\n\
         \x20   - {{name: rust, type: least-busy, parameters: {{min_device_overlap_blocks: 0}}}}\n\
         \x20   - {{name: c, type: c.least-busy, parameters: {{min_device_overlap_blocks: 0}}}}\n\
         \x20   - {{name: cpp, type: cpp.least-busy, parameters: {{min_device_overlap_blocks: 0}}}}\n",
        rust_plugin("least_busy").display(),
        cmake_plugin("least_busy_c").display(),
        cmake_plugin("least_busy_cpp").display(),
    )
}

#[test]
fn plugins_of_each_language_route_inside_envoy_and_count_in_the_modules_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let engines = engine_sims(2, &[]);
    let engine_refs: Vec<&Process> = engines.iter().collect();
    let config = switchyard_config(dir.path(), &engine_refs, &plugins_of_each_language());
    // Envoy's admin interface, to read the module's decisions in Envoy's own stats, which
    // it flushes every second (histograms reach the admin at a flush; 5 s by default).
    let admin = free_port();
    let module = start_module_with(dir.path(), &config, &engine_refs, |text| {
        format!("stats_flush_interval: 1s\nadmin:\n  address:\n    socket_address: {{ address: 127.0.0.1, port_value: {admin} }}\n{text}")
    });
    let url = format!("{}/v1/chat/completions", module.envoy.base);
    let agent = agent();
    for instance in ["rust", "c", "cpp"] {
        let mut served = std::collections::HashSet::new();
        for i in 0..4 {
            let response = agent
                .post(&url)
                .set("x-switchyard-instance", instance)
                .send_json(chat(&format!("{instance} {i}"), i % 2 == 1))
                .unwrap_or_else(|e| panic!("{instance} request {i}: {e}"));
            assert_eq!(response.status(), 200);
            served.insert(response.header("x-engine-name").unwrap_or("").to_owned());
            assert!(response.into_string().unwrap().contains("choices"));
        }
        assert!(
            served.iter().all(|e| e.starts_with('e')),
            "{instance}: answered by the engines: {served:?}"
        );
        // The module's own listener shows the routed requests under serve's names.
        let selections = labelled_metric(
            &module.api,
            "switchyard_selections_total",
            &format!("instance=\"{instance}\""),
        );
        assert!(
            selections >= 4.0,
            "{instance}: {selections} selections counted"
        );
    }
    assert!(metric(&module.api, "switchyard_ext_proc_picks_total") >= 12.0);
    // An instance nobody configured: the module answers it (404) itself.
    let refused = agent
        .post(&url)
        .set("x-switchyard-instance", "nope")
        .send_json(chat("nope", false));
    assert!(
        matches!(refused, Err(ureq::Error::Status(404, _))),
        "{refused:?}"
    );
    wait_for_no_bookings(&module.api, Duration::from_secs(10));
    envoy_stats_count_the_decisions(&format!("http://127.0.0.1:{admin}"), &module.api);
}

/// Envoy's own stats (its admin `/stats`) count the module's picks and refusals as the
/// module's metrics do, and hold each pick's decision time (at Envoy's next stats
/// flush).
fn envoy_stats_count_the_decisions(admin: &str, api: &str) {
    let text = ureq::get(&format!("{admin}/stats?filter=switchyard"))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let stat = |name: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| {
                l.strip_prefix("dynamicmodulescustom.switchyard.")?
                    .strip_prefix(name)?
                    .strip_prefix(": ")
            })
            .and_then(|v| v.trim().parse().ok())
    };
    let picks = metric(api, "switchyard_ext_proc_picks_total");
    let refusals = metric(api, "switchyard_ext_proc_refusals_total");
    assert_eq!(
        [stat("picks"), stat("refusals"), stat("rebooks")],
        [Some(picks), Some(refusals), Some(0.0)],
        "Envoy's picks, refusals and rebooks against the module's metrics; Envoy's stats:\n{text}"
    );
    assert_eq!(refusals, 1.0);
    let decisions = |agent: &ureq::Agent| -> Result<f64, String> {
        let text = agent
            .get(&format!("{admin}/stats/prometheus"))
            .call()
            .map_err(|e| e.to_string())?
            .into_string()
            .map_err(|e| e.to_string())?;
        let count = text
            .lines()
            .find_map(|l| {
                l.strip_prefix("envoy_dynamicmodulescustom_switchyard_decision_us_count{} ")
            })
            .and_then(|v| v.trim().parse::<f64>().ok())
            .ok_or_else(|| format!("no decision_us count yet in:\n{text}"))?;
        (count == picks)
            .then_some(count)
            .ok_or_else(|| format!("{count} decisions timed of {picks} picks"))
    };
    let agent = agent();
    eventually_ok(
        "Envoy's stats flush the decision times",
        Duration::from_secs(20),
        || decisions(&agent),
    );
}

/// A policy instance named `name` (the built-in cost), the config's default.
fn named_default(name: &str) -> String {
    format!(
        "worker_selection:\n  default: {name}\n  instances:\n\
         \x20   - name: {name}\n      scorers: [{{type: builtin.default-cost}}]\n      picker: {{type: builtin.lowest-cost}}\n"
    )
}

/// Four clients sending until `stop`, each request's status kept.
fn clients_until(url: &str, stop: &AtomicBool, sent: &AtomicUsize) -> Vec<u16> {
    std::thread::scope(|scope| {
        let clients: Vec<_> = (0..4)
            .map(|c| {
                scope.spawn(move || {
                    let agent = agent();
                    let mut statuses = Vec::new();
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let request = chat(&format!("client {c} request {i}"), i % 2 == 0);
                        statuses.push(post_json(&agent, url, &request).0);
                        sent.fetch_add(1, Ordering::Relaxed);
                        i += 1;
                    }
                    statuses
                })
            })
            .collect();
        clients
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect()
    })
}

#[test]
fn a_reload_under_load_fails_no_request_and_its_generation_routes() {
    let dir = tempfile::tempdir().unwrap();
    let engines = engine_sims(2, &[]);
    let engine_refs: Vec<&Process> = engines.iter().collect();
    // Before: Envoy's clients may choose the instance; the reloaded config takes that away.
    let before = format!(
        "auth: {{choose_instance: anyone}}\n{}",
        named_default("before")
    );
    let config = switchyard_config(dir.path(), &engine_refs, &before);
    let module = start_module(dir.path(), &config, &engine_refs);
    let url = format!("{}/v1/chat/completions", module.envoy.base);
    let choosing = |instance: &str| {
        let request = agent().post(&url).set("x-switchyard-instance", instance);
        match request.send_json(chat("chosen", false)) {
            Ok(r) | Err(ureq::Error::Status(_, r)) => r.status(),
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(choosing("before"), 200);
    let (stop, sent) = (AtomicBool::new(false), AtomicUsize::new(0));
    let statuses = std::thread::scope(|scope| {
        let load = scope.spawn(|| clients_until(&url, &stop, &sent));
        eventually("20 requests answered", Duration::from_secs(60), || {
            sent.load(Ordering::Relaxed) >= 20
        });
        // The same file, another default instance: what `serve` reloads.
        switchyard_config(dir.path(), &engine_refs, &named_default("after"));
        let reloaded = ureq::post(&format!("{}/v1/admin/reload", module.api)).call();
        let reloaded = reloaded.map(|r| r.into_string().unwrap());
        let at_reload = sent.load(Ordering::Relaxed);
        eventually("20 more requests answered", Duration::from_secs(60), || {
            sent.load(Ordering::Relaxed) >= at_reload + 20
        });
        stop.store(true, Ordering::Relaxed);
        let body = reloaded.unwrap_or_else(|e| panic!("the reload failed: {e}"));
        assert!(body.contains("\"reloaded\":true"), "{body}");
        load.join().unwrap()
    });
    assert!(
        statuses.iter().all(|s| *s == 200),
        "every request answered across the reload: {statuses:?}"
    );
    assert_eq!(metric(&module.api, "switchyard_config_generation"), 2.0);
    assert_eq!(
        choosing("after"),
        403,
        "the new generation's auth.choose_instance applies"
    );
    let after = |name: &str| {
        labelled_metric(
            &module.api,
            "switchyard_selections_total",
            &format!("instance=\"{name}\""),
        )
    };
    assert!(
        after("after") >= 20.0,
        "the new generation's instance routes: {}",
        after("after")
    );
    wait_for_no_bookings(&module.api, Duration::from_secs(10));
}

/// Total active requests, as the router at `api` counts them (its own and its peers').
fn active_total(api: &str) -> u64 {
    active_requests(api).iter().sum()
}

#[test]
fn two_envoys_with_the_module_share_bookings_over_nats() {
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(free_port());
    // Slow engines: a 150-token answer streams for six seconds, so bookings last.
    let engines = engine_sims(2, &["--decode-tps", "25"]);
    let engine_refs: Vec<&Process> = engines.iter().collect();
    let replica = |id: &str| {
        let folder = dir.path().join(id);
        std::fs::create_dir(&folder).unwrap();
        let replicas = format!(
            "replicas: {{nats: 'nats://127.0.0.1:{}', id: {id}, heartbeat_ms: 100, peer_ttl_ms: 800, snapshot_wait_ms: 300}}\n",
            nats.port
        );
        let config = switchyard_config(&folder, &engine_refs, &replicas);
        start_module(&folder, &config, &engine_refs)
    };
    let (a, b) = (replica("a"), replica("b"));
    let long = |i: usize| {
        json!({"model": "demo", "stream": true, "max_tokens": 150,
               "messages": [{"role": "user", "content": format!("long stream {i}")}]})
    };
    let answers = std::thread::scope(|scope| {
        // Four streams through A, then two through B.
        let mut streams = Vec::new();
        for (i, envoy) in [&a, &a, &a, &a, &b, &b].into_iter().enumerate() {
            let url = format!("{}/v1/chat/completions", envoy.envoy.base);
            streams.push(scope.spawn(move || post_json(&agent(), &url, &long(i))));
            if i == 3 {
                eventually(
                    "A's four bookings seen by B",
                    Duration::from_secs(10),
                    || active_total(&b.api) == 4,
                );
            }
        }
        for module in [&a, &b] {
            eventually("every booking on both", Duration::from_secs(10), || {
                active_total(&module.api) == 6
            });
        }
        // Each counts the other's: the engines share the six.
        assert_eq!(active_requests(&a.api), vec![3, 3], "A's view");
        assert_eq!(active_requests(&b.api), vec![3, 3], "B's view");
        streams
            .into_iter()
            .map(|s| s.join().unwrap())
            .collect::<Vec<_>>()
    });
    for (status, _, body) in &answers {
        assert_eq!(*status, 200, "{body}");
        assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    }
    for module in [&a, &b] {
        wait_for_no_bookings(&module.api, Duration::from_secs(10));
    }
    assert!(metric(&b.api, "switchyard_replica_bus_up") == 1.0);
}

/// A headers-only filter decides and books at the request headers: a request whose body
/// the client has not sent yet is already booked (a body-reading filter waits for it),
/// and then answered by the engine it was sent to. A request without the model header is
/// refused, naming it; `check --envoy-filter-config` refuses `headers_only` for a config
/// that routes on the prompt.
#[test]
fn a_headers_only_filter_books_before_the_body_arrives() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let engines = engine_sims(2, &[]);
    let engine_refs: Vec<&Process> = engines.iter().collect();
    let workers = demo_workers(engine_refs.iter().copied(), true);
    let config = write_config(
        dir.path(),
        &format!("models:\n  demo: {{kv_tracking: off}}\nworkers:\n{workers}"),
    );
    let module = start_module_with(dir.path(), &config, &engine_refs, real_envoy::headers_only);
    let port = module.envoy.base.rsplit(':').next().unwrap();
    let mut client = std::net::TcpStream::connect(format!("127.0.0.1:{port}")).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: switchyard\r\ncontent-type: application/json\r\n\
                x-gateway-model-name: demo\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
    client.write_all(head.as_bytes()).unwrap();
    eventually("booked at the headers", Duration::from_secs(10), || {
        active_total(&module.api) == 1
    });
    let body = chat("sent after the decision", false).to_string();
    let chunk = format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
    client.write_all(chunk.as_bytes()).unwrap();
    let mut answer = String::new();
    client.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("x-engine-name: e"), "{answer}");
    wait_for_no_bookings(&module.api, Duration::from_secs(10));

    let url = format!("{}/v1/chat/completions", module.envoy.base);
    let (status, _, body) = post_json(&agent(), &url, &chat("no model header", false));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("x-gateway-model-name"), "{body}");

    let predicted = switchyard_config(dir.path(), &engine_refs, "");
    let filter = json!({"config": predicted, "headers_only": true}).to_string();
    let output = std::process::Command::new(switchyard_bin())
        .args(["check", "--envoy-filter-config", &filter])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("models.demo.kv_tracking: predicted"),
        "{stderr}"
    );
    wait_for_no_bookings(&module.api, Duration::from_secs(10));
}
