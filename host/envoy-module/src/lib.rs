//! switchyard's router as an Envoy dynamic module (`libswitchyard_envoy.so`): an HTTP
//! filter that runs the router core inside Envoy's process, with no gRPC hop. The same
//! YAML config as `switchyard serve` (its path in the filter's config), the same policy
//! plugins, pipeline, KV index and events, bookings and admission; each request's pick
//! becomes Envoy's upstream override host. docs/envoy.md, "switchyard as an Envoy
//! dynamic module", shows the Envoy config.
//!
//! - `abi.rs`: the part of Envoy's C ABI (abi.h) the module calls;
//! - `hooks.rs`: the hooks Envoy calls, each guarded against panics;
//! - `filter_config.rs`: one router per filter config, and the module's threads;
//! - `stream.rs`: one stream's request, decision, booking and end;
//! - `envoy.rs`: the callbacks of one stream, as safe calls;
//! - `stats.rs`: the module's decisions in Envoy's own stats.

pub mod abi;
pub mod envoy;
pub mod filter_config;
pub mod hooks;
pub mod stats;
pub mod stream;

/// Once per process, when Envoy loads the module: logs to stderr (`RUST_LOG`, `info` by
/// default, as `serve`), and one TLS crypto provider for every engine client.
pub fn init_process() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,zeromq=error".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
    switchyard_engines::tls::install_default_provider();
}
