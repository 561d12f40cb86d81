//! The module's decisions in Envoy's own stats, beside switchyard's `/metrics` (which
//! has them all, on the module's `listen`): what an operator who scrapes Envoy sees
//! without a second endpoint. Envoy 1.40 keeps them under its custom-stats namespace:
//! `/stats` prints `dynamicmodulescustom.switchyard.picks: 12`, `/stats/prometheus`
//! `envoy_dynamicmodulescustom_switchyard_picks{} 12`.
//!
//! Envoy makes a filter config's stats only while that config is being made; each
//! stream then adds to them through its own filter, on its worker thread.

use std::time::Duration;

use crate::abi::{self, AddToMetric, Buffer, ConfigEnvoyPtr, DefineMetric};
use crate::envoy::Stream;

/// The ids Envoy gave the module's stats of one filter config.
pub struct EnvoyStats {
    /// `switchyard.picks`: requests the module sent to an endpoint it picked.
    picks: usize,
    /// `switchyard.refusals`: requests the module answered itself (admission, a bad
    /// request, no endpoint).
    refusals: usize,
    /// `switchyard.rebooks`: bookings moved to the endpoint that served after Envoy's
    /// retries.
    rebooks: usize,
    /// `switchyard.engine_failures`: picked engines Envoy could not reach.
    engine_failures: usize,
    /// `switchyard.decision_us`: how long each pick's decision took, in microseconds
    /// (the time `switchyard_ext_proc_decision_seconds` records).
    decision_us: usize,
}

impl EnvoyStats {
    /// Defines the stats in the filter config Envoy is making (call from
    /// `on_http_filter_config_new`); why not, when Envoy refuses one.
    pub fn define(config: ConfigEnvoyPtr) -> Result<EnvoyStats, String> {
        let counter = |name: &str| {
            define(
                config,
                name,
                abi::envoy_dynamic_module_callback_http_filter_config_define_counter,
            )
        };
        Ok(EnvoyStats {
            picks: counter("switchyard.picks")?,
            refusals: counter("switchyard.refusals")?,
            rebooks: counter("switchyard.rebooks")?,
            engine_failures: counter("switchyard.engine_failures")?,
            decision_us: define(
                config,
                "switchyard.decision_us",
                abi::envoy_dynamic_module_callback_http_filter_config_define_histogram,
            )?,
        })
    }

    /// A pick, and how long its decision took.
    pub fn picked(&self, stream: Stream, took: Duration) {
        add(stream, self.picks);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        add_to(
            stream,
            abi::envoy_dynamic_module_callback_http_filter_record_histogram_value,
            self.decision_us,
            micros,
        );
    }

    pub fn refused(&self, stream: Stream) {
        add(stream, self.refusals);
    }

    pub fn rebooked(&self, stream: Stream) {
        add(stream, self.rebooks);
    }

    pub fn engine_failed(&self, stream: Stream) {
        add(stream, self.engine_failures);
    }
}

fn define(config: ConfigEnvoyPtr, name: &str, define: DefineMetric) -> Result<usize, String> {
    let mut id = 0;
    // SAFETY: the config pointer of the `config_new` hook running; the name outlives the
    // call; no labels; `id` is written.
    let result = unsafe {
        define(
            config,
            Buffer::of(name.as_bytes()),
            std::ptr::null(),
            0,
            &mut id,
        )
    };
    if result == abi::METRICS_SUCCESS {
        Ok(id)
    } else {
        Err(format!(
            "Envoy refused to define `{name}` (metrics result {result})"
        ))
    }
}

fn add(stream: Stream, id: usize) {
    add_to(
        stream,
        abi::envoy_dynamic_module_callback_http_filter_increment_counter,
        id,
        1,
    );
}

/// `value` added to (a counter) or recorded in (a histogram) metric `id`.
fn add_to(stream: Stream, callback: AddToMetric, id: usize, value: u64) {
    // SAFETY: a hook's filter pointer and an id of its config; no labels. A failure (an
    // id Envoy does not know) costs the value, nothing else.
    unsafe {
        callback(stream.0, id, std::ptr::null(), 0, value);
    }
}
