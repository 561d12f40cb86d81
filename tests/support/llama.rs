//! Real engines for the tests: llama.cpp servers (PyPI xllamacpp, started by
//! `scripts/llama-server.py` with the venv's Python) serving SmolLM2-135M, both installed
//! by `scripts/install-test-tools` into target/. Each is stopped by its PID when dropped
//! (and dies with the thread that started it).

use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::{free_port, repo, Process};

/// The model name the servers answer to (`--alias`).
pub const MODEL: &str = "smollm2";

fn python() -> PathBuf {
    repo().join("target/test-venv/bin/python")
}

/// The GGUF model file the servers serve (its tokenizer is the router's in tests/engine_tokens.rs).
pub fn model() -> PathBuf {
    repo().join("target/models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// Whether llama.cpp and its model are installed. When they are not, says why on
/// stderr (the test then skips), or fails when `SWITCHYARD_REAL_ENGINES=required`
/// (`.ci/run` sets it: CI must run these tests).
pub fn available() -> bool {
    let missing = if !model().is_file() {
        Some(format!("no model at {}", model().display()))
    } else {
        let imports = Command::new(python())
            .args(["-c", "import xllamacpp"])
            .output();
        match imports {
            Ok(out) if out.status.success() => None,
            Ok(_) => Some(format!("no xllamacpp in {}", python().display())),
            Err(e) => Some(format!("cannot run {}: {e}", python().display())),
        }
    };
    let Some(missing) = missing else {
        return true;
    };
    let why = format!("real-engine test skipped: {missing}; run scripts/install-test-tools (it needs PyPI) to install xllamacpp and the model");
    if std::env::var("SWITCHYARD_REAL_ENGINES").as_deref() == Ok("required") {
        panic!("{why} (SWITCHYARD_REAL_ENGINES=required)");
    }
    eprintln!("{why}");
    false
}

/// `count` llama.cpp servers on free loopback ports: `slots` parallel sequences each,
/// one thread, `--metrics` on. Started from this thread (a server dies with the thread
/// that started it), awaited at once (each loads its model in a few seconds).
pub fn servers(count: usize, slots: u32) -> Vec<Process> {
    let children: Vec<_> = (0..count).map(|_| spawn(free_port(), slots)).collect();
    std::thread::scope(|scope| {
        let announced: Vec<_> = children
            .into_iter()
            .map(|child| {
                scope.spawn(move || Process::announced(child, ANNOUNCE, "llama-server.py"))
            })
            .collect();
        announced.into_iter().map(|a| a.join().unwrap()).collect()
    })
}

fn spawn(port: u16, slots: u32) -> std::process::Child {
    Command::new(python())
        .arg(repo().join("scripts/llama-server.py"))
        .args(["--port", &port.to_string()])
        .args(["--slots", &slots.to_string(), "--threads", "1"])
        .args(["--alias", MODEL])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start scripts/llama-server.py")
}

const ANNOUNCE: &str = "llama-server listening on ";

/// Kills `engine` and starts a new server (`slots`) on its port: the same URL.
pub fn restart(engine: &mut Process, slots: u32) {
    engine.kill();
    let port = engine.address.rsplit(':').next().unwrap().parse().unwrap();
    *engine = Process::announced(spawn(port, slots), ANNOUNCE, "llama-server.py");
}

/// `workers:` entries of model `smollm2` for `engines` (ids from 1), by `url`.
pub fn workers(engines: &[Process]) -> String {
    engines
        .iter()
        .enumerate()
        .map(|(i, e)| {
            format!(
                "  - {{model: {MODEL}, worker_id: {}, url: \"{}\"}}\n",
                i + 1,
                e.address
            )
        })
        .collect()
}
