//! `replay` run in process, through the tools crate's public API (`ReplayArgs` parsed as
//! the command line parses them, then `replay::run`): no binary, no server. The runs of
//! the `switchyard replay` command stay in tests/replay.rs.

use std::path::Path;

use clap::Parser;
use switchyard_tools::replay::{run, ReplayArgs, ReplayError};

#[derive(Parser)]
struct Replay {
    #[command(flatten)]
    args: ReplayArgs,
}

/// `replay ARGS --trace TRACE`, its CSV and SVG written beside the trace.
fn replay(args: &[&str], trace: &Path) -> Result<(), ReplayError> {
    let dir = trace.parent().unwrap();
    let mut argv: Vec<String> = ["replay"]
        .iter()
        .chain(args)
        .map(|a| a.to_string())
        .collect();
    for (flag, path) in [
        ("--trace", trace.to_owned()),
        ("--csv", dir.join("out.csv")),
        ("--svg", dir.join("out.svg")),
    ] {
        argv.push(flag.to_owned());
        argv.push(path.display().to_string());
    }
    run(&Replay::parse_from(argv).args)
}

/// One request of a trace line: at `ms`, `blocks` prompt blocks of 512 tokens.
fn request(ms: u64, blocks: &[u64]) -> String {
    format!(
        "{{\"timestamp\": {ms}, \"input_length\": {}, \"output_length\": 4, \"hash_ids\": {blocks:?}}}\n",
        blocks.len() * 512
    )
}

#[test]
fn a_replay_writes_one_csv_row_per_policy_and_an_svg() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.jsonl");
    let lines: String = (0..40u64)
        .map(|i| request(i * 100, &[i % 4, 100 + i % 4, 200 + i]))
        .collect();
    std::fs::write(&trace, lines).unwrap();
    replay(
        &[
            "--workers",
            "2",
            "--policy",
            "kv-overlap",
            "--policy",
            "least-busy",
        ],
        &trace,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let csv = std::fs::read_to_string(dir.path().join("out.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(rows.len(), 2, "{csv}");
    assert_eq!((rows[0][0], rows[0][1]), ("kv-overlap", "40"), "{csv}");
    assert_eq!((rows[1][0], rows[1][1]), ("least-busy", "40"), "{csv}");
    let svg = std::fs::read_to_string(dir.path().join("out.svg")).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("kv-overlap"),
        "{svg}"
    );
}

#[test]
fn bad_traces_and_policies_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("bad.jsonl");
    std::fs::write(&trace, request(0, &[1]) + "{\"timestamp\": 5}\n").unwrap();
    let error = replay(&["--policy", "kv-overlap"], &trace)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("bad.jsonl:2: not a trace request: missing field `input_length`"),
        "{error}"
    );
    std::fs::write(&trace, request(5, &[1]) + &request(0, &[2])).unwrap();
    let error = replay(&["--policy", "kv-overlap"], &trace)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("bad.jsonl:2: timestamps go backwards"),
        "{error}"
    );
    std::fs::write(&trace, request(0, &[1])).unwrap();
    let error = replay(&["--policy", "nope"], &trace)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains(
            "--policy nope: no such instance; available: default, least-busy, kv-overlap, load-only"
        ),
        "{error}"
    );
    assert!(
        !dir.path().join("out.csv").exists(),
        "nothing written on an error"
    );
}
