//! Thousands of interleaved reserve / prefill-complete / free calls from several threads
//! through the router: every worker's counts return to zero, and the candidate columns
//! kept per partition agree with the bookings and the registry. An instance over its call
//! budget is tripped to the fallback policy.

mod support;

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use support::pacing::Stop;
use support::*;
use switchyard::fleet::router::{RouteRequest, Router};
use switchyard::fleet::workers::WorkerSpec;
use switchyard::plugin::PartitionKey;
use switchyard_plugin_sdk::{WorkerId, WorkerType};

/// Worker `id` of model `m`.
fn spec(id: u64) -> WorkerSpec {
    serde_json::from_value(serde_json::json!({"model": "m", "worker_id": id})).unwrap()
}

/// A router on the built-in default policy with workers 0..`workers` of model `m`.
fn router_with(dir: &std::path::Path, workers: u64) -> Arc<Router> {
    let startup = start_yaml(
        dir,
        "worker_selection:\n  builtin_default: {temperature: 0.5, seed: 3}\n",
    )
    .unwrap();
    let router = Arc::new(Router::new(startup).unwrap());
    for id in 0..workers {
        router.add_worker(spec(id)).unwrap();
    }
    router
}

/// A request `id` for model `m`: 1 to 39 blocks, up to 200 expected output tokens.
fn random_request(rng: &mut impl Rng, id: &str) -> RouteRequest {
    RouteRequest {
        model: "m".into(),
        block_hashes: Some((0..rng.gen_range(1..40)).collect()),
        request_id: Some(id.to_owned()),
        expected_output_tokens: Some(rng.gen_range(0..200)),
        ..Default::default()
    }
}

#[test]
fn interleaved_reservations_return_every_count_to_zero() {
    let dir = tempfile::tempdir().unwrap();
    let router = router_with(dir.path(), 8);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let router = router.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                let mut open: Vec<(String, bool)> = Vec::new();
                let mut peak = 0;
                for n in 0..1500 {
                    match rng.gen_range(0..3) {
                        0 | 1 if open.len() < 64 => {
                            let id = format!("t{t}-r{n}");
                            let request = RouteRequest {
                                tracks_prefill_tokens: true,
                                ..random_request(&mut rng, &id)
                            };
                            router.select_and_reserve(&request).unwrap();
                            open.push((id, false));
                            peak = peak.max(open.len());
                        }
                        _ if !open.is_empty() => {
                            let i = rng.gen_range(0..open.len());
                            if !open[i].1 && rng.gen_bool(0.5) {
                                router.prefill_complete(&open[i].0).unwrap();
                                open[i].1 = true;
                            } else {
                                let (id, _) = open.swap_remove(i);
                                // Sometimes prefill-complete arrives after free: refused, no change.
                                router.free(&id).unwrap();
                                assert!(router.prefill_complete(&id).is_err());
                            }
                        }
                        _ => {}
                    }
                }
                for (id, _) in open {
                    router.free(&id).unwrap();
                }
                peak
            })
        })
        .collect();
    let peaks: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(
        peaks.iter().all(|&p| p > 10),
        "reservations must overlap: {peaks:?}"
    );
    assert_eq!(router.active_bookings(), 0);
    for (worker, load) in router.loads() {
        assert_eq!(
            load,
            Default::default(),
            "worker {worker:?} did not return to zero"
        );
    }
}

/// Workers marked unhealthy, probed healthy, added and removed at random until `stop`.
fn churn_until_stopped(router: &Router, stop: &Stop) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    let mut next = 16;
    loop {
        let id = WorkerId {
            worker_id: rng.gen_range(0..next),
            dp_rank: 0,
        };
        match rng.gen_range(0..4) {
            0 => router.mark_unhealthy(id, std::time::Duration::ZERO),
            1 => router.record_probe(id, Ok(())),
            2 => {
                router.add_worker(spec(next)).unwrap();
                next += 1;
            }
            _ => {
                let _ = router.remove_worker(id);
            }
        }
        // The churn's rate against the selecting threads.
        if stop.pause(std::time::Duration::from_micros(200)) {
            break;
        }
    }
}

/// The partition's kept columns hold exactly the healthy members, each with its booked
/// load; the loads.
fn columns_match_loads(
    router: &Router,
    partition: &PartitionKey,
) -> std::collections::HashMap<WorkerId, switchyard::fleet::load_accounting::WorkerLoad> {
    let columns = router.kept_columns(partition).unwrap();
    let loads: std::collections::HashMap<_, _> = router.loads().into_iter().collect();
    let mut kept: Vec<WorkerId> = (0..columns.len()).map(|row| columns.worker(row)).collect();
    for (row, id) in kept.iter().enumerate() {
        let load = loads[id];
        assert_eq!(
            (
                columns.active_prefill_tokens[row],
                columns.active_decode_blocks[row],
                columns.active_requests[row]
            ),
            (
                load.active_prefill_tokens,
                load.active_decode_blocks,
                load.active_requests
            ),
            "worker {id:?}"
        );
    }
    let mut healthy: Vec<WorkerId> = router
        .workers()
        .iter()
        .map(|w| w.id())
        .filter(|id| router.is_healthy(*id))
        .collect();
    kept.sort_by_key(|w| (w.worker_id, w.dp_rank));
    healthy.sort_by_key(|w| (w.worker_id, w.dp_rank));
    assert_eq!(
        kept, healthy,
        "the columns hold exactly the healthy members"
    );
    loads
}

/// Bookings from several threads while workers fail and recover their health, join and
/// leave: once quiet, the candidate columns the router keeps per partition hold exactly
/// the healthy members, each with its booked load, and every count is back to zero.
#[test]
fn kept_candidate_columns_follow_bookings_health_and_membership() {
    let dir = tempfile::tempdir().unwrap();
    let router = router_with(dir.path(), 16);
    let partition = PartitionKey::new("m", WorkerType::Select);
    let stop = Stop::new();
    let bookers: Vec<_> = (0..3u64)
        .map(|t| {
            let router = router.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                let mut open: Vec<String> = Vec::new();
                for n in 0..3000 {
                    if rng.gen_bool(0.6) && open.len() < 32 {
                        let id = format!("t{t}-r{n}");
                        let request = random_request(&mut rng, &id);
                        // Every worker may be unhealthy or gone for a moment.
                        if router.select_and_reserve(&request).is_ok() {
                            open.push(id);
                        }
                    } else if !open.is_empty() {
                        let id = open.swap_remove(rng.gen_range(0..open.len()));
                        if rng.gen_bool(0.3) {
                            let _ = router.prefill_complete(&id);
                        }
                        // Gone with its worker, if that left.
                        let _ = router.free(&id);
                    }
                }
                open
            })
        })
        .collect();
    let churn = {
        let router = router.clone();
        stop.spawn(move |stop| churn_until_stopped(&router, stop))
    };
    let open: Vec<String> = bookers
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    stop.stop();
    churn.join().unwrap();

    let check = || columns_match_loads(&router, &partition);
    let loads = check();
    assert!(
        loads.values().any(|l| l.active_requests > 0),
        "some bookings are still open: {} requests",
        open.len()
    );
    for id in &open {
        let _ = router.free(id);
    }
    for load in check().values() {
        assert_eq!(*load, Default::default());
    }
}

#[test]
fn an_instance_over_its_call_budget_trips_to_the_fallback_for_its_cool_down() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "plugins:\n  - path: {}\nworker_selection:\n  instances:\n\
         \x20   - name: slow\n      on_error: fallback\n      call_budget_ms: 1\n      trip_after: 2\n      trip_cooldown_secs: 600\n\
         \x20     scorers: [{{type: panicky.slow, parameters: {{sleep_ms: 20}}}}]\n      picker: {{type: builtin.lowest-cost}}\n\
         workers:\n  - {{model: demo, worker_id: 1}}\n  - {{model: demo, worker_id: 2}}\n",
        rust_plugin("panicky").display()
    );
    let router = Router::new(start_yaml(dir.path(), &yaml).unwrap()).unwrap();
    let request = RouteRequest {
        model: "demo".into(),
        instance: Some("slow".into()),
        token_ids: Some(vec![1, 2, 3]),
        ..Default::default()
    };
    // Two selections of 20 ms against a 1 ms budget: the second trips the instance.
    assert!(!router.select(&request).unwrap().fallback);
    assert!(!router.select(&request).unwrap().fallback);
    // Tripped: the built-in policy routes, without calling the slow component.
    let decision = router.select(&request).unwrap();
    assert!(decision.fallback, "{decision:?}");
    assert_eq!(decision.instance, "slow");
    let metrics = router.render_metrics();
    assert!(
        metrics.contains("switchyard_instance_tripped{instance=\"slow\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("switchyard_over_budget_selections_total{instance=\"slow\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("switchyard_fallbacks_total{instance=\"slow\"} 1"),
        "{metrics}"
    );
}

/// The `default` policy's `uncached_weight`: worker 0 holds the request's 32 blocks but
/// has two 32-block prefills booked (cost 2 x (32 queued + 32 decoding) = 128); worker 1
/// is idle and must prefill all 32 (cost 32 x weight + 32 decoding). At weight 1 the idle
/// worker is cheaper (64); at the default, 8, the holder is (288 against 128).
#[test]
fn uncached_weight_decides_between_the_holder_under_load_and_an_idle_worker() {
    let chosen = |knobs: &str| {
        let dir = tempfile::tempdir().unwrap();
        let startup = start_yaml(
            dir.path(),
            &format!("worker_selection:\n  builtin_default: {{{knobs}}}\n"),
        )
        .unwrap();
        let router = Router::new(startup).unwrap();
        for id in 0..2 {
            router.add_worker(spec(id)).unwrap();
        }
        let holder = WorkerId {
            worker_id: 0,
            dp_rank: 0,
        };
        let prompt: Vec<u64> = (1..=32).collect();
        let stored: switchyard::fleet::kv_index::KvEvent =
            serde_json::from_value(serde_json::json!({"type": "stored", "block_hashes": prompt}))
                .unwrap();
        router.kv_events(holder, &[stored]).unwrap();
        for booking in 0..2u64 {
            let booked = router
                .select_and_reserve(&RouteRequest {
                    model: "m".into(),
                    block_hashes: Some((1000 * (booking + 1)..1000 * (booking + 1) + 32).collect()),
                    request_id: Some(format!("load-{booking}")),
                    tracks_prefill_tokens: true,
                    only: Some(Arc::new([holder].into_iter().collect())),
                    ..Default::default()
                })
                .unwrap();
            assert_eq!(booked.worker_id, 0);
        }
        let decision = router
            .select(&RouteRequest {
                model: "m".into(),
                block_hashes: Some(prompt.into()),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(
            decision.device_overlap_blocks,
            if decision.worker_id == 0 { 32 } else { 0 }
        );
        decision.worker_id
    };
    assert_eq!(chosen("uncached_weight: 1"), 1, "weight 1: the idle worker");
    assert_eq!(chosen(""), 0, "the default weight: the holder");
}
