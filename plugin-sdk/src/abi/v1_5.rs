//! ABI 1.5's additions: the session-affinity modes, and the structs for factories (the
//! router's log and its cost knobs). Part of the `abi` module, in a file of its own for
//! size; the header generator reads it with `abi.rs` (tests/header.rs).

use core::ffi::c_void;

#[cfg(feature = "layout")]
use abi_stable::StableAbi;

use super::switchyard_str;

/// Session affinity (ABI 1.5): the request's session is bound to no worker (no session,
/// `router.session_affinity` off, or its binding expired).
pub const SWITCHYARD_AFFINITY_NONE: u32 = 0;
/// Session affinity (ABI 1.5): bound softly: the router keeps the session on its worker
/// while the worker is under `soft_max_active_requests` and not busy; past that the
/// policy decides, and may still prefer the worker.
pub const SWITCHYARD_AFFINITY_SOFT: u32 = 1;
/// Session affinity (ABI 1.5): bound hard: the session stays on its worker while it is a
/// candidate.
pub const SWITCHYARD_AFFINITY_HARD: u32 = 2;

/// Log level (ABI 1.5): something failed.
pub const SWITCHYARD_LOG_ERROR: u32 = 1;
/// Log level (ABI 1.5): something is wrong but handled.
pub const SWITCHYARD_LOG_WARN: u32 = 2;
/// Log level (ABI 1.5): what an operator wants to know.
pub const SWITCHYARD_LOG_INFO: u32 = 3;
/// Log level (ABI 1.5): what a plugin's developer wants to know.
pub const SWITCHYARD_LOG_DEBUG: u32 = 4;
/// Log level (ABI 1.5): every detail.
pub const SWITCHYARD_LOG_TRACE: u32 = 5;

/// The router's log, as handed to one factory or instance (ABI 1.5). Host-owned. Lines
/// go to the router's log with the plugin's name and type; each logger is rate-limited
/// (`router.plugin_log_lines_per_second`): lines past the limit are dropped, counted, and
/// their number reported in one line.
#[repr(C)]
#[cfg_attr(feature = "layout", derive(StableAbi))]
pub struct switchyard_logger {
    /// `sizeof(switchyard_logger)` as the host was compiled.
    pub struct_size: u32,
    /// The most detailed level the router's log keeps (`SWITCHYARD_LOG_*`), fixed when
    /// the logger was made: a line of a larger number is dropped, so skip formatting it.
    pub max_level: u32,
    /// Host-private; pass the logger pointer back to the callback.
    pub host_data: *const c_void,
    /// Logs `message` (UTF-8, not NUL-terminated; cut at 4 KiB) at `level`. OK also when
    /// the line was filtered or dropped by the rate limit; INVALID_ARGUMENT for a level
    /// out of range. Never blocks on I/O.
    pub callback_log: Option<
        unsafe extern "C" fn(
            logger: *const switchyard_logger,
            level: u32,
            message: switchyard_str,
        ) -> i32,
    >,
}

/// The router's own cost-model knobs (ABI 1.5): `worker_selection.builtin_default` with
/// its defaults filled in (docs/default-policy.md), and the router's block size, so a
/// factory can weigh as the router's `default` policy does. Host-owned, read-only.
#[repr(C)]
#[cfg_attr(feature = "layout", derive(StableAbi))]
pub struct switchyard_router_settings {
    /// `sizeof(switchyard_router_settings)` as the host was compiled.
    pub struct_size: u32,
    /// `router.block_size`: tokens per KV block.
    pub block_size: u32,
    /// Credit of a prefix block held in host memory beyond the device prefix.
    pub host_cache_weight: f64,
    /// Credit of a prefix block on disk beyond the device and host prefixes.
    pub disk_cache_weight: f64,
    /// Weight of a block the worker must prefill against a block of load booked on it.
    pub uncached_weight: f64,
    /// Scale of the prefill part of the cost (new blocks and queued prefill).
    pub prefill_load_scale: f64,
    /// The softmax picker's temperature (0: the lowest cost).
    pub temperature: f64,
    /// Weight of engine-reported load the router did not book (0: off).
    pub engine_load_weight: f64,
}
