//! A plugin is built and shipped separately: changing the example plugin's source and
//! rebuilding it alone changes the router's decision while the router binary stays
//! byte-identical.

mod support;

use std::path::Path;
use std::process::Command;

use sha2::{Digest, Sha256};
use support::*;

fn sha256(path: &Path) -> Vec<u8> {
    Sha256::digest(std::fs::read(path).unwrap()).to_vec()
}

fn decide(config: &Path) -> String {
    run(Command::new(switchyard_bin())
        .args(["select", "--config"])
        .arg(config)
        .args([
            "--blocks", "8", "--worker", "1:0:3", "--worker", "2:4:1", "--worker", "4:2:0",
        ]))
}

#[test]
fn rebuilding_the_plugin_alone_changes_the_decision_not_the_router() {
    let dir = tempfile::tempdir().unwrap();
    let krate = dir.path().join("least-busy");
    std::fs::create_dir_all(krate.join("src")).unwrap();
    std::fs::write(
        krate.join("Cargo.toml"),
        format!(
            "[package]\nname = \"least-busy\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[lib]\ncrate-type = [\"cdylib\"]\n\n\
             [dependencies]\nswitchyard-plugin-sdk = {{ path = \"{}\" }}\nserde = {{ version = \"1\", features = [\"derive\"] }}\n\n[workspace]\n",
            repo().join("plugin-sdk").display()
        ),
    )
    .unwrap();
    std::fs::copy(repo().join("Cargo.lock"), krate.join("Cargo.lock")).unwrap();
    let source =
        std::fs::read_to_string(repo().join("plugins/rust/least-busy/src/lib.rs")).unwrap();
    std::fs::write(krate.join("src/lib.rs"), &source).unwrap();

    let config = write_config(dir.path(), "plugins:\n  - path: plugin.so\nworker_selection:\n  default: lb\n  instances:\n    - name: lb\n      type: least-busy\n");
    let router = switchyard_bin();
    let router_before = sha256(&router);

    std::fs::copy(
        build_plugin_crate(&krate).join("libleast_busy.so"),
        dir.path().join("plugin.so"),
    )
    .unwrap();
    assert_eq!(
        decide(&config),
        "worker 4 dp_rank 0\n",
        "least busy: worker 4 has no active request"
    );

    // The plugin author swaps the SDK's active-requests scorer for one of their own that
    // prefers the busiest worker, and rebuilds the plugin alone.
    let busiest = r#"
struct Busiest;

impl switchyard_plugin_sdk::WorkerScorer for Busiest {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::LOAD
    }
    fn score(
        &mut self,
        _: &WorkerSelectionContext<'_>,
        candidate: &switchyard_plugin_sdk::WorkerCandidate<'_>,
    ) -> Result<f64, PolicyError> {
        let load = candidate.load().ok_or("load input unavailable")?;
        Ok(-f64::from(load.active_requests))
    }
}
"#;
    let changed = source.replace(
        "vec![Box::new(ActiveRequests)],",
        "vec![Box::new(Busiest)],",
    ) + busiest;
    assert_eq!(
        changed.matches("Box::new(Busiest)").count(),
        1,
        "the policy's scorer line to change was not found"
    );
    std::fs::write(krate.join("src/lib.rs"), changed).unwrap();
    std::fs::copy(
        build_plugin_crate(&krate).join("libleast_busy.so"),
        dir.path().join("plugin.so"),
    )
    .unwrap();
    assert_eq!(
        decide(&config),
        "worker 1 dp_rank 0\n",
        "busiest: worker 1 has 3 active requests"
    );

    assert_eq!(
        sha256(&router),
        router_before,
        "the router binary must not change"
    );
}
