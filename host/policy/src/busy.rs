//! When a worker is busy (`admission.busy`): not a candidate for a request. Written once,
//! over columns, for the router's selections, the saturation admitters read, and
//! `switchyard select`. Each threshold is one pass over a column (vectorized); the engine
//! thresholds read each worker's report.

use std::sync::Arc;

use switchyard_config::BusyThresholds;
use switchyard_plugin_host::plugin::EngineReport;

/// The columns the thresholds read, one value per worker.
pub struct BusyInputs<'a> {
    pub active_requests: &'a [u32],
    pub active_prefill_tokens: &'a [u64],
    pub active_decode_blocks: &'a [u64],
    pub engine: &'a [Arc<EngineReport>],
}

/// Into `out`, per worker: 1 when it is under every threshold of `busy` (the prefill one
/// only with `prefill`: a selection asks that one per request, with [`mark_prefill_room`]).
pub fn mark_not_busy(
    busy: &BusyThresholds,
    inputs: &BusyInputs<'_>,
    out: &mut Vec<u8>,
    prefill: bool,
) {
    out.clear();
    out.resize(inputs.active_requests.len(), 1);
    if let Some(max) = busy.max_active_requests {
        for (ok, &active) in out.iter_mut().zip(inputs.active_requests) {
            *ok &= u8::from(active < max);
        }
    }
    if let Some(max) = busy.max_active_prefill_tokens.filter(|_| prefill) {
        for (ok, &tokens) in out.iter_mut().zip(inputs.active_prefill_tokens) {
            *ok &= u8::from(tokens < max);
        }
    }
    if let Some(max) = busy.max_active_decode_blocks {
        for (ok, &blocks) in out.iter_mut().zip(inputs.active_decode_blocks) {
            *ok &= u8::from(blocks < max);
        }
    }
    if busy.max_engine_waiting.is_some() || busy.max_kv_cache_usage.is_some() {
        for (ok, report) in out.iter_mut().zip(inputs.engine) {
            let over = report.peek(|sample, _, _| {
                busy.max_engine_waiting
                    .is_some_and(|max| sample.waiting_requests >= max)
                    || busy
                        .max_kv_cache_usage
                        .is_some_and(|max| sample.kv_cache_usage >= max)
            });
            *ok &= u8::from(over != Some(true));
        }
    }
}

/// Whether one worker, its bookings now `active_requests`, `active_prefill_tokens` and
/// `active_decode_blocks`, still takes a request of `uncached_tokens` prompt tokens not in
/// its cache: the booking thresholds of [`mark_not_busy`] and [`mark_prefill_room`],
/// asked again when the request is booked (under the load lock), since another selection
/// may have booked the worker after this one read its columns. The engine's own
/// thresholds are not bookings, so they are not asked again.
pub fn takes_booking(
    busy: &BusyThresholds,
    active_requests: u32,
    active_prefill_tokens: u64,
    active_decode_blocks: u64,
    uncached_tokens: u64,
) -> bool {
    busy.max_active_requests
        .is_none_or(|max| active_requests < max)
        && busy
            .max_active_decode_blocks
            .is_none_or(|max| active_decode_blocks < max)
        && busy.max_active_prefill_tokens.is_none_or(|max| {
            active_prefill_tokens == 0
                || active_prefill_tokens.saturating_add(uncached_tokens) <= max
        })
}

/// Clears `allowed` for the workers without room for a request of `request_blocks`
/// blocks under `max` prefill tokens: a worker has room while what it has booked plus the
/// request's tokens not in its device cache (`overlaps`) stay within `max`, and an idle
/// worker has room for any. So the worker holding the prompt's prefix has room first.
pub fn mark_prefill_room(
    max: u64,
    booked: &[u64],
    overlaps: &[u32],
    request_blocks: u64,
    block_size: u64,
    allowed: &mut [u8],
) {
    let rows = allowed.iter_mut().zip(booked).zip(overlaps);
    for ((allowed, &booked), &overlap) in rows {
        let uncached = request_blocks.saturating_sub(u64::from(overlap)) * block_size;
        *allowed &= u8::from(booked == 0 || booked.saturating_add(uncached) <= max);
    }
}
