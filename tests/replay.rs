//! `switchyard replay` on a small generated trace (the public trace is not needed):
//! a cache-aware policy must beat a load-only one on hit rate, and bad traces get errors
//! that name the file and line.

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

#[test]
fn bad_traces_and_policies_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("bad.jsonl");
    std::fs::write(&trace, "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n{\"timestamp\": 5}\n").unwrap();
    let run = |args: &[&str]| {
        let output = Command::new(switchyard_bin())
            .arg("replay")
            .args(args)
            .arg("--trace")
            .arg(&trace)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(1));
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let error = run(&["--policy", "kv-overlap"]);
    assert!(
        error.contains("bad.jsonl:2: not a trace request: missing field `input_length`"),
        "{error}"
    );
    std::fs::write(
        &trace,
        "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n",
    )
    .unwrap();
    let error = run(&["--policy", "nope"]);
    assert!(error.contains("--policy nope: no such instance; available: default, least-busy, kv-overlap, load-only"), "{error}");
}
