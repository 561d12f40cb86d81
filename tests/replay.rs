//! `switchyard replay` on a small generated trace (the public trace is not needed):
//! a cache-aware policy must beat a load-only one on hit rate, the same replay with the
//! workers' KV events sent over ZeroMQ matches the in-process one. Bad traces, and a
//! replay run in process, are tested beside the tools crate (host/tools/tests/replay.rs).

mod support;

use std::process::Command;

use support::*;

/// 300 requests in 10 conversations: each turn extends its conversation's prefix.
fn write_trace(path: &std::path::Path) {
    let mut lines = String::new();
    for i in 0..300u64 {
        let conversation = i % 10;
        let turn = i / 10;
        let blocks: Vec<u64> = (0..4 + turn).map(|b| conversation * 1_000 + b).collect();
        lines.push_str(&format!(
            "{{\"timestamp\": {}, \"input_length\": {}, \"output_length\": 20, \"hash_ids\": {:?}}}\n",
            i * 50,
            blocks.len() * 512,
            blocks
        ));
    }
    std::fs::write(path, lines).unwrap();
}

#[test]
fn replay_compares_policies_and_writes_csv_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.jsonl");
    write_trace(&trace);
    let (csv, svg) = (dir.path().join("out.csv"), dir.path().join("out.svg"));
    run(Command::new(switchyard_bin())
        .args([
            "replay",
            "--workers",
            "4",
            "--policy",
            "kv-overlap",
            "--policy",
            "load-only",
            "--trace",
        ])
        .arg(&trace)
        .arg("--csv")
        .arg(&csv)
        .arg("--svg")
        .arg(&svg));
    let csv = std::fs::read_to_string(&csv).unwrap();
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(rows.len(), 2, "{csv}");
    assert_eq!((rows[0][0], rows[0][1]), ("kv-overlap", "300"));
    let hit = |row: &Vec<&str>| row[2].parse::<f64>().unwrap();
    // Turn t of a conversation can reuse the t+3 blocks of its previous turn, if it lands
    // on the same worker: the cache-aware policy finds it, load-only mostly does not.
    assert!(hit(&rows[0]) > 0.9, "kv-overlap hit rate {csv}");
    assert!(
        hit(&rows[0]) > hit(&rows[1]) + 0.1,
        "kv-overlap must beat load-only: {csv}"
    );
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("kv-overlap") && svg.contains("prefix-cache hit rate"));
}

/// `replay --kv-events MODE`: (policy, hit rate) per row of the CSV.
fn hit_rates(trace: &std::path::Path, mode: &str) -> Vec<(String, f64)> {
    let dir = trace.parent().unwrap();
    let csv = dir.join(format!("{mode}.csv"));
    run(Command::new(switchyard_bin())
        .args(["replay", "--workers", "4", "--kv-events", mode])
        .args([
            "--policy",
            "default",
            "--policy",
            "kv-overlap",
            "--policy",
            "load-only",
        ])
        .arg("--trace")
        .arg(trace)
        .arg("--csv")
        .arg(&csv)
        .arg("--svg")
        .arg(dir.join(format!("{mode}.svg"))));
    std::fs::read_to_string(&csv)
        .unwrap()
        .lines()
        .skip(1)
        .map(|line| {
            let fields: Vec<&str> = line.split(',').collect();
            (fields[0].to_owned(), fields[2].parse().unwrap())
        })
        .collect()
}

#[test]
fn kv_events_over_zeromq_give_the_in_process_hit_rates() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.jsonl");
    write_trace(&trace);
    let in_process = hit_rates(&trace, "in-process");
    // Each simulated worker publishes vLLM-format batches (token ids, its own block
    // hashes) on loopback; the router's subscribers and hash agreement feed the index,
    // and requests go in as token ids.
    let zmq = hit_rates(&trace, "zmq");
    assert_eq!(zmq.len(), 3);
    for ((policy, a), (same, b)) in in_process.iter().zip(&zmq) {
        assert_eq!(policy, same);
        assert!(
            (a - b).abs() <= 0.01,
            "{policy}: in process {a}, over ZeroMQ {b}: more than 1 point apart"
        );
    }
    // The events did arrive: blind to the cache, kv-overlap would do no better than
    // load-only.
    assert!(zmq[1].1 > zmq[2].1 + 0.1, "{zmq:?}");
}

/// `--replicas 3`: with shared bookings (what the NATS bus carries, without its latency)
/// three routers running the deterministic `least-busy` decide as one; each counting only
/// its own bookings, they balance worse. (Seeded random tie-breaks, as in `kv-overlap`,
/// draw from one generator per replica, so those runs differ by their draws alone.)
#[test]
fn replicas_sharing_bookings_route_as_one_router() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.jsonl");
    write_trace(&trace);
    let csv = dir.path().join("replicas.csv");
    run(Command::new(switchyard_bin())
        .args(["replay", "--workers", "4", "--policy", "least-busy"])
        .args([
            "--replicas",
            "1",
            "--replicas",
            "3",
            "--sync",
            "none",
            "--sync",
            "shared",
        ])
        .arg("--trace")
        .arg(&trace)
        .arg("--csv")
        .arg(&csv)
        .arg("--svg")
        .arg(dir.path().join("replicas.svg")));
    let csv = std::fs::read_to_string(&csv).unwrap();
    let rows: std::collections::HashMap<String, Vec<String>> = csv
        .lines()
        .skip(1)
        .map(|l| {
            let fields: Vec<String> = l
                .split(',')
                .map(|f| f.trim_matches('"').to_owned())
                .collect();
            (fields[0].clone(), fields)
        })
        .collect();
    let (one, shared, alone) = (
        &rows["least-busy"],
        &rows["least-busy x3 (shared)"],
        &rows["least-busy x3 (none)"],
    );
    // Hit rate, imbalance, TTFT p50 and p99: the same decisions.
    assert_eq!(one[2..6], shared[2..6], "{csv}");
    let imbalance = |row: &Vec<String>| row[3].parse::<f64>().unwrap();
    assert!(
        imbalance(alone) > imbalance(one),
        "without sharing the load spreads worse: {csv}"
    );
}

/// `replay --adapters`: requests ask for LoRA adapters, simulated engines report the
/// adapters of their requests (ENGINE), and the LoRA-affinity scorer of
/// `examples/lora-replay.yaml` sends more of them where their adapter is held.
#[test]
fn lora_affinity_raises_the_adapter_hit_rate_in_replay() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.jsonl");
    write_trace(&trace);
    let csv = dir.path().join("lora.csv");
    run(Command::new(switchyard_bin())
        .args([
            "replay",
            "--workers",
            "4",
            "--adapters",
            "8",
            "--max-loras",
            "2",
        ])
        .args(["--policy", "default-only", "--policy", "lora-aware-heavy"])
        .arg("--config")
        .arg(repo().join("examples/lora-replay.yaml"))
        .arg("--trace")
        .arg(&trace)
        .arg("--csv")
        .arg(&csv)
        .arg("--svg")
        .arg(dir.path().join("lora.svg")));
    let csv = std::fs::read_to_string(&csv).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let column = header
        .iter()
        .position(|h| *h == "adapter_hit_rate")
        .unwrap();
    let rate = |policy: &str| -> f64 {
        csv.lines()
            .find(|l| l.starts_with(policy))
            .unwrap()
            .split(',')
            .nth(column)
            .unwrap()
            .parse()
            .unwrap()
    };
    let (plain, aware) = (rate("default-only"), rate("lora-aware-heavy"));
    assert!(
        aware > plain + 0.1,
        "adapter hits {plain} -> {aware}:\n{csv}"
    );
}

/// `replay --batch-share` with `admission:`: past the fleet's capacity, requests wait in
/// the router's own queue in trace time, the interactive tenant (priority 10) ahead of
/// the batch one (0), so its TTFT stays below the batch tenant's.
#[test]
fn the_admission_queue_puts_the_interactive_tenant_first_in_replay() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.jsonl");
    write_trace(&trace);
    let config = dir.path().join("admission.yaml");
    std::fs::write(
        &config,
        "admission:\n  busy: {max_active_prefill_tokens: 4096}\n  queue: {max_queued: 300, max_wait_ms: 600000}\nworker_selection:\n  instances:\n    - {name: least-busy, type: builtin.least-busy}\n",
    )
    .unwrap();
    let csv = dir.path().join("tenants.csv");
    run(Command::new(switchyard_bin())
        .args(["replay", "--workers", "2", "--prefill-tps", "10000"])
        .args([
            "--policy",
            "least-busy",
            "--batch-share",
            "0.5",
            "--time-scale",
            "2",
        ])
        .arg("--config")
        .arg(&config)
        .arg("--trace")
        .arg(&trace)
        .arg("--csv")
        .arg(&csv)
        .arg("--svg")
        .arg(dir.path().join("tenants.svg")));
    let csv = std::fs::read_to_string(&csv).unwrap();
    let p99 = |tenant: &str| -> f64 {
        let row = csv
            .lines()
            .find(|l| l.contains(&format!("[{tenant}]")))
            .unwrap_or_else(|| panic!("no {tenant} row:\n{csv}"));
        row.split(',').nth(5).unwrap().parse().unwrap()
    };
    // Measured: interactive p99 8.6 s, batch 15.8 s; none refused.
    assert!(
        p99("interactive") * 1.5 < p99("batch"),
        "the interactive tenant goes first:\n{csv}"
    );
    assert!(
        csv.lines().skip(1).all(|l| l.ends_with(",0")),
        "none refused:\n{csv}"
    );
}

/// `replay --prefill-workers P --decode-workers D`: the disaggregated fleet against an
/// aggregated one of the same size, with the same interference model. A decode worker
/// never prefills, so its decodes keep full speed while the aggregated ones stall during
/// prefills (the TPOT tail); one decode worker for the whole fleet is a bottleneck.
#[test]
fn replay_compares_a_disaggregated_fleet_with_an_aggregated_one() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.jsonl");
    write_trace(&trace);
    let table = |p: &str, d: &str, batch: &str| {
        let out = run(Command::new(switchyard_bin())
            .args([
                "replay",
                "--policy",
                "kv-overlap",
                "--prefill-workers",
                p,
                "--decode-workers",
                d,
            ])
            .args([
                "--decode-tps",
                "40",
                "--prefill-tps",
                "20000",
                "--decode-batch",
                batch,
            ])
            .arg("--trace")
            .arg(&trace));
        let rows: Vec<Vec<f64>> = out
            .lines()
            .skip(1)
            .map(|l| {
                l.split_whitespace()
                    .rev()
                    .take(6)
                    .map(|v| v.trim_end_matches('%').parse().unwrap())
                    .collect::<Vec<f64>>()
                    .into_iter()
                    .rev()
                    .collect()
            })
            .collect();
        assert_eq!(rows.len(), 2, "{out}");
        (out, rows)
    };
    // Columns: hit rate, TTFT p50, TTFT p99, TPOT p50, TPOT p99, tokens/s.
    let (out, rows) = table("2", "2", "16");
    let (aggregated, pairs) = (&rows[0], &rows[1]);
    assert!(
        out.lines().nth(1).unwrap().contains("aggregated 4"),
        "{out}"
    );
    assert!(
        out.lines().nth(2).unwrap().contains("2 prefill + 2 decode"),
        "{out}"
    );
    assert!(
        pairs[4] < aggregated[4],
        "decodes never wait for a prefill: {out}"
    );
    assert!(
        pairs[1] > aggregated[1],
        "the KV transfer and half the prefill capacity cost TTFT: {out}"
    );
    let (out, rows) = table("3", "1", "4");
    assert!(
        rows[1][3] > rows[0][3] * 2.0,
        "one decode worker for all is a bottleneck: {out}"
    );
}
