//! Loaded code cannot change under the router: a plugin file overwritten in place (`cp
//! new.so loaded.so`: same inode, new bytes) once killed the router at its next selection
//! (SIGILL), `sha256:` pin or not. The router maps a private, sealed copy of the bytes it
//! checked, so the old code keeps serving until a reload reads and checks the file again.
//! Each test starts the real `switchyard serve` with a real plugin and stops it.

mod support;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use support::server::Server;
use support::*;

/// The fixture plugin (`fixture.by-id`: sign 1 prefers worker 1, -1 worker 3) built into
/// `dir`; its path.
fn version(dir: &Path, sign: i32) -> PathBuf {
    broken_plugin(
        dir,
        &format!("version{}", sign + 1),
        &[&format!("BY_ID_SIGN={sign}")],
    )
}

fn config(plugin: &Path, plugin_settings: &str) -> String {
    format!(
        "plugins:\n  - path: {}\n{plugin_settings}\
         isolation: {{restart_backoff_ms: 50}}\n\
         worker_selection:\n  default: v\n  instances:\n    - name: v\n\
         \x20     scorers: [{{type: fixture.by-id}}]\n      picker: {{type: builtin.lowest-cost}}\n\
         workers:\n  - {{model: demo, worker_id: 1}}\n  - {{model: demo, worker_id: 2}}\n  - {{model: demo, worker_id: 3}}\n",
        plugin.display()
    )
}

/// The worker one selection chose; panics (naming the answer) if the router did not answer.
fn chosen(server: &Server) -> u64 {
    let (status, decision) =
        server.post("/v1/select", json!({"model": "demo", "block_hashes": [1]}));
    assert_eq!(status, 200, "{decision}");
    decision["worker_id"].as_u64().unwrap()
}

/// Writes `bytes` over `target` in place (same inode), as `cp` does.
fn overwrite_in_place(target: &Path, bytes: &[u8]) {
    let inode = std::fs::metadata(target).unwrap().ino();
    std::fs::write(target, bytes).unwrap();
    assert_eq!(std::fs::metadata(target).unwrap().ino(), inode);
}

/// Kills the router's isolated plugin process (its only child) and waits until the
/// supervisor has restarted it.
fn restart_isolated_process(server: &Server) {
    let tasks = format!("/proc/{}/task", server.process.pid());
    let children: Vec<String> = std::fs::read_dir(tasks)
        .unwrap()
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(children.len(), 1, "one isolated process: {children:?}");
    run(std::process::Command::new("kill").args(["-KILL", &children[0]]));
    let line_is = |metrics: &str, name: &str, value: &str| {
        metrics
            .lines()
            .any(|l| l.starts_with(name) && l.ends_with(value))
    };
    wait_for("the isolated process restarts", || {
        let metrics = server.metrics();
        line_is(&metrics, "switchyard_isolated_process_restarts", " 1")
            && line_is(&metrics, "switchyard_isolated_process_up{", " 1.0")
    });
}

fn reload(server: &Server) -> (u16, Value) {
    server.call("POST", "/v1/admin/reload", None)
}

fn sha256_of(path: &Path) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(std::fs::read(path).unwrap());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The plugin is overwritten in place by another version: selections still run the old
/// code; a reload checks and loads the new one; garbage written in place next is refused
/// by the reload, naming the file, and the generation before keeps serving.
fn overwritten_in_place_keeps_serving(plugin_settings: &str, isolated: bool) {
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("plugin.so");
    std::fs::copy(version(dir.path(), 1), &plugin).unwrap();
    let newer = std::fs::read(version(dir.path(), -1)).unwrap();
    let server = Server::start(&write_config(dir.path(), &config(&plugin, plugin_settings)));
    assert_eq!(chosen(&server), 1, "version 1 prefers worker 1");
    if !isolated {
        // The code mapped is the sealed copy, never the file.
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", server.process.pid()));
        let maps = maps.unwrap();
        assert!(
            maps.contains("/memfd:switchyard-plugin:plugin.so"),
            "{maps}"
        );
        assert!(!maps.contains(&plugin.display().to_string()), "{maps}");
    }

    overwrite_in_place(&plugin, &newer);
    for _ in 0..20 {
        assert_eq!(
            chosen(&server),
            1,
            "the loaded code changed under the router"
        );
    }
    if isolated {
        restart_isolated_process(&server);
        assert_eq!(
            chosen(&server),
            1,
            "the restarted child loaded the file, not the image"
        );
    }
    let (status, answer) = reload(&server);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(chosen(&server), 3, "the reload loads the new version");

    overwrite_in_place(
        &plugin,
        &b"not a library, written over the loaded one\n".repeat(100),
    );
    let (status, answer) = reload(&server);
    assert!(status >= 400, "{status} {answer}");
    let message = answer.to_string();
    assert!(
        message.contains(&plugin.display().to_string())
            && message.contains("does not start with the ELF magic bytes"),
        "{message}"
    );
    assert!(!message.contains("/proc/self/fd"), "{message}");
    for _ in 0..20 {
        assert_eq!(chosen(&server), 3, "the generation before keeps serving");
    }
}

#[test]
fn a_plugin_overwritten_in_place_keeps_serving_its_old_code() {
    overwritten_in_place_keeps_serving("", false);
}

#[test]
fn an_isolated_plugin_overwritten_in_place_keeps_serving_its_old_code() {
    overwritten_in_place_keeps_serving("    isolation: process\n", true);
}

/// A pinned plugin overwritten in place: the pin covers what is mapped, so selections
/// keep running the pinned code, and a reload refuses the new bytes as a checksum mismatch.
#[test]
fn a_pinned_plugin_overwritten_in_place_keeps_its_pinned_code() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("plugin.so");
    std::fs::copy(version(dir.path(), 1), &plugin).unwrap();
    let pin = format!("    sha256: {}\n", sha256_of(&plugin));
    let server = Server::start(&write_config(dir.path(), &config(&plugin, &pin)));
    assert_eq!(chosen(&server), 1);

    overwrite_in_place(&plugin, &std::fs::read(version(dir.path(), -1)).unwrap());
    for _ in 0..20 {
        assert_eq!(
            chosen(&server),
            1,
            "the pinned code changed under the router"
        );
    }
    let (status, answer) = reload(&server);
    assert!(status >= 400, "{status} {answer}");
    assert!(answer.to_string().contains("sha256 mismatch"), "{answer}");
    assert_eq!(chosen(&server), 1);
}
