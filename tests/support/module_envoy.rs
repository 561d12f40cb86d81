//! A real Envoy with switchyard's dynamic module (`libswitchyard_envoy.so`, built from
//! `host/envoy-module`) for the tests: docs/envoy.md's module config, its addresses,
//! engines and config path changed to the test's, and the module's HTTP API (`listen`),
//! which shows its bookings and metrics.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use super::real_envoy::{free_port, module_config, module_dir, Envoy};
use super::{demo_workers, engine_sim, eventually_ok, switchyard_bin, write_config, Process};

/// A real Envoy with the module, and the module's HTTP API.
pub struct ModuleEnvoy {
    pub envoy: Envoy,
    pub api: String,
}

/// switchyard's config for `engines` (by address), written to `dir`, with `extra` lines.
pub fn switchyard_config(dir: &Path, engines: &[&Process], extra: &str) -> PathBuf {
    let workers = demo_workers(engines.iter().copied(), true);
    write_config(
        dir,
        &format!(
            "models:\n  demo: {{kv_tracking: predicted}}\n\
             frontend: {{health_interval_ms: 100, unhealthy_cooldown_ms: 300, health_timeout_ms: 200}}\n\
             {extra}workers:\n{workers}"
        ),
    )
}

/// The engines' addresses, as the Envoy cluster lists them.
pub fn addresses(engines: &[&Process]) -> Vec<SocketAddr> {
    engines
        .iter()
        .map(|e| e.address.trim_start_matches("http://").parse().unwrap())
        .collect()
}

/// Envoy with the module in front of `engines`, switchyard's config `config`.
pub fn start_module(dir: &Path, config: &Path, engines: &[&Process]) -> ModuleEnvoy {
    start_module_with(dir, config, engines, |text| text)
}

/// `start_module`, the Envoy config (docs/envoy.md's, addresses changed) passed through
/// `edit` first.
pub fn start_module_with(
    dir: &Path,
    config: &Path,
    engines: &[&Process],
    edit: impl FnOnce(String) -> String,
) -> ModuleEnvoy {
    let modules = module_dir();
    let (port, api) = (free_port(), free_port());
    let text = edit(module_config(port, config, api, &addresses(engines)));
    let envoy = Envoy::start_with_env(
        dir,
        port,
        &text,
        &[
            ("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", modules.as_os_str()),
            ("SWITCHYARD_EXE", switchyard_bin().as_os_str()),
            ("RUST_LOG", "warn".as_ref()),
        ],
    );
    let api = format!("http://127.0.0.1:{api}");
    eventually_ok(
        "the module's HTTP API answers",
        Duration::from_secs(30),
        || {
            ureq::get(&format!("{api}/v1/workers"))
                .call()
                .map(drop)
                .map_err(|e| e.to_string())
        },
    );
    ModuleEnvoy { envoy, api }
}

pub fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build()
}

pub fn chat(content: &str, stream: bool) -> Value {
    json!({"model": "demo", "stream": stream, "max_tokens": 6,
           "messages": [{"role": "user", "content": content}]})
}

/// `count` engine-sims named `e0`, `e1`, ..., with `extra` arguments.
pub fn engine_sims(count: usize, extra: &[&str]) -> Vec<Process> {
    (0..count)
        .map(|i| engine_sim(&format!("e{i}"), "127.0.0.1:0", extra))
        .collect()
}

/// The value of the series `name{labels}` (labels as written, e.g. `instance="c"`) in
/// the `/metrics` of `base`; 0 when absent.
pub fn labelled_metric(base: &str, name: &str, labels: &str) -> f64 {
    let series = format!("{name}{{{labels}}} ");
    super::metrics_text(base)
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}
