//! Thousands of interleaved reserve / prefill-complete / free calls from several threads
//! through the router: every worker's counts return to zero. An instance over its call
//! budget is tripped to the fallback policy.

mod support;

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use support::*;
use switchyard::fleet::router::{RouteRequest, Router};
use switchyard::fleet::workers::WorkerSpec;

#[test]
fn interleaved_reservations_return_every_count_to_zero() {
    let dir = tempfile::tempdir().unwrap();
    let startup = start_yaml(
        dir.path(),
        "worker_selection:\n  builtin_default: {temperature: 0.5, seed: 3}\n",
    )
    .unwrap();
    let router = Arc::new(Router::new(startup).unwrap());
    for id in 0..8 {
        let spec: WorkerSpec =
            serde_json::from_value(serde_json::json!({"model": "m", "worker_id": id})).unwrap();
        router.add_worker(spec).unwrap();
    }
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
                                model: "m".into(),
                                block_hashes: Some((0..rng.gen_range(1..40)).collect()),
                                request_id: Some(id.clone()),
                                expected_output_tokens: Some(rng.gen_range(0..200)),
                                tracks_prefill_tokens: true,
                                ..Default::default()
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
