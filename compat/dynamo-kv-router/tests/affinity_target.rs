//! Dynamo's `affinity_target()` reads the router's session binding (ABI 1.5), and reads
//! none when the request has no binding.

use core::ptr;

use dynamo_kv_router::{WorkerAffinityTarget, WorkerSelectionContext};
use switchyard_plugin_sdk::abi::*;
use switchyard_plugin_sdk::WorkerSelectionContext as SdkContext;

/// Dynamo's view of a request bound (`mode`) to worker 7, rank 2.
fn affinity_of(mode: u32) -> Option<WorkerAffinityTarget> {
    let raw = switchyard_request {
        struct_size: core::mem::size_of::<switchyard_request>() as u32,
        block_size: 16,
        request_blocks: 4,
        expected_output_tokens: 0,
        priority_jump: 0.0,
        router_temperature_override: 0.0,
        strict_priority: 0,
        tracks_prefill_tokens: 1,
        has_expected_output_tokens: 0,
        has_router_temperature_override: 0,
        reserved0: 0,
        session: ptr::null(),
        attributes: ptr::null(),
        affinity_worker_id: 7,
        affinity_dp_rank: 2,
        affinity_mode: mode,
    };
    // SAFETY: `raw` is a complete request with no session or attributes, alive for the call.
    let context = unsafe { SdkContext::from_abi(&raw) };
    WorkerSelectionContext::from_switchyard(&context).affinity_target()
}

#[test]
fn the_routers_binding_is_dynamos_affinity_target() {
    let bound = Some(WorkerAffinityTarget::new(7, Some(2)));
    assert_eq!(affinity_of(SWITCHYARD_AFFINITY_SOFT), bound);
    assert_eq!(affinity_of(SWITCHYARD_AFFINITY_HARD), bound);
    assert_eq!(affinity_of(SWITCHYARD_AFFINITY_NONE), None);
}
