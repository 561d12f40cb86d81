//! Reloading under traffic: `switchyard serve` in front of three `engine-sim` processes,
//! a request through the frontend every millisecond for several seconds, and meanwhile
//! reloads with a changed weight, with a new version of a plugin renamed over the old
//! file, and with a broken config. No request may fail because of a reload; decisions
//! follow the new generation once a reload has returned; bookings and the KV index
//! survive. Every process is started and killed here; every loop is bounded.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;

/// Each answer takes ~20 ms: requests overlap, so load-aware scoring spreads them.
fn engine(name: &str) -> Process {
    engine_sim(name, "127.0.0.1:0", &["--decode-tps", "200"])
}

/// The config: the fixture plugin at `plugin`, instance `v` = by-id (weight 1) plus active
/// requests (weight `load_weight`).
fn config(plugin: &std::path::Path, engines: &[Process], load_weight: f64) -> String {
    let workers: String = engines
        .iter()
        .enumerate()
        .map(|(i, e)| {
            format!(
                "  - {{model: demo, worker_id: {}, url: \"{}\"}}\n",
                i + 1,
                e.address
            )
        })
        .collect();
    format!(
        // Health probes off in effect: on a loaded test machine a late probe answer would
        // take a worker out and change decisions this test predicts.
        "frontend: {{health_interval_ms: 600000, health_timeout_ms: 10000}}\nplugins:\n  - path: {}\nworker_selection:\n  default: v\n  instances:\n    - name: v\n      scorers: [{{type: fixture.by-id, weight: 1.0}}, {{type: builtin.active-requests, weight: {load_weight}}}]\n      picker: {{type: builtin.lowest-cost}}\nworkers:\n{workers}",
        plugin.display()
    )
}

/// Compiles the fixture (version `sign`) into `dir`, then renames it over `target`, as
/// the docs tell vendors to replace a library.
fn install_plugin(dir: &std::path::Path, target: &std::path::Path, sign: i32) {
    let built = broken_plugin(
        dir,
        &format!("build{sign}"),
        &[&format!("BY_ID_SIGN={sign}")],
    );
    std::fs::rename(built, target).unwrap();
}

struct Sent {
    /// When the request was sent ...
    at: Instant,
    /// ... and when its answer's headers (with the decision) came back.
    decided: Instant,
    status: u16,
    worker: u64,
}

async fn reload(client: &reqwest::Client, base: &str) -> (Instant, u16, Value) {
    let response = client
        .post(format!("{base}/v1/admin/reload"))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (Instant::now(), status, response.json().await.unwrap())
}

/// Workers chosen by requests sent at or after `from` and decided before `to`.
fn chosen(sent: &[Sent], from: Instant, to: Instant) -> Vec<u64> {
    sent.iter()
        .filter(|s| s.at >= from && s.decided < to)
        .map(|s| s.worker)
        .collect()
}

/// Waits (20 s at most) until the workers chosen by the requests sent since `from` and
/// answered so far are `enough`: the traffic has shown what the test then checks.
async fn until_chosen(
    sent: &Mutex<Vec<Sent>>,
    from: Instant,
    what: &str,
    enough: impl Fn(&[u64]) -> bool,
) {
    eventually_async(what, Duration::from_secs(20), || {
        std::future::ready(enough(&chosen(&sent.lock().unwrap(), from, Instant::now())))
    })
    .await;
}

/// Waits (20 s at most) until `count` requests sent since `from` are answered.
async fn until_answered(sent: &Mutex<Vec<Sent>>, from: Instant, count: usize) {
    until_chosen(sent, from, &format!("{count} answers"), |w| {
        w.len() >= count
    })
    .await;
}

/// When each reload of the test started and ended.
struct Reloads {
    started: Instant,
    weight: (Instant, Instant),
    version: (Instant, Instant),
    broken_done: Instant,
    end: Instant,
}

/// No request failed, and each reload switched the decisions made after it.
fn decisions_switched(sent: &[Sent], r: &Reloads) {
    assert!(sent.len() > 1000, "only {} requests were sent", sent.len());
    let failed: Vec<u16> = sent
        .iter()
        .map(|s| s.status)
        .filter(|s| *s != 200)
        .collect();
    assert!(
        failed.is_empty(),
        "{} requests failed during the reloads: {failed:?}",
        failed.len()
    );

    let before = chosen(sent, r.started, r.weight.0);
    assert!(
        !before.is_empty() && before.iter().all(|w| *w == 1),
        "version 1, no load weight: worker 1 only: {before:?}"
    );
    let weighted = chosen(sent, r.weight.1, r.version.0);
    assert!(
        weighted.iter().any(|w| *w != 1),
        "with the load weight, overlapping requests spread: {weighted:?}"
    );
    let after = chosen(sent, r.version.1, r.end);
    assert!(
        !after.is_empty() && after.iter().all(|w| *w == 3),
        "version 2 prefers worker 3 from the reload on: {after:?}"
    );
    assert!(chosen(sent, r.broken_done, r.end).iter().all(|w| *w == 3));
}

/// A booking (`kept`) and blocks cached on worker 2.
async fn book_and_cache(client: &reqwest::Client, base: &str) {
    let kept: Value = client
        .post(format!("{base}/v1/reserve"))
        .json(&json!({"model": "demo", "request_id": "kept", "block_hashes": [1, 2, 3]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(kept["worker_id"].is_u64(), "{kept}");
    let stored = client
        .post(format!("{base}/v1/kv_events"))
        .json(&json!({"worker_id": 2, "events": [{"type": "stored", "block_hashes": [7001, 7002, 7003, 7004]}]}))
        .send().await.unwrap();
    assert!(
        stored.status().is_success(),
        "{}",
        stored.text().await.unwrap()
    );
}

/// The booking made before the reloads is still known (and freeable), worker 2's blocks
/// still cached, generation 3 serving with 2 reloads and 1 refusal counted.
async fn state_survived(client: &reqwest::Client, base: &str) {
    let selected: Value = client
        .post(format!("{base}/v1/select"))
        .json(&json!({"model": "demo", "instance": "default", "block_hashes": [7001, 7002, 7003, 7004]}))
        .send().await.unwrap().json().await.unwrap();
    assert_eq!(
        (&selected["worker_id"], &selected["device_overlap_blocks"]),
        (&json!(2), &json!(4)),
        "{selected}"
    );
    let workers: Value = get_json(client, &format!("{base}/v1/workers")).await;
    let busy: u64 = workers
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["load"]["active_requests"].as_u64().unwrap())
        .sum();
    assert_eq!(busy, 1, "only the kept booking remains: {workers}");
    let freed = client
        .post(format!("{base}/v1/requests/kept/free"))
        .send()
        .await
        .unwrap();
    assert!(
        freed.status().is_success(),
        "the booking made before the reloads is still known"
    );
    let policies: Value = get_json(client, &format!("{base}/v1/policies")).await;
    assert_eq!(policies["generation"]["number"], 3);
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "switchyard_config_generation 3",
        "switchyard_config_reloads_total{result=\"ok\"} 2",
        "switchyard_config_reloads_total{result=\"failed\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
    // Both versions are loaded (different files at one path); the serving one is listed.
    assert_eq!(
        metrics.matches("switchyard_plugin_info{").count(),
        1,
        "{metrics}"
    );
}

/// One streamed chat request every millisecond until `stop` (30 s at most), at most 128
/// in flight; each one's times, status and worker into `sent`.
async fn chat_until_stopped(
    client: reqwest::Client,
    base: String,
    sent: Arc<Mutex<Vec<Sent>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let mut tasks = Vec::new();
    let in_flight = Arc::new(tokio::sync::Semaphore::new(128));
    let started = Instant::now();
    let mut i = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed)
        && started.elapsed() < Duration::from_secs(30)
    {
        tick.tick().await;
        i += 1;
        let permit = in_flight.clone().acquire_owned().await.unwrap();
        let (client, base, sent) = (client.clone(), base.clone(), sent.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let at = Instant::now();
            let response = client
                .post(format!("{base}/v1/chat/completions"))
                .json(&json!({"model": "demo", "stream": true, "max_tokens": 4,
                              "messages": [{"role": "user", "content": format!("request {i}")}]}))
                .send()
                .await
                .unwrap();
            let decided = Instant::now();
            let status = response.status().as_u16();
            let worker = response
                .headers()
                .get("x-switchyard-worker")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(0);
            let body = response.text().await.unwrap();
            assert!(
                status != 200 || body.contains("[DONE]"),
                "a stream ended early: {body}"
            );
            sent.lock().unwrap().push(Sent {
                at,
                decided,
                status,
                worker,
            });
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

#[test]
fn reloads_under_traffic_switch_decisions_and_drop_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let engines: Vec<Process> = ["a", "b", "c"].iter().map(|n| engine(n)).collect();
    let plugin = dir.path().join("acme.so");
    install_plugin(dir.path(), &plugin, 1);
    let config_path = write_config(dir.path(), &config(&plugin, &engines, 0.0));
    let router = serve(&config_path);
    let base = router.address.clone();
    runtime().block_on(async {
        let client = support::http_client();
        // State that must survive: a booking, and blocks cached on worker 2.
        book_and_cache(&client, &base).await;

        // Traffic: one streamed chat request every millisecond until the reloads are done
        // (30 s at most), at most 128 in flight (a loaded machine slows the rate rather
        // than piling up connections).
        let sent: Arc<Mutex<Vec<Sent>>> = Arc::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let traffic = {
            let (client, base, sent, stop) =
                (client.clone(), base.clone(), sent.clone(), stop.clone());
            tokio::spawn(chat_until_stopped(client, base, sent, stop))
        };

        let started = Instant::now();
        until_answered(&sent, started, 200).await;
        // 1. A changed weight: load now counts, so overlapping requests spread.
        std::fs::write(&config_path, config(&plugin, &engines, 100.0)).unwrap();
        let weight_started = Instant::now();
        let (weight_done, status, answer) = reload(&client, &base).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["generation"]["number"], 2, "{answer}");
        until_chosen(&sent, weight_done, "a spread pick", |w| {
            w.iter().any(|w| *w != 1)
        })
        .await;

        // 2. A new version of the plugin renamed over the old file, load weight back to 0:
        //    the new version prefers the highest worker id.
        install_plugin(dir.path(), &plugin, -1);
        std::fs::write(&config_path, config(&plugin, &engines, 0.0)).unwrap();
        let version_started = Instant::now();
        let (version_done, status, answer) = reload(&client, &base).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["generation"]["number"], 3, "{answer}");
        until_answered(&sent, version_done, 200).await;

        // 3. A broken config: refused with its errors; generation 3 keeps serving.
        std::fs::write(
            &config_path,
            config(&plugin, &engines, 0.0).replace("fixture.by-id", "fixture.by-idd"),
        )
        .unwrap();
        let (broken_done, status, answer) = reload(&client, &base).await;
        assert_eq!(status, 422, "{answer}");
        assert_eq!(answer["reloaded"], false);
        assert_eq!(answer["generation"]["number"], 3, "{answer}");
        let errors = answer["errors"].to_string();
        assert!(
            errors.contains("fixture.by-idd") && errors.contains("config.yaml"),
            "{errors}"
        );

        until_answered(&sent, broken_done, 100).await;
        until_answered(&sent, started, 1001).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        traffic.await.unwrap();
        let sent = std::mem::take(&mut *sent.lock().unwrap());
        let end = Instant::now();
        let reloads = Reloads {
            started,
            weight: (weight_started, weight_done),
            version: (version_started, version_done),
            broken_done,
            end,
        };
        decisions_switched(&sent, &reloads);

        // What survives: the booking (freeable) and worker 2's cached blocks.
        state_survived(&client, &base).await;
    });
    drop(engines);
}

fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

#[test]
fn fifty_reloads_leave_memory_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("acme.so");
    install_plugin(dir.path(), &plugin, 1);
    let workers = "workers:\n  - {model: demo, worker_id: 1}\n  - {model: demo, worker_id: 2}\n  - {model: other, worker_id: 3}\n";
    let yaml = |weight: f64| {
        format!(
            "plugins:\n  - path: {}\nworker_selection:\n  instances:\n    - name: v\n      scorers: [{{type: fixture.by-id, weight: {weight}}}]\n      picker: {{type: builtin.lowest-cost}}\n{workers}",
            plugin.display()
        )
    };
    let config_path = write_config(dir.path(), &yaml(1.0));
    let router = serve(&config_path);
    let base = router.address.clone();
    let reload = |n: usize| {
        std::fs::write(&config_path, yaml(1.0 + n as f64)).unwrap();
        let answer: Value = ureq::post(&format!("{base}/v1/admin/reload"))
            .call()
            .unwrap()
            .into_json()
            .unwrap();
        assert_eq!(answer["reloaded"], true, "{answer}");
    };
    for n in 0..5 {
        reload(n); // warm up: allocator arenas, thread pools
    }
    let before = resident_kib(router.pid());
    for n in 5..55 {
        reload(n);
    }
    let after = resident_kib(router.pid());
    let per_reload = (after as f64 - before as f64) / 50.0;
    eprintln!("resident memory: {before} KiB before, {after} KiB after 50 reloads: {per_reload:+.1} KiB per reload");
    assert!(
        per_reload < 256.0,
        "memory grows {per_reload:.1} KiB per reload"
    );
    let policies: Value = ureq::get(&format!("{base}/v1/policies"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(policies["generation"]["number"], 56);
}

/// A reload that would remove every worker (a config emptied by mistake) is refused with
/// the reason and changes nothing, unless the new config says it may.
#[test]
fn a_reload_that_would_remove_every_worker_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let workers = "workers:\n  - {model: demo, worker_id: 1}\n  - {model: demo, worker_id: 2}\n";
    let config_path = write_config(
        dir.path(),
        &format!("worker_selection: {{default: default}}\n{workers}"),
    );
    let router = serve(&config_path);
    let base = router.address.clone();
    let reload = || -> (u16, Value) {
        match ureq::post(&format!("{base}/v1/admin/reload")).call() {
            Ok(r) => (r.status(), r.into_json().unwrap()),
            Err(ureq::Error::Status(status, r)) => (status, r.into_json().unwrap()),
            Err(e) => panic!("reload: {e}"),
        }
    };
    let worker_count = || {
        let workers: Value = ureq::get(&format!("{base}/v1/workers"))
            .call()
            .unwrap()
            .into_json()
            .unwrap();
        workers.as_array().map_or(0, Vec::len)
    };
    std::fs::write(&config_path, "worker_selection: {default: default}\n").unwrap();
    let (status, answer) = reload();
    assert_ne!(status, 200, "{answer}");
    let text = answer.to_string();
    assert!(
        text.contains("would remove every worker (2 of 2)"),
        "{text}"
    );
    assert!(text.contains("router.reload_may_empty_fleet"), "{text}");
    assert_eq!(worker_count(), 2, "a refused reload changed the fleet");
    std::fs::write(
        &config_path,
        "router: {reload_may_empty_fleet: true}\nworker_selection: {default: default}\n",
    )
    .unwrap();
    let (status, answer) = reload();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(worker_count(), 0);
}
