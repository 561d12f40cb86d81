//! Soak with faults, over loopback, bounded in time (issue #28). For
//! `SWITCHYARD_SOAK_SECS` seconds (60 by default, as CI runs it; `make soak` runs 600):
//! clients stream and hang up through the frontend in front of three `engine-sim`
//! engines, while engines are killed and restarted, the config is reloaded, duplicate
//! registrations are refused, and a KV-event flood with clears runs against a fourth
//! worker. At the end: every request was answered (an answer or an OpenAI-shaped error,
//! none left hanging), no booking is left, and `/metrics` and resident memory are flat
//! after warm-up. `/healthz` latencies are reported (p50, p99, max), not asserted: the
//! machine is shared and noisy.
//!
//! Also: clearing and removing workers that hold 400k blocks each, with `/healthz` and
//! `/v1/select` probed throughout (latencies reported).

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use support::load::*;
use support::pacing::Stop;
use support::*;

#[test]
fn clearing_and_removing_workers_of_400k_blocks_keeps_serving() {
    const BLOCKS: u64 = 400_000;
    let dir = tempfile::tempdir().unwrap();
    let workers: String = (1..=3)
        .map(|w| format!("  - {{model: m, worker_id: {w}, total_kv_blocks: {BLOCKS}}}\n"))
        .collect();
    let router = serve(&write_config(
        dir.path(),
        &format!("worker_selection: {{default: default}}\nworkers:\n{workers}"),
    ));
    let base = router.address.clone();
    let agent = agent();
    let load = |worker: u64| {
        for chunk in 0..(BLOCKS / 10_000) {
            let hashes: Vec<u64> = (0..10_000)
                .map(|i| (worker << 40) | (chunk * 10_000 + i + 1))
                .collect();
            let body = json!({"worker_id": worker, "events": [{"type": "stored", "block_hashes": hashes}]});
            let (status, text) =
                call(&agent, "POST", &format!("{base}/v1/kv_events"), Some(&body)).unwrap();
            assert_eq!(status, 200, "{text}");
        }
    };
    for worker in 1..=3 {
        load(worker);
    }
    let blocks = |agent: &ureq::Agent| -> f64 {
        let (_, text) = call(agent, "GET", &format!("{base}/metrics"), None).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("switchyard_kv_blocks{tier=\"device\"} "))
            .and_then(|v| v.parse().ok())
            .unwrap()
    };
    assert_eq!(blocks(&agent), (3 * BLOCKS) as f64);
    let stop = Stop::new();
    let healthz = probe(format!("{base}/healthz"), None, &stop);
    let prompt: Vec<u64> = (0..64).map(|i| 3 << 40 | (i + 1)).collect();
    let select = probe(
        format!("{base}/v1/select"),
        Some(json!({"model": "m", "block_hashes": prompt})),
        &stop,
    );
    // The clear and the DELETE happen while the probes run: wait until selections count.
    eventually("the probes run", Duration::from_secs(10), || {
        metric_sum(&base, "switchyard_selections_total") >= 5.0
    });
    let started = Instant::now();
    let clear = json!({"worker_id": 1, "events": [{"type": "cleared"}]});
    assert_eq!(
        call(
            &agent,
            "POST",
            &format!("{base}/v1/kv_events"),
            Some(&clear)
        )
        .unwrap()
        .0,
        200
    );
    let cleared = started.elapsed();
    let started = Instant::now();
    assert_eq!(
        call(&agent, "DELETE", &format!("{base}/v1/workers/2"), None)
            .unwrap()
            .0,
        200
    );
    let deleted = started.elapsed();
    // The probes go on 300 ms past the DELETE: the window they measure.
    stop.run_for(Duration::from_millis(300));
    stop.stop();
    let (healthz, healthz_failed) = healthz.join().unwrap();
    let (select, select_failed) = select.join().unwrap();
    eprintln!("clear of {BLOCKS} blocks: {cleared:?}; DELETE of a worker of {BLOCKS}: {deleted:?}");
    eprintln!("/healthz meanwhile: {}", summary(healthz));
    eprintln!("/v1/select meanwhile: {}", summary(select));
    assert_eq!((healthz_failed, select_failed), (0, 0), "probes failed");
    assert_eq!(
        blocks(&agent),
        BLOCKS as f64,
        "worker 3's blocks remain, the others' are gone"
    );
}

/// Reloads (the config written with another weight), duplicate registrations and a
/// KV-event flood with clears, until `stop`.
fn churn_until_stopped(
    base: &str,
    config: &std::path::Path,
    yaml: &dyn Fn(u32) -> String,
    stop: &Stop,
) {
    let agent = agent();
    let mut n = 0u64;
    loop {
        n += 1;
        if n.is_multiple_of(40) {
            std::fs::write(config, yaml(1 + (n / 40 % 3) as u32)).unwrap();
            let (status, text) =
                call(&agent, "POST", &format!("{base}/v1/admin/reload"), None).unwrap();
            assert_eq!(status, 200, "reload: {text}");
        }
        let dup = json!({"model": format!("dup-{n}"), "worker_id": 1});
        assert_eq!(
            call(&agent, "POST", &format!("{base}/v1/workers"), Some(&dup))
                .unwrap()
                .0,
            409
        );
        let hashes: Vec<u64> = (0..2_000).map(|i| n << 20 | i).collect();
        let events = if n.is_multiple_of(10) {
            json!([{"type": "cleared"}])
        } else {
            json!([{"type": "stored", "block_hashes": hashes}])
        };
        let body = json!({"worker_id": 9, "events": events});
        assert_eq!(
            call(&agent, "POST", &format!("{base}/v1/kv_events"), Some(&body))
                .unwrap()
                .0,
            200
        );
        if stop.pause(Duration::from_millis(50)) {
            break;
        }
    }
}

/// Every request answered, /healthz never failed, and neither the series nor the memory
/// grew past warm-up.
fn answered_and_flat(
    counts: &Counts,
    healthz_failed: u64,
    (series_warm, series_end): (usize, usize),
    (rss_warm, rss_end): (u64, u64),
) {
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    assert_eq!(
        get(&counts.unanswered),
        0,
        "requests left without an answer"
    );
    assert_eq!(healthz_failed, 0, "/healthz failed");
    assert!(
        get(&counts.answered) > 100,
        "too little traffic to mean anything"
    );
    assert!(
        series_end as f64 <= series_warm as f64 * 1.05,
        "/metrics grew from {series_warm} to {series_end} series"
    );
    assert!(
        rss_end as f64 <= rss_warm as f64 * 1.25 + 8_192.0,
        "resident memory grew from {rss_warm} to {rss_end} KiB"
    );
}

/// The soak's config: three engines on `ports`, a KV-only worker, the load scorer at
/// `weight` (reloads change it).
fn soak_config(ports: &[u16], weight: u32) -> String {
    let workers: String = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            format!(
                "  - {{model: demo, worker_id: {}, url: \"http://127.0.0.1:{port}\"}}\n",
                i + 1
            )
        })
        .collect();
    format!(
        "models:\n  demo: {{kv_tracking: predicted}}\n\
         frontend: {{health_interval_ms: 100, unhealthy_cooldown_ms: 300, connect_timeout_ms: 300, connect_retries: 3, request_timeout_secs: 10}}\n\
         worker_selection:\n  default: soak\n  instances:\n    - name: soak\n      scorers: [{{type: builtin.active-requests, weight: {weight}}}, {{type: builtin.kv-overlap, weight: 1}}]\n      picker: {{type: builtin.lowest-cost}}\n\
         workers:\n{workers}  - {{model: kvonly, worker_id: 9, total_kv_blocks: 50000}}\n"
    )
}

#[test]
fn soak_with_faults_answers_everything_and_stays_flat() {
    let seconds: u64 = std::env::var("SWITCHYARD_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let dir = tempfile::tempdir().unwrap();
    let (ports, start_engine) = restartable_engines();
    let engines: Arc<Mutex<Vec<Process>>> =
        Arc::new(Mutex::new((0..3).map(&start_engine).collect()));
    let yaml = move |weight: u32| soak_config(&ports, weight);
    let config = write_config(dir.path(), &yaml(1));
    let router = serve(&config);
    let base = router.address.clone();
    let stop = Stop::new();
    let counts = Arc::new(Counts::default());
    let mut threads = Vec::new();
    // Clients: streamed and not; one request in four hangs up after its first bytes.
    for client in 0..6u64 {
        let (base, counts) = (base.clone(), counts.clone());
        threads.push(stop.spawn(move |stop| chat_until_stopped(&base, client, stop, &counts)));
    }
    // Engines killed and restarted on their port, one every 3 s.
    {
        let engines = engines.clone();
        threads.push(
            stop.spawn(move |stop| restart_engines_until_stopped(&engines, start_engine, stop)),
        );
    }
    // Reloads, duplicate registrations, a KV-event flood with clears.
    {
        let (base, config) = (base.clone(), config.clone());
        threads.push(stop.spawn(move |stop| churn_until_stopped(&base, &config, &yaml, stop)));
    }
    let healthz = probe(format!("{base}/healthz"), None, &stop);
    let size = || series(&base);
    let warm_up = Duration::from_secs((seconds / 4).max(5));
    stop.run_for(warm_up);
    let (series_warm, rss_warm) = (size(), resident_kib(router.pid()));
    stop.run_for(Duration::from_secs(seconds).saturating_sub(warm_up));
    let (series_end, rss_end) = (size(), resident_kib(router.pid()));
    stop.stop();
    for thread in threads {
        thread.join().unwrap();
    }
    let (healthz, healthz_failed) = healthz.join().unwrap();
    // Bookings: none left once every client is done (hung-up ones included).
    wait_for_no_bookings(&base, Duration::from_secs(15));
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    eprintln!(
        "soak {seconds} s: {} answered, {} OpenAI errors, {} hung up, {} unanswered; /metrics series {series_warm} after warm-up, {series_end} at the end; RSS {rss_warm} KiB after warm-up, {rss_end} KiB at the end",
        get(&counts.answered), get(&counts.errors), get(&counts.hung_up), get(&counts.unanswered)
    );
    eprintln!("/healthz throughout: {}", summary(healthz));
    answered_and_flat(
        &counts,
        healthz_failed,
        (series_warm, series_end),
        (rss_warm, rss_end),
    );
}
