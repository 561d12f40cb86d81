//! What `admission:` costs a selection that finds a worker, side by side in interleaved
//! rounds: the same router (1,024 workers, the built-in least-busy policy, select and
//! reserve then free) without the section, with a queue but no busy thresholds, and with
//! every threshold set but never reached (the busy pass over the candidates runs on every
//! selection), and with an admitter before each selection: the built-in strict priority,
//! and the C tenant allow-list (plugin, through the C ABI). Every variant but "not
//! admitted" (the selection alone) runs the serving paths' `admit` first. Median and fastest round per variant, and their ratios to
//! the router without `admission:`.
//!
//! `make bench-admission` (or `cargo bench -p switchyard --bench admission`).

use std::hint::black_box;
use std::time::Instant;

use switchyard::config::ConfigSource;
use switchyard::fleet::router::{RouteRequest, Router};
use switchyard::fleet::workers::WorkerSpec;
use switchyard::startup::start;

const WORKERS: u64 = 1_024;

fn router(admission: &str) -> Router {
    let yaml = format!(
        "{admission}worker_selection:\n  default: lb\n  instances:\n    - {{name: lb, type: builtin.least-busy}}\n"
    );
    let source = ConfigSource::parse(yaml, "<bench>".into(), std::path::PathBuf::new()).unwrap();
    let router = Router::new(start(source).unwrap_or_else(|e| panic!("{e:?}"))).unwrap();
    for id in 0..WORKERS {
        let spec: WorkerSpec =
            serde_json::from_value(serde_json::json!({"model": "bench", "worker_id": id})).unwrap();
        router.add_worker(spec).unwrap();
    }
    router
}

fn main() {
    let variants = [
        ("no admission", router("")),
        ("not admitted", router("")),
        ("queue only", router("admission: {queue: {max_queued: 1024}}\n")),
        (
            "thresholds",
            router("admission:\n  busy: {max_active_requests: 1000000, max_active_prefill_tokens: 1000000000}\n"),
        ),
        (
            "builtin admit",
            router("admission:\n  admitters: [{type: builtin.strict-priority, parameters: {priorities: {bench: 5}}}]\n"),
        ),
        (
            "C admitter",
            router(&format!(
                "plugins:\n  - path: {}/../target/plugins/libtenant_allowlist_c.so\nadmission:\n  admitters: [{{type: c.tenant-allowlist, parameters: {{tenants: [{{name: bench, priority: 5}}]}}}}]\n",
                env!("CARGO_MANIFEST_DIR")
            )),
        ),
    ];
    let request = RouteRequest {
        model: "bench".into(),
        block_hashes: Some((0..64).collect()),
        request_id: Some("bench".into()),
        tracks_prefill_tokens: true,
        attributes: Some(std::sync::Arc::new(switchyard::plugin::RequestAttributes {
            tenant: Some("bench".into()),
            ..Default::default()
        })),
        ..Default::default()
    };
    let per_round = 2_000;
    let mut samples = vec![Vec::new(); variants.len()];
    for _ in 0..31 {
        for (i, (_, router)) in variants.iter().enumerate() {
            let start = Instant::now();
            for _ in 0..per_round {
                // "not admitted": the selection alone, as before admitters existed.
                if i != 1 {
                    black_box(router.admit(&request, 64, 1024).unwrap());
                }
                black_box(router.select_and_reserve(&request).unwrap());
                router.free("bench").unwrap();
            }
            samples[i].push(start.elapsed().as_secs_f64() / f64::from(per_round));
        }
    }
    let stats: Vec<(f64, f64)> = samples
        .iter_mut()
        .map(|s| {
            s.sort_by(f64::total_cmp);
            (s[s.len() / 2], s[0])
        })
        .collect();
    println!("admit + select-and-reserve + free, {WORKERS} workers, 31 interleaved rounds of {per_round}:");
    println!(
        "{:<14} {:>12} {:>8} {:>12} {:>8}",
        "variant", "median", "ratio", "fastest", "ratio"
    );
    for ((label, _), (median, fastest)) in variants.iter().zip(&stats) {
        println!(
            "{label:<14} {:>9.2} us {:>8.3} {:>9.2} us {:>8.3}",
            median * 1e6,
            median / stats[0].0,
            fastest * 1e6,
            fastest / stats[0].1
        );
    }
}
