//! A simulated worker: its prefix cache, prefill queue, adapters and the load it
//! reports as an engine would.

use super::*;

pub(super) struct SimWorker {
    pub(super) cache: LruCache<u64, ()>,
    pub(super) prefill_free_at: f64,
    pub(super) active_tokens: u64,
    /// Requests routed here whose prefill has not ended, and those decoding.
    pub(super) waiting: u64,
    pub(super) running: u64,
    /// The adapters it holds, least recently used first out.
    pub(super) adapters: LruCache<u32, ()>,
    /// Per adapter: its (waiting, running) requests here.
    pub(super) adapter_requests: std::collections::BTreeMap<u32, (u64, u64)>,
}

impl SimWorker {
    /// What this worker's engine would report on its `/metrics`.
    pub(super) fn sample(&self, kv_capacity_tokens: f64) -> EngineSample {
        let names = |running: bool| -> Box<[Box<str>]> {
            self.adapter_requests
                .iter()
                .filter(|(_, &(w, r))| if running { r > 0 } else { r == 0 && w > 0 })
                .map(|(a, _)| adapter_name(*a).into_boxed_str())
                .collect()
        };
        EngineSample {
            running_requests: self.running as f64,
            waiting_requests: self.waiting as f64,
            kv_cache_usage: (self.active_tokens as f64 / kv_capacity_tokens).min(1.0),
            running_adapters: Some(names(true)),
            waiting_adapters: Some(names(false)),
            kv_capacity_tokens: None,
        }
    }

    /// Moves one request for `adapter` (if any) from waiting to running, or (`running`
    /// false at the end) out.
    pub(super) fn count_adapter(&mut self, adapter: Option<u32>, step: AdapterStep) {
        let Some(a) = adapter else { return };
        let entry = self.adapter_requests.entry(a).or_default();
        match step {
            AdapterStep::Arrive => entry.0 += 1,
            AdapterStep::Run => {
                entry.0 -= 1;
                entry.1 += 1;
            }
            AdapterStep::Leave => entry.1 -= 1,
        }
        if *entry == (0, 0) {
            self.adapter_requests.remove(&a);
        }
    }
}

#[derive(Clone, Copy)]
pub(super) enum AdapterStep {
    Arrive,
    Run,
    Leave,
}

pub(super) fn adapter_name(adapter: u32) -> String {
    format!("adapter-{adapter}")
}

/// The adapter a request asks for: requests sharing a first block (one application, one
/// adapter) ask for the same one.
pub(super) fn adapter_of(request: &TraceRequest, adapters: u32) -> Option<u32> {
    if adapters == 0 {
        return None;
    }
    let key = request
        .hash_ids
        .first()
        .copied()
        .unwrap_or(request.timestamp);
    Some(((key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % u64::from(adapters)) as u32)
}
